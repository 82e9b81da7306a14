"""AppWorld (Trivedi et al., 2024) through its own server process (Table 4, Appworld/SAPI column).

    python launch/train.py --config=configs/appworld.py

Train on the Pass@128 = 0 tasks of train + dev + test-normal (34 tasks in the paper), evaluate on
test-challenge (417 tasks). AppWorld's data must be installed first (see README); it cannot be downloaded on
machines without internet. The `tiny` preset keeps the AppWorld environment with a tiny random model.
"""

from rltldr_jax.config import base


def _paper(c) -> None:
    base.override(
        c,
        {
            "env.name": "appworld",
            "env.train_split": "train+dev+test_normal",
            "env.eval_split": "test_challenge",
            "eval.num_tasks": 417,
        },
    )


def _tiny(c) -> None:
    _paper(c)
    base.apply_tiny(c)


PRESETS = {"paper": _paper, "tiny": _tiny}


def get_config(preset: str | None = None):
    """`preset`: paper (default) | tiny."""
    return base.from_presets(PRESETS, preset)
