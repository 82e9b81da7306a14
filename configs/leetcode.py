"""LeetCode-style coding, one message per task (Table 4, Leetcode column; A.4–A.5).

    python launch/train.py --config=configs/leetcode.py
    python launch/train.py --config=configs/leetcode.py:tiny

One step per attempt, thinking off (the think budget ran out on the hardest problems, A.4), 16k action tokens,
128 tasks per phase, lr 6e-6, global batch 32 (1 per device × 4 accumulation × 8 devices).
"""

from rltldr_jax.config import base


def _paper(c) -> None:
    base.override(
        c,
        {
            "env.name": "leetcode",
            "env.eval_split": "humaneval",
            "rollout.tasks_per_phase": 128,
            "rollout.max_steps": 1,
            "rollout.thinking": False,
            "rollout.max_think_tokens": 0,
            "rollout.max_action_tokens": 16384,
            "optim.learning_rate": 6e-6,
            "batch.micro_batch_size": 1,
            "batch.grad_accum_steps": 4,
            "eval.num_tasks": 0,  # all of HumanEval (the paper holds out 228 LeetCode problems)
        },
    )


def _tiny(c) -> None:
    _paper(c)
    base.apply_tiny(c)
    base.override(
        c,
        {
            "rollout.max_steps": 1,
            "rollout.thinking": False,
            "rollout.max_think_tokens": 0,
            "rollout.max_action_tokens": 96,
        },
    )


PRESETS = {"paper": _paper, "tiny": _tiny}


def get_config(preset: str | None = None):
    """`preset`: paper (default) | tiny."""
    return base.from_presets(PRESETS, preset)
