"""One optimizer step of RLTL;DR: gradient accumulation over micro-batches of L_GRPO + λ·L_SFT (and any other
configured term, `loss_terms`).

Pure functions over (graphdef, params, opt_state), so the step can be jitted with explicit shardings and
AOT-compiled from abstract shapes (benchmarks/plan_memory.py). The loss coefficients (`LossConfig`) are arguments of
the jitted step, not constants: runs that differ only in λ, the GRPO weight, ε or the writer-SFT weight share one
compiled program. The token counts of the loss terms are summed
over the *whole* step batch before the first micro-batch, so accumulation and data parallelism give exactly
the full-batch loss and gradient (see losses.py). A step whose loss or gradient norm is not finite changes nothing
and says so (`skipped_nonfinite`); `NonFiniteGuard` counts such steps on the host and stops a run after too many in
a row.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import operator
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from rltldr_jax.loss_terms import DEFAULT_TERMS, LOSS_TERMS, LossTerm, TermInputs, combine, parse_terms
from rltldr_jax.losses import safe_divide
from rltldr_jax.models.lora import join_trainable, split_trainable, with_dropout
from rltldr_jax.models.qwen3_5 import sequence_logprobs
from rltldr_jax.settings import Loss, Optim, build, choices

log = logging.getLogger(__name__)


#: The masks every `TrainBatch` has (`batching.pack`), by the `TrainBatch.masks` key: the loss targets of the built-in
#: terms (`loss_terms`).
BASE_MASKS = ("action", "insight", "writer")


@struct.dataclass(init=False)
class TrainBatch:
    """The examples of one optimizer step, as A micro-batches of M rows of T tokens: one example per row, or with
    `segments` several examples packed in a row (`batching.pack`, `batch.pack_rows`).

    ids: [A, M, T] int32 context + current step ids (right-padded).
    old_logprobs: [A, M, T] float32 logprobs of the sampled tokens under the sampling policy.
    advantages: [A, M] float32 per-example advantage, or [A, M, T] per token (packed rows).
    masks: {name: [A, M, T] bool} the loss terms' targets by name (`loss_terms.LossTerm.mask`):
      "action" the GRPO targets (tokens sampled in the example's step), "insight" the SFT targets (insight sentences;
      for the offline SFT baselines, whatever the baseline trains on), "writer" the insight-generator SFT targets
      (the insight in the writer's context, Table 8), and any a registered term reads. A missing mask has no tokens.
    detach_ratio: [A, M] (or [A, M, T], packed rows) bool, examples trained without an importance ratio (RLTF-SD);
      None = none.
    segments: [A, M, T] int32 segment ids of packed rows (`Qwen35.hidden_states`): 1, 2, ... one per example in
      row order, 0 after the last one; None = one example per row.

    The constructor also takes the masks as `action_mask=`, `insight_mask=`, `writer_mask=` (None: absent), and the
    properties of those names read them back (None when absent).
    """

    ids: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array
    masks: dict[str, jax.Array]
    detach_ratio: jax.Array | None = None
    segments: jax.Array | None = None

    def __init__(
        self,
        ids: jax.Array,
        old_logprobs: jax.Array,
        advantages: jax.Array,
        masks: Mapping[str, jax.Array] | None = None,
        detach_ratio: jax.Array | None = None,
        segments: jax.Array | None = None,
        *,
        action_mask: jax.Array | None = None,
        insight_mask: jax.Array | None = None,
        writer_mask: jax.Array | None = None,
    ):
        masks = dict(masks or {})
        for name, mask in (("action", action_mask), ("insight", insight_mask), ("writer", writer_mask)):
            if mask is not None:
                masks[name] = mask
        for name, value in (
            ("ids", ids),
            ("old_logprobs", old_logprobs),
            ("advantages", advantages),
            ("masks", masks),
            ("detach_ratio", detach_ratio),
            ("segments", segments),
        ):
            object.__setattr__(self, name, value)

    @property
    def action_mask(self) -> jax.Array | None:
        return self.masks.get("action")

    @property
    def insight_mask(self) -> jax.Array | None:
        return self.masks.get("insight")

    @property
    def writer_mask(self) -> jax.Array | None:
        return self.masks.get("writer")


#: Positions per vocabulary-projection chunk of the loss's logprobs (`LossConfig.logprob_chunk`; not a setting).
DEFAULT_LOGPROB_CHUNK = 128

#: The coefficients and parameters `LossConfig` holds as fields (the default terms' `loss.*` keys). Every other key a
#: configured term reads (the built-in `kl` term's `loss.kl_coef`, a registered term's) is held in `LossConfig.extra`,
#: and only when a configured term reads it: the default terms' step has no other argument.
BUILTIN_COEFS = ("lam", "grpo_coef", "clip_eps", "writer_sft_coef")


@struct.dataclass
class LossConfig:
    """The objective's terms and coefficients, named as their `loss.*` config keys.

    The coefficients (the four fields and `extra`) are pytree leaves: `ShardedUpdate` passes them to the jitted step
    as float32 scalars (`traced`), so runs that differ only in them (the arms of a λ sweep, GRPO vs RLTL;DR) run one
    compiled program, read from the compilation cache by every run after the first. Nothing inside the step may
    branch on them in Python. `terms` (which `loss_terms.LOSS_TERMS` the loss sums, in order) and `logprob_chunk`
    shape the program and stay static.

    Attributes:
      lam, grpo_coef, clip_eps, writer_sft_coef: the default terms' coefficients and GRPO's clip ε.
      extra: {loss.* key: value} the coefficients and parameters of the other configured terms (`kl_coef` of the
        built-in `kl` term, those of terms registered from outside the package).
      terms: names of the terms, `loss.terms`.
    """

    lam: float | jax.Array = 0.5
    grpo_coef: float | jax.Array = 1.0
    clip_eps: float | jax.Array = 0.2
    writer_sft_coef: float | jax.Array = 0.0
    extra: dict[str, float | jax.Array] = struct.field(default_factory=dict)
    terms: tuple[str, ...] = struct.field(pytree_node=False, default=DEFAULT_TERMS)
    # Positions per vocabulary-projection chunk; chunks without a loss target are skipped (sequence_logprobs).
    logprob_chunk: int = struct.field(pytree_node=False, default=DEFAULT_LOGPROB_CHUNK)

    @classmethod
    def of(cls, loss: Loss) -> LossConfig:
        """The terms (`loss.terms`) and coefficients of a run's `loss.*` settings: lam, grpo_coef, clip_eps,
        writer_sft_coef, and the `coef` and `params` keys of every other configured term, each read from the `Loss`
        field of that name (`loss.kl_coef`) or else from `Loss.extra` (a term registered from outside the package)."""
        terms = parse_terms(loss.terms)
        fields = {f.name for f in dataclasses.fields(loss) if not f.metadata.get("extra")}
        keys = [k for name in terms for k in (LOSS_TERMS[name].coef, *LOSS_TERMS[name].params)]
        keys = [k for k in dict.fromkeys(keys) if k not in BUILTIN_COEFS]
        missing = [k for k in keys if k not in fields and k not in loss.extra]
        if missing:
            raise ValueError(
                f"the loss settings have no key {', '.join(map(repr, missing))} for loss.terms={','.join(terms)!r}: "
                "import the module that registers the term before building the config"
            )
        extra = {k: getattr(loss, k) if k in fields else loss.extra[k] for k in keys}
        return build(cls, loss, extra=extra, terms=terms, logprob_chunk=DEFAULT_LOGPROB_CHUNK)

    def coef(self, key: str) -> float | jax.Array:
        """The coefficient or parameter of `loss.<key>`."""
        if key in BUILTIN_COEFS:
            return getattr(self, key)
        if key not in self.extra:
            raise KeyError(f"LossConfig has no coefficient {key!r}: give it in LossConfig(extra={{{key!r}: ...}})")
        return self.extra[key]

    def loss_terms(self) -> tuple[LossTerm, ...]:
        """The configured `LossTerm`s, in order."""
        return tuple(LOSS_TERMS[name] for name in parse_terms(self.terms))

    @property
    def needs_ref(self) -> bool:
        """Whether a configured term reads the reference policy's logprobs (`LossTerm.needs_ref`): the train step
        then takes the reference parameters."""
        return any(t.needs_ref for t in self.loss_terms())

    def traced(self) -> LossConfig:
        """The coefficients as numpy float32 scalars (arguments of a jitted step: one program for every value)."""
        return jax.tree.map(np.float32, self)


#: Values of `optim.name` that `make_optimizer` builds.
OPTIMIZERS = choices("optim.name")


def learning_rate_schedule(
    learning_rate: float, warmup_steps: int = 0, decay_steps: int = 0, end_learning_rate: float = 0.0
) -> float | optax.Schedule:
    """The learning rate of optimizer step t (counted from 0; a step skipped as non-finite does not count).

    Warmup (`warmup_steps` = W > 0): lr(t) = learning_rate * t / W for t < W, a linear ramp from 0 at t=0 (the first
    step moves no parameter; Adam's moments still take its gradient) reaching `learning_rate` at t=W.

    After the warmup: the constant `learning_rate` with `decay_steps` = 0; with `decay_steps` = D > 0, a cosine decay
    to `end_learning_rate` over D steps, then constant:
    lr(W + s) = end + (learning_rate - end) * (1 + cos(pi * min(s, D) / D)) / 2.

    W = D = 0 gives the float `learning_rate` (the optimizer is exactly the constant-lr one and holds no schedule
    counter in its state). The paper trains with a constant learning rate and no warmup (A.4, Table 4), so both are
    off by default (`optim.warmup_steps`, `optim.decay_steps`).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} is negative: use 0 (no warmup) or a positive number of steps")
    if decay_steps < 0:
        raise ValueError(f"decay_steps={decay_steps} is negative: use 0 (no decay) or a positive number of steps")
    if problem := lr_decay_error(learning_rate, end_learning_rate, decay_steps, prefix="optim."):
        raise ValueError(problem)
    if decay_steps == 0:
        return learning_rate if warmup_steps == 0 else optax.linear_schedule(0.0, learning_rate, warmup_steps)
    decay = optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=end_learning_rate / learning_rate)
    if warmup_steps == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), decay], [warmup_steps])


