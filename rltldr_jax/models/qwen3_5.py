"""Qwen 3.5 (text) in Flax NNX, numerically matching transformers' `Qwen3_5ForCausalLM`.

Architecture (as transformers' `modeling_qwen3_5.py`): embeddings → `num_hidden_layers` pre-norm decoder layers, each
a token mixer (Gated DeltaNet for `linear_attention`, gated GQA attention for `full_attention`) and a SwiGLU
MLP → zero-centred RMSNorm → LM head (tied or not).

Layout: the layers form `num_blocks` repetitions of `config.block_pattern` (3 × DeltaNet + 1 × attention),
and a pattern is a sequence of *runs* of one layer type (`config.block_runs`: 3 × DeltaNet, then 1 ×
attention). Parameters are stacked twice, [n_blocks, run_length, ...], and both levels run with `lax.scan`:
compile time does not depend on depth, and with `remat=True` each layer is rematerialised in the backward
pass one at a time (only layer inputs are kept), so activation memory is that of a single layer.

Numerics (fp32 islands, as HF): every RMSNorm; the DeltaNet decay g and the whole delta rule; attention
scores and softmax; logprobs. RoPE cos/sin are computed in fp32 and cast to the activation dtype.

Decoding: `init_decode_state` allocates a `DecodeState` (KV cache for attention layers; conv and recurrent
state for DeltaNet layers; per-row lengths). Calling the model with a state appends the new tokens of each
row at that row's length; a right-padded chunk is handled with `valid` (padding never enters any state).
Prefill followed by one-token steps gives the logits of one full forward.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from rltldr_jax import sharding
from rltldr_jax.models import gated_delta
from rltldr_jax.models.config import FULL, Qwen35Config

Array = jax.Array
# Attention queries are processed in chunks of this many: scores are [B, H, chunk, S], not [B, H, T, S].
ATTENTION_QUERY_CHUNK = 512
#: Attention implementations (`Qwen35(attention_impl=...)`, `ModelSpec.attention_impl`):
#:   "xla": `causal_attention`, the reference: every query chunk against every key, masked.
#:   "blocked": `blocked_causal_attention`, the same attention with an online softmax over key blocks that skips
#:     blocks no query of a chunk can see (about half the work of a causal prefix); the fast one on CPU.
#:   "cudnn": `cudnn_causal_attention`, cuDNN's fused flash attention through `jax.nn.dot_product_attention`
#:     (NVIDIA GPUs, bfloat16/float16 compute).
#:   "auto": "blocked" on CPU; "cudnn" on an NVIDIA GPU where cuDNN supports the dtype and head size; else "xla".
ATTENTION_IMPLS = ("auto", "xla", "blocked", "cudnn")
# Queries per chunk and keys per block of `blocked_causal_attention`: [B, H, 256, 256] fp32 score blocks stay in
# a CPU's cache (512 was up to 10x slower on this model's CPU benchmark shapes, 128 slower by loop overhead).
ATTENTION_BLOCK = 256


# ----------------------------------------------------------------------------------------------------
# Decode state
# ----------------------------------------------------------------------------------------------------


@struct.dataclass
class AttentionCache:
    """KV cache of one run of attention layers: k, v [n_blocks, run_length, B, S, KV, D]."""

    k: Array
    v: Array


@struct.dataclass
class DeltaNetCache:
    """State of one run of DeltaNet layers.

    conv: [n_blocks, run_length, B, K−1, conv_dim] the last K−1 inputs of the causal conv (pre-activation).
    ssm: [n_blocks, run_length, B, Hv, Dk, Dv] float32 recurrent state of the delta rule.
    """

    conv: Array
    ssm: Array


@struct.dataclass
class DecodeState:
    """Everything a decode step needs: one cache per run of the block pattern, and per-row lengths.

    lengths: [B] int32, tokens already in the cache of each row (the next token's position).
    """

    lengths: Array
    layers: tuple[AttentionCache | DeltaNetCache, ...]


def init_decode_state(config: Qwen35Config, batch: int, max_len: int, dtype: Any = jnp.float32) -> DecodeState:
    """An empty state for `batch` rows of at most `max_len` tokens each (prompt + generation)."""
    layers: list[AttentionCache | DeltaNetCache] = []
    for kind, run in config.block_runs:
        lead = (config.num_blocks, run, batch)
        if kind == FULL:
            shape = (*lead, max_len, config.num_key_value_heads, config.head_dim)
            layers.append(AttentionCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
        else:
            conv = jnp.zeros((*lead, config.linear_conv_kernel_dim - 1, config.conv_dim), dtype)
            ssm_shape = (*lead, config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
            layers.append(DeltaNetCache(conv, jnp.zeros(ssm_shape, jnp.float32)))
    return DecodeState(jnp.zeros((batch,), jnp.int32), tuple(layers))


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------


class RowLinear(nnx.Module):
    """A bias-free linear layer with its weight stored [out, in] (torch's layout): y = x Wᵀ. The `unrolled` model
    uses it: at decode batch sizes a matmul is bound by reading the weight, and XLA:CPU reads [out, in] rows
    faster (measured 1.2–1.5× on this model's shapes) than `nnx.Linear`'s [in, out] kernel."""

    def __init__(self, din: int, dout: int, dtype, param_dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (dout, din), param_dtype))
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        x, w = x.astype(self.dtype), self.weight[...].astype(self.dtype)
        return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))


class DropoutKey(nnx.Variable):
    """The random key of one adapter's dropout in one forward pass (`lora.with_dropout`; stacked layers hold one key
    per layer). Never a parameter: only the training loss's transient copy of the model holds keys."""


class Linear(nnx.Linear):
    """A bias-free `nnx.Linear` ([in, out] kernel, the stacked model's layers) that may hold a LoRA adapter
    (`models/lora.py`): y = x·W + lora_scale · (drop(x)·A)·B. Without one (`lora` None, the default) it is
    `nnx.Linear`.

    drop is PEFT's adapter dropout (each input element zeroed with probability `lora_dropout`, the rest scaled by
    1 / (1 − p)), applied only while the layer holds a `DropoutKey` (`lora.with_dropout`: the train step's loss);
    without a key (engines, evaluation, exports, the reference policy) the layer is deterministic."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lora = nnx.data(None)  # an `nnx.LoRA` once `lora.attach` adds one
        self.lora_scale = 1.0  # α / r
        self.lora_dropout = 0.0  # p (`model.lora.dropout`)
        self.dropout_key = nnx.data(None)  # a `DropoutKey` while the train step's loss runs (`lora.with_dropout`)

    def __call__(self, x: Array) -> Array:
        y = super().__call__(x)
        if self.lora is None:
            return y
        if self.dropout_key is not None and self.lora_dropout > 0:
            keep = 1.0 - self.lora_dropout
            mask = jax.random.bernoulli(self.dropout_key[...], keep, x.shape)
            x = jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))
        return y + (self.lora_scale * self.lora(x)).astype(y.dtype)


def _linear(din: int, dout: int, dtype, param_dtype, rngs: nnx.Rngs, rows: bool = False) -> Linear | RowLinear:
    if rows:
        return RowLinear(din, dout, dtype, param_dtype, rngs)
    return Linear(
        din,
        dout,
        use_bias=False,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(0.02),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """Zero-centred RMSNorm (`x̂ · (1 + w)`), computed in fp32 and cast back; w starts at 0."""

    def __init__(self, dim: int, eps: float, param_dtype=jnp.float32):
        self.weight = nnx.Param(jnp.zeros((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        """x: [..., dim] → same shape and dtype."""
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """DeltaNet's output norm: plain-weight RMSNorm (w starts at 1) times SiLU(gate), per value head."""

    def __init__(self, dim: int, eps: float, param_dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: Array, gate: Array) -> Array:
        """x, gate: [..., dim] → [..., dim] in x.dtype (HF casts back to the input dtype before the weight)."""
        xf = x.astype(jnp.float32)
        normed = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)).astype(x.dtype)
        out = self.weight[...].astype(x.dtype) * normed
        return (out.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) · up(x))."""

    def __init__(self, config: Qwen35Config, dtype, param_dtype, rngs: nnx.Rngs, rows: bool = False):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(d, f, dtype, param_dtype, rngs, rows)
        self.up_proj = _linear(d, f, dtype, param_dtype, rngs, rows)
        self.down_proj = _linear(f, d, dtype, param_dtype, rngs, rows)

    def __call__(self, x: Array) -> Array:
        hidden = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(sharding.constrain(hidden, ("batch", "length", "ffn")))


def rope_cos_sin(positions: Array, rotary_dim: int, theta: float, dtype) -> tuple[Array, Array]:
    """cos, sin: [B, T, rotary_dim] for integer positions [B, T] (fp32, then cast to `dtype`, as HF).

    Qwen 3.5's M-RoPE reduces to 1-D RoPE for text (all three position rows are equal).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotates the first `rotary_dim` dims of x [B, T, H, D] (rotate-half layout); the rest pass through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def check_attention_impl(impl: str) -> str:
    """`impl` if it names an attention implementation, else a ValueError that lists them."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(
            f"attention_impl={impl!r} is not an attention implementation; choose one of {', '.join(ATTENTION_IMPLS)}"
        )
    return impl


def _default_device() -> jax.Device:
    """The device a computation without placed inputs runs on: `jax.default_device` if set, else jax.devices()[0]."""
    dev = jax.config.jax_default_device
    if isinstance(dev, jax.Device):
        return dev
    return jax.devices(dev)[0] if isinstance(dev, str) else jax.devices()[0]


def cudnn_attention_problem(dtype, head_dim: int, device: jax.Device | None = None) -> str | None:
    """Why cuDNN's fused attention cannot run these inputs on `device` (default: the default device), or None.

    cuDNN flash attention needs an NVIDIA GPU of compute capability >= 8.0, bfloat16 or float16 inputs, and a head
    size that is a multiple of 8 and at most 128 (256 from Hopper, capability 9.0, on).
    """
    device = device or _default_device()
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or capability is None or "nvidia" not in device.device_kind.lower():
        return f"no NVIDIA GPU (the device is {device.device_kind!r}, platform {device.platform})"
    major_minor = tuple(int(x) for x in str(capability).split(".")[:2])
    if major_minor < (8, 0):
        return f"compute capability {capability} < 8.0"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"{jnp.dtype(dtype).name} compute (cuDNN fused attention takes bfloat16 or float16)"
    limit = 256 if major_minor >= (9, 0) else 128
    if head_dim % 8 or head_dim > limit:
        return f"head_dim={head_dim} (cuDNN needs a multiple of 8, at most {limit} on compute capability {capability})"
    return None


def resolve_attention_impl(impl: str, dtype, head_dim: int) -> str:
    """The implementation `impl` stands for on the default device: "auto" picks "blocked" on CPU, "cudnn" where
    `cudnn_attention_problem` finds none, else "xla"; an explicit "cudnn" that cannot run raises, saying why."""
    check_attention_impl(impl)
    if impl == "auto":
        if _default_device().platform == "cpu":
            return "blocked"
        return "cudnn" if cudnn_attention_problem(dtype, head_dim) is None else "xla"
    if impl == "cudnn" and (problem := cudnn_attention_problem(dtype, head_dim)) is not None:
        raise ValueError(f"attention_impl='cudnn' cannot run here: {problem}; use attention_impl='auto' or 'xla'")
    return impl


def causal_attention(
    q: Array,
    k: Array,
    v: Array,
    q_pos: Array,
    k_pos: Array,
    chunk: int = ATTENTION_QUERY_CHUNK,
    q_seg: Array | None = None,
    k_seg: Array | None = None,
) -> Array:
    """Grouped-query attention where query i sees key j iff k_pos[j] <= q_pos[i] (and, with segments, iff both are
    in the same segment).

    Args:
      q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0 (query head h uses KV head h // (H/KV)).
      q_pos: [B, T] positions of the queries; k_pos: [B, S] positions of the keys (a large value masks a key).
      chunk: queries per step; scores [B, KV, H/KV, chunk, S] are the peak memory, in fp32.
      q_seg, k_seg: optional [B, T], [B, S] int32 segment ids (packed sequences: a query sees only its segment's keys).

    Returns:
      [B, T, H, D] in q.dtype.
    """
    b, t, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    scale = d**-0.5

    def attend(qc: Array, qpos: Array, qseg: Array | None = None) -> Array:  # qc [B, c, H, D], qpos [B, c]
        qg = qc.reshape(b, qc.shape[1], kv, g, d)
        scores = jnp.einsum("bckgd,bskd->bkgcs", qg, k, preferred_element_type=jnp.float32) * scale
        mask = k_pos[:, None, None, None, :] <= qpos[:, None, None, :, None]
        if qseg is not None:
            mask = mask & (k_seg[:, None, None, None, :] == qseg[:, None, None, :, None])
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgcs,bskd->bckgd", probs, v, preferred_element_type=jnp.float32)
        return out.reshape(b, qc.shape[1], h, d).astype(q.dtype)

    if t <= chunk:
        return attend(q, q_pos, q_seg)
    n = -(-t // chunk)
    pad = n * chunk - t
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, chunk, h, d).swapaxes(0, 1)
    pp = jnp.pad(q_pos, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
    xs = (qp, pp) if q_seg is None else (qp, pp, jnp.pad(q_seg, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1))
    out = jax.lax.map(lambda xs: jax.checkpoint(attend)(*xs), xs)  # [n, B, c, H, D]
    return out.swapaxes(0, 1).reshape(b, n * chunk, h, d)[:, :t]


def blocked_causal_attention(
    q: Array,
    k: Array,
    v: Array,
    q_pos: Array,
    k_pos: Array,
    chunk: int = ATTENTION_BLOCK,
    key_block: int = ATTENTION_BLOCK,
    q_seg: Array | None = None,
    k_seg: Array | None = None,
) -> Array:
    """`causal_attention` that skips the key blocks no query of a chunk can see (flash-attention style).

    Queries go in chunks of `chunk`, keys in blocks of `key_block`. For each query chunk a scan over the key blocks
    keeps a running max, normaliser and weighted sum (online softmax, fp32); a block whose smallest key position is
    above the chunk's largest query position in every row is skipped (`lax.cond`), so a causal prefix costs about
    half the score and value matmuls of the reference, and a prefill into a long cache skips the empty slots. Which
    blocks run is decided from the positions at run time: any positions give the reference's result (within fp32
    rounding), under jit and grad alike. The only difference: a query that sees no key at all (which the model never
    asks for) averages the values of the blocks that ran instead of all values.

    Args:
      q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0 (query head h uses KV head h // (H/KV)).
      q_pos: [B, T] positions of the queries; k_pos: [B, S] positions of the keys (query i sees key j iff
        k_pos[j] <= q_pos[i]; a large value masks a key).
      chunk: queries per chunk; key_block: keys per block. Scores [B, KV, H/KV, chunk, key_block] fp32 are the
        largest temporaries; each query chunk is rematerialised in the backward pass.
      q_seg, k_seg: optional segment ids, as in `causal_attention`.

    Returns:
      [B, T, H, D] in q.dtype.
    """
    b, t, h, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    g = h // kv
    chunk, key_block = min(chunk, t), min(key_block, s)
    n, m = -(-t // chunk), -(-s // key_block)
    scale = d**-0.5
    lowest = jnp.finfo(jnp.float32).min
    # Padded queries see nothing (lowest position), padded keys are seen by nothing (highest position).
    qp = (
        jnp.pad(q, ((0, 0), (0, n * chunk - t), (0, 0), (0, 0)))
        .reshape(b, n, chunk, kv, g, d)
        .transpose(1, 0, 3, 4, 2, 5)
    )
    pp = (
        jnp.pad(q_pos, ((0, 0), (0, n * chunk - t)), constant_values=jnp.iinfo(jnp.int32).min)
        .reshape(b, n, chunk)
        .swapaxes(0, 1)
    )

    def blocks(x):
        return (
            jnp.pad(x, ((0, 0), (0, m * key_block - s), (0, 0), (0, 0)))
            .reshape(b, m, key_block, kv, d)
            .transpose(1, 0, 3, 2, 4)
        )

    kb, vb = blocks(k), blocks(v)  # [m, B, KV, key_block, D]
    kp = (
        jnp.pad(k_pos, ((0, 0), (0, m * key_block - s)), constant_values=jnp.iinfo(jnp.int32).max)
        .reshape(b, m, key_block)
        .swapaxes(0, 1)
    )
    first_key = kp.min(axis=2)  # [m, B]
    segmented = q_seg is not None
    if segmented:  # padded queries and keys get segments no real token has
        sp = jnp.pad(q_seg, ((0, 0), (0, n * chunk - t)), constant_values=-1).reshape(b, n, chunk).swapaxes(0, 1)
        ks = jnp.pad(k_seg, ((0, 0), (0, m * key_block - s)), constant_values=-2)
        ks = ks.reshape(b, m, key_block).swapaxes(0, 1)
    else:  # placeholders, never read
        sp, ks = jnp.zeros((n, 1, 1), jnp.int32), jnp.zeros((m, 1, 1), jnp.int32)

    def one_chunk(xs):
        qc, qpos, qseg = xs  # [B, KV, G, c, D], [B, c], [B, c]
        last_query = qpos.max(axis=1)  # [B]

        def update(carry, kc, vc, kpos, kseg):
            mx, den, acc = carry
            scores = jnp.einsum("bkgcd,bksd->bkgcs", qc, kc, preferred_element_type=jnp.float32) * scale
            mask = kpos[:, None, None, None, :] <= qpos[:, None, None, :, None]
            if segmented:
                mask = mask & (kseg[:, None, None, None, :] == qseg[:, None, None, :, None])
            scores = jnp.where(mask, scores, lowest)
            new_mx = jnp.maximum(mx, scores.max(axis=-1))
            p = jnp.exp(scores - new_mx[..., None])
            alpha = jnp.exp(mx - new_mx)
            pv = jnp.einsum("bkgcs,bksd->bkgcd", p.astype(vc.dtype), vc, preferred_element_type=jnp.float32)
            return new_mx, den * alpha + p.sum(axis=-1), acc * alpha[..., None] + pv

        def body(carry, ys):
            kc, vc, kpos, kseg, first = ys
            visible = jnp.any(first <= last_query)
            return jax.lax.cond(visible, lambda c: update(c, kc, vc, kpos, kseg), lambda c: c, carry), None

        stats = qc.shape[:-1]
        init = (jnp.full(stats, lowest, jnp.float32), jnp.zeros(stats, jnp.float32), jnp.zeros(qc.shape, jnp.float32))
        (_, den, acc), _ = jax.lax.scan(body, init, (kb, vb, kp, ks, first_key))
        return (acc / jnp.where(den > 0, den, 1.0)[..., None]).astype(q.dtype)

    out = jax.lax.map(jax.checkpoint(one_chunk), (qp, pp, sp))  # [n, B, KV, G, c, D]
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(b, n * chunk, h, d)[:, :t]


def cudnn_causal_attention(
    q: Array,
    k: Array,
    v: Array,
    q_pos: Array,
    k_pos: Array,
    *,
    in_order: bool = False,
    q_seg: Array | None = None,
    k_seg: Array | None = None,
) -> Array:
    """`causal_attention` by cuDNN's fused flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`).

    Args:
      q: [B, T, H, D]; k, v: [B, S, KV, D] (GQA as in `causal_attention`), bfloat16 or float16.
      q_pos, k_pos: [B, T], [B, S] positions, as in `causal_attention`.
      in_order: the keys are the queries' own tokens (S == T) with positions increasing along each row, so the mask
        k_pos[j] <= q_pos[i] is j <= i: cuDNN's causal mask, which skips the masked blocks (a full forward, training).
        Otherwise the position mask goes to cuDNN as a [B, 1, T, S] mask (a prefill into a decode cache).
      q_seg, k_seg: optional segment ids (`causal_attention`); they go to cuDNN in the [B, 1, T, S] mask.

    Returns:
      [B, T, H, D] in q.dtype.
    """
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    if in_order and q_seg is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    mask = k_pos[:, None, None, :] <= q_pos[:, None, :, None]
    if q_seg is not None:
        mask = mask & (k_seg[:, None, None, :] == q_seg[:, None, :, None])
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")


def attention(
    q: Array,
    k: Array,
    v: Array,
    q_pos: Array,
    k_pos: Array,
    *,
    impl: str = "auto",
    in_order: bool = False,
    q_seg: Array | None = None,
    k_seg: Array | None = None,
) -> Array:
    """Causal GQA attention by the implementation `impl` (one of ATTENTION_IMPLS; "auto" resolved for q's dtype and
    the default device): q [B, T, H, D], k, v [B, S, KV, D], positions and optional segment ids as in
    `causal_attention` → [B, T, H, D]. `in_order` as in `cudnn_causal_attention` (only the cuDNN path uses it)."""
    impl = resolve_attention_impl(impl, q.dtype, q.shape[-1])
    segs = {"q_seg": q_seg, "k_seg": k_seg}
    if impl == "blocked":
        return blocked_causal_attention(q, k, v, q_pos, k_pos, chunk=ATTENTION_BLOCK, key_block=ATTENTION_BLOCK, **segs)
    if impl == "cudnn":
        return cudnn_causal_attention(q, k, v, q_pos, k_pos, in_order=in_order, **segs)
    return causal_attention(q, k, v, q_pos, k_pos, **segs)


class Attention(nnx.Module):
    """Gated full attention: q/gate from one projection (per head [q | gate]), q/k RMSNorm per head, partial
    RoPE, GQA, output · sigmoid(gate) before o_proj.

    `attention_impl` (ATTENTION_IMPLS) computes softmax(q kᵀ/√D + causal mask) v of a full forward or a prefill; a
    one-token decode step always uses the reference `causal_attention`. Without a cache the fused cuDNN path masks by
    token order (query t sees keys <= t), which is the reference's position mask because a full forward's positions
    increase along each row.
    """

    def __init__(
        self, config: Qwen35Config, dtype, param_dtype, rngs: nnx.Rngs, rows: bool = False, attention_impl: str = "auto"
    ):
        c = config
        self.config = c
        self.attention_impl = check_attention_impl(attention_impl)
        self.q_proj = _linear(c.hidden_size, c.num_attention_heads * c.head_dim * 2, dtype, param_dtype, rngs, rows)
        self.k_proj = _linear(c.hidden_size, c.num_key_value_heads * c.head_dim, dtype, param_dtype, rngs, rows)
        self.v_proj = _linear(c.hidden_size, c.num_key_value_heads * c.head_dim, dtype, param_dtype, rngs, rows)
        self.o_proj = _linear(c.num_attention_heads * c.head_dim, c.hidden_size, dtype, param_dtype, rngs, rows)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype)

    def __call__(
        self,
        x: Array,
        positions: Array,
        cache: AttentionCache | None,
        lengths: Array | None,
        segments: Array | None = None,
    ) -> tuple[Array, AttentionCache | None]:
        """x: [B, T, d]; positions: [B, T] (RoPE's). With a cache, the new keys go to slots lengths[b] + [0, T).
        segments: [B, T] ids of packed sequences (full forward only): a token sees the earlier tokens of its own
        segment, whatever the positions."""
        c = self.config
        b, t, _ = x.shape
        q_and_gate = self.q_proj(x).reshape(b, t, c.num_attention_heads, 2 * c.head_dim)
        q, gate = q_and_gate[..., : c.head_dim], q_and_gate[..., c.head_dim :]
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        cos, sin = rope_cos_sin(positions, c.rotary_dim, c.rope_theta, x.dtype)
        heads = ("batch", "length", None, None)
        q, k, v = (sharding.constrain(t, heads) for t in (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))

        if cache is None and segments is not None:
            order = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))  # causal by token order
            out = attention(
                q, k, v, order, order, impl=self.attention_impl, in_order=True, q_seg=segments, k_seg=segments
            )
            new_cache = None
        elif cache is None:
            out = attention(q, k, v, positions, positions, impl=self.attention_impl, in_order=True)
            new_cache = None
        else:
            write = jax.vmap(lambda buf, new, start: jax.lax.dynamic_update_slice_in_dim(buf, new, start, axis=0))
            k_all = write(cache.k, k.astype(cache.k.dtype), lengths)
            v_all = write(cache.v, v.astype(cache.v.dtype), lengths)
            slots = jnp.broadcast_to(jnp.arange(k_all.shape[1], dtype=jnp.int32), (b, k_all.shape[1]))
            out = self.cached_attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), positions, slots)
            new_cache = AttentionCache(k_all, v_all)
        out = out.reshape(b, t, -1) * jax.nn.sigmoid(gate.reshape(b, t, -1))
        return self.o_proj(out), new_cache

    def cached_attention(self, q: Array, k: Array, v: Array, positions: Array, slots: Array) -> Array:
        """Attention of the new queries q [B, T, H, D] over the whole cache k, v [B, S, Hk, D] (keys at `slots`
        [B, S], queries at `positions` [B, T]); a subclass may swap the kernel (the engine's decode step does)."""
        impl = self.attention_impl if q.shape[1] > 1 else "xla"  # decode: one query against the cache
        return attention(q, k, v, positions, slots, impl=impl)


class GatedDeltaNet(nnx.Module):
    """Gated DeltaNet token mixer (linear attention with a gated delta-rule state)."""

    def __init__(self, config: Qwen35Config, dtype, param_dtype, rngs: nnx.Rngs, rows: bool = False):
        c = config
        self.config = c
        self.in_proj_qkv = _linear(c.hidden_size, c.conv_dim, dtype, param_dtype, rngs, rows)
        self.in_proj_z = _linear(c.hidden_size, c.linear_value_dim, dtype, param_dtype, rngs, rows)
        self.in_proj_b = _linear(c.hidden_size, c.linear_num_value_heads, dtype, param_dtype, rngs, rows)
        self.in_proj_a = _linear(c.hidden_size, c.linear_num_value_heads, dtype, param_dtype, rngs, rows)
        kernel = c.linear_conv_kernel_dim
        bound = kernel**-0.5  # torch's default depthwise Conv1d init: U(±1/sqrt(fan_in)), fan_in = kernel
        self.conv_weight = nnx.Param(
            jax.random.uniform(rngs.params(), (kernel, c.conv_dim), param_dtype, -bound, bound)
        )  # [K, conv_dim]; HF conv1d.weight [conv_dim, 1, K]
        self.A_log = nnx.Param(
            jnp.log(jax.random.uniform(rngs.params(), (c.linear_num_value_heads,), jnp.float32, 0.01, 16.0)).astype(
                param_dtype
            )
        )
        self.dt_bias = nnx.Param(jnp.ones((c.linear_num_value_heads,), param_dtype))
        self.norm = GatedRMSNorm(c.linear_value_head_dim, c.rms_norm_eps, param_dtype)
        self.out_proj = _linear(c.linear_value_dim, c.hidden_size, dtype, param_dtype, rngs, rows)
        self.dtype = dtype

    def __call__(
        self, x: Array, cache: DeltaNetCache | None, valid: Array | None, segments: Array | None = None
    ) -> tuple[Array, DeltaNetCache | None]:
        """x: [B, T, d]. valid: [B, T] bool (right padding) or None; padded tokens leave the state unchanged.
        segments: [B, T] ids of packed sequences (full forward only): each starts from a zero state and conv window."""
        c = self.config
        b, t, _ = x.shape
        k_size = c.linear_conv_kernel_dim
        mixed = self.in_proj_qkv(x)  # [B, T, conv_dim]
        z = self.in_proj_z(x).reshape(b, t, c.linear_num_value_heads, c.linear_value_head_dim)
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
        a = self.in_proj_a(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32))

        # Causal depthwise conv over [previous K−1 inputs | new inputs], then SiLU.
        past = jnp.zeros((b, k_size - 1, c.conv_dim), mixed.dtype) if cache is None else cache.conv.astype(mixed.dtype)
        padded = jnp.concatenate([past, mixed], axis=1)  # [B, K−1+T, C]
        w = self.conv_weight[...].astype(mixed.dtype)
        if segments is None:
            conv = sum(padded[:, j : j + t] * w[j] for j in range(k_size))
        else:  # tap j reads token i - (K-1) + j only if it is in token i's segment
            seg = jnp.concatenate([jnp.repeat(segments[:, :1], k_size - 1, axis=1), segments], axis=1)
            same = [(seg[:, j : j + t] == segments)[..., None].astype(mixed.dtype) for j in range(k_size)]
            conv = sum(padded[:, j : j + t] * same[j] * w[j] for j in range(k_size))
        conv = jax.nn.silu(conv)
        q, k, v = jnp.split(conv, [c.linear_key_dim, 2 * c.linear_key_dim], axis=-1)
        q = q.reshape(b, t, c.linear_num_key_heads, c.linear_key_head_dim)
        k = k.reshape(b, t, c.linear_num_key_heads, c.linear_key_head_dim)
        v = v.reshape(b, t, c.linear_num_value_heads, c.linear_value_head_dim)

        if valid is not None:  # padding: no decay (g = 0), no write (β = 0)
            g = jnp.where(valid[..., None], g, 0.0)
            beta = jnp.where(valid[..., None], beta, 0.0)
        heads = ("batch", "length", None, None)
        q, k, v = (sharding.constrain(t, heads) for t in (q, k, v))
        g, beta = (sharding.constrain(t, heads[:3]) for t in (g, beta))
        initial = None if cache is None else cache.ssm
        rule = gated_delta.recurrent_gated_delta_rule if t == 1 else gated_delta.chunk_gated_delta_rule
        extra = {} if segments is None else {"segments": segments}
        o, state = rule(q, k, v, g, beta, initial_state=initial, **extra)

        new_cache = None
        if cache is not None:
            n_new = jnp.full((b,), t, jnp.int32) if valid is None else valid.sum(axis=1).astype(jnp.int32)
            take = jax.vmap(lambda seq, start: jax.lax.dynamic_slice_in_dim(seq, start, k_size - 1, axis=0))
            new_cache = DeltaNetCache(take(padded, n_new).astype(cache.conv.dtype), state)
        o = self.norm(o, z)  # per value head
        return self.out_proj(o.reshape(b, t, c.linear_value_dim)), new_cache


class DecoderLayer(nnx.Module):
    """Pre-norm residual layer: h = x + mixer(norm(x)); y = h + mlp(norm(h))."""

    def __init__(
        self,
        config: Qwen35Config,
        kind: str,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
        rows: bool = False,
        attention_impl: str = "auto",
    ):
        self.kind = kind
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
        if kind == FULL:
            self.self_attn = Attention(config, dtype, param_dtype, rngs, rows, attention_impl)
        else:
            self.linear_attn = GatedDeltaNet(config, dtype, param_dtype, rngs, rows)
        self.mlp = MLP(config, dtype, param_dtype, rngs, rows)

    def __call__(self, x, positions, cache, lengths, valid, segments=None):
        h = self.input_layernorm(x)
        if self.kind == FULL:
            h, cache = self.self_attn(h, positions, cache, lengths, segments)
        else:
            h, cache = self.linear_attn(h, cache, valid, segments)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), cache


def stacked(make, n: int) -> nnx.Module:
    """n modules from `make()` (each with its own random init) as one module with parameters stacked on axis 0."""
    modules = [make() for _ in range(n)]
    graphdef, *_ = nnx.split(modules[0])
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(m) for m in modules]))


