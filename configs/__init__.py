"""Run configurations: `base.py` documents every knob; one file per environment; `ablations.py` the paper's rows."""
