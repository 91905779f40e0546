"""What a parallel mode declares about itself, as plain records: the one source every other part asks.

A mode class states its mesh axes, where the batch and the state go, how gradients are combined and
which collectives a step runs (:class:`CollectiveNeed`). The planner prices those collectives, the
ledger's theory lists them, the widgets explain them and :func:`fit_mesh` judges a mesh with them, so
none of these facts is written twice.

Example:
    >>> fit = fit_mesh("dp", ("data",), other_axes="replicate", mesh="data=4,model=2", example="data=8")
    >>> fit.level, [fix.label for fix in fit.fixes]
    ('warning', ['use mesh data=8'])
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from ...layout.mesh import MeshShape, parse_mesh

# What a collective carries, and whether its size per device is simply the parameter bytes. Sizes as in
# the ledger: the whole array one device contributes or receives (see workbench.analysis.ledger).
CARRIES: dict[str, str] = {
    "gradients": "every parameter's gradient, whole (the state is replicated over the axis)",
    "sharded-parameters": "the parameters split over the axis, gathered whole to compute",
    "regathered-parameters": "the same parameters, gathered again for the backward pass",
    "sharded-gradients": "the gradients of those parameters, summed, each device keeping its shard",
    "whole-gradients": "the gradients of the parameters not split over the axis, and the loss",
    "activations": "layer outputs after each row-parallel layer",
}
# Upper bounds for "regathered-parameters": the last layer a forward pass calls keeps its parameters for its backward
# pass (the planner leaves it out: planned_collectives.py), and a layer whose backward pass reads none of its
# parameters (an embedding lookup, or a first layer whose input needs no gradient) is not gathered again either.
PARAM_SIZED = ("gradients", "sharded-parameters", "regathered-parameters", "sharded-gradients")


@dataclasses.dataclass(frozen=True)
class CollectiveNeed:
    """One kind of collective a mode's step runs, in theory.

    Attributes:
        kind: ``all-reduce``, ``all-gather`` or ``reduce-scatter``.
        axis: the mesh axis its groups span.
        carries: what moves (a key of :data:`CARRIES`); the planner sizes it from the layout.
        what: the same in words, for menus and tables.

    Example:
        >>> CollectiveNeed("all-reduce", "data", "gradients", "gradients").theory_bytes(1000)
        1000
    """

    kind: str
    axis: str
    carries: str
    what: str

    def __post_init__(self):
        if self.carries not in CARRIES:
            raise ValueError(f"carries={self.carries!r} is not one of {', '.join(CARRIES)}")

    def theory_bytes(self, param_bytes: int) -> int | None:
        """Bytes per device per occurrence from the parameter bytes alone; None where the layout or the
        batch decides (activations, or the leaves a split leaves whole)."""
        return param_bytes if self.carries in PARAM_SIZED else None

    def to_json(self, param_bytes: int | None = None) -> dict[str, Any]:
        size = None if param_bytes is None else self.theory_bytes(param_bytes)
        return {"kind": self.kind, "axes": [self.axis], "carries": self.carries, "what": self.what,
                "bytes": size}


@dataclasses.dataclass(frozen=True)
class MeshFix:
    """A one-click fix for a run that cannot train as it is: another ``mode``, ``mesh`` (text) or global ``batch``."""

    label: str
    mode: str | None = None
    mesh: str | None = None
    batch: int | None = None


OTHER_AXES = {
    "replicate": "devices along other mesh axes hold identical copies and compute the same work",
    "ignore": "it computes on one device: other axes are ignored",
    "refuse": "it cannot run on a mesh with other axes",
}
LEVELS = ("ok", "warning", "error")


@dataclasses.dataclass(frozen=True)
class MeshFit:
    """Whether a mode trains on a mesh, as a verdict: ``level`` is ``ok``, ``warning`` (it trains, but
    some devices only repeat others' work) or ``error`` (it cannot train); a one-line ``message`` naming
    the mode and the mesh (for ``error``, the trainer's own error); and the ``fixes`` to offer.
    """

    mode: str
    mesh: MeshShape
    level: str
    message: str
    fixes: tuple[MeshFix, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the mode can train on the mesh (``ok`` or ``warning``)."""
        return self.level != "error"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "mesh": self.mesh.axes, "level": self.level, "ok": self.ok,
                "message": self.message, "fixes": [dataclasses.asdict(fix) for fix in self.fixes]}


def reshaped_mesh(axes: tuple[str, ...], devices: int, example: str) -> str:
    """``devices`` arranged over ``axes`` (a 2-D mesh keeps the example's last size), else ``example``.

    Example:
        >>> reshaped_mesh(("data",), 8, "data=8"), reshaped_mesh(("data", "model"), 8, "data=4,model=2")
        ('data=8', 'data=4,model=2')
    """
    if len(axes) == 1:
        return f"{axes[0]}={devices}"
    sizes = example_shape(example).axes
    inner = math.prod(sizes[a] for a in axes[1:])
    if devices % inner or devices // inner < 1 or devices == inner:
        return example
    return ",".join([f"{axes[0]}={devices // inner}", *(f"{a}={sizes[a]}" for a in axes[1:])])


@functools.cache
def example_shape(example: str) -> MeshShape:
    """A mode's declared ``mesh_example``, read once (at registration, :func:`~.base.validate_declaration`): it is
    a constant of the class, not input, and is asked each time a mesh is judged.

    Example:
        >>> example_shape("data=4,model=2").axes
        {'data': 4, 'model': 2}
    """
    return parse_mesh(example)


def mesh_fixes(axes: tuple[str, ...], shape: MeshShape, example: str,
               alternative: str | None) -> tuple[str, tuple[MeshFix, ...], str]:
    """For a mesh a mode cannot use: the same devices arranged for the mode's ``axes`` (``example``'s layout), the
    fixes to offer (``alternative``, a mode that uses the mesh as it is, first), and the advice in words.

    Example:
        >>> target, fixes, instead = mesh_fixes(("data", "model"), parse_mesh("data=8"), "data=4,model=2", "dp")
        >>> target, instead
        ('data=4,model=2', "use mode 'dp', or mesh data=4,model=2")
    """
    target = reshaped_mesh(axes, shape.size, example) if axes else example  # the same devices, arranged for the mode
    fixes = ((MeshFix(f"use mode {alternative}", mode=alternative),) if alternative else ()) + (
        MeshFix(f"use mesh {target}", mesh=target),)
    instead = f"use mode {alternative!r}, or mesh {target}" if alternative else f"use mesh {target}"
    return target, fixes, instead


def fit_mesh(mode: str, axes: tuple[str, ...], *, other_axes: str, mesh: Any, example: str,
             alternative: str | None = None) -> MeshFit:
    """Judge ``mesh`` for a mode that uses ``axes`` and does ``other_axes`` (a key of :data:`OTHER_AXES`)
    with the rest (see :meth:`ParallelMode.fit_mesh`).

    Every axis the mode uses must exist. Devices along other axes (size > 1) are an error for a mode that
    refuses them, and a warning for one that replicates over them: they repeat the same work, which real
    jobs sometimes accept but a user should see. ``alternative`` is a mode that uses the whole mesh,
    offered as the first fix.
    """
    shape = parse_mesh(mesh)
    missing = [axis for axis in axes if axis not in shape.names]
    idle = {n: s for n, s in shape.axes.items() if n not in axes and s > 1}
    target, fixes, instead = mesh_fixes(axes, shape, example, alternative)
    if missing:
        message = (f"mode {mode!r} needs a mesh axis {missing[0]!r}, but mesh {shape} has {', '.join(shape.names)}: "
                   f"use e.g. --mesh {target}")
        return MeshFit(mode, shape, "error", message, fixes)
    if idle and other_axes == "refuse":
        name, size = next(iter(idle.items()))
        message = (f"mode {mode!r} uses only mesh axes {', '.join(repr(a) for a in axes)}, but mesh {shape} also "
                   f"splits {size} devices over {name!r}: {instead}")
        return MeshFit(mode, shape, "error", message, fixes)
    if idle and other_axes == "replicate":
        names = " x ".join(f"{n}={s}" for n, s in idle.items())
        message = (f"mode {mode!r} uses only {', '.join(repr(a) for a in axes)}: the {names} devices hold "
                   f"{math.prod(idle.values())} identical copies and compute the same work; {instead} to use them")
        return MeshFit(mode, shape, "warning", message, fixes)
    note = f"; the other {shape.size - 1:,} devices stay idle" if other_axes == "ignore" and shape.size > 1 else ""
    return MeshFit(mode, shape, "ok", f"mode {mode!r} trains on mesh {shape}{note}")


__all__ = [
    "CARRIES", "LEVELS", "OTHER_AXES", "CollectiveNeed", "MeshFit", "MeshFix", "example_shape", "fit_mesh",
    "mesh_fixes", "reshaped_mesh",
]
