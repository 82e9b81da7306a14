"""What the RL trainer and the offline SFT trainer share: the policy from a config, and the sharded update.

model = build_policy(config)                                   # HF weights, or the tiny preset's random ones
update = ShardedUpdate(build(MeshConfig, config.mesh), model, tx, LossConfig.of(config.loss),
                       micro_batch_size=config.batch.micro_batch_size)   # params + optimizer state on the mesh
metrics = update.step(batch)                                   # one optimizer step; params, opt_state updated

With a loss term that reads the reference policy (`loss.terms=...,kl`), `update.ref_params` is a frozen copy of the
parameters `ShardedUpdate` was built with: the policy the run starts from (see `ShardedUpdate`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rltldr_jax import distributed, sharding
from rltldr_jax.envs import Env, make_env
from rltldr_jax.envs.spec import get_spec
from rltldr_jax.models import ModelSpec, get_preset, load_pretrained
from rltldr_jax.models.lora import (
    attach,
    dropout_rate,
    is_adapter_dir,
    load_adapter,
    merged,
    set_dropout,
    spec_of,
    split_trainable,
)
from rltldr_jax.models.presets import checkpoint_needed_error
from rltldr_jax.settings import Settings
from rltldr_jax.tokenization import Tokenizer, load_tokenizer
from rltldr_jax.train.step import (
    LossConfig,
    TrainBatch,
    dropout_key,
    dropout_seed_key,
    train_step,
    with_step_count,
)


def workdir_of(config: Settings) -> str:
    """Where a run's checkpoints, event files and rollouts go: `config.workdir`, else runs/{env}-{name}; absolute
    (a relative one is taken against the current directory, as the launchers' config resolution does)."""
    env = config.env.name if ":" not in config.env.name else get_spec(config.env.name).name  # (not a path's ':')
    return os.path.abspath(config.workdir or os.path.join("runs", f"{env}-{config.name}"))


def policy_tokenizer(config: Settings) -> Tokenizer:
    """`config.tokenizer`, else the policy checkpoint's (a PEFT adapter's own, else its base's), else the built-in
    Qwen 3.5 tokenizer."""
    source = config.model.checkpoint or None
    if source and is_adapter_dir(source) and not os.path.isfile(os.path.join(source, "tokenizer.json")):
        source = config.model.base_checkpoint or source
    return load_tokenizer(config.tokenizer or source)


def env_maker(config: Settings) -> Callable[[], Env]:
    """Builds one environment of `config.env` per call (the collector makes one per attempt chain)."""
    e = config.env
    return lambda: make_env(e.name, step_timeout_s=e.step_timeout_s, memory_limit_mb=e.memory_limit_mb)


def build_policy(config: Settings) -> Any:
    """The Qwen35 policy of `config.model`: `model.checkpoint`'s weights, or random ones for the tiny preset only
    (a paper-size preset without weights fails here, saying where to get them); with `model.lora.rank` > 0, LoRA
    adapters attached (B = 0: the same policy until they train)."""
    dtype = getattr(jnp, config.model.dtype)
    param_dtype = getattr(jnp, config.model.param_dtype)
    if problem := checkpoint_needed_error(config.model.preset, config.model.checkpoint, pretrain_steps=0):
        raise ValueError(problem)  # (launchers say so before building anything: config.base.run_errors)
    if is_adapter_dir(config.model.checkpoint):
        return _adapted_policy(config, dtype, param_dtype)
    if config.model.checkpoint:
        model = load_pretrained(
            config.model.checkpoint,
            dtype=param_dtype,
            compute_dtype=dtype,
            remat=config.model.remat,
            allow_nonfinite=config.model.allow_nonfinite,
        )
    else:
        spec = ModelSpec(
            get_preset(config.model.preset), dtype=dtype, param_dtype=param_dtype, remat=config.model.remat
        )
        model = spec.build(seed=config.seed)
    lora = spec_of(config.model.lora)
    return model if lora is None else attach(model, lora, seed=config.seed)


def _adapted_policy(config: Settings, dtype, param_dtype) -> Any:
    """`build_policy` of a PEFT LoRA adapter directory as `model.checkpoint`: its base (`model.base_checkpoint`, else
    the adapter's `base_model_name_or_path`) with the adapter attached; trained further as adapters when
    `model.lora.rank` is the adapter's rank, else (rank 0) merged into the base, every weight trained."""
    import json

    from rltldr_jax.models import hub

    adapter = config.model.checkpoint
    with open(os.path.join(adapter, "adapter_config.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    base = config.model.base_checkpoint or hub.resolve(recorded.get("base_model_name_or_path") or "")
    if not base or not os.path.isfile(os.path.join(base, "config.json")):
        raise ValueError(
            f"model.checkpoint={adapter} is a PEFT adapter whose base model "
            f"{base or '(not recorded)'} is no HF directory here: give --config.model.base_checkpoint=DIR (or a hub id)"
        )
    rank = config.model.lora.rank
    if rank and rank != recorded.get("r"):
        raise ValueError(
            f"model.lora.rank={rank} but the adapter {adapter} has rank {recorded.get('r')}: set model.lora.rank to "
            "it to train the adapter further, or 0 to merge it and train every weight"
        )
    model = load_pretrained(
        base,
        dtype=param_dtype,
        compute_dtype=dtype,
        remat=config.model.remat,
        allow_nonfinite=config.model.allow_nonfinite,
    )
    model = load_adapter(model, adapter)
    return set_dropout(model, config.model.lora.dropout) if rank else merged(model)


def _sharded_train_step(
    params: nnx.State,
    opt_state: Any,
    batch: TrainBatch,
    loss_cfg: LossConfig,
    extras: dict[str, Any],
    *,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """`train_step` with the loss coefficients and the `extras` as (traced) arguments: the function `ShardedUpdate`
    jits. `extras` may hold "ref_params" (the reference parameters, when a term needs them) and "dropout_seed" (the
    run's dropout key data, `step.dropout_seed_key`: the adapters' dropout then runs with each step's key,
    `step.dropout_key`); as arguments, not constants, so runs with other seeds share the compiled step."""
    seed_key = extras.get("dropout_seed")
    key = None if seed_key is None else dropout_key(opt_state, jax.random.wrap_key_data(seed_key))
    return train_step(
        graphdef,
        params,
        opt_state,
        batch,
        tx=tx,
        loss_cfg=loss_cfg,
        ref_params=extras.get("ref_params"),
        dropout_key=key,
    )


def _copy(tree: Any) -> Any:
    """A copy of every array of `tree` (new buffers)."""
    return jax.tree.map(jnp.copy, tree)


class ShardedUpdate:
    """Parameters and optimizer state on a (data, fsdp, tensor) mesh, and `train_step` jitted with those shardings
    (ZeRO-3 over fsdp, tensor parallel over tensor, the batch rows over data × fsdp).

    Args:
      mesh: the mesh's axis sizes.
      model: the policy (its parameters are split off and placed on the mesh).
      tx: the optimizer.
      loss_cfg: the objective's coefficients.
      micro_batch_size: rows per micro-batch (`batch.micro_batch_size`, or `batch.pack_rows` with packed rows): a
        multiple of the data × fsdp devices.
      rows_key: the config key `micro_batch_size` came from, for the error message.
      seed: the run's seed: with adapter dropout (`model.lora.dropout` > 0), each step's dropout key is drawn from it
        and the step number, which the optimizer state then holds (`step.with_step_count`), so a resumed run drops
        exactly what an uninterrupted one would.

    Attributes:
      mesh, graphdef, params, opt_state, tx, loss_cfg; `shardings` = (params, optimizer state).
      ref_params: the reference policy of the terms that need one (`loss_cfg.needs_ref`: the `kl` term), else None.
        A frozen copy of `model`'s parameters as given here (same shardings as `params`; never updated, not in the
        optimizer state, not checkpointed): the policy the run starts from. The trainers build `model` from
        `model.checkpoint` before restoring a checkpoint into `params`, so a resumed run keeps the original
        reference, not the resumed weights. It doubles the parameter memory (a LoRA policy would later make the
        frozen base the reference for free), and each micro-batch runs one more forward pass. Without such a term
        there is no copy and the compiled step is exactly the one without reference.
    """

    def __init__(
        self,
        mesh: sharding.MeshConfig,
        model: Any,
        tx: optax.GradientTransformation,
        loss_cfg: LossConfig,
        *,
        micro_batch_size: int,
        rows_key: str = "batch.micro_batch_size",
        seed: int = 0,
    ):
        self.mesh = mesh.make()
        dp = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if micro_batch_size % dp:
            raise ValueError(
                f"{rows_key}={micro_batch_size} is not divisible by the {dp} data-parallel "
                f"devices of mesh {dict(self.mesh.shape)}: make it a multiple of {dp}"
            )
        dropout = dropout_rate(model) > 0
        if dropout:
            tx = with_step_count(tx)
        self.tx, self.loss_cfg = tx, loss_cfg
        self.graphdef, params = nnx.split(model)
        p_sh = sharding.param_shardings(params, self.mesh)
        self.params = jax.device_put(params, p_sh)
        # (with LoRA adapters the optimizer holds state for them alone: `lora.split_trainable`)
        trainable, t_sh = split_trainable(self.params)[0], split_trainable(p_sh)[0]
        o_sh = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, trainable), t_sh, self.mesh)
        self.opt_state = jax.jit(tx.init, out_shardings=o_sh)(trainable)
        self.shardings = (p_sh, o_sh)
        b_sh = NamedSharding(self.mesh, PartitionSpec(None, ("data", "fsdp")))  # every TrainBatch field is [A, M, ...]
        self._batch_sharding = b_sh
        replicated = NamedSharding(self.mesh, PartitionSpec())
        # The coefficients are arguments (float32 scalars, replicated), not constants: one compiled step serves every
        # λ / grpo_coef / clip_eps / writer_sft_coef, so the arms of a grid share it (through the compilation cache).
        self._coefs = distributed.global_batch(loss_cfg.traced(), replicated)
        # A copy (new buffers: `params` are donated to every step), placed like the params.
        self.ref_params = jax.jit(_copy, out_shardings=p_sh)(self.params) if loss_cfg.needs_ref else None
        self._extras, extras_sh = {}, {}
        if self.ref_params is not None:
            self._extras["ref_params"], extras_sh["ref_params"] = self.ref_params, p_sh
        if dropout:
            seed_key = jax.random.key_data(dropout_seed_key(seed))
            self._extras["dropout_seed"] = distributed.global_batch(seed_key, replicated)
            extras_sh["dropout_seed"] = replicated
        self._step = jax.jit(
            functools.partial(_sharded_train_step, graphdef=self.graphdef, tx=tx),
            in_shardings=(p_sh, o_sh, b_sh, replicated, extras_sh),
            out_shardings=(p_sh, o_sh, replicated),
            donate_argnums=(0, 1),
        )

    def step(self, batch: TrainBatch) -> dict[str, jax.Array]:
        """One optimizer step on `batch` (updates `params` and `opt_state` in place); returns its metrics.

        `batch` fields are [A, M, T] / [A, M] (`TrainBatch`); each distinct (A, M, T) compiles the step once per
        process (read from the compilation cache when an earlier process compiled it): `batching.pack` pads T to a
        few bucket lengths for that reason.
        """
        # multi-process: every process holds the same batch
        batch = distributed.global_batch(batch, self._batch_sharding)
        with sharding.activate(self.mesh):
            self.params, self.opt_state, metrics = self._step(
                self.params, self.opt_state, batch, self._coefs, self._extras
            )
        return metrics

    def abstract(self) -> tuple[Any, Any]:
        """Restore targets (ShapeDtypeStructs with the mesh shardings) of the params and the optimizer state."""
        p_sh, o_sh = self.shardings
        params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.params, p_sh)
        opt = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.opt_state, o_sh)
        return params, opt

    def model(self, *, merge: bool = True) -> Any:
        """The current policy as a module (shares the arrays); with LoRA adapters, a plain Qwen 3.5 with them merged
        into its kernels (`lora.merged`: what most engines and exports take), or with `merge=False` the model with
        its adapters (for an engine that `takes_adapters`). In a multi-process job: a whole copy on this process's
        first device, gathered from every process (`distributed.host_local`, a collective: every process calls
        it)."""
        model = nnx.merge(self.graphdef, distributed.host_local(self.params))
        return merged(model) if merge else model
