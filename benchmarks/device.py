"""Device check for the paper's scale (GPU): one command, one table, nothing downloaded.

    python benchmarks/device.py                      # on the accelerator jax finds (jax.devices()[0]); <= 8 min
    python benchmarks/device.py --out DIR            # also writes DIR/device_table.json and DIR/device_table.md
    python benchmarks/device.py --smoke              # tiny shapes on CPU (tests/test_device_benchmark.py runs it)
    python benchmarks/device.py --only train,decode  # a subset of: parity, attention, train, decode

Random weights from the model presets (`qwen3_5_0_8b`, `qwen3_5_2b`), random token ids, no tokenizer, no network.
Compiled programs are cached for reruns in `$XDG_CACHE_HOME/rltldr_jax/device_xla_cache` (`~/.cache/...`, created
0700; one other users could write is not used, see `private_cache_dir`).
Rows of the table, in the order they run (a global time budget, --budget-s, skips what would not fit, saying so):

parity: the `tiny` preset's fp32 logits on the accelerator against the same weights on CPU (jax.devices("cpu") is
  always there beside an accelerator backend), matmul precision "highest"; passes at max |Δ logits| <= 1e-4. Its
  embeddings are redrawn N(0, 0.1²) (from 0.02) so that logits are O(1): TF32-level matmul errors would exceed the
  tolerance, fp32 rounding stays two orders below it.

attention: the fused attention paths against the reference `causal_attention` (attention_impl="xla") on the same
  inputs of the 0.8B layout (8 query heads, 2 KV heads, head_dim 256, 2 x 4096 tokens): cuDNN's flash attention in
  bf16 for a full forward (token-order causal mask; values and gradients, as training uses it) and for a prefill of
  512 tokens into a 4096-slot decode cache at ragged offsets (position mask; values), each with its time against
  the reference; and the block-skipping `blocked_causal_attention` in fp32 (passes at max |Δ| <= 1e-4). A cuDNN row
  passes within bf16 tolerance: its max error against the fp32 reference is at most twice the bf16 reference's own
  error plus 2^-8 (gradients: the same, relative to the largest gradient). On CPU the cuDNN rows read "skipped: no
  GPU".

train: the trainer's real optimizer step (`rltldr_jax.train.setup.ShardedUpdate`, built as `Trainer` builds it
  from `configs/base.py`: `train_step` jitted with the mesh shardings and donated buffers) on the 0.8B and 2B
  presets: bf16 compute, fp32 master weights and AdamW state, per-layer remat, A micro-batches of M rows of T
  tokens accumulated in one step (`batch.grad_accum_steps`, `batch.micro_batch_size`). Each row holds loss targets
  on its last 256 tokens (the step's action) and 128 insight tokens, as RLTL;DR examples do; the vocabulary
  projection runs only on 128-token chunks holding a target (`LossConfig.logprob_chunk`).

    MFU = model FLOPs per second / the device's peak dense bf16 FLOP/s (PEAK_BF16_TFLOPS, keyed by
          `device_kind`; an unknown device prints n/a and names its kind)
    model FLOPs per token (a training step: forward 1x + backward 2x; remat's recomputation is not counted) =
          6 · N_nonembedding                                  (every weight matrix, MLPs and both mixers)
        + 6 · L_attn · H · D · T                              (causal attention: QKᵀ and PV, half the T x T
                                                               square, 2 FLOPs per MAC, 3x for training)
        + 18 · L_deltanet · Hv · Dk · Dv                      (gated delta rule, state-size estimate: read-out Sᵀq,
                                                               Sᵀk and the rank-1 update, 2 · Dk · Dv each per
                                                               value head, 3x for training; the chunked algorithm's
                                                               intra-chunk products and the short conv are left out)
    N_nonembedding = Qwen35Config.num_params() minus the embedding (and the LM head when untied); the tied head's
    vocabulary projection is real work but not counted (it runs on few chunks, see above).

decode: JaxEngine decode throughput for the 0.8B preset (bf16 weights and compute) at batch 1, 32 and 128, prompts
  of 512 random ids, 256 new tokens each, sampled at temperature 1 without a stop token. decode tok/s =
  batch · 255 / (t(256 new) - t(1 new)) (prefill and the first token excluded, public API only: `generate_many`);
  e2e tok/s = batch · 256 / t(256 new). Prefill runs `attention_impl="auto"`, a decode step the reference.

  Reference (published SGLang figure for a model of this size on a Hopper GPU): Qwen3-0.6B (dense, 0.6B; ours is
  the 0.8B hybrid), BF16, batch 1, SGLang 0.4.6.post1 on one NVIDIA H20 96GB (Hopper; the H100/H200 class with less
  compute, batch-1 decode is bandwidth- and launch-bound): 414.17 tokens/s, (prompt + generated) / time for 2048
  generated tokens. Source: https://qwen.readthedocs.io/zh-cn/latest/getting_started/speed_benchmark.html
  ("Qwen3-0.6B (SGLang)", input length 1). No published SGLang figure for this model size at batch 32 or 128 on
  H100/H200 was found; those rows print none.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rltldr_jax.models import ModelSpec, Qwen35Config, get_preset
from rltldr_jax.models.config import FULL, LINEAR
from rltldr_jax.models.qwen3_5 import (
    blocked_causal_attention,
    causal_attention,
    cudnn_attention_problem,
    cudnn_causal_attention,
    resolve_attention_impl,
)
from rltldr_jax.settings import build, settings_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Peak dense (no sparsity) bf16 tensor FLOP/s per device, in TFLOP/s, keyed by `jax.Device.device_kind`, from the
#: vendors' datasheets (NVIDIA states the sparse figure, twice these).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "NVIDIA H200": 989.4,  # SXM
    "NVIDIA H200 NVL": 835.5,
    "NVIDIA H100 80GB HBM3": 989.4,  # SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.5,
    "NVIDIA GH200 480GB": 989.4,
    "NVIDIA B200": 2250.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA L40S": 362.1,
    "NVIDIA L4": 121.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,  # v5e
    "TPU v5e": 197.0,
    "TPU v5": 459.0,  # v5p
    "TPU v5p": 459.0,
    "TPU v6 lite": 918.0,  # v6e (Trillium)
    "TPU v6e": 918.0,
}

SGLANG_BATCH1 = (414.17, "https://qwen.readthedocs.io/zh-cn/latest/getting_started/speed_benchmark.html")


@dataclasses.dataclass
class Row:
    """One line of the table: `value` in `unit` (None when not measured or not applicable), `status` "ok", "pass",
    "FAIL", "n/a: ...", "skipped: ..." or "error: ...", numbers behind it in `metrics`."""

    key: str
    check: str
    setting: str
    value: float | None = None
    unit: str = ""
    status: str = "ok"
    note: str = ""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def result(self) -> str:
        if self.value is None:
            return self.status
        shown = f"{self.value:.3g}" if abs(self.value) < 1e-2 or abs(self.value) >= 1e5 else f"{self.value:,.2f}"
        return f"{shown} {self.unit}".strip() + ("" if self.status == "ok" else f" ({self.status})")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: full size on the accelerator, or tiny shapes for the CPU smoke run."""

    smoke: bool
    train: tuple[tuple[str, int, int, int], ...]  # (preset, context T, micro-batch M, accumulation A)
    train_steps: int
    decode_preset: str
    decode_batches: tuple[int, ...]
    prompt: int
    new_tokens: int
    parity_tokens: int
    attention_shape: tuple[int, int, int, int, int]  # B, T, H, KV, D

    @staticmethod
    def make(smoke: bool) -> Plan:
        if smoke:
            return Plan(True, (("tiny", 64, 2, 2),), 2, "tiny", (2,), 16, 8, 32, (2, 96, 4, 2, 32))
        train = (
            ("qwen3_5_0_8b", 4096, 4, 2),
            ("qwen3_5_2b", 4096, 4, 2),
            ("qwen3_5_0_8b", 16384, 2, 2),
            ("qwen3_5_2b", 16384, 2, 2),
        )
        return Plan(False, train, 3, "qwen3_5_0_8b", (1, 32, 128), 512, 256, 256, (2, 4096, 8, 2, 256))


