"""Examples of extending rltldr_jax from outside the package (e.g. `--config.env.name=examples.my_env:SPEC`)."""
