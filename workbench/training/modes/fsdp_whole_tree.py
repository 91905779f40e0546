"""``fsdp-whole-tree``: ZeRO-3 written out in one ``jax.shard_map``, the simplest FSDP to read.

Parameters and optimizer state are sharded over ``data`` as in ``fsdp`` (each device stores 1/N), but
the step gathers the *whole* parameter tree at once, where ``fsdp`` gathers one layer at a time:

1. ``lax.all_gather`` puts the whole parameters on every device, for this step only;
2. each device computes the gradient of its own batch shard against them (locally, not yet summed);
3. ``lax.psum_scatter`` (a reduce-scatter) sums the gradients over devices and hands each device the
   sum for just its own shard; leaves held whole get an ordinary ``psum``.

Outside the shard_map the optimizer updates each shard where it lives: Adam is element-wise, so no
device ever needs another's optimizer state. Per device, one all-gather of the parameters and one
reduce-scatter of the gradients move exactly what ``dp``'s single all-reduce moves (a ring all-reduce
*is* a reduce-scatter then an all-gather). The price: during the step every device holds the whole
parameters and their whole local gradients, which ``fsdp`` avoids by gathering layer by layer.
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
from .param_gathering import WHOLE, gather, split_dims

# Shared with fsdp: the gradients of what each device owns, and of the leaves too small to split.
SHARDED_GRADIENT_REDUCE_SCATTER = CollectiveNeed(
    "reduce-scatter", DATA_AXIS, "sharded-gradients", "gradients, summed with each device keeping its own shard")
WHOLE_LEAVES_ALL_REDUCE = CollectiveNeed(
    "all-reduce", DATA_AXIS, "whole-gradients",
    "the loss, and the gradients of parameters too small to split (kept whole on every device)")
FSDP_FAULT_REASONS = {
    **NO_HAND_WRITTEN_SYNC,
    "psum": "its gradients are reduce-scattered leaf by leaf; the psum mistake is shown in dp-shard-map",
    "vma-double-count": "it marks the gathered parameters per-device by design; the trap is shown in dp-shard-map",
}


class WholeTreeShardedDataParallel(ShardedJitMode):
    name = "fsdp-whole-tree"
    summary = "FSDP written out: the whole parameter tree gathered for the step, gradients reduce-scattered"
    sharded = "the batch, parameters and optimizer state, all over 'data' (each device stores 1/N)"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "shard"
    parameter_gathering = "whole-tree"
    gradient_sync = "shard_map"
    collectives = (
        CollectiveNeed("all-gather", DATA_AXIS, "sharded-parameters", "parameters, gathered whole for the step"),
        SHARDED_GRADIENT_REDUCE_SCATTER,
        WHOLE_LEAVES_ALL_REDUCE,
    )
    fault_reasons = FSDP_FAULT_REASONS

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        param_specs = jax.tree.map(lambda s: s.spec, self.state_shardings(state).params)
        dims = split_dims(param_specs)

        def local_sums(shards, other, batch_shard):
            full = gather(shards, dims)  # 1. all-gather
            # 2. local gradients: gathered (and whole) leaves must be per-device before grad, or
            # JAX would sum them over devices already (the shard_map trap; see dp_shard_map.py).
            full = as_per_device(full, DATA_AXIS)
            sums = step_sums(self.plan, full, other, batch_shard)
            grads = jax.tree.map(  # 3. reduce-scatter (psum for whole leaves)
                lambda g, d: lax.psum(g, DATA_AXIS) if d == WHOLE
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
