"""SAPI-like synthetic API world (the paper's main setting; Table 4, Appworld/SAPI column).

    python launch/train.py --config=configs/sapi.py          # the paper's setup (Qwen 3.5 9B, SGLang servers)
    python launch/train.py --config=configs/sapi.py:tiny     # tiny random model on CPU, a few minutes

The paper's SAPI is proprietary (16k train tasks, eval on 4 unseen apps); rltldr_jax generates a SAPI-like
world of its own (rltldr_jax/envs/sapi). Paper numbers: RLTL;DR 18.9 % eval Pass@1 on the 642-task hard split
(Table 2), GRPO stays near 0–1 %.
"""

from rltldr_jax.config import base


def _paper(c) -> None:
    base.override(c, {"env.name": "sapi"})


def _tiny(c) -> None:
    _paper(c)
    base.apply_tiny(c)


PRESETS = {"paper": _paper, "tiny": _tiny}


def get_config(preset: str | None = None):
    """`preset`: paper (default) | tiny."""
    return base.from_presets(PRESETS, preset)
