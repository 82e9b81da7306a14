"""Device mesh and logical-axis rules.

The mesh has three axes:
- `data`: pure data parallelism (parameters replicated);
- `fsdp`: data parallelism with parameters and optimizer state sharded along their `embed` dimension
  (ZeRO-3 style; XLA all-gathers each block's weights inside the scan);
- `tensor`: tensor parallelism of the wide dimensions (MLP hidden, attention heads, vocabulary).

Every parameter gets *logical* axis names from its path (`param_logical_axes`); `LOGICAL_RULES` maps logical
names to mesh axes. A dimension that the mesh axis size does not divide is left unsharded, so tiny test
models run on any mesh. Activations are constrained with `constrain(x, logical_axes)`, a no-op unless a
mesh is active (`with activate(mesh):`).

The multi-process runtime (joining a job, the collectives between processes) is `rltldr_jax.distributed`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Iterator, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")

#: logical axis → mesh axis (or axes). Unlisted logical names are replicated.
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),  # activations: the batch is split over all data-parallel devices
    "length": None,
    "embed": "fsdp",  # parameters: FSDP shards the model dimension
    "act_embed": None,  # activations keep the model dimension whole
    "ffn": "tensor",  # MLP hidden, attention/DeltaNet head dims: tensor parallel
    "vocab": "tensor",
    "layers": None,  # the stacked-blocks axis is scanned over, never sharded
}

# (regex on "a.b.c" parameter path, logical axes of the *unstacked* parameter), first match wins.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed_tokens\.embedding$", ("vocab", "embed")),
    (r"lm_head\.kernel$", ("embed", "vocab")),
    (r"(o_proj|out_proj|down_proj)\.kernel$", ("ffn", "embed")),
    (r"(in_proj_a|in_proj_b)\.kernel$", ("embed", None)),
    (r"(q_proj|k_proj|v_proj|in_proj_qkv|in_proj_z|gate_proj|up_proj)\.kernel$", ("embed", "ffn")),
    (r"conv_weight$", (None, "ffn")),
    (r".*", ()),  # norms, A_log, dt_bias: small, replicated
)


def mesh_sizes_error(data: int, fsdp: int, tensor: int) -> str | None:
    """What is wrong with these mesh axis sizes, None if nothing: each is positive, or -1 ("all remaining devices")
    on at most one axis. `make_mesh` raises it; config validation reports it for `mesh.*`."""
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        return (
            f"mesh sizes {dict(zip(AXES, sizes, strict=True))}: "
            "each positive, with at most one -1 (all remaining devices)"
        )
    return None


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all); one size may be -1 for "the rest"."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    problem = mesh_sizes_error(data, fsdp, tensor)
    if problem:
        raise ValueError(problem)
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices are not divisible by the fixed mesh axes {dict(zip(AXES, sizes, strict=True))}"
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(AXES, sizes, strict=True))} needs {int(np.prod(sizes))} devices, have {len(devices)}"
        )
    return Mesh(np.array(devices).reshape(sizes), AXES)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The sizes of the (data, fsdp, tensor) mesh axes (`build(MeshConfig, settings.mesh)`; `mesh_sizes_error` says
    which are valid)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def make(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """The mesh over `devices` (default: all), as `make_mesh`."""
        return make_mesh(self.data, self.fsdp, self.tensor, devices)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for an array of `shape` with these logical axes; indivisible dimensions stay whole."""
    spec = []
    for name, dim in zip(logical, shape, strict=False):
        axes = LOGICAL_RULES.get(name) if name else None
        if axes is None:
            spec.append(None)
            continue
        axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
        size = int(np.prod([mesh.shape[a] for a in axes_t]))
        spec.append((axes_t[0] if len(axes_t) == 1 else axes_t) if size > 1 and dim % size == 0 else None)
    return PartitionSpec(*spec)


def param_logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
    """Logical axes of a parameter from its dotted path; stacked block parameters ([n_blocks, run, ...]) get two
    leading "layers" axes."""
    stacked = 2 if path.startswith("blocks.") else 0
    for pattern, axes in PARAM_RULES:
        if re.search(pattern, path):
            base = axes if axes else (None,) * (ndim - stacked)
            return ("layers",) * stacked + tuple(base)
    raise AssertionError("the catch-all rule matches every path")


def param_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """NamedSharding for every leaf of a model's state (same structure), by `param_logical_axes`."""

    def one(path, leaf):
        # Keep dict/sequence keys ("blocks.layers.0.mlp.up_proj.kernel"), not the Variable's ".value".
        name = ".".join(str(p.key if hasattr(p, "key") else p.idx) for p in path if not hasattr(p, "name"))
        shape = np.shape(leaf)
        return NamedSharding(mesh, logical_to_spec(param_logical_axes(name, len(shape)), shape, mesh))

    return jax.tree_util.tree_map_with_path(one, state)


def optimizer_shardings(tx: optax.GradientTransformation, opt_state, params_sharding, mesh: Mesh):
    """Shardings of an optax state: parameter-shaped parts follow the parameters, the rest is replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        opt_state,
        params_sharding,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


# ----------------------------------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------------------------------

_ACTIVE_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("rltldr_active_mesh", default=None)


@contextlib.contextmanager
def activate(mesh: Mesh) -> Iterator[Mesh]:
    """Within this context (around tracing), `constrain` places activations on `mesh`."""
    token = _ACTIVE_MESH.set(mesh)
    try:
        yield mesh
    finally:
        _ACTIVE_MESH.reset(token)


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical axes under an active mesh; identity otherwise."""
    mesh = _ACTIVE_MESH.get()
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh)))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a [batch, ...] input array: batch over (data, fsdp), the rest whole."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))
