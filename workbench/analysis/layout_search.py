"""The layouts a recommendation weighs: the parallel modes worth recommending, the meshes each can use on a fleet,
the remat policies and the microbatch counts, as :class:`LayoutChoice` records (:func:`layout_choices`).

A mode is a candidate family when it compiles ahead (one jit program over a mesh, so the target's compiler can
verify it) and is the first registered mode with its axes and state placement: ``dp-shard-map`` and
``fsdp-whole-tree`` compute what ``dp`` and ``fsdp`` compute, written out by hand for teaching, so they are left
out. A mode registered later (``fsdp-tp``) joins by itself. The chips are factorised into ``data`` x ``model``
with the model axis inside one host (its fast links) and at most :data:`MAX_TENSOR_PARALLEL` ways, dividing the
model's heads; the microbatch counts are :data:`MICROBATCH_CHOICES` that divide each replica's batch; a remat
policy (:func:`remat_choices`) is weighed for a layout the lighter policies do not fit (the recommender asks).

Example:
    >>> candidate_modes()[:3]
    ('dp', 'fsdp', 'tp')
    >>> [str(mesh) for mesh in candidate_meshes(mode_class("dp-tp"), 16, 8)]
    ['data=8,model=2', 'data=4,model=4', 'data=2,model=8']
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import WorkbenchError
from ..layout.mesh import DATA_AXIS, MODEL_AXIS, MeshShape
from ..training.models import model_class
from ..training.modes import MODES, mode_class
from ..training.step import validate_compiles_ahead

# Tensor parallelism beyond this splits a 1-2k wide layer into slivers whose all-reduces outweigh their maths
# (the scaling book keeps TP within 8-16 chips); on a GPU fleet the host's NVLink domain (8) is the tighter limit.
MAX_TENSOR_PARALLEL = 16
MICROBATCH_CHOICES = (1, 2, 4, 8, 16)
# Least recomputation first: a policy is only weighed for a layout the one before it does not fit.
REMAT_ORDER = ("none", "dots", "block")


@dataclasses.dataclass(frozen=True)
class LayoutChoice:
    """One layout to weigh: a mode on a mesh, a remat policy and the microbatches per step (``accum``)."""

    mode: str
    mesh: MeshShape
    remat: str = "none"
    accum: int = 1

    def __str__(self) -> str:
        remat = "" if self.remat == "none" else f", remat {self.remat}"
        return f"{self.mode} on {self.mesh}{remat}, {self.accum} microbatch{'es' if self.accum > 1 else ''}"


def candidate_modes() -> tuple[str, ...]:
    """The registered modes a recommendation weighs, in menu order (see the module docstring for which and why)."""
    chosen: dict[tuple, str] = {}
    for name in MODES:
        cls = mode_class(name)
        try:
            validate_compiles_ahead(cls)
        except WorkbenchError:
            continue
        if not cls.one_device:
            chosen.setdefault((tuple(cls.axes), cls.state_placement), name)
    return tuple(chosen.values())


def remat_choices(model: Any) -> tuple[str, ...]:
    """The remat policies to weigh for ``model`` (a registered model's name, or your own module), least
    recomputation first: the model's own (:attr:`~workbench.training.models.RegisteredModel.REMAT_POLICIES`), none
    for your own module (the workbench applies policies to its transformer's blocks only).

    Example:
        >>> remat_choices("transformer"), remat_choices("mlp")
        (('none', 'dots', 'block'), ('none',))
    """
    if not isinstance(model, str):
        return ("none",)
    declared = model_class(model).REMAT_POLICIES
    return tuple(policy for policy in REMAT_ORDER if policy in declared) + tuple(
        policy for policy in declared if policy not in REMAT_ORDER)


def candidate_meshes(mode: type, devices: int, max_model: int, heads: int | None = None) -> list[MeshShape]:
    """The meshes of ``devices`` chips that ``mode`` (its class) splits along all of its axes: ``data=N`` for
    data parallelism, ``model=N`` for tensor parallelism, ``data x model`` for both, with ``model`` at most
    ``max_model`` and dividing ``heads`` (the attention heads, when the model has them).

    Example:
        >>> [str(mesh) for mesh in candidate_meshes(mode_class("tp"), 8, 8, heads=4)]
        []
    """
    axes = set(mode.axes)
    model_sizes = [m for m in range(2, min(devices, max_model) + 1)
                   if devices % m == 0 and (heads is None or heads % m == 0)]
    if axes == {DATA_AXIS}:
        return [MeshShape((DATA_AXIS,), (devices,))] if devices > 1 else []
    if axes == {MODEL_AXIS}:
        return [MeshShape((MODEL_AXIS,), (devices,))] if devices in model_sizes else []
    if axes == {DATA_AXIS, MODEL_AXIS}:
        return [MeshShape((DATA_AXIS, MODEL_AXIS), (devices // m, m)) for m in model_sizes if devices // m > 1]
    return []


def microbatch_choices(global_batch: int, data_parallel: int) -> tuple[int, ...]:
    """The microbatch counts of :data:`MICROBATCH_CHOICES` that split ``global_batch`` evenly over
    ``data_parallel`` replicas.

    Example:
        >>> microbatch_choices(64, 16)
        (1, 2, 4)
    """
    return tuple(accum for accum in MICROBATCH_CHOICES if global_batch % (data_parallel * accum) == 0)


def layout_choices(model: Any, devices: int, global_batch: int, max_model: int,
                   heads: int | None = None) -> tuple[list[LayoutChoice], dict[str, str]]:
    """Every :class:`LayoutChoice` for ``devices`` chips and ``global_batch`` sequences, and, per candidate mode
    that has none, why (its one line).

    Example:
        >>> choices, why_not = layout_choices("mlp", 8, 64, 8)
        >>> len(choices) > 8, sorted(why_not)
        (True, [])
    """
    choices: list[LayoutChoice] = []
    why_not: dict[str, str] = {}
    for name in candidate_modes():
        cls = mode_class(name)
        meshes = candidate_meshes(cls, devices, max_model, heads)
        if not meshes:
            why_not[name] = _no_mesh(cls, devices, max_model, heads)
            continue
        found = False
        for mesh in meshes:
            replicas = mesh.axis_size(DATA_AXIS) if DATA_AXIS in mesh.names else 1
            for accum in microbatch_choices(global_batch, replicas):
                choices.append(LayoutChoice(name, mesh, "none", accum))  # other policies when it does not fit
                found = True
        if not found:
            replicas = min(m.axis_size(DATA_AXIS) for m in meshes)
            why_not[name] = (f"{name}: a batch of {global_batch} does not split over {replicas} data-parallel "
                             f"replicas or more")
    return choices, why_not


def _no_mesh(mode: type, devices: int, max_model: int, heads: int | None) -> str:
    if set(mode.axes) == {MODEL_AXIS}:
        if devices > max_model:
            why = f"layers split at most {max_model} ways here (within a host's fast links)"
        else:
            why = f"the model's {heads} attention heads do not split {devices} ways"
        return f"{mode.name} on {devices:,} chips: one 'model' axis of {devices:,}, but {why}"
    return f"{mode.name}: no {' x '.join(mode.axes)} mesh of {devices:,} chips fits its axes"


__all__ = [
    "MAX_TENSOR_PARALLEL", "MICROBATCH_CHOICES", "REMAT_ORDER", "LayoutChoice", "candidate_meshes", "candidate_modes",
    "layout_choices", "microbatch_choices", "remat_choices",
]
