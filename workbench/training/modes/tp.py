"""``tp``: tensor parallelism over a ``model`` axis. Every device sees the whole batch; the large
weight matrices are split between devices (Megatron's column-/row-parallel pairs).

In an MLP the first layer is split by output columns, so each device computes a slice of the hidden
activations with no communication; the second is split by input rows, so each device's partial product
must be summed: the compiler inserts that all-reduce after it. In attention, q/k/v are split by columns,
which gives each device whole heads, and the output projection by rows. The model declares its pairs
(``tensor_parallel_rules``); parameters no rule names stay replicated, as do their optimizer moments.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import PartitionSpec

from ...errors import WorkbenchError
from ...layout.rules import RuleTable
from .base import MODEL_AXIS, ShardedJitMode, StepPlan, axis_size, check_batch, only_axes


def check_tensor_parallel(plan: StepPlan, mode: str) -> int:
    """The model-axis size; WorkbenchError when the model has no layer to split."""
    size = axis_size(plan, MODEL_AXIS, mode, "model=2" if mode == "tp" else "data=4,model=2")
    if not plan.tp_rules:
        raise WorkbenchError(
            f"mode {mode!r} splits layers over the 'model' axis, but this model has no splittable layer pair "
            "(a single linear layer has none): choose mlp, cnn or transformer, or a data-parallel mode"
        )
    return size


class TensorParallel(ShardedJitMode):
    name = "tp"
    summary = "layers split over 'model' (column-/row-parallel pairs); each device sees the whole batch"
    batch_spec = PartitionSpec()

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        check_tensor_parallel(plan, cls.name)
        only_axes(plan, (MODEL_AXIS,), cls.name, "use mode 'dp-tp' for a data x model mesh")
        check_batch(plan, 1, "the whole batch on each device")

    def placement(self) -> Any:
        return RuleTable(list(self.plan.tp_rules))