def model_config(preset: str, smoke: bool) -> Qwen35Config:
    """The preset's architecture; in the smoke run the tiny preset shrunk (4 layers, 4,096 ids) to compile fast."""
    config = get_preset(preset)
    if smoke:
        config = dataclasses.replace(config, vocab_size=4096, num_hidden_layers=4, layer_types=())
    return config


def flops_per_token(config: Qwen35Config, context: int) -> dict[str, float]:
    """Model FLOPs of one training token at `context` tokens (module docstring): the three terms and their sum."""
    d = config.hidden_size
    embed = config.vocab_size * d * (1 if config.tie_word_embeddings else 2)
    n_attn, n_gdn = config.layer_types.count(FULL), config.layer_types.count(LINEAR)
    dense = 6.0 * (config.num_params() - embed)
    attn = 6.0 * n_attn * config.num_attention_heads * config.head_dim * context
    gdn = 18.0 * n_gdn * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    return {"dense": dense, "attention": attn, "deltanet": gdn, "total": dense + attn + gdn}


def peak_tflops(device: jax.Device) -> float | None:
    """The device's peak dense bf16 TFLOP/s from PEAK_BF16_TFLOPS, or None for an unknown kind."""
    return PEAK_BF16_TFLOPS.get(device.device_kind)


def _timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of `fn()` (which blocks until its results are ready) over `repeat` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# ----------------------------------------------------------------------------------------------------
# parity
# ----------------------------------------------------------------------------------------------------


