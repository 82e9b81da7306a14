"""A loss term added from outside the package: an entropy bonus on the action tokens.

The term is data (`rltldr_jax.loss_terms.LossTerm`): its name, the mask it reads ("action", the GRPO targets), a pure
function giving a micro-batch's (sum, count, aux), and the `loss.*` key of its coefficient. Registering it, before the
config is built, adds `loss.entropy_coef` (default 0) to the config; listing it in `loss.terms` puts it in the
objective (§3), which becomes

    L = L_GRPO + λ·L_SFT + writer_sft_coef·L_writer + entropy_coef · (−mean entropy of π_θ over the action tokens),

so a positive `loss.entropy_coef` pushes the policy's entropy up. The coefficient is traced like λ: every value runs
the same compiled step. Its metric is `update/entropy_bonus` (the mean of −H over the action tokens).

Train with it (from the repository root; the module registers the term, then runs the training launcher):

    python -m examples.entropy_bonus --config=configs/sapi.py:tiny \\
        --config.loss.terms=grpo,insight_sft,writer_sft,entropy_bonus --config.loss.entropy_coef=0.01
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rltldr_jax.loss_terms import Coefficients, LossTerm, TermInputs, register_loss_term


def entropy_bonus(inputs: TermInputs, mask: jax.Array, cfg: Coefficients) -> tuple[jax.Array, jax.Array, dict]:
    """−Σ H(π_θ(· | ids[:t])) over the masked tokens, and their count.

    Args:
      inputs: the micro-batch's `TermInputs`; reads `entropy` [M, T] float32.
      mask: [M, T] bool, the action tokens.
      cfg: the coefficients (unused: the step multiplies by `loss.entropy_coef`).

    Returns:
      (sum, count, {}) scalars: the step divides the sum by the action-token count of the whole update batch.
    """
    m = mask.astype(jnp.float32)
    return -jnp.sum(inputs.entropy * m), jnp.sum(m), {}


ENTROPY_BONUS = register_loss_term(
    LossTerm("entropy_bonus", mask="action", fn=entropy_bonus, coef="entropy_coef", default_coef=0.0)
)


if __name__ == "__main__":  # the training launcher, with this term registered
    from rltldr_jax.cli.train import run

    run()
