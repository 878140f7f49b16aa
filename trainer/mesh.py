"""The ('data', 'expert') device mesh and the shardings the trainer puts arrays on.

Layout:

- tokens ``[B, T]`` are split over BOTH axes on the batch dimension (every device holds
  ``B / (data * expert)`` whole sequences), so expert parallelism does not cost data parallelism;
- routed-expert weights ``[E, ...]`` are split over ``'expert'`` on their leading expert dimension
  and replicated over ``'data'``;
- everything else (embeddings, attention, router, shared experts, norms) is replicated.

The mesh uses ``AxisType.Auto`` axes: jax 0.10's ``jax.make_mesh`` defaults to explicit axes, which
would make every ``jnp`` op outside the MoE ``shard_map`` demand sharding annotations.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "AXES",
    "BATCH_AXES",
    "EXPERT_AXIS",
    "batch_sharding",
    "make_mesh",
    "param_sharding",
    "replicated",
    "shard_batch",
    "shard_model",
]

AXES = ("data", "expert")
EXPERT_AXIS = "expert"
# The batch dimension is split over both mesh axes.
BATCH_AXES = ("data", "expert")
# Metadata key set on nnx.Param objects whose leading dimension is the expert dimension.
EXPERT_SHARDED = "expert_sharded"


def make_mesh(data: int, expert: int, *, devices=None) -> Mesh:
    """A ``('data', 'expert')`` mesh over ``data * expert`` devices (all processes' devices).

    Raises ValueError when the sizes do not multiply to the number of devices available.
    On CPU, simulate devices with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set
    before jax is imported.
    """
    if data < 1 or expert < 1:
        raise ValueError(f"mesh sizes must be >= 1, got data={data}, expert={expert}")
    devs = list(jax.devices() if devices is None else devices)
    need = data * expert
    if need > len(devs):
        raise ValueError(
            f"mesh data={data} x expert={expert} needs {need} devices but only {len(devs)} are "
            "available; lower mesh.data/mesh.expert, or on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need} before importing jax"
        )
    if devices is None and need == len(devs):
        return jax.make_mesh((data, expert), AXES, axis_types=(AxisType.Auto, AxisType.Auto))
    return Mesh(
        np.asarray(devs[:need]).reshape(data, expert), AXES, axis_types=(AxisType.Auto, AxisType.Auto)
    )


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding for ``[B, ...]`` batches: batch dimension over ('data', 'expert')."""
    return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(mesh: Mesh, tokens):
    """Put a host batch ``[B, T(+1)]`` on the mesh, batch split over both axes.

    ``B`` must be divisible by ``data * expert``. Single process only; with several processes use
    ``jax.make_array_from_process_local_data(batch_sharding(mesh), local_tokens)``.
    """
    n = mesh.size
    if tokens.shape[0] % n:
        raise ValueError(
            f"batch size {tokens.shape[0]} is not divisible by the mesh size {n} "
            f"(data={mesh.shape['data']} x expert={mesh.shape['expert']}); choose a batch size "
            f"that is a multiple of {n}"
        )
    return jax.device_put(tokens, batch_sharding(mesh))


def param_sharding(mesh: Mesh, variable: nnx.Variable) -> NamedSharding:
    """Expert weights (marked with ``expert_sharded=True`` metadata) over 'expert', others replicated."""
    if variable.get_metadata().get(EXPERT_SHARDED, False):
        return NamedSharding(mesh, P(EXPERT_AXIS))
    return NamedSharding(mesh, P())


def shard_model(model: nnx.Module, mesh: Mesh) -> None:
    """Move every variable of ``model`` (in place) onto its sharding on ``mesh``."""
    for _path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable):
            var.set_value(jax.device_put(var.get_value(), param_sharding(mesh, var)))