def parity_row(plan: Plan, device: jax.Device) -> Row:
    cpu = jax.devices("cpu")[0]
    config = model_config("tiny", plan.smoke)
    with jax.default_device(cpu):
        model = ModelSpec(config).build(seed=0)
        emb = model.embed_tokens.embedding
        emb[...] = 0.1 * jax.random.normal(jax.random.key(1), emb.shape, emb.dtype)  # logits O(1), see docstring
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, plan.parity_tokens)).astype(np.int32)
    graphdef, state = nnx.split(model)
    logits = {}
    impls = {}
    for name, dev in (("cpu", cpu), ("device", device)):
        with jax.default_device(dev), jax.default_matmul_precision("highest"):
            m = nnx.merge(graphdef, jax.device_put(state, dev))
            logits[name] = np.asarray(jax.jit(lambda m, x: m(x))(m, jax.device_put(ids, dev)))
            impls[name] = resolve_attention_impl(m.attention_impl, m.dtype, config.head_dim)
    diff = float(np.abs(logits["device"] - logits["cpu"]).max())
    return Row(
        "parity",
        "fp32 parity, accelerator vs CPU",
        f"tiny preset, 2 x {plan.parity_tokens} tokens",
        diff,
        "max |Δ logits|",
        "pass" if diff <= 1e-4 else "FAIL",
        f"tolerance 1e-4; max |logits| {np.abs(logits['cpu']).max():.1f}; "
        f"attention {impls['device']} vs {impls['cpu']} (cpu)",
        {"max_abs_diff": diff, "max_abs_logit": float(np.abs(logits["cpu"]).max())},
    )


# ----------------------------------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------------------------------


def _max_err(x: jax.Array, ref: jax.Array) -> float:
    return float(jnp.abs(x.astype(jnp.float32) - ref).max())


