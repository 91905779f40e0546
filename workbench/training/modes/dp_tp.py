"""``dp-tp``: data and tensor parallelism on a 2-D ``data x model`` mesh.

Each row of the mesh (fixed ``data`` index) holds one copy of the model, split over its ``model``
devices as in ``tp``; the batch is split over the ``data`` rows as in ``dp``. The compiler inserts two
kinds of collective: the all-reduce after each row-parallel layer (within a row, over ``model``) and the
gradient all-reduce across copies (within a column, over ``data``).
"""

from __future__ import annotations

from ...layout.mesh import DATA_AXIS, MODEL_AXIS
from .base import ShardedJitMode
from .declaration import CollectiveNeed
from .dp import NO_HAND_WRITTEN_SYNC
from .tp import ACTIVATION_ALL_REDUCE


class DataTensorParallel(ShardedJitMode):
    name = "dp-tp"
    summary = "2-D mesh: batch split over 'data', layers split over 'model'"
    sharded = "the batch over 'data' and the layers' weights over 'model', on a 2-D mesh"
    axes = (DATA_AXIS, MODEL_AXIS)
    mesh_example = "data=4,model=2"
    batch_axis = DATA_AXIS
    state_placement = "tensor-parallel"
    gradient_sync = "compiler"
    collectives = (
        ACTIVATION_ALL_REDUCE,
        CollectiveNeed("all-reduce", DATA_AXIS, "whole-gradients",
                       "gradients of each device's share of the parameters, over 'data': depends on the model split"),
    )
    fault_reasons = NO_HAND_WRITTEN_SYNC
