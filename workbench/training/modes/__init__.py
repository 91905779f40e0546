"""Parallel modes: one small module each, all with the same shape (see :mod:`.base`).

========================  ==================================================================
``single``                one device, the reference
``simulated``             one device, a Python loop over N shards, one update
``dp``                    jit, batch sharded, state replicated; the compiler all-reduces
``dp-shard-map``          shard_map with an explicit, correct pmean
``dp-pmap``               legacy pmap with stacked replicas
``fsdp``                  parameters and optimizer state sharded over ``data``, gathered layer by layer
``fsdp-whole-tree``       the same, the whole parameter tree gathered at once (ZeRO-3 written out)
``fsdp-tp``               2-D: ``fsdp`` over ``data`` x ``dp-tp``'s layer split over ``model``
``tp``                    layers split over ``model``
``dp-tp``                 2-D ``data x model``
========================  ==================================================================

Every mode computes the same update as ``single`` on the same global batch (tested to 1e-5).

Example (``graphdef, state = init_state(model, optimizer)``, ``batch`` a dict of arrays of 64 rows):
    >>> setup = StepSetup(graphdef, loss_fn, optimizer, parse_mesh("data=8"), 64)
    >>> mode = build_mode("dp", setup)
    >>> state, metrics = mode.step(mode.place_state(state), mode.place_batch(batch))
    >>> float(metrics["loss"]) > 0
    True
"""

from __future__ import annotations

from ...renamed import renamed_attribute
from ...layout.mesh import MODEL_AXIS
from .base import ParallelMode, StepSetup, validate_declaration
from .core import PRECISIONS, TrainState
from .declaration import CollectiveNeed, MeshFit, MeshFix
from .dp import DataParallel
from .dp_pmap import PmapDataParallel
from .dp_shard_map import ShardMapDataParallel
from .dp_tp import DataTensorParallel
from .faults import FAULTS, Fault
from .fsdp import FullyShardedDataParallel
from .fsdp_tp import FullyShardedTensorParallel
from .fsdp_whole_tree import WholeTreeShardedDataParallel
from .registry import build_mode, describe_modes, mesh_fit, mode_class, modes_supporting, register
from .simulated import SimulatedDataParallel
from .single import SingleDevice
from .tp import TensorParallel

_REGISTRY = register(  # in menu order
    SingleDevice,
    SimulatedDataParallel,
    DataParallel,
    ShardMapDataParallel,
    PmapDataParallel,
    FullyShardedDataParallel,
    WholeTreeShardedDataParallel,
    TensorParallel,
    DataTensorParallel,
    FullyShardedTensorParallel,
)
for _cls in _REGISTRY.values():
    validate_declaration(_cls)  # a mode that leaves a fact undeclared fails at import, naming it

MODES: tuple[str, ...] = tuple(_REGISTRY)
# The modes that split only the batch (and perhaps the state) over 'data': no layer is split.
DATA_PARALLEL_MODES: tuple[str, ...] = tuple(name for name, cls in _REGISTRY.items() if MODEL_AXIS not in cls.axes)

__all__ = [
    "DATA_PARALLEL_MODES", "FAULTS", "CollectiveNeed", "Fault", "MODES", "MeshFit", "MeshFix", "PRECISIONS",
    "ParallelMode", "StepSetup", "TrainState", "build_mode", "describe_modes", "mesh_fit", "mode_class",
    "modes_supporting",
]


def __getattr__(name: str):
    """An old name (see ``workbench.renamed``): its new value, with a DeprecationWarning."""
    return renamed_attribute(__name__, name, globals())