def attention_rows(plan: Plan, device: jax.Device) -> list[Row]:
    """The blocked path (fp32) and the cuDNN paths (bf16) against the reference on the same inputs (docstring)."""
    b, t, h, kv, d = plan.attention_shape
    rng = np.random.default_rng(0)
    q32, k32, v32 = (jnp.asarray(rng.standard_normal((b, t, n, d)), jnp.float32) for n in (h, kv, kv))
    w = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)  # cotangent of the output
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    # The engine's prefill: t/8 new tokens of each row at ragged offsets into a cache of t slots.
    tp = max(t // 8, 8)
    q_pos_p = jnp.asarray([(i * 5 * t) // (8 * b) for i in range(b)], jnp.int32)[:, None] + jnp.arange(
        tp, dtype=jnp.int32
    )
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    setting = f"B={b} T={t} H={h} KV={kv} D={d}"
    bf = lambda *xs: tuple(x.astype(jnp.bfloat16) for x in xs)  # noqa: E731

    def loss_grad(f):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w), argnums=(0, 1, 2)))

    forward_ref = lambda q, k, v: causal_attention(q, k, v, pos, pos)  # noqa: E731
    prefill_ref = lambda q, k, v: causal_attention(q, k, v, q_pos_p, slots)  # noqa: E731
    with jax.default_matmul_precision("highest"):  # the fp32 truth, whatever the device's default matmul precision
        truth = {
            "out": jax.jit(forward_ref)(q32, k32, v32),
            "grads": loss_grad(forward_ref)(q32, k32, v32),
            "prefill": jax.jit(prefill_ref)(q32[:, :tp], k32, v32),
        }
        blocked = jax.jit(lambda q, k, v: blocked_causal_attention(q, k, v, pos, pos))(q32, k32, v32)
    diff = _max_err(blocked, truth["out"])
    rows = [
        Row(
            "attention/blocked",
            "attention blocked vs xla (fp32)",
            setting + ", full forward",
            diff,
            "max |Δ|",
            "pass" if diff <= 1e-4 else "FAIL",
            "tolerance 1e-4 (fp32, matmul precision highest)",
            {"max_abs_diff": diff},
        )
    ]

    problem = cudnn_attention_problem(jnp.bfloat16, d, device)
    skipped = None if problem is None else ("skipped: no GPU" if "no NVIDIA GPU" in problem else f"skipped: {problem}")
    scale = max(float(jnp.abs(g).max()) for g in truth["grads"])
    rel_grad_err = lambda gs: max(_max_err(g, r) for g, r in zip(gs, truth["grads"], strict=True)) / scale  # noqa: E731

    def forward_row() -> Row:
        """Training and full forward: cuDNN's causal mask, values and gradients, and the fwd+bwd time."""
        fused = lambda q, k, v: cudnn_causal_attention(q, k, v, pos, pos, in_order=True)  # noqa: E731
        xb = bf(q32, k32, v32)
        e = {
            "out_err": _max_err(jax.jit(fused)(*xb), truth["out"]),
            "ref_bf16_out_err": _max_err(jax.jit(forward_ref)(*xb), truth["out"]),
            "grad_rel_err": rel_grad_err(loss_grad(fused)(*xb)),
            "ref_bf16_grad_rel_err": rel_grad_err(loss_grad(forward_ref)(*xb)),
        }
        ok = (
            e["out_err"] <= 2 * e["ref_bf16_out_err"] + 2**-8
            and e["grad_rel_err"] <= 2 * e["ref_bf16_grad_rel_err"] + 2**-8
        )
        g_fused, g_xla = loss_grad(fused), loss_grad(forward_ref)
        e["cudnn_fwd_bwd_ms"] = 1e3 * _timed(lambda: jax.block_until_ready(g_fused(*xb)), 5)
        e["xla_fwd_bwd_ms"] = 1e3 * _timed(lambda: jax.block_until_ready(g_xla(*xb)), 5)
        note = (
            f"bf16 xla's own error {e['ref_bf16_out_err']:.2g}; grad rel err {e['grad_rel_err']:.2g} (bf16 xla "
            f"{e['ref_bf16_grad_rel_err']:.2g}); "
            f"fwd+bwd {e['cudnn_fwd_bwd_ms']:.1f} ms vs xla {e['xla_fwd_bwd_ms']:.1f} ms"
        )
        return Row(
            "attention/cudnn/forward",
            "attention cudnn vs xla (bf16), full forward + grad",
            setting,
            e["out_err"],
            "max |Δ| vs fp32",
            "pass" if ok else "FAIL",
            note,
            e,
        )

    def prefill_row() -> Row:
        """A prefill into a decode cache: the position mask as a cuDNN mask, values (inference only)."""
        fused = jax.jit(lambda q, k, v: cudnn_causal_attention(q, k, v, q_pos_p, slots, in_order=False))
        xla = jax.jit(prefill_ref)
        xb = bf(q32[:, :tp], k32, v32)
        e = {
            "out_err": _max_err(fused(*xb), truth["prefill"]),
            "ref_bf16_out_err": _max_err(xla(*xb), truth["prefill"]),
        }
        e["cudnn_ms"] = 1e3 * _timed(lambda: jax.block_until_ready(fused(*xb)), 5)
        e["xla_ms"] = 1e3 * _timed(lambda: jax.block_until_ready(xla(*xb)), 5)
        ok = e["out_err"] <= 2 * e["ref_bf16_out_err"] + 2**-8
        note = f"bf16 xla's own error {e['ref_bf16_out_err']:.2g}; {e['cudnn_ms']:.2f} ms vs xla {e['xla_ms']:.2f} ms"
        return Row(
            "attention/cudnn/prefill",
            "attention cudnn vs xla (bf16), prefill into cache",
            f"{setting}, {tp} new",
            e["out_err"],
            "max |Δ| vs fp32",
            "pass" if ok else "FAIL",
            note,
            e,
        )

    for key, check, make in (
        ("attention/cudnn/forward", "attention cudnn vs xla (bf16), full forward + grad", forward_row),
        ("attention/cudnn/prefill", "attention cudnn vs xla (bf16), prefill into cache", prefill_row),
    ):
        if skipped:
            rows.append(Row(key, check, setting, None, "", skipped))
            continue
        try:
            rows.append(make())
        except Exception as exc:  # noqa: BLE001 - one row's failure must not hide the others
            rows.append(Row(key, check, setting, None, "", f"error: {type(exc).__name__}: {str(exc)[:300]}"))
    return rows


