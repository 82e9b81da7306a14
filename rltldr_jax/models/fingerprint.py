"""A fingerprint of a model's weights, to check that a generation server samples from the trainer's policy.

The trainer holds fp32 master weights on a mesh; a server holds its own copy, often in bf16, behind gRPC. Hashing
every byte would mean copying the whole model to the host on both sides; instead the fingerprint hashes, for each
parameter (in path order), its path, its shape and `SAMPLES` values at evenly spaced flat positions, cast to the
dtype the server holds. Two checkpoints of one architecture (another seed, another training step, another
revision) differ in essentially every value, so they differ in the samples; equal weights give equal
fingerprints on any device and sharding, because gathering values is exact (no reduction, no rounding order).

    fingerprint = weights_fingerprint(model)                         # the server, on the weights it loaded
    weights_fingerprint(trainer_model, dtype="bfloat16") == fingerprint  # the trainer, at the server's dtype

Both sides must hold the model in the same layout (`Qwen35` with its stacked `blocks`): `launch/serve.py`
fingerprints the model it builds or loads, before the engine makes its per-layer copy.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

SAMPLES = 32  # values gathered per parameter


def _positions(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Multi-dimensional indices of up to SAMPLES evenly spaced flat positions (first and last included)."""
    size = int(np.prod(shape))
    flat = np.unique(np.linspace(0, size - 1, min(SAMPLES, size)).round().astype(np.int64))
    return np.unravel_index(flat, shape)


def weights_fingerprint(model: nnx.Module, dtype: Any = None) -> str:
    """A 32-hex-digit fingerprint of `model`'s parameters (module doc).

    Args:
      model: an nnx model (e.g. `Qwen35`), its parameters on any devices and sharding.
      dtype: cast the sampled values to this dtype first (a numpy/jax dtype or its name, e.g. "bfloat16": the
        dtype the other side holds); None keeps each parameter's own dtype.

    Returns:
      The hex digest; equal for equal weights at that dtype.
    """
    flat = [(key, var[...]) for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    cast = None if dtype is None else jnp.dtype(dtype)

    @jax.jit
    def gather(values):  # one compiled gather for every parameter: a few values each, exact
        out = []
        for value in values:
            picked = value[_positions(value.shape)]
            out.append((picked if cast is None else picked.astype(cast)).astype(jnp.float32))
        return out

    sampled = gather([value for _, value in flat])
    if not all(s.is_fully_addressable for s in sampled):  # parameters spread over processes: a collective
        from jax.experimental import multihost_utils

        sampled = multihost_utils.process_allgather(sampled, tiled=True)
    digest = hashlib.blake2b(digest_size=16)
    for (key, value), picked in zip(flat, sampled, strict=True):
        digest.update(f"{'/'.join(map(str, key))}|{tuple(value.shape)}|".encode())
        digest.update(np.ascontiguousarray(np.asarray(picked, np.float32)).tobytes())
    return digest.hexdigest()
