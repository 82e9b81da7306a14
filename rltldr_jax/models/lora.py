"""LoRA adapters on the Flax Qwen 3.5: low-rank updates W + (α/r)·A·B on chosen linear layers, the base frozen.

    model = load_pretrained(path)                        # or ModelSpec(...).build()
    attach(model, LoraSpec(rank=16, alpha=32), seed=0)   # adds A [.., in, r] and B [.., r, out] (B = 0: same logits)
    nnx.state(model, nnx.LoRAParam)                      # the adapters: what trains (`trainable_filter`)
    plain = merged(model)                                # W + (α/r)·A·B, no adapters: what engines and exports get
    noisy = with_dropout(model, key)                     # a copy whose adapters drop inputs (the train step's loss)

A targeted layer's output becomes y = x·W + (α/r)·(drop(x)·A)·B (PEFT's convention, so that an adapter exported in
PEFT's format gives the same logits in transformers + peft), drop being PEFT's `lora_dropout` in training only:
`with_dropout` gives the train step's loss a copy of the model holding one random key per adapted layer (and per
stacked layer), drawn from the step's key; every other use of the model (engines, evaluation, the reference policy,
exports) has no keys and no dropout. The adapters are flax's `nnx.LoRA` modules, held by the
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
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rltldr_jax.models.qwen3_5 import DropoutKey, Linear, Qwen35

#: Every projection of the attention, DeltaNet and MLP layers (not the embeddings or the LM head).
DEFAULT_TARGETS = (r"(self_attn|linear_attn|mlp)/[a-z_]+$",)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Which layers get adapters and how large (`model.lora.*`).

    Attributes:
      rank: r, the adapters' inner dimension (> 0).
      alpha: α; the update is scaled by α / r.
      targets: regular expressions, searched in each linear layer's `/`-joined path; a layer matching any gets one.
      dropout: p of the dropout on the adapters' input while training (PEFT's `lora_dropout`), in [0, 1).
    """

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"LoRA rank {self.rank}: give a rank >= 1 (model.lora.rank=0 means no adapters)")
        for t in self.targets:
            try:
                re.compile(t)
            except re.error as e:
                raise ValueError(f"LoRA target {t!r} is not a regular expression ({e}): fix model.lora.targets") from e
        _check_dropout(self.dropout)

    @property
    def scale(self) -> float:
        """α / r."""
        return self.alpha / self.rank


def _check_dropout(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"LoRA dropout {p}: give a probability in [0, 1) (model.lora.dropout)")


