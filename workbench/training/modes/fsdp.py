"""``fsdp``: fully sharded data parallelism (ZeRO-3). Like ``dp`` the batch is split over ``data``, but
parameters and optimizer state are sharded over ``data`` too: each device stores 1/N of them.

Each parameter is split along its largest dimension divisible by the axis size (small leaves, such as
biases of 10 classes, stay replicated; :meth:`state_layout` says which and why). The gradient is
computed inside ``jax.shard_map``, with the two collectives of ZeRO-3 written out:

1. ``lax.all_gather`` puts the whole parameters on every device, for this step only;
2. each device computes the gradient of its own batch shard against them (locally, not yet summed);
3. ``lax.psum_scatter`` (a reduce-scatter) sums the gradients over devices and hands each device the
   sum for just its own shard; replicated leaves get an ordinary ``psum``.

Outside the shard_map the optimizer updates each shard where it lives: Adam is element-wise, so no
device ever needs another's optimizer state. Per device, one all-gather of the parameters and one
reduce-scatter of the gradients move what ``dp``'s single all-reduce moves, but no device ever stores a
whole copy of the parameters between steps, nor any of the optimizer state but its own 1/N.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec

from .base import DATA_AXIS, ShardedJitMode, step_sums
from .core import TrainState, as_per_device, finish_step, means
from .declaration import CollectiveNeed
from .dp import NO_HAND_WRITTEN_SYNC


REPLICATED = -1


def _sharded_dim(spec: PartitionSpec) -> int:
    """Which dimension a leaf's spec splits over ``data`` (``REPLICATED``: none, the leaf is whole)."""
    return next((dim for dim, entry in enumerate(spec) if entry == DATA_AXIS), REPLICATED)


class FullyShardedDataParallel(ShardedJitMode):
    name = "fsdp"
    summary = "batch split over 'data'; parameters and optimizer state sharded over it too, gathered to compute"
    sharded = "the batch, parameters and optimizer state, all over 'data' (each device stores 1/N)"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "shard"
    gradient_sync = "shard_map"
    collectives = (
        CollectiveNeed("all-gather", DATA_AXIS, "sharded-parameters", "parameters, gathered to compute"),
        CollectiveNeed("reduce-scatter", DATA_AXIS, "sharded-gradients",
                       "gradients, summed with each device keeping its own shard"),
        CollectiveNeed("all-reduce", DATA_AXIS, "whole-gradients",
                       "the loss, and the gradients of parameters too small to split (kept whole on every device)"),
    )
    fault_reasons = {
        **NO_HAND_WRITTEN_SYNC,
        "psum": "its gradients are reduce-scattered leaf by leaf; the psum mistake is shown in dp-shard-map",
        "vma-double-count": "it marks the gathered parameters per-device by design; the trap is shown in dp-shard-map",
    }

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        param_specs = jax.tree.map(lambda s: s.spec, self.state_shardings(state).params)
        dims = jax.tree.map(_sharded_dim, param_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))

        def local_sums(shards, other, batch_shard):
            full = jax.tree.map(  # 1. all-gather
                lambda x, d: x if d == REPLICATED else lax.all_gather(x, DATA_AXIS, axis=d, tiled=True), shards, dims
            )
            # 2. local gradients: gathered (and replicated) leaves must be per-device before grad, or
            # JAX would sum them over devices already (the shard_map trap; see dp_shard_map.py).
            full = as_per_device(full, DATA_AXIS)
            sums = step_sums(self.plan, full, other, batch_shard)
            grads = jax.tree.map(  # 3. reduce-scatter (psum for replicated leaves)
                lambda g, d: lax.psum(g, DATA_AXIS) if d == REPLICATED
                else lax.psum_scatter(g, DATA_AXIS, scatter_dimension=d, tiled=True),
                sums["grads"], dims,
            )
            return {"grads": grads, "metrics": lax.psum(sums["metrics"], DATA_AXIS),
                    "weight": lax.psum(sums["weight"], DATA_AXIS)}

        sums = jax.shard_map(
            local_sums,
            mesh=self.mesh,
            in_specs=(param_specs, PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs={"grads": param_specs, "metrics": PartitionSpec(), "weight": PartitionSpec()},
            check_vma=True,
        )(state.params, state.other, batch)
        return finish_step(self.plan.optimizer, state, means(sums), diagnostics, self.faults)  # updates each shard in place