def lr_decay_error(learning_rate: float, end_learning_rate: float, decay_steps: int, *, prefix: str = "") -> str | None:
    """What is wrong with the decay's end, None if nothing: with `decay_steps` > 0 the learning rate decays from
    `learning_rate` (optim.learning_rate, or sft.learning_rate for the offline SFT baselines) to `end_learning_rate`,
    which must lie in [0, learning_rate]; with `decay_steps` = 0 it is unused. `prefix` ("optim.") names the keys."""
    if decay_steps > 0 and not 0 <= end_learning_rate <= learning_rate:
        return (
            f"{prefix}end_learning_rate={end_learning_rate} with {prefix}decay_steps={decay_steps}: the cosine decay "
            f"goes from the learning rate {learning_rate} to it, so it must be in [0, {learning_rate}]"
        )
    return None


def weight_decay_error(name: str, weight_decay: float, *, flag: str = "") -> str | None:
    """What is wrong with this combination, None if nothing: weight decay is decoupled (AdamW's), so with another
    rule a nonzero `weight_decay` would be silently ignored. `flag` prefixes the keys in the fix ("--config." for
    the command line)."""
    if weight_decay != 0 and name != "adamw":
        return (
            f"optim.weight_decay={weight_decay} with optim.name={name!r} would be ignored: "
            f"set {flag}optim.weight_decay=0, "
            f"or {flag}optim.name=adamw for decoupled weight decay"
        )
    return None