def _copy(model: Qwen35) -> Qwen35:
    """A copy of `model`'s module objects, sharing its arrays (until a layer's are replaced)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, state)


def _strip_adapter(layer: Linear) -> None:
    """`layer` as a plain linear layer: no adapter, scale, dropout or dropout key."""
    layer.lora, layer.lora_scale, layer.lora_dropout, layer.dropout_key = None, 1.0, 0.0, None


def parse_targets(targets: str) -> tuple[str, ...]:
    """`model.lora.targets` (comma-separated regular expressions; "" = `DEFAULT_TARGETS`) as a tuple."""
    parts = tuple(t.strip() for t in targets.split(",") if t.strip())
    return parts or DEFAULT_TARGETS


def lora_error(targets: str) -> str | None:
    """What is wrong with `model.lora.targets` (None if nothing): config validation's check, run before anything is
    built."""
    for t in parse_targets(targets):
        try:
            re.compile(t)
        except re.error as e:
            return f"model.lora.targets: {t!r} is not a regular expression ({e})"
    return None


def spec_of(lora: Any) -> LoraSpec | None:
    """The `LoraSpec` of the `model.lora.*` settings, None when rank is 0."""
    if lora.rank == 0:
        return None
    return LoraSpec(rank=lora.rank, alpha=lora.alpha, targets=parse_targets(lora.targets), dropout=lora.dropout)


def _keyed_layers(model: nnx.Module) -> list[tuple[tuple[Any, ...], Linear]]:
    """Every `Linear` layer of `model` with its path as a tuple (`("blocks", "runs", 1, "self_attn", "q_proj")`)."""
    return [(tuple(path), m) for path, m in nnx.iter_graph(model) if isinstance(m, Linear)]


def lora_spec_of_run(config: Mapping[str, Any] | None) -> LoraSpec | None:
    """The `LoraSpec` of a run's recorded config (`as_dict(Settings)`, as checkpoints and summaries keep it), None
    when it trained without adapters (or predates `model.lora`)."""
    settings = ((config or {}).get("model") or {}).get("lora") or {}
    if not settings.get("rank"):
        return None
    return LoraSpec(
        rank=settings["rank"],
        alpha=settings["alpha"],
        targets=parse_targets(settings.get("targets", "")),
        dropout=settings.get("dropout", 0.0),
    )


def linear_layers(model: nnx.Module) -> list[tuple[str, Linear]]:
    """Every `Linear` layer of `model` with its `/`-joined path, in graph order."""
    return [("/".join(map(str, key)), m) for key, m in _keyed_layers(model)]


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
        _add_adapter(layer, spec.rank, spec.scale, rngs, param_dtype, spec.dropout)
    return model


def _add_adapter(layer: Linear, rank: int, scale: float, rngs: nnx.Rngs, param_dtype, dropout: float = 0.0) -> None:
    """Gives `layer` an `nnx.LoRA` of `rank` (A He-uniform per stacked layer, B = 0) scaled by `scale`, its input
    dropped with probability `dropout` in training."""
    *lead, din, dout = layer.kernel.shape
    batch = tuple(range(len(lead)))  # (stacked layers: each gets its own He-uniform draw over its own fan-in)
    init_a = nnx.initializers.variance_scaling(2.0, "fan_in", "uniform", in_axis=-2, out_axis=-1, batch_axis=batch)
    layer.lora = nnx.LoRA(
        din,
        rank,
        dout,
        dtype=layer.dtype,
        param_dtype=param_dtype,
        a_initializer=lambda key, shape, dtype, lead=tuple(lead), init=init_a: init(key, (*lead, *shape), dtype),
        b_initializer=lambda key, shape, dtype, lead=tuple(lead): jnp.zeros((*lead, *shape), dtype),
        rngs=rngs,
    )
    layer.lora_scale = scale
    layer.lora_dropout = float(dropout)


def has_adapters(model: nnx.Module) -> bool:
    """Whether any layer of `model` holds a LoRA adapter."""
    return any(m.lora is not None for _, m in linear_layers(model))


def dropout_rate(model: nnx.Module) -> float:
    """The largest adapter dropout probability of `model` (0 without adapters or dropout)."""
    return max((m.lora_dropout for _, m in linear_layers(model) if m.lora is not None), default=0.0)


def set_dropout(model: Qwen35, p: float) -> Qwen35:
    """Sets every adapter's dropout probability to `p` (in place; returns `model`): a loaded adapter trained further
    under this run's `model.lora.dropout`, not the one its PEFT config recorded."""
    _check_dropout(p)
    for _, layer in linear_layers(model):
        if layer.lora is not None:
            layer.lora_dropout = float(p)
    return model


def with_dropout(model: Qwen35, key: jax.Array) -> Qwen35:
    """A copy of `model` (sharing its arrays) whose adapters drop their inputs (`Linear`'s `lora_dropout`), with keys
    drawn from `key`: one per adapted layer and, for stacked layers, per stacked layer ([n_blocks, run] keys that the
    scan over layers hands out like the kernels). What `train.step`'s loss runs for a model with adapter dropout;
    `model` itself is unchanged (no keys, deterministic). Works under `jit` (`key` may be traced)."""
    noisy = _copy(model)
    for i, (_, layer) in enumerate(linear_layers(noisy)):
        if layer.lora is None or layer.lora_dropout <= 0:
            continue
        lead = tuple(layer.kernel.shape[:-2])
        keys = jax.random.split(jax.random.fold_in(key, i), max(1, math.prod(lead)))
        layer.dropout_key = DropoutKey(keys.reshape(lead) if lead else keys[0])
    return noisy


