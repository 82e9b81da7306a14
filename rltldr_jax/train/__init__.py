"""Training: building a run from its config (setup.py), attempts to examples (batching.py), the jitted update step
(step.py), the phase loop (loop.py, `Trainer`), evaluation, the offline SFT baselines (sft.py), pretraining of the
replication's base policies (pretrain.py), resuming, stopping and the run summary."""
