"""Parallel modes: one small module each, all with the same shape (see :mod:`.base`).

========================  ==================================================================
``single``                one device, the reference
``simulated``             one device, a Python loop over N shards, one update
``dp``                    jit, batch sharded, state replicated; the compiler all-reduces
``dp-shard-map``          shard_map with an explicit, correct pmean
``dp-pmap``               legacy pmap with stacked replicas
``fsdp``                  parameters and optimizer state sharded over ``data`` (ZeRO-3)
``tp``                    layers split over ``model``
``dp-tp``                 2-D ``data x model``
========================  ==================================================================

Every mode computes the same update as ``single`` on the same global batch (tested to 1e-5).

Example:
    >>> mode = build_mode("dp", StepPlan(graphdef, loss_fn, optax.sgd(0.1), "data=8", 64))  # doctest: +SKIP
    >>> state, metrics = mode.step(mode.place_state(state), mode.place_batch(batch))  # doctest: +SKIP
"""

from __future__ import annotations

from ...errors import WorkbenchError
from .base import ParallelMode, StepPlan
from .core import PRECISIONS, TrainState
from .dp import DataParallel
from .dp_pmap import PmapDataParallel
from .dp_shard_map import ShardMapDataParallel
from .dp_tp import DataTensorParallel
from .faults import FAULTS, Fault
from .fsdp import FullyShardedDataParallel
from .simulated import SimulatedDataParallel
from .single import SingleDevice
from .tp import TensorParallel

_REGISTRY: dict[str, type[ParallelMode]] = {
    cls.name: cls
    for cls in (
        SingleDevice,
        SimulatedDataParallel,
        DataParallel,
        ShardMapDataParallel,
        PmapDataParallel,
        FullyShardedDataParallel,
        TensorParallel,
        DataTensorParallel,
    )
}
MODES: tuple[str, ...] = tuple(_REGISTRY)
DATA_PARALLEL_MODES: tuple[str, ...] = ("single", "simulated", "dp", "dp-shard-map", "dp-pmap", "fsdp")


def mode_class(name: str) -> type[ParallelMode]:
    """The class of mode ``name``; WorkbenchError listing :data:`MODES` if there is none."""
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown mode {name!r}: choose one of {', '.join(MODES)}")
    return _REGISTRY[name]


def build_mode(name: str, plan: StepPlan) -> ParallelMode:
    """Mode ``name`` for ``plan``, checked: a bad combination raises here, before anything compiles.

    Example:
        >>> build_mode("tp", StepPlan(g, loss, tx, "data=8", 64))  # doctest: +SKIP
        MeshError: mode 'tp' needs a mesh axis 'model', but mesh data=8 has data: use e.g. --mesh model=2
    """
    return mode_class(name)(plan)


def modes_supporting(fault: str) -> tuple[str, ...]:
    """The modes in which teaching fault ``fault`` can be switched on (see :mod:`.faults`).

    Example:
        >>> modes_supporting("skip-sync")
        ('dp-pmap',)
    """
    return tuple(name for name, cls in _REGISTRY.items() if fault in cls.supported_faults)


def describe_modes() -> dict[str, str]:
    """Mode name -> one-line summary, in menu order."""
    return {name: cls.summary for name, cls in _REGISTRY.items()}


__all__ = [
    "DATA_PARALLEL_MODES", "FAULTS", "Fault", "MODES", "PRECISIONS", "ParallelMode", "StepPlan", "TrainState", "build_mode",
    "describe_modes", "mode_class", "modes_supporting",
]
