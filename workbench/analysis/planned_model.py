"""The model a plan is for, resolved once: a registered model's name and options, or your own ``nnx.Module``,
as an abstract module (nothing allocated) with the traits its class declares.

Example:
    >>> planned = resolve_planned_model("transformer", {"n_layers": 2}, None, notes=[])
    >>> planned.reads_sequences, planned_seq_len(planned, None)
    (True, 128)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from flax import nnx

from ..errors import WorkbenchError
from ..layout.mesh import MODEL_AXIS
from ..layout.rules import RuleTable
from ..training.modes.base import MODEL_SPLIT_PLACEMENTS
from ..training.models import (
    MODELS,
    RegisteredModel,
    abstract_model,
    has_tensor_parallel_layers,
    model_class,
    model_config,
    parse_model_options,
    tensor_parallel_rules,
)


@dataclasses.dataclass(frozen=True)
class PlannedModel:
    """The model being planned, resolved once: its name, preset overrides and abstract module.

    Attributes:
        name: the registered model's name, or your module's class name.
        options: the overrides of a registered model's preset ({} for your own).
        resolved: every option of a registered model's preset, overrides applied ({} for your own).
        abstract: the module, with ``ShapeDtypeStruct`` parameters.
        model_class: the registered model's class, whose traits the planner reads; None for your own.
    """

    name: str
    options: dict[str, Any]
    resolved: dict[str, Any]
    abstract: Any
    model_class: type[RegisteredModel] | None

    @property
    def registered(self) -> bool:
        return self.model_class is not None

    @property
    def transformer_estimates(self) -> bool:
        """Whether FLOPs, activations and tensor-parallel all-reduces follow the transformer's formulas."""
        return self.model_class is not None and self.model_class.TRANSFORMER_ESTIMATES

    @property
    def reads_sequences(self) -> bool:
        """Whether a registered model reads sequences (its tokens per sequence are bounded by an option)."""
        return self.model_class is not None and self.model_class.SEQUENCE_OPTION is not None


def resolve_planned_model(model: Any, model_options: Any, seq_len: int | None, notes: list[str]) -> PlannedModel:
    """A registered model's name and options, or your own module, as one record (abstract: nothing allocated).

    Your own module's estimates are rough, and ``notes`` says so.
    """
    if isinstance(model, str):
        cls = model_class(model)  # unknown name: the registry's own message, listing the models
        if isinstance(model_options, str):
            options = parse_model_options(model_options, model)
        else:
            options = dict(model_options or {})
        return PlannedModel(model, options, model_config(model, **options).options,
                            _registered_abstract_model(model, options), cls)
    abstract = own_model(model, model_options)
    name = type(abstract).__name__
    notes.append(f"compute of your {name} is estimated as 6 FLOPs per parameter per "
                 f"{'token' if seq_len else 'example'}; its activations are not estimated")
    return PlannedModel(name, {}, {}, abstract, None)


def own_model(model: Any, model_options: Any) -> Any:
    """A user's ``nnx.Module`` (instance, or a builder traced with ``nnx.eval_shape``), checked."""
    if model_options:
        raise WorkbenchError(
            f"model_options {model_options!r} apply to registered models only: build your own model with its "
            "options instead and pass model_options=None"
        )
    if not isinstance(model, nnx.Module):
        if not callable(model):
            raise WorkbenchError(
                f"model {model!r} is neither a registered model's name nor an nnx.Module: pass a name such as "
                "'transformer', your module, or a function that builds it (lambda: MyModel(..., rngs=nnx.Rngs(0)))"
            )
        model = nnx.eval_shape(model)
        if not isinstance(model, nnx.Module):
            raise WorkbenchError(f"the model builder returned {type(model).__name__}, not an nnx.Module")
    if not jax.tree.leaves(nnx.state(model, nnx.Param)):
        raise WorkbenchError(f"model {type(model).__name__} has no nnx.Param leaves: there is nothing to plan")
    return model


def _registered_abstract_model(name: str, options: dict[str, Any]) -> Any:
    """A registered model's abstract module, traced once per name and options (planning only reads it), so
    re-planning it on another mesh or mode skips the trace (0.3 s for a 65B model)."""
    key = tuple(sorted((k, type(v).__name__, v) for k, v in options.items()))
    try:
        hash(key)
    except TypeError:  # an option value that cannot be a key: trace afresh
        return _traced_model.__wrapped__(name, key)
    return _traced_model(name, key)


@functools.lru_cache(maxsize=8)
def _traced_model(name: str, key: tuple) -> Any:
    return abstract_model(name, **{k: v for k, _, v in key})


def whole_seq_len(seq_len: Any) -> int | None:
    """``seq_len`` checked: None, or a whole number >= 1."""
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise WorkbenchError(f"seq_len {seq_len!r} must be a whole number >= 1: use e.g. --seq-len 1024")
    return seq_len


def planned_seq_len(planned: PlannedModel, seq_len: int | None) -> int | None:
    """Tokens per sequence: a registered model's sequence bound (its ``SEQUENCE_OPTION``) by default, None for
    models without sequences; your own model reads sequences only if you say so (then compute counts tokens)."""
    if planned.model_class is None:
        return whole_seq_len(seq_len)
    option = planned.model_class.SEQUENCE_OPTION
    if option is None:
        if seq_len is not None:
            raise WorkbenchError(
                f"model {planned.name!r} reads no sequences: drop --seq-len (it is for the transformer)"
            )
        return None
    longest = planned.resolved[option]
    if seq_len is None:
        return longest
    whole_seq_len(seq_len)
    if seq_len > longest:
        raise WorkbenchError(
            f"seq_len {seq_len} exceeds the model's {option}={longest}: add {option}={seq_len} to "
            "--config (positions are computed, so it adds no parameters)"
        )
    return seq_len


def planned_tensor_parallel_rules(declared: type, planned: PlannedModel, custom_rules: RuleTable | None) -> list:
    """The model's tensor-parallel rules when mode ``declared`` splits layers over 'model' (and you gave no table)."""
    if declared.state_placement not in MODEL_SPLIT_PLACEMENTS or custom_rules is not None:
        return []
    tp_rules = tensor_parallel_rules(planned.name, MODEL_AXIS, planned.resolved) if planned.registered else []
    if not tp_rules:
        splittable = [name for name in MODELS if has_tensor_parallel_layers(name)]
        raise WorkbenchError(
            f"mode {declared.name!r} splits layers over the 'model' axis, but model {planned.name!r} has no splittable "
            f"layer pair: choose {', '.join(splittable[:-1])} or {splittable[-1]}, pass rules=[(regex, spec), ...] "
            "for your own model, or plan a data-parallel mode"
        )
    return tp_rules


__all__ = ["PlannedModel", "own_model", "planned_seq_len", "planned_tensor_parallel_rules", "resolve_planned_model",
           "whole_seq_len"]