def trainable_filter(model: nnx.Module) -> type[nnx.Variable]:
    """What an optimizer trains in `model`: its adapters (`nnx.LoRAParam`) when it has some, else every `nnx.Param`."""
    return nnx.LoRAParam if has_adapters(model) else nnx.Param


def merged(model: Qwen35) -> Qwen35:
    """A copy of `model` without adapters, each adapted kernel replaced by W + (α/r)·A·B in W's dtype: the plain
    Qwen 3.5 that engines, exports and weight pushes take. A model without adapters is returned as it is."""
    if not has_adapters(model):
        return model
    plain = _copy(model)
    for _, layer in linear_layers(plain):
        if layer.lora is None:
            continue
        w = layer.kernel[...]
        delta = jnp.matmul(layer.lora.lora_a[...].astype(jnp.float32), layer.lora.lora_b[...].astype(jnp.float32))
        layer.kernel = nnx.Param((w.astype(jnp.float32) + layer.lora_scale * delta).astype(w.dtype))
        _strip_adapter(layer)
    return plain


def without_adapters(model: Qwen35) -> Qwen35:
    """A copy of `model` with its adapters dropped (the base as it was loaded: kernels unchanged)."""
    plain = _copy(model)
    for _, layer in linear_layers(plain):
        _strip_adapter(layer)
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


# ----------------------------------------------------------------------------------------------------
# PEFT's adapter format
# ----------------------------------------------------------------------------------------------------

#: A PEFT adapter directory: its config and its weights.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's prefix of the wrapped model's module names (`PeftModelForCausalLM.base_model.model`).
PEFT_PREFIX = "base_model.model."


def is_adapter_dir(path: str) -> bool:
    """Whether `path` is a PEFT adapter directory (holds `adapter_config.json`)."""
    return bool(path) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def _module_names(key: tuple[Any, ...], layer: Linear, config: Any) -> list[tuple[tuple[int, ...], str]]:
    """(index into the layer's stacked leading axes, HF module name) of every layer a `Linear` holds
    (`model.layers.3.self_attn.q_proj`): one per stacked layer, or one with index () when not stacked."""
    from rltldr_jax.models.hf import hf_names

    names, _ = hf_names((*key, "kernel"), config)
    if layer.kernel.ndim == 2:
        return [((), names[0].removesuffix(".weight"))]
    return [((b, j), name.removesuffix(".weight")) for b, row in enumerate(names) for j, name in enumerate(row)]


def save_adapter(model: Qwen35, path: str | os.PathLike, *, base_model: str = "") -> list[str]:
    """Writes `model`'s adapters as a PEFT LoRA adapter directory that `peft.PeftModel.from_pretrained(base, path)`
    loads onto transformers' Qwen 3.5 with the same logits: `adapter_config.json` (r, lora_alpha = scale · r, the
    adapted modules by their full HF names) and `adapter_model.safetensors` (`base_model.model.{module}.lora_A.weight`
    [r, in] = Aᵀ and `.lora_B.weight` [out, r] = Bᵀ, float32). Written to a temporary directory beside `path`, then
    renamed into place (an existing adapter directory is replaced as a whole). Returns the adapted module names.

    Raises:
      ValueError: the model holds no adapters, or adapters of different ranks or scales.
    """
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    ranks, scales, dropouts, modules = set(), set(), set(), []
    for key, layer in _keyed_layers(model):
        if layer.lora is None:
            continue
        a = np.asarray(jax.device_get(layer.lora.lora_a[...]), np.float32)
        b = np.asarray(jax.device_get(layer.lora.lora_b[...]), np.float32)
        ranks.add(a.shape[-1])
        scales.add(float(layer.lora_scale))
        dropouts.add(float(layer.lora_dropout))
        for index, module in _module_names(key, layer, model.config):
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a[index].T)
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b[index].T)
            modules.append(module)
    if not modules:
        raise ValueError("the model holds no LoRA adapters to save (train with model.lora.rank > 0)")
    if len(ranks) > 1 or len(scales) > 1 or len(dropouts) > 1:
        raise ValueError(
            f"adapters of several ranks {sorted(ranks)}, scales {sorted(scales)} or dropouts {sorted(dropouts)}: "
            "PEFT needs one"
        )
    (rank,), (scale,), (dropout,) = ranks, scales, dropouts
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or None,
        "r": rank,
        "lora_alpha": scale * rank,
        "lora_dropout": dropout,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        os.chmod(tmp, 0o755)
        if os.path.isdir(path):
            old = f"{tmp}.old"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(modules)


