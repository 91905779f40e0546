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

from .base import DATA_AXIS, step_sums
from .core import as_per_device
from .declaration import CollectiveNeed
from .param_gathering import WHOLE, gather
from .sharded_state import SHARDED_GRADIENT_REDUCE_SCATTER, WHOLE_LEAVES_ALL_REDUCE, ShardedStateMode


class WholeTreeShardedDataParallel(ShardedStateMode):
    name = "fsdp-whole-tree"
    summary = "FSDP written out: the whole parameter tree gathered for the step, gradients reduce-scattered"
    parameter_gathering = "whole-tree"
    collectives = (
        CollectiveNeed("all-gather", DATA_AXIS, "sharded-parameters", "parameters, gathered whole for the step"),
        SHARDED_GRADIENT_REDUCE_SCATTER,
        WHOLE_LEAVES_ALL_REDUCE,
    )

    def _local_sums(self, shards: Any, other: Any, batch_shard: Any, dims: Any, kept: Any = None) -> dict[str, Any]:
        full = gather(shards, dims)  # 1. all-gather
        # 2. local gradients: gathered (and whole) leaves must be per-device before grad, or
        # JAX would sum them over devices already (the shard_map trap; see dp_shard_map.py).
        sums = step_sums(self.setup, as_per_device(full, DATA_AXIS), other, batch_shard)
        grads = jax.tree.map(  # 3. reduce-scatter (psum for whole leaves)
            lambda g, d: lax.psum(g, DATA_AXIS) if d == WHOLE
            else lax.psum_scatter(g, DATA_AXIS, scatter_dimension=d, tiled=True),
            sums["grads"], dims,
        )
        return {**sums, "grads": grads}
