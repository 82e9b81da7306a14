"""LoRA adapters on the Flax Qwen 3.5: low-rank updates W + (α/r)·A·B on chosen linear layers, the base frozen.

    model = load_pretrained(path)                        # or ModelSpec(...).build()
    attach(model, LoraSpec(rank=16, alpha=32), seed=0)   # adds A [.., in, r] and B [.., r, out] (B = 0: same logits)
    nnx.state(model, nnx.LoRAParam)                      # the adapters: what trains (`trainable_filter`)
    plain = merged(model)                                # W + (α/r)·A·B, no adapters: what engines and exports get

A targeted layer's output becomes y = x·W + (α/r)·(x·A)·B (PEFT's convention, so that an adapter exported in PEFT's
format gives the same logits in transformers + peft). The adapters are flax's `nnx.LoRA` modules, held by the
model's `Linear` layers (`qwen3_5.Linear.lora`), their parameters of type `nnx.LoRAParam`: a model with adapters
trains only those (`trainable_filter`; `train.step.train_step` takes gradients and optimizer state for them alone).
The layers of a stacked model hold stacked adapters ([n_blocks, run, in, r], as their kernels), so the scan over
layers runs them as it runs the kernels.

Why `nnx.LoRA` and not qwix (what tunix uses): qwix attaches adapters by intercepting the model's matmuls during a
traced call, which does not see through this model's `lax.scan` over stacked layer parameters (`qwen3_5.scan_stacked`
splits the parameters off the module first); tried on the tiny preset, `qwix.apply_lora_to_model` fails inside the
scan. `nnx.LoRA` is a plain module: it stacks with the layers and needs no interception.

Targets are regular expressions searched in each linear layer's path, `/`-joined (`blocks/runs/1/self_attn/q_proj`,
`blocks/runs/0/linear_attn/in_proj_qkv`, `blocks/runs/0/mlp/down_proj`; the LM head `lm_head` only when a target
names it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rltldr_jax.models.qwen3_5 import Linear, Qwen35

#: Every projection of the attention, DeltaNet and MLP layers (not the embeddings or the LM head).
DEFAULT_TARGETS = (r"(self_attn|linear_attn|mlp)/[a-z_]+$",)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Which layers get adapters and how large (`model.lora.*`).

    Attributes:
      rank: r, the adapters' inner dimension (> 0).
      alpha: α; the update is scaled by α / r.
      targets: regular expressions, searched in each linear layer's `/`-joined path; a layer matching any gets one.
    """

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"LoRA rank {self.rank}: give a rank >= 1 (model.lora.rank=0 means no adapters)")
        for t in self.targets:
            try:
                re.compile(t)
            except re.error as e:
                raise ValueError(f"LoRA target {t!r} is not a regular expression ({e}): fix model.lora.targets") from e

    @property
    def scale(self) -> float:
        """α / r."""
        return self.alpha / self.rank


def parse_targets(targets: str) -> tuple[str, ...]:
    """`model.lora.targets` (comma-separated regular expressions; "" = `DEFAULT_TARGETS`) as a tuple."""
    parts = tuple(t.strip() for t in targets.split(",") if t.strip())
    return parts or DEFAULT_TARGETS


def lora_error(targets: str, dropout: float) -> str | None:
    """What is wrong with `model.lora.targets` / `model.lora.dropout` (None if nothing): config validation's check,
    run before anything is built."""
    for t in parse_targets(targets):
        try:
            re.compile(t)
        except re.error as e:
            return f"model.lora.targets: {t!r} is not a regular expression ({e})"
    if dropout:
        return (
            f"model.lora.dropout={dropout}: only 0 is implemented (adapter dropout needs a per-step random stream in "
            "the train step); set model.lora.dropout=0"
        )
    return None


def spec_of(lora: Any) -> LoraSpec | None:
    """The `LoraSpec` of the `model.lora.*` settings, None when rank is 0."""
    if lora.rank == 0:
        return None
    return LoraSpec(rank=lora.rank, alpha=lora.alpha, targets=parse_targets(lora.targets))


def linear_layers(model: nnx.Module) -> list[tuple[str, Linear]]:
    """Every `Linear` layer of `model` with its `/`-joined path, in graph order."""
    return [("/".join(map(str, path)), m) for path, m in nnx.iter_graph(model) if isinstance(m, Linear)]


def targeted(model: nnx.Module, targets: Sequence[str]) -> list[tuple[str, Linear]]:
    """The `linear_layers` whose path matches one of `targets` (`re.search`)."""
    patterns = [re.compile(t) for t in targets]
    return [(p, m) for p, m in linear_layers(model) if any(pat.search(p) for pat in patterns)]


