"""Parallel modes: one small module each, all with the same shape (see :mod:`.base`).

========================  ==================================================================
``single``                one device, the reference
``simulated``             one device, a Python loop over N shards, one update
``dp``                    jit, batch sharded, state replicated; the compiler all-reduces
``dp-shard-map``          shard_map with an explicit, correct pmean
``dp-pmap``               legacy pmap with stacked replicas
``fsdp``                  parameters and optimizer state sharded over ``data``, gathered layer by layer
``fsdp-whole-tree``       the same, the whole parameter tree gathered at once (ZeRO-3 written out)
``tp``                    layers split over ``model``
``dp-tp``                 2-D ``data x model``
========================  ==================================================================

Every mode computes the same update as ``single`` on the same global batch (tested to 1e-5).

Example:
    >>> mode = build_mode("dp", StepPlan(graphdef, loss_fn, optax.sgd(0.1), parse_mesh("data=8"), 64))  # doctest: +SKIP
    >>> state, metrics = mode.step(mode.place_state(state), mode.place_batch(batch))  # doctest: +SKIP
"""

from __future__ import annotations

from ...errors import WorkbenchError
from ...layout.mesh import MODEL_AXIS, parse_mesh
from .base import ParallelMode, StepPlan, check_declaration
from .core import PRECISIONS, TrainState
from .declaration import CollectiveNeed, MeshFit, MeshFix
from .dp import DataParallel
from .dp_pmap import PmapDataParallel
from .dp_shard_map import ShardMapDataParallel
from .dp_tp import DataTensorParallel
from .faults import FAULTS, Fault
from .fsdp import FullyShardedDataParallel
from .fsdp_whole_tree import WholeTreeShardedDataParallel
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
        WholeTreeShardedDataParallel,
        TensorParallel,
        DataTensorParallel,
    )
}
for _cls in _REGISTRY.values():
    check_declaration(_cls)  # a mode that leaves a fact undeclared fails at import, naming it

MODES: tuple[str, ...] = tuple(_REGISTRY)
# The modes that split only the batch (and perhaps the state) over 'data': no layer is split.
DATA_PARALLEL_MODES: tuple[str, ...] = tuple(name for name, cls in _REGISTRY.items() if MODEL_AXIS not in cls.axes)


def mode_class(name: str) -> type[ParallelMode]:
    """The class of mode ``name``; WorkbenchError listing :data:`MODES` if there is none."""
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown mode {name!r}: choose one of {', '.join(MODES)}")
    return _REGISTRY[name]


def build_mode(name: str, plan: StepPlan) -> ParallelMode:
    """Mode ``name`` for ``plan``, checked: a bad combination raises here, before anything compiles.

    Example:
        >>> build_mode("tp", StepPlan(g, loss, tx, parse_mesh("data=8"), 64))  # doctest: +SKIP
        MeshError: mode 'tp' needs a mesh axis 'model', but mesh data=8 has data: use e.g. --mesh model=8
    """
    return mode_class(name)(plan)


def mesh_fit(mode: str | type[ParallelMode], mesh) -> MeshFit:
    """Whether ``mode`` (a name, or a mode's class where the name was resolved already) trains on ``mesh``
    (any size: only the axes are judged), with one-click fixes.

    The fixes are a mode that uses exactly the mesh's split axes, if one exists, and the same number of
    devices arranged over the axes ``mode`` uses. Trainer, planner and widgets all ask this.

    Example:
        >>> fit = mesh_fit("dp", "data=4,model=2")
        >>> fit.ok, fit.level, [(f.mode, f.mesh) for f in fit.fixes]
        (True, 'warning', [('dp-tp', None), (None, 'data=8')])
    """
    declared = mode if isinstance(mode, type) else mode_class(mode)
    shape = parse_mesh(mesh)
    split = {name for name, size in shape.axes.items() if size > 1}
    alternative = next((name for name, cls in _REGISTRY.items()
                        if not cls.one_device and set(cls.axes) == split and name != declared.name), None)
    return declared.fit_mesh(shape, alternative)


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
    "DATA_PARALLEL_MODES", "FAULTS", "CollectiveNeed", "Fault", "MODES", "MeshFit", "MeshFix", "PRECISIONS",
    "ParallelMode", "StepPlan", "TrainState", "build_mode", "describe_modes", "mesh_fit", "mode_class",
    "modes_supporting",
]
