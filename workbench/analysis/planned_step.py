"""The real step a plan describes, as the trainer would resolve it, and its memory per device simulated from its
jaxpr (:mod:`.step_memory`): once per model, options, mode, mesh, batch and precision for a registered model.

Example:
    >>> from workbench.layout.mesh import parse_mesh
    >>> from workbench.training.models import model_class
    >>> from workbench.training.modes import mode_class
    >>> step = step_config("mlp", {}, mode_class("dp"), parse_mesh("data=8"), 64, "bf16", "adamw", model_class("mlp"))
    >>> step.config.mesh, step.mode_class.name
    ('data=8', 'dp')
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import WorkbenchError
from ..layout.mesh import MeshShape
from ..training.config import ResolvedConfig, TrainConfig
from ..training.models import model_class
from ..training.step import CustomModel, validate_compiles_ahead
from .compiler_rules import CompilerRules
from .planned_model import PlannedModel
from .step_memory import NotSimulated, StepMemory, planned_step_memory


def simulated_memory(planned: PlannedModel, declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                     precision: str, optimizer: str, custom_rules: Any, loss: Any, example_batch: Any,
                     compiler: CompilerRules, accum: int = 1,
                     remat: str = "none") -> tuple[StepMemory | None, str | None]:
    """(the step's simulated :class:`~.step_memory.StepMemory`, None) or (None, why it is not modelled)."""
    try:
        return _simulate_memory(planned, declared, mesh, batch, seq_len, precision, optimizer, custom_rules, loss,
                                example_batch, compiler, accum, remat)
    except NotSimulated as reason:
        return None, str(reason)
    except WorkbenchError as error:
        if custom_rules is None:
            raise
        # The plan lays out what it can of your table; a step that cannot be traced with it is the plan's alone.
        return None, f"the step could not be traced with your rule table: {error}"


def _simulate_memory(planned: PlannedModel, declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                     precision: str, optimizer: str, custom_rules: Any, loss: Any, example_batch: Any,
                     compiler: CompilerRules, accum: int, remat: str) -> tuple[StepMemory | None, str | None]:
    try:
        validate_compiles_ahead(declared)
    except WorkbenchError:
        return None, f"mode {declared.name!r} is not one jit program, so there is no single step to simulate"
    if planned.registered and custom_rules is not None:  # the mode's step on your table's layout (not cached)
        config = step_config(planned.name, dict(planned.options), declared, mesh, batch, precision, optimizer,
                             model_class(planned.name), accum, remat)
        return planned_step_memory(config, seq_len=seq_len, compiler=compiler, state_rules=custom_rules), None
    if planned.registered:
        key = (planned.name, tuple(sorted(planned.options.items())), declared, mesh, batch, seq_len, precision,
               optimizer, compiler.kind, accum, remat)
        try:
            hash(key)
        except TypeError:  # an option value that cannot be a key: simulate afresh
            return _registered_memory.__wrapped__(*key), None
        return _registered_memory(*key), None
    if example_batch is None:
        return None, (f"your {planned.name}'s step needs the shapes of its input to be traced: pass "
                      "example_batch=<a batch of its input> (and loss=fn unless it has a loss method)")
    if loss is None and not hasattr(type(planned.abstract), "loss"):
        raise WorkbenchError(f"your {planned.name} has no loss method: pass loss=fn with fn(model, batch) -> "
                             "(loss, aux) to simulate its step")
    config = step_config(f"custom:{planned.name}", {}, declared, mesh, batch, precision, optimizer, None, accum)
    # Your table is also the tensor-parallel rules a mode that splits over 'model' asks for (the same layout).
    pairs = () if custom_rules is None else tuple((rule.pattern, rule.spec) for rule in custom_rules.rules)
    custom = CustomModel(planned.abstract, loss, batches=(), tp_rules=pairs)
    return planned_step_memory(config, custom=custom, example_batch=example_batch, compiler=compiler,
                               state_rules=custom_rules), None


@functools.lru_cache(maxsize=32)
def _registered_memory(name: str, options: tuple, declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                       precision: str, optimizer: str, compiler: str, accum: int = 1,
                       remat: str = "none") -> StepMemory:
    """A registered model's simulated step memory, once per model, options, mode, mesh, batch, precision,
    microbatch count and remat policy."""
    config = step_config(name, dict(options), declared, mesh, batch, precision, optimizer, model_class(name), accum,
                         remat)
    return planned_step_memory(config, seq_len=seq_len, compiler=compiler)


def step_config(model: str, options: dict, declared: type, mesh: MeshShape, batch: int, precision: str,
                optimizer: str, model_cls: type | None, accum: int = 1, remat: str = "none") -> ResolvedConfig:
    """The step :func:`~.planning.plan_training` simulates, as the resolved record the trainer's would be: built
    from what the planner has checked and parsed already (mode, mesh, batch, precision, optimizer, microbatches,
    remat), not from text again. ``model_cls``: the registered model's class; None for your own."""
    config = TrainConfig(model=model, model_options=options, mode=declared.name, mesh=str(mesh), batch=batch,
                         precision=precision, optimizer=optimizer, accum=accum, remat=remat)
    return ResolvedConfig(config, mesh, declared, model_cls)


__all__ = ["simulated_memory", "step_config"]