def load_adapter(model: Qwen35, path: str | os.PathLike, *, param_dtype=jnp.float32) -> Qwen35:
    """Attaches the PEFT LoRA adapter in `path` to `model` (in place; returns it): the inverse of `save_adapter`,
    for adapters of this model's modules written by PEFT or by us. A stacked layer that the adapter leaves out gets
    A = B = 0 (its output is unchanged).

    Raises:
      ValueError: not a LoRA adapter, per-module ranks or scales (`rank_pattern`, `alpha_pattern`), bias or
        `modules_to_save` (weights beyond the adapters), tensors naming no module of this model, or a model that holds
        adapters already.
    """
    from safetensors.numpy import load_file

    path = os.fspath(path)
    with open(os.path.join(path, ADAPTER_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    where = f"PEFT adapter {path}"
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{where} is a {cfg.get('peft_type')!r} adapter: only LORA loads")
    unsupported = [k for k in ("rank_pattern", "alpha_pattern") if cfg.get(k)]
    unsupported += [k for k in ("modules_to_save",) if cfg.get(k)] + (
        ["bias"] if cfg.get("bias", "none") != "none" else []
    )
    if unsupported:
        raise ValueError(f"{where} uses {', '.join(unsupported)}, which this loader does not support")
    if has_adapters(model):
        raise ValueError("the model holds LoRA adapters already: load an adapter onto a base model")
    rank = int(cfg["r"])
    scale = float(cfg["lora_alpha"]) / (math.sqrt(rank) if cfg.get("use_rslora") else rank)
    tensors = load_file(os.path.join(path, ADAPTER_WEIGHTS))
    owner = {}  # HF module name -> (layer, stacked index)
    for key, layer in _keyed_layers(model):
        for index, module in _module_names(key, layer, model.config):
            owner[module] = (layer, index)
    values: dict[int, tuple[Linear, np.ndarray, np.ndarray]] = {}
    for name, t in tensors.items():
        module, _, kind = name.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if module.endswith(".default"):  # (PEFT keeps the adapter's name in some versions' keys)
            module = module.removesuffix(".default")
        if module not in owner or kind not in ("A.weight", "B.weight"):
            raise ValueError(f"{where}: tensor {name!r} names no linear layer of this model (a Qwen 3.5 adapter?)")
        layer, index = owner[module]
        if id(layer) not in values:
            *lead, din, dout = layer.kernel.shape
            values[id(layer)] = (
                layer,
                np.zeros((*lead, din, rank), np.float32),
                np.zeros((*lead, rank, dout), np.float32),
            )
        _, a, b = values[id(layer)]
        (a if kind == "A.weight" else b)[index] = t.T
    rngs = nnx.Rngs(0)
    dropout = float(cfg.get("lora_dropout") or 0.0)
    for layer, a, b in values.values():
        _add_adapter(layer, rank, scale, rngs, param_dtype, dropout)
        layer.lora.lora_a[...] = jnp.asarray(a, param_dtype)
        layer.lora.lora_b[...] = jnp.asarray(b, param_dtype)
    return model
