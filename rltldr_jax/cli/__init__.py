"""The launchers: one module per command, each with `main` (its logic) and `run` (the command). Each is installed as
a console script (`rltldr-train`, `rltldr-eval`, ...: setup.py) and run from a checkout as `python launch/NAME.py`
(a few lines calling `run`); `common` and `multihost` hold what they share. Config files are named relative to the
current directory; without `--config` a launcher uses the checkout's `configs/` (common.default_config)."""
