"""``fsdp``: fully sharded data parallelism (ZeRO-3). Like ``dp`` the batch is split over ``data``, but
parameters and optimizer state are sharded over ``data`` too: each device stores 1/N of them.

Each parameter is split along its largest dimension divisible by the axis size (small leaves, such as
biases of 10 classes, stay replicated; :meth:`state_layout` says which and why). For compute the step
gathers the full parameters (``with_sharding_constraint`` to replicated: an all-gather), so the maths is
exactly ``dp``'s; the gradient of that gather is a reduce-scatter, which hands each device the summed
gradient of just its own shard, and the optimizer updates only that shard.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .base import DATA_AXIS, ShardedJitMode, StepPlan, check_data_parallel


class FullyShardedDataParallel(ShardedJitMode):
    name = "fsdp"
    summary = "batch split over 'data'; parameters and optimizer state sharded over it too, gathered to compute"
    batch_spec = PartitionSpec(DATA_AXIS)
    state_placement = "shard"

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        check_data_parallel(plan, cls.name, "drop that axis (fsdp shards over 'data' only)")

    def compute_params(self, params: Any) -> Any:
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return jax.tree.map(lambda p: jax.lax.with_sharding_constraint(p, replicated), params)
