"""Training: the jitted update step (step.py); the phase loop lands with the end-to-end issue."""
