"""``dp-tp``: data and tensor parallelism on a 2-D ``data x model`` mesh.

Each row of the mesh (fixed ``data`` index) holds one copy of the model, split over its ``model``
devices as in ``tp``; the batch is split over the ``data`` rows as in ``dp``. The compiler inserts two
kinds of collective: the all-reduce after each row-parallel layer (within a row, over ``model``) and the
gradient all-reduce across copies (within a column, over ``data``).
"""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec

from ...layout.rules import RuleTable
from .base import DATA_AXIS, MODEL_AXIS, ShardedJitMode, StepPlan, axis_size, check_batch, only_axes
from .tp import check_tensor_parallel


class DataTensorParallel(ShardedJitMode):
    name = "dp-tp"
    summary = "2-D mesh: batch split over 'data', layers split over 'model'"
    batch_spec = PartitionSpec(DATA_AXIS)

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        check_tensor_parallel(plan, cls.name)
        size = axis_size(plan, DATA_AXIS, cls.name, "data=4,model=2")
        only_axes(plan, (DATA_AXIS, MODEL_AXIS), cls.name, "drop that axis")
        check_batch(plan, size, f"{size} rows of 'data'")

    def placement(self) -> Any:
        return RuleTable(list(self.plan.tp_rules))
