"""``tp``: tensor parallelism over a ``model`` axis. Every device sees the whole batch; the large
weight matrices are split between devices (Megatron's column-/row-parallel pairs).

In an MLP the first layer is split by output columns, so each device computes a slice of the hidden
activations with no communication; the second is split by input rows, so each device's partial product
must be summed: the compiler inserts that all-reduce after it. In attention, q/k/v are split by columns,
which gives each device whole heads, and the output projection by rows. The model declares its pairs
(``tensor_parallel_rules``); parameters no rule names stay replicated, as do their optimizer moments.
"""

from __future__ import annotations

from ...layout.mesh import MODEL_AXIS
from .base import ShardedJitMode
from .declaration import CollectiveNeed
from .dp import NO_HAND_WRITTEN_SYNC

ACTIVATION_ALL_REDUCE = CollectiveNeed(
    "all-reduce", MODEL_AXIS, "activations",
    "activations after each row-parallel layer, over 'model': depends on the batch size and the layer widths",
)


class TensorParallel(ShardedJitMode):
    name = "tp"
    summary = "layers split over 'model' (column-/row-parallel pairs); each device sees the whole batch"
    sharded = "the layers' weights, over 'model' (column- then row-parallel); every device sees the whole batch"
    axes = (MODEL_AXIS,)
    mesh_example = "model=2"
    batch_axis = None
    state_placement = "tensor-parallel"
    gradient_sync = "compiler"
    collectives = (ACTIVATION_ALL_REDUCE,)
    supported_faults = ("optimizer-reset",)
    fault_reasons = {**NO_HAND_WRITTEN_SYNC, "skip-sync": "it has no replicas: each device holds its own part",
                     "same-shard": "every device reads the whole batch, so there is no shard to load twice"}