def make_optimizer(
    learning_rate: float,
    *,
    name: str = "adamw",
    warmup_steps: int = 0,
    decay_steps: int = 0,
    end_learning_rate: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    grad_clip_norm: float = 1.0,
) -> optax.GradientTransformation:
    """Global-norm gradient clipping (Fig. 4: the clip at 1 fires on nearly every update; grad_clip_norm=0 means no
    clipping), then the update rule `name`, scaled by `learning_rate_schedule(learning_rate, warmup_steps,
    decay_steps, end_learning_rate)`.

    name: "adamw" (Adam with decoupled weight decay: update -lr(t) * (adam_t + weight_decay * param)), "adam" (the
    same without weight decay) or "sgd" (plain SGD without momentum: update -lr(t) * clipped grad). b1, b2, eps are
    Adam's and unused by "sgd"; a nonzero weight_decay with "adam" or "sgd" is refused (it would be silently
    ignored). With the defaults (adamw, warmup_steps=0, decay_steps=0) this is clip + `optax.adamw(learning_rate,
    ...)`.

    Raises:
      ValueError: an unknown `name`, a negative `warmup_steps` or `decay_steps`, an `end_learning_rate` outside
        [0, learning_rate] with decay_steps > 0, or weight_decay != 0 with a name other than "adamw".
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r} is not one of {', '.join(map(repr, OPTIMIZERS))}: pick one of them")
    problem = weight_decay_error(name, weight_decay, flag="--config.")
    if problem:
        raise ValueError(problem)
    lr = learning_rate_schedule(learning_rate, warmup_steps, decay_steps, end_learning_rate)
    clip = optax.clip_by_global_norm(grad_clip_norm) if grad_clip_norm > 0 else optax.identity()
    if name == "adamw":
        rule = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    elif name == "adam":
        rule = optax.adam(lr, b1=b1, b2=b2, eps=eps)
    else:
        rule = optax.sgd(lr)
    return optax.chain(clip, rule)


def optimizer_of(optim: Optim, learning_rate: float | None = None) -> optax.GradientTransformation:
    """`make_optimizer` of the `optim.*` settings; `learning_rate` replaces `optim.learning_rate` (the offline SFT
    baselines use `sft.learning_rate` with the rest of `optim.*`)."""
    return build(make_optimizer, optim, **({} if learning_rate is None else {"learning_rate": learning_rate}))


def learning_rate_of(optim: Optim, opt_state: Any, learning_rate: float | None = None) -> float:
    """The learning rate of the last optimizer step `opt_state` has taken (of the first step before any): the
    `optim.*` schedule (`learning_rate_schedule`) at the state's step count minus one. Skipped non-finite steps are
    not counted (`train_step` keeps the state). `learning_rate` replaces `optim.learning_rate`, as in
    `optimizer_of`. Reads one scalar of the (replicated) state on the host; no collective."""
    given = {} if learning_rate is None else {"learning_rate": learning_rate}
    schedule = build(learning_rate_schedule, optim, **given)
    if not callable(schedule):
        return float(schedule)  # constant: the state holds no counter
    counts = [
        int(np.asarray(c.addressable_shards[0].data) if isinstance(c, jax.Array) else c)
        for _, c in optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    ]
    return float(schedule(max(max(counts, default=0) - 1, 0)))


class StepCount(NamedTuple):
    """The optimizer state of `step_counter`: updates applied so far (skipped non-finite steps not counted)."""

    count: jax.Array  # int32 []


def step_counter() -> optax.GradientTransformation:
    """Counts the updates it sees and leaves them unchanged: chained after an optimizer that keeps no count of its
    own (plain SGD), it puts the step number in the optimizer state, so what derives from it (the adapters' dropout
    keys, `dropout_key`) is checkpointed and resumed with the state."""

    def init(params):
        del params
        return StepCount(jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        del params
        return updates, StepCount(state.count + 1)

    return optax.GradientTransformation(init, update)


def with_step_count(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` followed by `step_counter` (the same updates)."""
    return optax.chain(tx, step_counter())