def scan_stacked(module: nnx.Module, fn, carry, xs, *, remat: bool = False):
    """`lax.scan` of `fn(layer, carry, x) -> (carry, y)` over the stacked parameters of `module` (and `xs`).

    With `remat`, each iteration is rematerialised in the backward pass: the scan keeps only its carries.
    """
    graphdef, params = nnx.split(module)

    def body(carry, inputs):
        layer_params, x = inputs
        return fn(nnx.merge(graphdef, layer_params), carry, x)

    if remat:
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
    return jax.lax.scan(body, carry, (params, xs))


class Block(nnx.Module):
    """One repetition of the layer pattern, as runs of stacked same-type layers (3 × DeltaNet, 1 × attention)."""

    def __init__(self, config: Qwen35Config, dtype, param_dtype, rngs: nnx.Rngs, attention_impl: str = "auto"):
        self.runs = nnx.List(
            [
                stacked(
                    lambda kind=kind: DecoderLayer(
                        config, kind, dtype, param_dtype, rngs, attention_impl=attention_impl
                    ),
                    n,
                )
                for kind, n in config.block_runs
            ]
        )

    def __call__(self, x, positions, caches, lengths, valid, remat: bool = False, segments=None):
        """Scans each run's layers in order; returns (x, per-run caches)."""

        def layer_fn(layer, h, cache):
            return layer(h, positions, cache, lengths, valid, segments)

        new_caches = []
        for run, cache in zip(self.runs, caches, strict=True):
            x, cache = scan_stacked(run, layer_fn, x, cache, remat=remat)
            new_caches.append(cache)
        return x, tuple(new_caches)


