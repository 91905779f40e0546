"""Assertions that hold a training step to its layout and its budget, for a user's CI: every parameter keeps its
spec (:func:`assert_layout`), and the compiled step's peak memory and collective bytes stay within a margin of
today's (:func:`assert_step_budget`). The test file :func:`~.layout_export.budget_test_code` writes calls both;
a user's own tests can too. A broken budget raises ``AssertionError`` naming the figure, the budget and the fix.

Example:
    >>> config = TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64)
    >>> specs = layout_specs(config)
    >>> assert_layout(config, specs)  # the layout the mode gives today: nothing to say
"""

from __future__ import annotations

from typing import Any

from ..formatting import format_bytes
from ..layout.specs import format_spec
from ..training.config import resolve_config
from .compiled_step import CompiledStep
from .planning import plan_training
from .training_plan import TrainingPlan

DEFAULT_MARGIN = 0.05
REGENERATE = ("if the change is intended, write the budget again: workbench recommend ... --export-test FILE, or "
              "update the figures in the test")


def layout_specs(config: Any, *, seq_len: int | None = None) -> dict[str, str]:
    """Parameter path -> the spec (as text) that ``config``'s mode gives it on its mesh: a
    :class:`~workbench.TrainConfig` of a registered model (laid out abstractly, any mesh size), or a
    :class:`~.training_plan.TrainingPlan` (your own module's, or any model's with your rules: the plan's specs).

    Example:
        >>> layout_specs(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64))["hidden1/kernel"]
        'P()'
    """
    if isinstance(config, TrainingPlan):
        return {path: format_spec(spec) for path, spec in config.specs.items()}
    config = resolve_config(config).config
    plan = plan_training(config.model, dict(config.model_options), config.mesh, config.mode, optimizer=config.optimizer,
                         global_batch=config.batch, seq_len=seq_len, precision=config.precision, accum=config.accum,
                         simulate=False)
    return layout_specs(plan)


def assert_layout(config: Any, expected: dict[str, str], *, seq_len: int | None = None) -> None:
    """Raise ``AssertionError`` unless every parameter of ``config``'s model (a config or a plan, as
    :func:`layout_specs` takes) keeps the spec in ``expected`` (path -> spec text, as :func:`layout_specs` gives),
    naming each one that moved, appeared or went.

    Example:
        >>> fsdp_specs = layout_specs(TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64))
        >>> assert_layout(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64), fsdp_specs)
        Traceback (most recent call last):
        ...
        AssertionError: the layout of mlp in dp on data=8 changed: hidden1/bias is P() (was data); ...
    """
    if not isinstance(config, TrainingPlan):
        config = resolve_config(config).config
    today = layout_specs(config, seq_len=seq_len)
    changes = [f"{path} is {today[path]} (was {spec})" for path, spec in expected.items()
               if path in today and today[path] != spec]
    changes += [f"{path} is gone (was {spec})" for path, spec in expected.items() if path not in today]
    changes += [f"{path} is new ({spec})" for path, spec in today.items() if path not in expected]
    if changes:
        raise AssertionError(f"the layout of {config.model} in {config.mode} on {config.mesh} changed: "
                             f"{'; '.join(changes)}; {REGENERATE}")


def assert_step_budget(compiled: CompiledStep, *, peak_bytes: int, collective_bytes: dict[str, int],
                       margin: float = DEFAULT_MARGIN) -> None:
    """Raise ``AssertionError`` when the compiled step (a :class:`~.compiled_step.CompiledStep`, e.g. from
    :func:`~.verification.verify_step`) needs more than ``margin`` above ``peak_bytes`` per device, or sends more
    than ``margin`` above ``collective_bytes[kind]`` per step in a kind of collective, or a kind the budget lacks.

    Example:
        >>> step = CompiledStep("cpu", "cpu", "data=8", 100, 100, 100, 50, 0, None, None, 0.0, 0.0, ())
        >>> assert_step_budget(step, peak_bytes=140, collective_bytes={})
        Traceback (most recent call last):
        ...
        AssertionError: peak memory per device: 150 B is above the budget of 147 B (140 B + 5%); ...
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
        raise AssertionError(f"margin={margin!r} must be a fraction >= 0: use e.g. margin=0.05 (5%)")
    broken = []
    limit = int(peak_bytes * (1 + margin))
    if compiled.peak_bytes > limit:
        broken.append(f"peak memory per device: {format_bytes(compiled.peak_bytes)} is above the budget of "
                      f"{format_bytes(limit)} ({format_bytes(peak_bytes)} + {margin:.0%})")
    for kind, nbytes in compiled.bytes_by_kind().items():
        scalars = all(c.bytes <= 8 * c.arrays for c in compiled.collectives if c.kind == kind)
        if kind not in collective_bytes:
            if not scalars:
                broken.append(f"{kind}: {format_bytes(nbytes)} per step, a collective the budget does not have")
            continue
        allowed = int(collective_bytes[kind] * (1 + margin))
        if nbytes > allowed:
            broken.append(f"{kind}: {format_bytes(nbytes)} per step is above the budget of {format_bytes(allowed)} "
                          f"({format_bytes(collective_bytes[kind])} + {margin:.0%})")
    if broken:
        raise AssertionError(f"{'; '.join(broken)}; {REGENERATE}")


__all__ = ["DEFAULT_MARGIN", "assert_layout", "assert_step_budget", "layout_specs"]