def dropout_seed_key(seed: int) -> jax.Array:
    """The run's key for the adapters' dropout, from its seed (a stream of its own: no other use of the seed draws
    from it)."""
    return jax.random.fold_in(jax.random.key(seed), 0x4C6F5241)  # ("LoRA")


def dropout_key(opt_state: Any, seed_key: jax.Array) -> jax.Array:
    """The random key of one optimizer step's adapter dropout: `seed_key` (`dropout_seed_key`) folded with the step
    number that the state of a `with_step_count` optimizer holds, so a resumed run draws the same keys as an
    uninterrupted one.

    Raises:
      ValueError: `opt_state` has no `StepCount` (the optimizer was not built `with_step_count`).
    """
    found = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, StepCount))
    counts = [x for x in found if isinstance(x, StepCount)]
    if not counts:
        raise ValueError("adapter dropout needs the step number in the optimizer state: build it with_step_count(tx)")
    return jax.random.fold_in(seed_key, counts[-1].count)


def _mask_names(terms: tuple[LossTerm, ...]) -> tuple[str, ...]:
    """The masks the terms read, each once, in term order."""
    return tuple(dict.fromkeys(t.mask for t in terms))


def _needed(masks: Mapping[str, jax.Array], terms: tuple[LossTerm, ...]) -> jax.Array:
    """[M, T] bool: the positions some term reads (the union of their masks)."""
    return functools.reduce(operator.or_, (masks[m] for m in _mask_names(terms)))


