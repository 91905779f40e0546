"""``dp``: data parallelism the compiler's way. The batch is split over the ``data`` axis, the state is
replicated, and the step is an ordinary ``jax.jit``.

Why no collective appears here: the loss is a mean over the whole (sharded) batch, so its gradient
with respect to the replicated parameters needs every device's contribution. XLA sees that and inserts
one all-reduce of the gradients; every device then applies the same update to its copy. This is the
update ``single`` computes on the global batch, up to the order of float additions.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec

from .base import DATA_AXIS, ShardedJitMode, StepPlan, check_data_parallel


class DataParallel(ShardedJitMode):
    name = "dp"
    summary = "jit, batch split over 'data', state replicated: the compiler inserts the all-reduce"
    batch_spec = PartitionSpec(DATA_AXIS)
    state_placement = "replicate"

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        check_data_parallel(plan, cls.name, "use mode 'dp-tp' to split over both, or drop that axis")