# ----------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------


class UnrolledBlock(nnx.Module):
    """One repetition of the layer pattern with a separate module (own weight arrays) per layer: runs[r][j]."""

    def __init__(self, config: Qwen35Config, dtype, param_dtype, rngs: nnx.Rngs, attention_impl: str = "auto"):
        self.runs = nnx.List(
            [
                nnx.List(
                    [
                        DecoderLayer(config, kind, dtype, param_dtype, rngs, rows=True, attention_impl=attention_impl)
                        for _ in range(n)
                    ]
                )
                for kind, n in config.block_runs
            ]
        )


class Qwen35(nnx.Module):
    """Qwen 3.5 causal LM.

    Args:
      config: architecture.
      dtype: compute dtype (float32 or bfloat16); fp32 islands as described in the module docstring.
      param_dtype: dtype of freshly initialised parameters (loaded ones keep their own, see `hf.py`).
      remat: rematerialise each block in the backward pass.
      unrolled: one module (own weight arrays) per layer, run by a Python loop, instead of stacked parameters
        run by `lax.scan` (the default, which training, checkpoints and sharding use). For decoding: reading a
        layer's weights out of a stack inside a compiled step copies them (XLA cannot hand a slice of a buffer
        to a matmul), which dominates a small-batch decode step. Build it from a stacked model with `unroll`.
      attention_impl: how the attention layers compute a full forward or a prefill (ATTENTION_IMPLS): "auto" (the
        default) picks the block-skipping one on CPU and cuDNN's fused one on NVIDIA GPUs with bf16/fp16 compute.
      rngs: parameter initialisation.
    """

    def __init__(
        self,
        config: Qwen35Config,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        remat: bool = False,
        unrolled: bool = False,
        attention_impl: str = "auto",
        rngs: nnx.Rngs,
    ):
        self.config = config
        self.attention_impl = check_attention_impl(attention_impl)
        self.dtype = dtype
        self.remat = remat
        self.unrolled = unrolled
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.hidden_size,
            dtype=dtype,
            param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(0.02),
            rngs=rngs,
        )
        if unrolled:
            self.blocks = nnx.List(
                [UnrolledBlock(config, dtype, param_dtype, rngs, attention_impl) for _ in range(config.num_blocks)]
            )
        else:
            self.blocks = stacked(lambda: Block(config, dtype, param_dtype, rngs, attention_impl), config.num_blocks)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, dtype, param_dtype, rngs, rows=unrolled)

    # -- trunk ------------------------------------------------------------------------------------------

    def hidden_states(
        self,
        ids: Array,
        *,
        positions: Array | None = None,
        state: DecodeState | None = None,
        valid: Array | None = None,
        segments: Array | None = None,
    ) -> tuple[Array, DecodeState | None]:
        """Final-norm hidden states [B, T, d] and, with a decode state, the updated state.

        Args:
          ids: [B, T] int token ids.
          positions: [B, T] positions; default arange(T), or lengths[b] + arange(T) with a state, or with `segments`
            each token's index within its segment (`segment_positions`).
          state: a `DecodeState` to continue from (prefill, chunked prefill, decode) or None (full forward).
          valid: [B, T] bool, only with a state: False marks right padding of rows with fewer new tokens.
          segments: [B, T] int32, full forward only: packed sequences, one segment id per token, non-decreasing along
            a row; each segment is computed as if it were alone in its row (attention within the segment, DeltaNet
            state and conv window reset at its first token), up to float32 rounding.
        """
        b, t = ids.shape
        if segments is not None and state is not None:
            raise ValueError("`segments` (packed sequences) is for a full forward; a decode state holds one per row")
        if state is not None:
            lengths = state.lengths
            if positions is None:
                positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)
        else:
            if valid is not None:
                raise ValueError("`valid` (right padding) needs a decode state; a full forward is causal already")
            lengths = None
            if positions is None and segments is not None:
                positions = segment_positions(segments)
            elif positions is None:
                positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        act = ("batch", "length", "act_embed")  # data-parallel activations (a no-op without an active mesh)
        x = sharding.constrain(self.embed_tokens(ids), act)

        def block_fn(block, h, caches):
            h, caches = block(h, positions, caches, lengths, valid, remat=self.remat, segments=segments)
            return sharding.constrain(h, act), caches

        caches = state.layers if state is not None else tuple(None for _ in self.config.block_runs)
        if self.unrolled:
            x, new_caches = self._unrolled_layers(x, positions, caches, lengths, valid, segments)
        else:
            x, new_caches = scan_stacked(self.blocks, block_fn, x, caches)
        x = self.norm(x)
        if state is None:
            return x, None
        n_new = jnp.full((b,), t, jnp.int32) if valid is None else valid.sum(axis=1).astype(jnp.int32)
        return x, DecodeState(lengths + n_new, new_caches)

    def _unrolled_layers(self, x, positions, caches, lengths, valid, segments=None):
        """The layers one after the other (`unrolled`); each reads and writes its own slice of the stacked caches."""
        caches = list(caches)
        for b, block in enumerate(self.blocks):
            for r, run in enumerate(block.runs):
                for j, layer in enumerate(run):
                    cache = None if caches[r] is None else jax.tree.map(lambda c, b=b, j=j: c[b, j], caches[r])
                    x, cache = layer(x, positions, cache, lengths, valid, segments)
                    if cache is not None:
                        caches[r] = jax.tree.map(lambda c, new, b=b, j=j: c.at[b, j].set(new), caches[r], cache)
                    x = sharding.constrain(x, ("batch", "length", "act_embed"))
        return x, tuple(caches)

    # -- heads ------------------------------------------------------------------------------------------

    def _head_kernel(self) -> Array:
        """[d, V] output projection (the transposed embedding when tied)."""
        if self.lm_head is None:
            return self.embed_tokens.embedding[...].T
        if isinstance(self.lm_head, RowLinear):
            return self.lm_head.weight[...].T
        return self.lm_head.kernel[...]

    def logits(self, h: Array) -> Array:
        """[B, T, d] hidden states → [B, T, V] float32 logits."""
        w = self._head_kernel().astype(self.dtype)
        return jnp.einsum("btd,dv->btv", h.astype(self.dtype), w, preferred_element_type=jnp.float32)

    def __call__(
        self,
        ids: Array,
        *,
        positions: Array | None = None,
        state: DecodeState | None = None,
        valid: Array | None = None,
    ):
        """Logits [B, T, V] (float32); with a decode state, (logits, new_state)."""
        h, new_state = self.hidden_states(ids, positions=positions, state=state, valid=valid)
        return self.logits(h) if state is None else (self.logits(h), new_state)

    def token_logprobs(
        self, h: Array, targets: Array, *, chunk: int = 1024, needed: Array | None = None
    ) -> tuple[Array, Array]:
        """log π(targets) and the entropy of π at each position, without materialising [B, T, V] logits.

        Args:
          h: [B, T, d] hidden states (position t predicts token t+1).
          targets: [B, T] ids whose log-probabilities are wanted at each position.
          chunk: positions per step; peak memory is [B, chunk, V] float32.
          needed: optional [B, T] bool, the positions whose values are used: a chunk without any is skipped (its
            outputs are 0). The vocabulary projection dominates small models and long contexts, and training needs
            it only at loss targets (the current step's action, the insights), often a few percent of the tokens.

        Returns:
          (logprobs [B, T] float32, entropy [B, T] float32).
        """
        b, t, d = h.shape
        n = -(-t // chunk)
        pad = n * chunk - t
        hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
        tp = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
        need = (
            jnp.ones((n,), bool)
            if needed is None
            else jnp.pad(needed, ((0, 0), (0, pad))).reshape(b, n, chunk).any(axis=(0, 2))
        )

        def compute(hc, tc):
            logits = self.logits(hc)  # [B, c, V] fp32
            # One exp over the vocabulary serves both the normaliser and the entropy (it dominates the cost).
            shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
            e = jnp.exp(logits - shift)
            z = jnp.sum(e, axis=-1)
            logz = shift[..., 0] + jnp.log(z)
            picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
            entropy = logz - jnp.sum(e * logits, axis=-1) / z
            return picked - logz, entropy

        def skip(hc, tc):
            zero = jnp.zeros(tc.shape, jnp.float32)
            return zero, zero

        @jax.checkpoint
        def one(xs):
            hc, tc, nc = xs
            return jax.lax.cond(nc, compute, skip, hc, tc)

        lp, ent = jax.lax.map(one, (hp, tp, need))
        unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]  # noqa: E731
        return unchunk(lp), unchunk(ent)