def _reference_logprobs(ref_params, graphdef, mb: dict[str, Any], loss_cfg: LossConfig) -> jax.Array:
    """[M, T] log π_ref of one micro-batch's tokens under the frozen reference parameters, at the positions the terms
    read (0 elsewhere); a constant of the loss (`stop_gradient`: no backward pass)."""
    model = nnx.merge(graphdef, jax.lax.stop_gradient(ref_params))
    lp, _ = sequence_logprobs(
        model,
        mb["ids"],
        chunk=loss_cfg.logprob_chunk,
        needed=_needed(mb["masks"], loss_cfg.loss_terms()),
        segments=mb.get("segments"),
    )
    return jax.lax.stop_gradient(lp)


def _micro_loss(
    params,
    graphdef,
    mb: dict[str, Any],
    counts: dict[str, jax.Array],
    loss_cfg: LossConfig,
    ref_logprobs: jax.Array | None = None,
    frozen=None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One micro-batch's Σ_k coef_k · sum_k / count_k (global counts) and every term's sums, keyed "{term}/sum" and
    "{term}/{aux key}"; `ref_logprobs` go to the terms as `TermInputs.ref_logprobs`. `params` are what trains; with
    LoRA adapters, `frozen` the rest of the model (`lora.split_trainable`). A micro-batch with a "dropout_key" runs
    the model's adapter dropout with it (`lora.with_dropout`)."""
    terms = loss_cfg.loss_terms()
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    if "dropout_key" in mb:
        model = with_dropout(model, mb["dropout_key"])
    masks = mb["masks"]
    lp, entropy = sequence_logprobs(
        model, mb["ids"], chunk=loss_cfg.logprob_chunk, needed=_needed(masks, terms), segments=mb.get("segments")
    )
    inputs = TermInputs(lp, entropy, mb, ref_logprobs)
    sums, coefs, aux = {}, {}, {}
    for term in terms:
        total, _, term_aux = term.fn(inputs, masks[term.mask], loss_cfg)
        sums[term.name], coefs[term.name] = total, loss_cfg.coef(term.coef)
        aux[f"{term.name}/sum"] = total
        aux.update({f"{term.name}/{k}": v for k, v in term_aux.items()})
    return combine(sums, counts, coefs), aux


def train_step(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    opt_state: Any,
    batch: TrainBatch,
    *,
    tx: optax.GradientTransformation,
    loss_cfg: LossConfig,
    ref_params: nnx.State | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """Accumulates the gradients of the configured loss terms (`loss_cfg.terms`, §3: L = Σ_k coef_k · sum_k / count_k
    with count_k the token count of term k's mask over the whole batch) over the A micro-batches of `batch`, then
    applies one optimizer update.

    A model with LoRA adapters (`models/lora.py`) trains only them: the gradients, the optimizer state (`opt_state`
    is `tx.init` of `lora.split_trainable(params)[0]`) and the update cover the adapters, the base is a constant.

    A step whose loss or gradient norm is not finite changes nothing: the parameters and the optimizer state
    are returned as they came, and the metric `skipped_nonfinite` is 1 (else 0). A micro-batch without any loss
    target (the all-padding rows that fill the last batch of a phase, or the unused rows of packed steps) is skipped
    at run time (`lax.cond`): it would add exactly zero to the loss and the gradient.

    Args:
      graphdef, params, opt_state: the policy's structure, parameters and optimizer state.
      batch: A micro-batches of M rows of T tokens (`TrainBatch`).
      tx: the optimizer.
      loss_cfg: the coefficients, as Python floats (constants of the program) or float32 scalars (`LossConfig.traced`:
        arguments of a jitted step, one program for every value); only used arithmetically, never branched on.
      ref_params: the frozen reference policy's parameters (same structure as `params`), needed when a configured
        term `needs_ref` (`loss_cfg.needs_ref`: the `kl` term): each micro-batch with targets then also runs their
        forward pass (no backward) for `TermInputs.ref_logprobs`. Ignored, and the step is exactly the one without
        them, when no term needs them.
      dropout_key: the step's key for the adapters' dropout (`dropout_key`; each micro-batch gets its own split);
        None = no dropout. Only the policy's forward pass in the loss drops; the reference policy's does not.

    Returns:
      (new params, new optimizer state, metrics): loss, grad_norm (before clipping), detached_examples,
      skipped_nonfinite, and per term its mean (`LossTerm.metric_name`: grpo_loss, sft_nll, writer_sft_nll), its token
      count (`tokens_metric_name`: grpo_tokens, sft_tokens, writer_sft_tokens) and its extra metrics (GRPO's
      clip_fraction, importance_ratio, entropy and sampler-vs-trainer logprob_gap; the kl term's kl, kl_tokens and
      kl_k1).
    """
    terms = loss_cfg.loss_terms()
    if not loss_cfg.needs_ref:
        ref_params = None
    elif ref_params is None:
        names = ", ".join(t.name for t in terms if t.needs_ref)
        raise ValueError(f"the loss term(s) {names} need the reference policy: pass train_step(..., ref_params=...)")
    blank = jnp.zeros(batch.ids.shape, bool)  # a mask the batch lacks: no tokens
    masks = {name: batch.masks.get(name, blank) for name in _mask_names(terms)}
    detach = jnp.zeros(batch.advantages.shape, bool) if batch.detach_ratio is None else batch.detach_ratio
    counts = {t.name: jnp.sum(masks[t.mask]).astype(jnp.float32) for t in terms}
    grad_fn = jax.value_and_grad(_micro_loss, has_aux=True)
    params, frozen = split_trainable(params)

    def compute(mb):
        ref_logprobs = None if ref_params is None else _reference_logprobs(ref_params, graphdef, mb, loss_cfg)
        return grad_fn(params, graphdef, mb, counts, loss_cfg, ref_logprobs, frozen)

    def accumulate(carry, mb):
        grads, loss, aux = carry
        targets = jnp.any(functools.reduce(operator.or_, (mb["masks"][m] for m in masks)))
        (micro_loss, a), g = jax.lax.cond(targets, compute, lambda _: nothing, mb)
        return (jax.tree.map(jnp.add, grads, g), loss + micro_loss, jax.tree.map(jnp.add, aux, a)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    micro = {
        "ids": batch.ids,
        "old_logprobs": batch.old_logprobs,
        "advantages": batch.advantages,
        "masks": masks,
        "detach_ratio": detach,
    }
    if batch.segments is not None:
        micro["segments"] = batch.segments
    if dropout_key is not None:
        micro["dropout_key"] = jax.random.split(dropout_key, batch.ids.shape[0])
    # What a micro-batch without targets contributes: zeros shaped like `compute`'s outputs.
    shapes = jax.eval_shape(compute, jax.tree.map(lambda x: x[0], micro))
    nothing = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    aux0 = nothing[0][1]
    (grads, loss, aux), _ = jax.lax.scan(accumulate, (zeros, jnp.float32(0), aux0), micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite loss or gradient (an infinite advantage, a -inf old logprob, an overflow) would make the
    # parameters and AdamW's moments NaN for good: such a step keeps both as they were (a select, so the
    # donated buffers are still updated in place).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    params, opt_state = jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state)
    params = join_trainable(params, frozen)
    metrics = {"loss": loss, "grad_norm": grad_norm}
    for t in terms:
        count = counts[t.name]
        metrics[t.metric_name] = safe_divide(aux[f"{t.name}/sum"], count)
        metrics[t.tokens_metric_name] = count
        prefix = f"{t.name}/"
        term_aux = {k[len(prefix) :]: v for k, v in aux.items() if k.startswith(prefix) and k != f"{t.name}/sum"}
        metrics.update(t.extra_metrics(term_aux, count))
    action = masks.get("action", batch.masks.get("action", blank))
    metrics["detached_examples"] = _detached_examples(detach, action, batch.segments)
    metrics["skipped_nonfinite"] = (~finite).astype(jnp.float32)
    return params, opt_state, metrics


def _detached_examples(detach: jax.Array, action_mask: jax.Array, segments: jax.Array | None) -> jax.Array:
    """How many examples with GRPO tokens are trained without an importance ratio: rows ([A, M] `detach`), or the
    segments of packed rows ([A, M, T] `detach` and `segments`)."""
    if segments is None:
        return jnp.sum(detach & (jnp.sum(action_mask, -1) > 0)).astype(jnp.float32)
    t = segments.shape[-1]
    rows = jnp.arange(segments.size // t, dtype=jnp.int32).reshape(segments.shape[:-1])[..., None]
    ids = (rows * t + segments).reshape(-1)  # a distinct id per (row, segment)
    hit = jax.ops.segment_max((detach & action_mask).reshape(-1).astype(jnp.int32), ids, num_segments=segments.size)
    return jnp.sum(jnp.maximum(hit, 0)).astype(jnp.float32)


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient norm (config train.max_nonfinite_skips)."""


class NonFiniteGuard:
    """Watches the `skipped_nonfinite` metric of `train_step` on the host: warns loudly for every skipped step and
    raises NonFiniteError after `limit` skipped steps in a row (0 = never). The trainers let it propagate before
    their next checkpoint, so the latest checkpoint stays the last good state.

    Attributes:
      in_a_row: skipped steps since the last applied one.
      total: skipped steps so far.
    """

    def __init__(self, limit: int):
        self.limit, self.in_a_row, self.total = limit, 0, 0

    def record(self, metrics: Mapping[str, Any], where: str) -> None:
        """Accounts for one step's metrics; `where` names the step in messages (e.g. "phase 3, step 2")."""
        if not float(metrics["skipped_nonfinite"]):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        values = f"loss {float(metrics['loss'])}, gradient norm {float(metrics['grad_norm'])}"
        stop = f"the run stops at {self.limit} in a row" if self.limit else "train.max_nonfinite_skips=0: never stops"
        log.warning(
            "%s: NON-FINITE %s: optimizer step SKIPPED, parameters and optimizer state unchanged (%d in a row; %s)",
            where,
            values,
            self.in_a_row,
            stop,
        )
        if self.limit and self.in_a_row >= self.limit:
            raise NonFiniteError(
                f"{self.in_a_row} optimizer steps in a row had a non-finite loss or gradient norm (last at {where}: "
                f"{values}); stopped without saving, the last checkpoint is intact. Look for infinite advantages or "
                "logprobs, lower optim.learning_rate, or raise train.max_nonfinite_skips"
            )


class LogprobGapError(RuntimeError):
    """The sampler's logprobs are not the trainer's: the engine does not sample from the policy being trained."""


def check_logprob_gap(metrics: Mapping[str, Any], limit: float, phase: int) -> None:
    """Raises LogprobGapError when a phase's first minibatch has |logprob_gap| > `limit` nats per token.

    `logprob_gap` is the mean of (trainer - sampler) logprobs over the minibatch's GRPO tokens; before the phase's
    update changes anything it estimates -KL(sampler || trainer), which is at the numerical floor (~1e-6 fp32,
    ~1e-3 bf16 servers) when the engine samples from the trainer's weights. `limit` 0 disables the check; a
    minibatch without GRPO tokens has no gap to check, and a non-finite one is left to `NonFiniteGuard`.
    """
    gap = float(metrics["logprob_gap"])
    if not limit or not float(metrics["grpo_tokens"]) or not math.isfinite(gap) or abs(gap) <= limit:
        return
    raise LogprobGapError(
        f"phase {phase + 1}: the sampler's logprobs differ from the trainer's by {gap:+.4f} nats per token "
        "on the first "
        f"minibatch (|gap| > train.max_logprob_gap={limit}), so the rollouts were not sampled from the policy being "
        "trained; stopped without saving, the last checkpoint is intact. Likely causes: the generation servers serve "
        "other weights (started from another checkpoint, or engine.assume_initial_weights=True when they were not), "
        "the servers' tokenizer or chat template differs from the trainer's, or sampling that is not the policy's "
        "(rollout.temperature != 1, rollout.top_p < 1, rollout.top_k > 0), or a large adapter dropout "
        "(model.lora.dropout: the trainer's logprobs are those of one step's masks). "
        "To train on anyway, raise train.max_logprob_gap or set it to 0"
    )
