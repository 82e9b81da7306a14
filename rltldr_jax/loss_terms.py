"""The terms of the training objective as data: L = Σ_k coef_k · sum_k / count_k (§3; the paper's L_GRPO + λ·L_SFT).

A `LossTerm` names the mask it reads (a key of `TrainBatch.masks`), a pure function giving that mask's micro-batch
`(sum, count, aux)` (sums, never means: see losses.py), and the `loss.*` config key of its coefficient. The train step
(`train.step.train_step`) loops over the configured terms (`loss.terms`): it divides every term's sum by the token
count of its mask over the *whole* update batch (all micro-batches and devices), multiplies by the term's coefficient
(a traced float32 argument of the compiled step: one program for every value), and adds the terms in order. Its
metrics and accumulated sums follow from the term list.

Built in, in this order (the default `loss.terms`):
- `grpo` (L_GRPO, §3 / eq. 3.1 and A.3; mask "action", coefficient `loss.grpo_coef`, metric `grpo_loss`),
- `insight_sft` (L_SFT, §3.3: the insight tokens given the task; mask "insight", coefficient λ = `loss.lam`,
  metric `sft_nll`),
- `writer_sft` (insight-writer SFT of Table 8, π(f | τ); mask "writer", coefficient `loss.writer_sft_coef`, metric
  `writer_sft_nll`).

Built in, not in the default `loss.terms` (not in the paper):
- `kl` (KL(π_θ || π_ref) to the frozen initial policy, Schulman's k3 estimator, `losses.kl_loss`; mask "action",
  coefficient `loss.kl_coef`, metrics `kl` and `kl_k1`): the second replication round's stabiliser, on with
  `--config.loss.terms=grpo,insight_sft,writer_sft,kl --config.loss.kl_coef=0.05`. It `needs_ref`: the train step
  then also runs the reference policy forward (`train.setup.ShardedUpdate` holds its parameters).

A term from outside the package (examples/entropy_bonus.py):

    register_loss_term(LossTerm("entropy_bonus", mask="action", fn=entropy_sum, coef="entropy_coef"))

then `--config.loss.terms=grpo,insight_sft,writer_sft,entropy_bonus --config.loss.entropy_coef=0.01` (a registered
term's coefficient key joins the config's `loss.*` keys, `Loss.extra` of rltldr_jax/settings.py, when the module that
registers it is imported before the config is built).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from rltldr_jax.losses import grpo_loss, insight_sft_loss, kl_loss, safe_divide

Array = jax.Array


class TermInputs(NamedTuple):
    """What a term's function reads for one micro-batch of M rows of T tokens.

    logprobs: [M, T] float32 log π_θ(ids[t] | ids[:t]) (0 where no term needs it: `sequence_logprobs(needed=...)`).
    entropy: [M, T] float32 entropy of π_θ at each position (same positions).
    batch: the micro-batch's other arrays: "ids" [M, T], "old_logprobs" [M, T], "advantages" [M] (or [M, T] packed),
      "detach_ratio" [M] (or [M, T]) bool, "masks" {name: [M, T] bool}, and "segments" [M, T] when rows are packed.
    ref_logprobs: [M, T] float32 log π_ref of the same tokens under the frozen reference policy (a constant, same
      positions as `logprobs`) when a configured term `needs_ref`; None otherwise.
    """

    logprobs: Array
    entropy: Array
    batch: Mapping[str, Any]
    ref_logprobs: Array | None = None


class Coefficients(Protocol):
    """What a term reads from the loss configuration (`train.step.LossConfig`): a coefficient or parameter by its
    `loss.*` key, a float32 scalar (traced in the compiled step: use it arithmetically, never branch on it)."""

    def coef(self, key: str) -> Array | float: ...


#: A term's function: (inputs, its mask [M, T] bool, the coefficients) -> (sum, count, aux) of the micro-batch;
#: sum and count are scalars, aux a dict of scalar sums (accumulated over micro-batches like sum).
TermFn = Callable[[TermInputs, Array, Coefficients], tuple[Array, Array, dict[str, Array]]]

#: A term's extra metrics: (its aux sums over the whole batch, its global count) -> {metric name: scalar}.
MetricsFn = Callable[[Mapping[str, Array], Array], dict[str, Array]]


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """One term of the objective, coef · sum / count.

    Attributes:
      name: its name in `loss.terms` and in the registry.
      mask: the `TrainBatch.masks` key of its target tokens; the term's normaliser is that mask's token count over the
        whole update batch (a batch without the mask has none: the term contributes 0).
      fn: the pure function (`TermFn`). Its `count` must be the micro-batch's number of mask tokens (the step uses
        the global one, known before any forward pass, so accumulation and data parallelism stay exact).
      coef: the `loss.*` config key of its coefficient (e.g. "lam").
      default_coef: the value that key gets in the config (external terms; the built-ins' keys are `Loss` fields).
      params: other `loss.*` keys the function reads through `Coefficients.coef` (traced like the coefficient).
      metric: the metric of sum / count (default `name`); tokens_metric: that of the global count (default
        `{name}_tokens`).
      metrics: extra metrics from its aux sums (default: each aux sum divided by the count, under its own key).
      needs_ref: the function reads `TermInputs.ref_logprobs` (the frozen reference policy's logprobs). When any
        configured term does, the train step takes the reference parameters and runs one more forward pass per
        micro-batch (no backward); otherwise the step is exactly the one without reference.
    """

    name: str
    mask: str
    fn: TermFn
    coef: str
    default_coef: float = 0.0
    params: tuple[str, ...] = ()
    metric: str | None = None
    tokens_metric: str | None = None
    metrics: MetricsFn | None = None
    needs_ref: bool = False

    @property
    def metric_name(self) -> str:
        return self.metric or self.name

    @property
    def tokens_metric_name(self) -> str:
        return self.tokens_metric or f"{self.name}_tokens"

    def extra_metrics(self, aux: Mapping[str, Array], count: Array) -> dict[str, Array]:
        """The term's metrics beyond sum / count and the count: `metrics`, or each aux sum / count."""
        if self.metrics is not None:
            return self.metrics(aux, count)
        return {k: safe_divide(v, count) for k, v in aux.items()}


#: The registered terms by name; `loss.terms` picks from them.
LOSS_TERMS: dict[str, LossTerm] = {}

#: The default `loss.terms`: the paper's objective (§3) and writer SFT (Table 8, coefficient 0 by default).
DEFAULT_TERMS: tuple[str, ...] = ("grpo", "insight_sft", "writer_sft")


def register_loss_term(term: LossTerm, *, replace: bool = False) -> LossTerm:
    """Adds `term` to `LOSS_TERMS` (an error if the name is taken, unless `replace`); returns it."""
    if term.name in LOSS_TERMS and not replace and LOSS_TERMS[term.name] != term:
        raise ValueError(f"a loss term named {term.name!r} is already registered; pass replace=True to replace it")
    if "," in term.name or not term.name:
        raise ValueError(f"loss term name {term.name!r}: use a non-empty name without commas")
    LOSS_TERMS[term.name] = term
    return term


def loss_term(name: str, *, mask: str, coef: str, **options: Any) -> Callable[[TermFn], TermFn]:
    """Decorator form of `register_loss_term`: `@loss_term("entropy_bonus", mask="action", coef="entropy_coef")`
    over a `TermFn` registers it (`options`: the other `LossTerm` fields) and returns the function unchanged."""

    def wrap(fn: TermFn) -> TermFn:
        register_loss_term(LossTerm(name, mask=mask, fn=fn, coef=coef, **options))
        return fn

    return wrap


def parse_terms(spec: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`loss.terms` ("grpo,insight_sft,writer_sft") as a tuple of registered names, in order.

    Raises:
      ValueError: an unknown or repeated name, or no name.
    """
    names = tuple(n.strip() for n in spec.split(",")) if isinstance(spec, str) else tuple(spec)
    names = tuple(n for n in names if n)
    if not names:
        raise ValueError("loss.terms is empty: name at least one term, e.g. 'grpo,insight_sft,writer_sft'")
    unknown = [n for n in names if n not in LOSS_TERMS]
    if unknown:
        raise ValueError(
            f"loss.terms names unregistered loss term(s) {', '.join(map(repr, unknown))}; registered: "
            f"{', '.join(LOSS_TERMS)} (import the module that registers a term before building the config)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"loss.terms={','.join(names)!r} names a term twice")
    return names


def terms_error(spec: str) -> str | None:
    """What is wrong with `loss.terms`, None if nothing (for the config's validation)."""
    try:
        parse_terms(spec)
    except ValueError as e:
        return str(e)
    return None


def combine(
    sums: Mapping[str, Array], counts: Mapping[str, Array | float], coefs: Mapping[str, Array | float]
) -> Array:
    """L = Σ_k coefs[k] · sums[k] / counts[k] over the terms in the order of `sums` (a term with count 0 adds 0).

    With the built-in terms this is `losses.rltldr_loss`, operation for operation."""
    loss = None
    for name, total in sums.items():
        part = coefs[name] * safe_divide(total, counts[name])
        loss = part if loss is None else loss + part
    return jnp.float32(0) if loss is None else loss


# ----------------------------------------------------------------------------------------------------
# The built-in terms
# ----------------------------------------------------------------------------------------------------


def grpo_term(inputs: TermInputs, mask: Array, cfg: Coefficients) -> tuple[Array, Array, dict[str, Array]]:
    """L_GRPO (§3, eq. 3.1; `losses.grpo_loss`) over the action tokens, with the action-token diagnostics as aux:
    clipped tokens, Σ ρ, Σ entropy, Σ trainer and sampler logprobs (all [M, T] inputs reduced to scalars)."""
    b = inputs.batch
    g = grpo_loss(inputs.logprobs, b["old_logprobs"], b["advantages"], mask, cfg.coef("clip_eps"), b["detach_ratio"])
    aux = {
        "clipped": g.clipped,
        "ratio_sum": g.ratio_sum,
        "entropy_sum": jnp.sum(inputs.entropy * mask),
        "trainer_logprob_sum": jnp.sum(inputs.logprobs * mask),
        "sampler_logprob_sum": jnp.sum(b["old_logprobs"] * mask),
    }
    return g.loss_sum, g.count, aux


def _grpo_metrics(aux: Mapping[str, Array], count: Array) -> dict[str, Array]:
    return {
        "clip_fraction": safe_divide(aux["clipped"], count),
        "importance_ratio": safe_divide(aux["ratio_sum"], count),
        "entropy": safe_divide(aux["entropy_sum"], count),
        "logprob_gap": safe_divide(aux["trainer_logprob_sum"] - aux["sampler_logprob_sum"], count),
    }


def sft_term(inputs: TermInputs, mask: Array, cfg: Coefficients) -> tuple[Array, Array, dict[str, Array]]:
    """Next-token NLL of the mask's tokens (`losses.insight_sft_loss`): L_SFT of §3.3 on the insight mask, writer SFT
    on the writer mask. No aux."""
    s = insight_sft_loss(inputs.logprobs, mask)
    return s.loss_sum, s.count, {}


GRPO = register_loss_term(
    LossTerm(
        "grpo",
        mask="action",
        fn=grpo_term,
        coef="grpo_coef",
        default_coef=1.0,
        params=("clip_eps",),
        metric="grpo_loss",
        tokens_metric="grpo_tokens",
        metrics=_grpo_metrics,
    )
)
INSIGHT_SFT = register_loss_term(
    LossTerm(
        "insight_sft",
        mask="insight",
        fn=sft_term,
        coef="lam",
        default_coef=0.5,
        metric="sft_nll",
        tokens_metric="sft_tokens",
    )
)
WRITER_SFT = register_loss_term(
    LossTerm(
        "writer_sft",
        mask="writer",
        fn=sft_term,
        coef="writer_sft_coef",
        metric="writer_sft_nll",
        tokens_metric="writer_sft_tokens",
    )
)


def kl_term(inputs: TermInputs, mask: Array, cfg: Coefficients) -> tuple[Array, Array, dict[str, Array]]:
    """KL(π_θ || π_ref) over the mask's tokens, k3 per token (`losses.kl_loss`), with the k1 sum as aux (`kl_k1`:
    the mean of log π_θ − log π_ref)."""
    if inputs.ref_logprobs is None:
        raise ValueError("the kl loss term needs the reference logprobs: TermInputs.ref_logprobs is None")
    k = kl_loss(inputs.logprobs, inputs.ref_logprobs, mask)
    return k.loss_sum, k.count, {"kl_k1": k.k1_sum}


KL = register_loss_term(
    LossTerm("kl", mask="action", fn=kl_term, coef="kl_coef", metric="kl", tokens_metric="kl_tokens", needs_ref=True)
)
