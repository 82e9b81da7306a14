"""Analyses of a finished training run: saved rollouts (insight evolution, revisits, categories, reliance) and
weights."""