def attach(model: Qwen35, spec: LoraSpec, *, seed: int = 0, param_dtype=jnp.float32) -> Qwen35:
    """Adds an adapter to every targeted layer of `model` (in place; returns it): A initialised as flax's `nnx.LoRA`
    does (He-uniform over the layer's input dimension, per stacked layer), B = 0, so the logits are unchanged until
    B trains. Adapters are `param_dtype` (float32 by default, whatever the base's dtype).

    Raises:
      ValueError: no layer matches `spec.targets`, or the model holds adapters already.
    """
    layers = targeted(model, spec.targets)
    if not layers:
        names = sorted({p.rsplit("/", 1)[-1] for p, _ in linear_layers(model)})
        raise ValueError(
            f"model.lora.targets={list(spec.targets)} match no linear layer: the layers are {', '.join(names)} "
            "(paths like blocks/runs/1/self_attn/q_proj)"
        )
    if has_adapters(model):
        raise ValueError("the model holds LoRA adapters already: attach them once (or merge them first: `merged`)")
    rngs = nnx.Rngs(seed)
    for _, layer in layers:
        *lead, din, dout = layer.kernel.shape
        batch = tuple(range(len(lead)))  # (stacked layers: each gets its own He-uniform draw over its own fan-in)
        init_a = nnx.initializers.variance_scaling(2.0, "fan_in", "uniform", in_axis=-2, out_axis=-1, batch_axis=batch)

        layer.lora = nnx.LoRA(
            din,
            spec.rank,
            dout,
            dtype=layer.dtype,
            param_dtype=param_dtype,
            a_initializer=lambda key, shape, dtype, lead=tuple(lead), init=init_a: init(key, (*lead, *shape), dtype),
            b_initializer=lambda key, shape, dtype, lead=tuple(lead): jnp.zeros((*lead, *shape), dtype),
            rngs=rngs,
        )
        layer.lora_scale = spec.scale
    return model


def has_adapters(model: nnx.Module) -> bool:
    """Whether any layer of `model` holds a LoRA adapter."""
    return any(m.lora is not None for _, m in linear_layers(model))


def trainable_filter(model: nnx.Module) -> type[nnx.Variable]:
    """What an optimizer trains in `model`: its adapters (`nnx.LoRAParam`) when it has some, else every `nnx.Param`."""
    return nnx.LoRAParam if has_adapters(model) else nnx.Param


def merged(model: Qwen35) -> Qwen35:
    """A copy of `model` without adapters, each adapted kernel replaced by W + (α/r)·A·B in W's dtype: the plain
    Qwen 3.5 that engines, exports and weight pushes take. A model without adapters is returned as it is."""
    if not has_adapters(model):
        return model
    graphdef, state = nnx.split(model)
    plain = nnx.merge(graphdef, state)  # (new module objects; the arrays are shared until replaced below)
    for _, layer in linear_layers(plain):
        if layer.lora is None:
            continue
        w = layer.kernel[...]
        delta = jnp.matmul(layer.lora.lora_a[...].astype(jnp.float32), layer.lora.lora_b[...].astype(jnp.float32))
        layer.kernel = nnx.Param((w.astype(jnp.float32) + layer.lora_scale * delta).astype(w.dtype))
        layer.lora = None
        layer.lora_scale = 1.0
    return plain


def adapter_state(model: nnx.Module) -> nnx.State:
    """The adapters' parameters (`nnx.LoRAParam`), keyed by their paths (`.../q_proj/lora/lora_a`)."""
    return nnx.state(model, nnx.LoRAParam)


def adapter_count(model: nnx.Module) -> int:
    """Number of adapter parameters (scalars)."""
    return sum(int(x.size) for x in jax.tree.leaves(adapter_state(model)))


def split_trainable(state: nnx.State) -> tuple[nnx.State, nnx.State | None]:
    """(what trains, what stays frozen) of a model's state: (adapters, the rest) when it holds `nnx.LoRAParam`s,
    else (all of it, None). `join_trainable` undoes it (the same tree structure as `state`)."""
    if not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(state)):
        return state, None
    trainable, frozen = nnx.split_state(state, nnx.LoRAParam, ...)
    return trainable, frozen


def join_trainable(trainable: nnx.State, frozen: nnx.State | None) -> nnx.State:
    """The whole state from `split_trainable`'s parts."""
    return trainable if frozen is None else nnx.merge_state(trainable, frozen)
