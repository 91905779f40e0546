"""The registry of parallel modes: each mode's name -> its class, in menu order, and what is asked of it.

The package's ``__init__`` imports every mode and registers it here (:func:`register`). This module imports
no mode, so :mod:`.base` (a mode's check offers another mode that fits the mesh) and :mod:`.faults` (which
modes carry a fault) ask the registry without importing the package that imports them.

Example:
    >>> mode_class("fsdp").state_placement
    'shard'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import WorkbenchError
from ...layout.mesh import parse_mesh

if TYPE_CHECKING:
    from .base import ParallelMode, StepSetup
    from .declaration import MeshFit

_REGISTRY: dict[str, type[ParallelMode]] = {}


def register(*classes: type[ParallelMode]) -> dict[str, type[ParallelMode]]:
    """Add mode classes to the registry, in menu order; returns the registry."""
    for cls in classes:
        _REGISTRY[cls.name] = cls
    return _REGISTRY


def mode_class(name: str) -> type[ParallelMode]:
    """The class of mode ``name``; WorkbenchError listing :data:`~workbench.training.modes.MODES` if there is
    none."""
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown mode {name!r}: choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def build_mode(name: str, setup: StepSetup) -> ParallelMode:
    """Mode ``name`` for ``setup``, checked: a bad combination raises here, before anything compiles.

    Example:
        >>> from workbench.training import StepSetup
        >>> build_mode("tp", StepSetup(graphdef, loss_fn, optimizer, parse_mesh("data=8"), 64))
        Traceback (most recent call last):
        ...
        workbench.errors.MeshError: mode 'tp' needs a mesh axis 'model', but mesh data=8 has data: use e.g. ...
    """
    return mode_class(name)(setup)


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
