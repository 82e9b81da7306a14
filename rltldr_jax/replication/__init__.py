"""The small-scale replication: a grid of ordinary training runs (arms × seeds), the base policy's checks, the
report."""