def unroll_state(state: nnx.State) -> nnx.State:
    """The parameters of a stacked model laid out for its `unrolled` twin: each [n_blocks, run, ...] parameter
    becomes n_blocks × run separate arrays, and every linear kernel [in, out] its transpose [out, in] (`RowLinear`),
    all copies. An unrolled model's state passes through unchanged."""
    flat = []
    for key, var in nnx.to_flat_state(state):
        value = var[...] if isinstance(var, nnx.Variable) else var
        if key == ("lm_head", "kernel"):
            flat.append((("lm_head", "weight"), jnp.asarray(value).T))
            continue
        if key[:2] != ("blocks", "runs"):
            flat.append((key, jnp.array(value, copy=True)))  # a copy: the trainer may donate its own buffers
            continue
        _, runs, r, *rest = key  # ("blocks", "runs", r, ...) → ("blocks", b, "runs", r, j, ...)
        kernel = rest[-1] == "kernel"
        if kernel:
            rest[-1] = "weight"
        for b in range(value.shape[0]):
            for j in range(value.shape[1]):
                flat.append((("blocks", b, runs, r, j, *rest), value[b, j].T if kernel else value[b, j]))
    return nnx.from_flat_state(flat)


def unroll(model: Qwen35) -> Qwen35:
    """The `unrolled` twin of a stacked model (same weights, copied into one array per layer), for decoding."""
    if model.unrolled:
        return model
    graphdef, _ = nnx.split(
        nnx.eval_shape(
            lambda: Qwen35(
                model.config,
                dtype=model.dtype,
                remat=model.remat,
                unrolled=True,
                attention_impl=model.attention_impl,
                rngs=nnx.Rngs(0),
            )
        )
    )
    return nnx.merge(graphdef, unroll_state(nnx.state(model)))


