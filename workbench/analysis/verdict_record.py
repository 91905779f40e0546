"""The verdict's record, and its ``error`` level: what nothing runs, judged without planning anything.

:func:`refusal` asks what the trainer, Check and Verify all refuse before anything is compiled (a mode the
mesh cannot carry, a batch that does not split, a model with no layer pair to split), in their words and
with fixes. Verification checks a config with it; :func:`~.verdict.training_verdict` starts with it and then
judges this machine's devices and memory, which plans the step (:mod:`.planning`), which may verify.

Example:
    >>> refusal(TrainConfig(mode="tp", mesh="data=8").resolved()).fixes[0].label
    'use mode dp'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import WorkbenchError
from ..training.config import ResolvedConfig
from ..training.models import MODELS, model_config, tensor_parallel_rules
from ..training.modes import MeshFit, MeshFix, mesh_fit
from ..training.modes.base import MODEL_SPLIT_PLACEMENTS, StepSetup

LEVELS = ("ok", "warning", "plan", "error")


@dataclasses.dataclass(frozen=True)
class TrainingVerdict:
    """Whether a config trains on this machine: ``level`` (see :data:`LEVELS`), a one-line ``message``, the
    ``fixes`` to offer (each a :class:`~workbench.training.MeshFix`: another mode, mesh or batch), and ``notes``: what
    else holds (e.g. a mesh that is both larger than the machine and wasteful for the mode)."""

    level: str
    message: str
    fixes: tuple[MeshFix, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def trains(self) -> bool:
        """Whether Start trains it here (``ok`` or ``warning``)."""
        return self.level in ("ok", "warning")

    @property
    def plans(self) -> bool:
        """Whether it can be planned and verified (every level but ``error``)."""
        return self.level != "error"

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "trains": self.trains, "plans": self.plans, "message": self.message,
                "fixes": [dataclasses.asdict(fix) for fix in self.fixes], "notes": list(self.notes)}


def refusal(resolved: ResolvedConfig, fit: MeshFit | None = None) -> TrainingVerdict | None:
    """The ``error`` verdict on ``resolved`` (a :class:`~workbench.training.config.ResolvedConfig`): the mode
    against the mesh (``fit``, where the caller judged it already), then the mode's own check of the batch and the
    model; None when nothing refuses it."""
    fit = mesh_fit(resolved.mode_class, resolved.mesh_shape) if fit is None else fit
    if not fit.ok:
        return TrainingVerdict("error", fit.message, fit.fixes)
    try:
        return _step_refusal(resolved)
    except WorkbenchError as error:  # e.g. a model option the model does not have
        return TrainingVerdict("error", str(error))


def _step_refusal(resolved: ResolvedConfig) -> TrainingVerdict | None:
    """What the mode's own check refuses before compiling (a batch that does not split into the data axis's
    parts and the microbatches, a model with no layer pair to split), in the trainer's words, with fixes."""
    config, declared, mesh = resolved.config, resolved.mode_class, resolved.mesh_shape
    tp_rules = ()
    if declared.state_placement in MODEL_SPLIT_PLACEMENTS and config.model in MODELS:
        tp_rules = tuple(tensor_parallel_rules(config.model, options=model_config(config.model,
                                                                               **config.model_options).options))
    elif declared.state_placement in MODEL_SPLIT_PLACEMENTS:
        tp_rules = (("your own model", "its rules"),)  # your module brings its rules: the trainer checks them
    try:
        declared.validate(StepSetup(None, None, None, mesh, config.batch, config.accum, tp_rules=tp_rules))
    except WorkbenchError as error:
        unit = declared.batch_parts(mesh) * config.accum
        fixes = batch_fixes(config.batch, unit) if config.batch % unit else (MeshFix("use mode dp", mode="dp"),)
        return TrainingVerdict("error", str(error), fixes)
    return None


def batch_fixes(batch: int, unit: int) -> tuple[MeshFix, ...]:
    """A fix per multiple of ``unit`` next to ``batch`` (the one below first, if there is one).

    Example:
        >>> [fix.batch for fix in batch_fixes(100, 8)]
        [96, 104]
    """
    lower, upper = batch // unit * unit, -(-batch // unit) * unit
    return tuple(MeshFix(f"use batch {size}", batch=size) for size in dict.fromkeys((lower, upper)) if size)


__all__ = ["LEVELS", "TrainingVerdict", "batch_fixes", "refusal"]