# ----------------------------------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------------------------------


def _train_batch(config: Qwen35Config, context: int, micro: int, accum: int, seed: int):
    from rltldr_jax.train.step import TrainBatch

    rng = np.random.default_rng(seed)
    shape = (accum, micro, context)
    pos = np.arange(context)
    action = np.broadcast_to(pos >= context - min(256, context // 4), shape)  # the step's action: the last tokens
    insight_start = context // 4
    insight = np.broadcast_to((pos >= insight_start) & (pos < insight_start + min(128, context // 8)), shape)
    return TrainBatch(
        ids=jnp.asarray(rng.integers(0, config.vocab_size, shape), jnp.int32),
        old_logprobs=jnp.asarray(-rng.uniform(0.5, 3.0, shape), jnp.float32),
        advantages=jnp.asarray(rng.standard_normal(shape[:2]), jnp.float32),
        action_mask=jnp.asarray(action),
        insight_mask=jnp.asarray(insight),
    )


def train_row(plan: Plan, device: jax.Device, preset: str, context: int, micro: int, accum: int) -> Row:
    from rltldr_jax.config.base import get_config
    from rltldr_jax.sharding import MeshConfig
    from rltldr_jax.train.setup import ShardedUpdate
    from rltldr_jax.train.step import LossConfig, make_optimizer

    config = model_config(preset, plan.smoke)
    cfg = get_config()
    cfg.model.preset, cfg.model.dtype, cfg.model.param_dtype, cfg.model.remat = preset, "bfloat16", "float32", True
    cfg.batch.micro_batch_size, cfg.batch.grad_accum_steps = micro, accum
    spec = ModelSpec(
        config,
        dtype=getattr(jnp, cfg.model.dtype),
        param_dtype=getattr(jnp, cfg.model.param_dtype),
        remat=cfg.model.remat,
    )
    model = spec.build(seed=0)
    tx = make_optimizer(
        cfg.optim.learning_rate,
        b1=cfg.optim.b1,
        b2=cfg.optim.b2,
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        grad_clip_norm=cfg.optim.grad_clip_norm,
    )
    update = ShardedUpdate(
        build(MeshConfig, settings_of(cfg).mesh),
        model,
        tx,
        LossConfig.of(settings_of(cfg).loss),
        micro_batch_size=micro,
    )
    del model
    batch = _train_batch(config, context, micro, accum, seed=1)
    n_dev = update.mesh.size
    start = time.perf_counter()
    metrics = update.step(batch)  # compiles
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(plan.train_steps):
        start = time.perf_counter()
        metrics = update.step(batch)
        jax.block_until_ready((metrics, update.params))
        times.append(time.perf_counter() - start)
    loss = float(metrics["loss"])
    step_s = float(np.median(times))
    tokens = accum * micro * context  # M rows per micro-batch over the whole mesh (ShardedUpdate splits them)
    f = flops_per_token(config, context)
    achieved = f["total"] * tokens / step_s  # FLOP/s over all devices
    impl = resolve_attention_impl(spec.attention_impl, spec.dtype, config.head_dim)
    metrics_out = {
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "model_tflops_per_s": achieved / 1e12,
        "flops_per_token": f["total"],
        "attention_flops_share": f["attention"] / f["total"],
        "compile_s": compile_s,
        "loss": loss,
    }
    setting = f"{preset}{' (smoke)' if plan.smoke else ''}, T={context}, M={micro} x A={accum}"
    note = (
        f"{tokens / step_s:,.0f} tok/s, step {step_s:.2f} s, {achieved / 1e12 / n_dev:.3g} model TFLOP/s per device, "
        f"attention {impl}, compile {compile_s:.0f} s"
    )
    if not math.isfinite(loss):
        return Row(
            f"train/{preset}/{context}", "train step MFU", setting, None, "", f"FAIL: loss {loss}", note, metrics_out
        )
    peak = peak_tflops(device)
    if peak is None:
        return Row(
            f"train/{preset}/{context}",
            "train step MFU",
            setting,
            None,
            "%",
            f"n/a: no peak FLOP/s for device kind {device.device_kind!r}",
            note,
            metrics_out,
        )
    mfu = 100.0 * achieved / (peak * 1e12 * n_dev)
    metrics_out["mfu_percent"] = mfu
    return Row(
        f"train/{preset}/{context}",
        "train step MFU",
        setting,
        mfu,
        "%",
        "ok",
        note + f"; peak {peak:g} TFLOP/s",
        metrics_out,
    )


# ----------------------------------------------------------------------------------------------------
# decode
# ----------------------------------------------------------------------------------------------------


def decode_row(plan: Plan, batch: int, model) -> Row:
    from rltldr_jax.engines import GenerationRequest, JaxEngine, SamplingParams

    config = model.config
    prompts = np.random.default_rng(batch).integers(0, config.vocab_size, (batch, plan.prompt)).tolist()

    def run(engine, new: int) -> float:
        requests = [
            GenerationRequest(tuple(p), SamplingParams(max_new_tokens=new, seed=i)) for i, p in enumerate(prompts)
        ]
        start = time.perf_counter()
        results = engine.generate_many(requests)
        elapsed = time.perf_counter() - start
        if any(len(r.token_ids) != new for r in results):
            raise RuntimeError(f"expected {new} tokens per request, got {sorted({len(r.token_ids) for r in results})}")
        return elapsed

    engine = JaxEngine(model, max_batch=batch, max_len=plan.prompt + plan.new_tokens)
    try:
        run(engine, 2)  # compiles prefill and decode
        t_one = min(run(engine, 1) for _ in range(2))
        t_all = run(engine, plan.new_tokens)
    finally:
        engine.close()
    decode_s = max(t_all - t_one, 1e-9)
    decode_tps = batch * (plan.new_tokens - 1) / decode_s
    e2e_tps = batch * plan.new_tokens / t_all
    prefill_impl = resolve_attention_impl(model.attention_impl, model.dtype, config.head_dim)
    note = (
        f"e2e {e2e_tps:,.0f} tok/s (prefill incl.); {decode_s / (plan.new_tokens - 1) * 1e3:.2f} ms/step; attention: "
        f"prefill {prefill_impl}, decode xla"
    )
    if batch == 1 and not plan.smoke:
        note += f"; SGLang reference {SGLANG_BATCH1[0]} tok/s (Qwen3-0.6B, batch 1, H20) {SGLANG_BATCH1[1]}"
    elif not plan.smoke:
        note += "; no published SGLang figure found for this batch"
    setting = (
        f"{plan.decode_preset}{' (smoke)' if plan.smoke else ''}, batch {batch}, prompt {plan.prompt}, "
        f"{plan.new_tokens} new"
    )
    metrics = {"decode_tokens_per_s": decode_tps, "e2e_tokens_per_s": e2e_tps, "t_prefill_s": t_one, "t_total_s": t_all}
    return Row(f"decode/{batch}", "JaxEngine decode", setting, decode_tps, "tok/s", "ok", note, metrics)


# ----------------------------------------------------------------------------------------------------
# table
# ----------------------------------------------------------------------------------------------------


def markdown(rows: Sequence[Row], header: str) -> str:
    lines = [header, "", "| check | setting | result | note |", "|---|---|---|---|"]
    lines += [f"| {r.check} | {r.setting} | {r.result()} | {r.note} |" for r in rows]
    lines += [
        "",
        f"SGLang reference (decode, batch 1): {SGLANG_BATCH1[0]} tok/s for Qwen3-0.6B BF16 on one H20, "
        f"SGLang 0.4.6.post1: {SGLANG_BATCH1[1]}",
    ]
    return "\n".join(lines)


SECTIONS = ("parity", "attention", "train", "decode")


def private_cache_dir(name: str) -> str | None:
    """A cache directory only this user can write: `$XDG_CACHE_HOME/rltldr_jax/{name}` (`~/.cache/...` by default),
    created with mode 0700.

    The XLA cache holds compiled executables that this process loads and runs: one another user can write (a fixed
    /tmp path they created first, a symlink, a group/world-writable directory) would run their code here. Such a
    directory is not used: None, with a one-line warning naming it and the fix (the check then runs uncached).
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "rltldr_jax", name)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as e:
        print(f"warning: not using the cache {path}: {e}", file=sys.stderr)
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else f"owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}"
        print(
            f"warning: not using the cache {path}: it must be a directory owned by uid {os.getuid()} with mode 700 "
            f"(found {kind}); remove it to have it recreated",
            file=sys.stderr,
        )
        return None
    return path


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Runs the check, prints the table (and writes it with --out); returns its rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few steps (CPU, the test suite)")
    parser.add_argument("--out", default="", help="directory for device_table.json and device_table.md")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="skip rows that would start after this many seconds"
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := sorted(set(only) - set(SECTIONS)):
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    plan = Plan.make(args.smoke)
    if not jax.config.jax_compilation_cache_dir:  # a rerun on the same machine skips most compilation
        cache = private_cache_dir("device_xla_cache")
        if cache is not None:
            jax.config.update("jax_compilation_cache_dir", cache)
    device = jax.devices()[0]
    start = time.perf_counter()
    rows: list[Row] = []

    def guarded(key: str, check: str, setting: str, need_s: float, fn: Callable[[], Row | list[Row]]) -> None:
        left = args.budget_s - (time.perf_counter() - start)
        if left < need_s:
            rows.append(Row(key, check, setting, None, "", f"skipped: time budget ({left:.0f} s left of --budget-s)"))
            return
        try:
            out = fn()
            rows.extend(out if isinstance(out, list) else [out])
        except Exception as exc:  # noqa: BLE001 - a failed row is reported, the table goes on
            rows.append(Row(key, check, setting, None, "", f"error: {type(exc).__name__}: {str(exc)[:300]}"))
        print(
            f"[{time.perf_counter() - start:6.1f} s] {rows[-1].check}: {rows[-1].setting}: {rows[-1].result()}",
            flush=True,
        )

    if "parity" in only:
        guarded("parity", "fp32 parity, accelerator vs CPU", "tiny preset", 5, lambda: parity_row(plan, device))
    if "attention" in only:
        guarded("attention", "attention paths", "", 10, lambda: attention_rows(plan, device))
    train = list(plan.train)
    if "train" in only:
        for preset, context, micro, accum in train[:2]:  # 4k first: the headline
            guarded(
                f"train/{preset}/{context}",
                "train step MFU",
                f"{preset}, T={context}",
                40,
                lambda p=preset, c=context, m=micro, a=accum: train_row(plan, device, p, c, m, a),
            )
    if "decode" in only:
        config = model_config(plan.decode_preset, plan.smoke)
        model = ModelSpec(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16).build(seed=0)
        for batch in plan.decode_batches:
            guarded(
                f"decode/{batch}",
                "JaxEngine decode",
                f"{plan.decode_preset}, batch {batch}",
                40,
                lambda b=batch: decode_row(plan, b, model),
            )
        del model
    if "train" in only:
        for preset, context, micro, accum in train[2:]:
            guarded(
                f"train/{preset}/{context}",
                "train step MFU",
                f"{preset}, T={context}",
                60,
                lambda p=preset, c=context, m=micro, a=accum: train_row(plan, device, p, c, m, a),
            )

    peak = peak_tflops(device)
    header = (
        f"Device check on {device.device_kind} ({device.platform}), jax {jax.__version__}; peak bf16 "
        f"{f'{peak:g} TFLOP/s' if peak else 'n/a (kind not in PEAK_BF16_TFLOPS)'}; "
        f"{'smoke shapes; ' if plan.smoke else ''}{time.perf_counter() - start:.0f} s"
    )
    table = markdown(rows, header)
    print("\n" + table, flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "device_table.md"), "w", encoding="utf-8") as f:
            f.write(table + "\n")
        with open(os.path.join(args.out, "device_table.json"), "w", encoding="utf-8") as f:
            payload = {
                "header": header,
                "device_kind": device.device_kind,
                "platform": device.platform,
                "rows": [dataclasses.asdict(r) for r in rows],
            }
            json.dump(payload, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