def with_attention_impl(model: Qwen35, impl: str) -> Qwen35:
    """The same model, sharing its arrays, with its attention computed by `impl` (ATTENTION_IMPLS), e.g. the
    reference "xla" for a model that `load_pretrained` built with "auto"."""
    check_attention_impl(impl)
    abstract = nnx.eval_shape(
        lambda: Qwen35(
            model.config,
            dtype=model.dtype,
            remat=model.remat,
            unrolled=model.unrolled,
            attention_impl=impl,
            rngs=nnx.Rngs(0),
        )
    )
    return nnx.merge(nnx.graphdef(abstract), nnx.state(model))


def segment_positions(segments: Array) -> Array:
    """[B, T] each token's index within its segment (0 at a token whose segment id differs from the one before)."""
    t = segments.shape[-1]
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segments.shape)
    starts = jnp.concatenate([jnp.ones_like(segments[..., :1], bool), segments[..., 1:] != segments[..., :-1]], axis=-1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=segments.ndim - 1)


def sequence_logprobs(
    model: Qwen35, ids: Array, *, chunk: int = 1024, needed: Array | None = None, segments: Array | None = None
) -> tuple[Array, Array]:
    """Teacher-forced log π(ids[t] | ids[:t]) for every position (0 at t = 0), and the entropy there.

    Aligned with `tokenization.Context` masks: `logprobs[b, t]` is the logprob of token t.

    Args:
      ids: [B, T] int token ids.
      needed: optional [B, T] bool (aligned like the outputs): only chunks holding a needed token compute the
        vocabulary projection; the other positions read 0 (`Qwen35.token_logprobs`).
      segments: optional [B, T] packed sequences (`Qwen35.hidden_states`); a segment's first token is "predicted"
        from the previous segment's last one, a value no loss may use (its masks are False there).
    Returns:
      (logprobs [B, T], entropy [B, T]) float32; entropy[b, t] is that of the distribution over token t.
    """
    h, _ = model.hidden_states(ids, segments=segments)
    lp, ent = model.token_logprobs(h[:, :-1], ids[:, 1:], chunk=chunk, needed=None if needed is None else needed[:, 1:])
    return jnp.pad(lp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build a model: architecture, dtypes, remat (what the `model.*` settings map to), and the
    attention implementation (ATTENTION_IMPLS; "auto" picks per backend)."""

    config: Qwen35Config
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    attention_impl: str = "auto"

    def build(self, seed: int = 0) -> Qwen35:
        return Qwen35(
            self.config,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            remat=self.remat,
            attention_impl=self.attention_impl,
            rngs=nnx.Rngs(seed),
        )

    def abstract(self) -> Qwen35:
        """The model with ShapeDtypeStruct leaves: no memory, for AOT compilation and sharded loading."""
        return nnx.eval_shape(lambda: self.build())
