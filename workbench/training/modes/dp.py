"""``dp``: data parallelism the compiler's way. The batch is split over the ``data`` axis, the state is
replicated, and the step is an ordinary ``jax.jit``.

Why no collective appears here: the loss is a mean over the whole (sharded) batch, so its gradient
with respect to the replicated parameters needs every device's contribution. XLA sees that and inserts
one all-reduce of the gradients; every device then applies the same update to its copy. This is the
update ``single`` computes on the global batch, up to the order of float additions.
"""

from __future__ import annotations

from .base import DATA_AXIS, ShardedJitMode
from .declaration import CollectiveNeed

# Shared by the modes that replicate the state and average every gradient over 'data'.
GRADIENT_ALL_REDUCE = CollectiveNeed(
    "all-reduce", DATA_AXIS, "gradients", "gradients, summed over 'data' (each device then applies the same update)"
)
NO_HAND_WRITTEN_SYNC = {
    "skip-sync": "the compiler synchronises its replicas, so they cannot drift apart",
    "psum": "it has no hand-written gradient reduction",
    "per-shard-update": "it computes all shards at once, so there is no per-shard loop to update in",
    "vma-double-count": "it differentiates outside shard_map, where check_vma does not apply",
}


class DataParallel(ShardedJitMode):
    name = "dp"
    summary = "jit, batch split over 'data', state replicated: the compiler inserts the all-reduce"
    sharded = "the batch, over 'data'; parameters and optimizer state are replicated on every device"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "replicate"
    gradient_sync = "compiler"
    collectives = (GRADIENT_ALL_REDUCE,)
    fault_reasons = NO_HAND_WRITTEN_SYNC
