"""The plan's analytic figures beside the compiler's, per device, with their ratio.

:func:`compare_plan` lines a :class:`~workbench.analysis.TrainingPlan` up against the
:class:`~.compiled_step.CompiledStep` of the same step: memory part by part, the peak, FLOPs, and the
bytes each kind of collective moves. ``ratio`` is analytic / compiler (1.0: the plan is exact; below 1:
the plan promises less than the compiler needs). A figure the plan does not model has no ratio. The last row is
the step time the cost model gives on the plan's collectives and on the compiler's (:func:`~.step_time.step_time`):
where the compiler moves more, or over another axis, than planned, that is what it costs.

Example (``plan``: ``plan_training("mlp", {}, "data=8", "dp", hardware="cpu", verify="cpu")``, verified):
    >>> [(row.figure, round(row.ratio, 2)) for row in compare_plan(plan, plan.compiled).rows][:2]
    [('arguments', 1.0), ('outputs', 1.0)]
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..formatting import align_columns, format_bytes, format_seconds
from .compile_target import parse_target
from .compiled_step import PEAK_FORMULA, CompiledStep
from .compiler_rules import compiler_rules
from .gpu_memory_budget import LIFTED_SLOP_PERCENT, SLOP_FLAG, recomputed_toward_budget
from .step_time import step_time

# The step size (compiled peak per device) from which the plan's peak holds ±15% of the compiler's: measured
# 0.97-1.13 on bench_step_memory's transformers (tens of MiB and more); the default mlp's steps (0.1-2 MiB)
# measured 0.97-1.9, and 2.5-2.9 in fsdp on 512 devices, where small buffers the compiler packs or drops
# weigh as much as the arrays themselves.
PLAN_ACCURACY_FROM_BYTES = 4 * 2**20


@dataclasses.dataclass(frozen=True)
class ComparedFigure:
    """One figure both ways. ``unit`` is ``"bytes"``, ``"FLOPs"`` or ``"s"`` (seconds); ``analytic`` is None where
    the plan does not model it; ``note`` says what each side counts."""

    figure: str
    unit: str
    analytic: float | None
    compiler: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """analytic / compiler, None when either is missing or the compiler's is 0."""
        if self.analytic is None or not self.compiler:
            return None
        return self.analytic / self.compiler

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "unit": self.unit, "analytic": self.analytic, "compiler": self.compiler,
                "ratio": self.ratio, "note": self.note}


@dataclasses.dataclass(frozen=True)
class PlanComparison:
    """Rows of :class:`ComparedFigure` and the :class:`~.compiled_step.CompiledStep` they came from."""

    rows: tuple[ComparedFigure, ...]
    compiled: CompiledStep
    recomputed_to_budget: int | None = None  # XLA:GPU's budget, where it computed values again to come down to it

    @property
    def recomputed_words(self) -> str:
        """What the compiler did where it held fewer temporaries than planned to stay within XLA:GPU's budget
        (:mod:`.gpu_memory_budget`); empty otherwise."""
        return _recomputed_words(self.recomputed_to_budget)

    def row(self, figure: str) -> ComparedFigure:
        """The row called ``figure`` (e.g. ``"peak"``); KeyError naming the figures if none."""
        for row in self.rows:
            if row.figure == figure:
                return row
        raise KeyError(f"no figure {figure!r}: the rows are {', '.join(r.figure for r in self.rows)}")

    def to_json(self) -> dict[str, Any]:
        return {"rows": [row.to_json() for row in self.rows], "compiled": self.compiled.to_json(),
                "recomputed_to_budget": self.recomputed_to_budget}

    def to_text(self) -> str:
        """The side-by-side table, then the compiler's collectives with the code that caused them."""
        c = self.compiled
        rss = f", child peak RSS {format_bytes(c.peak_rss_bytes)}" if c.peak_rss_bytes else ""
        lines = [f"compiler     {c.target}: {c.device_kind}, {c.devices:,} devices ({c.mesh}); compiled in "
                 f"{format_seconds(c.compile_seconds)} after {format_seconds(c.build_seconds)} of tracing{rss}"]
        table = [[row.figure, _shown(row.analytic, row.unit), _shown(row.compiler, row.unit, "not comparable"),
                  "-" if row.ratio is None else f"{row.ratio:.2f}", row.note] for row in self.rows]
        lines += ["  " + line for line in align_columns(
            ["per device", "analytic", "compiler", "ratio", "what each side counts"], table, right=range(1, 4))]
        lines += ["", "collectives in the compiled step (per device; the layer and code each came from)",
                  c.collectives_text()]
        return "\n".join(lines)


def _shown(value: float | None, unit: str, missing: str = "not modelled") -> str:
    if value is None:
        return missing
    if unit == "s":
        return format_seconds(value)
    return format_bytes(int(value)) if unit == "bytes" else f"{value:.3g}"


def _simulated_words(rules: Any, target: str) -> str:
    """How the plan's memory was simulated (``rules``: its CompilerRules), and whether for the compiler it is
    compared with."""
    compiled_by = parse_target(target).kind
    if rules.kind == compiled_by:
        trust = f" (rough: {rules.trust})" if rules.trust else ""
        return f"simulated from the step's jaxpr as {rules.name} stores it{trust}"
    return (f"simulated from the step's jaxpr as {rules.name} stores it, not {compiler_rules(compiled_by).name}: "
            f"plan with compiler={compiled_by!r} (or verify={target!r}) to compare like with like")


def _peak_words(compiled: CompiledStep) -> str:
    return compiled.peak_source


def compare_plan(plan: Any, compiled: CompiledStep) -> PlanComparison:
    """The plan's figures beside the compiler's for the same step (see the module docstring)."""
    state = plan.params_bytes + plan.opt_state_bytes
    memory = plan.memory  # the step's memory simulated from its jaxpr (None: not modelled)
    simulated = _simulated_words(plan.memory_rules, compiled.target)
    budget = None if memory is None else _recomputed_budget(memory.temp_bytes, compiled)
    recomputed = f"; {_recomputed_words(budget)}" if budget is not None else ""
    if recomputed and compiled.as_written_temp_bytes is not None:
        recomputed += " (compiled again with the budget lifted: 'temporaries as written')"
    if memory is not None:
        rows = [
            ComparedFigure("arguments", "bytes", memory.argument_bytes, compiled.argument_bytes,
                           "the step's inputs: parameters + optimizer state + the batch"),
            ComparedFigure("outputs", "bytes", memory.output_bytes, compiled.output_bytes,
                           "the updated state and the metrics"),
            ComparedFigure("aliased", "bytes", memory.alias_bytes, compiled.alias_bytes,
                           "every mode's step donates its state: the updated state is written over it"),
            ComparedFigure("temporaries", "bytes", memory.temp_bytes, compiled.temp_bytes,
                           _temporaries_words(compiled,
                                              f"plan: {simulated} (gradients, activations, gathered parameters)"
                                              + recomputed)),
        ]
    else:
        transients = plan.grads_bytes + (plan.activation_bytes or 0) + plan.transient_params_bytes + \
            plan.accumulator_bytes
        rows = [
            ComparedFigure("arguments", "bytes", state, compiled.argument_bytes,
                           "plan: parameters + optimizer state; compiler: the step's inputs, the batch too"),
            ComparedFigure("outputs", "bytes", state, compiled.output_bytes,
                           "plan: the updated state; compiler: the step's outputs, metrics too"),
            ComparedFigure("aliased", "bytes", state, compiled.alias_bytes,
                           "every mode's step donates its state: the updated state is written over it"),
            ComparedFigure("temporaries", "bytes", None, compiled.temp_bytes,
                           f"not modelled: {plan.memory_caveat} (rough transients: {format_bytes(transients)})"),
        ]
    if memory is not None and compiled.as_written_temp_bytes is not None:
        rows.append(ComparedFigure(
            "temporaries as written", "bytes", memory.temp_bytes, compiled.as_written_temp_bytes,
            f"the compiler's came out at XLA:GPU's memory budget, so the step was compiled again with the budget "
            f"lifted ({SLOP_FLAG}={LIFTED_SLOP_PERCENT}): the step as written, which the plan simulates"))
    rows += [
        ComparedFigure("peak", "bytes", None if memory is None else plan.peak_bytes, compiled.peak_bytes,
                       f"plan: {PEAK_FORMULA}, {simulated}; compiler: {_peak_words(compiled)}" + recomputed
                       if memory is not None
                       else f"plan: not modelled ({plan.memory_caveat}); compiler: {_peak_words(compiled)}"),
        _flops_row(plan, compiled),
    ]
    planned: dict[str, float] = {}
    for collective in plan.collectives:
        planned[collective.kind] = planned.get(collective.kind, 0) + collective.total_bytes
    measured = compiled.bytes_by_kind()
    for kind in dict.fromkeys([*planned, *measured]):
        analytic, note = planned.get(kind, 0), "per step: bytes per occurrence x count"
        if not analytic and measured.get(kind, 0) and measured[kind] == _scalar_bytes(compiled, kind):
            # The loss and metrics summed over devices: a few bytes the plan does not price, not a 0 ratio.
            analytic, note = None, f"only scalars (the loss and metrics summed over devices); {note}"
        rows.append(ComparedFigure(f"{kind} bytes", "bytes", analytic, measured.get(kind, 0), note))
    rows.append(_step_time_row(plan, compiled))
    return PlanComparison(tuple(rows), compiled, budget)


def _step_time_row(plan: Any, compiled: CompiledStep) -> ComparedFigure:
    """The cost model's step on the plan's collectives and on the compiler's, each kind on its own axes."""
    planned, on_compiled = step_time(plan), step_time(plan, compiled.collectives)
    return ComparedFigure(
        "step time", "s", planned.step_s, on_compiled.step_s,
        f"the cost model on {plan.hardware.name} at {plan.utilisation:.0%} of peak, on the plan's collectives and on "
        f"the compiler's (its bytes of each kind over each mesh axis); not overlapped with the maths: "
        f"{format_seconds(planned.exposed_s)} planned, {format_seconds(on_compiled.exposed_s)} compiled")


def _flops_row(plan: Any, compiled: CompiledStep) -> ComparedFigure:
    if compiled.loop_trips:  # XLA's cost analysis counts a loop's body once, whatever its trip count
        loops = ", ".join(map(str, compiled.loop_trips))
        return ComparedFigure("FLOPs", "FLOPs", plan.flops_per_device, None,
                              f"plan: the model's analytic count; compiler: not comparable, its cost analysis counts "
                              f"each loop body once (loops of {loops} iterations)")
    return ComparedFigure("FLOPs", "FLOPs", plan.flops_per_device, compiled.flops,
                          "plan: the model's analytic count; compiler: its cost analysis")


def _scalar_bytes(compiled: CompiledStep, kind: str) -> int:
    """Bytes per step of ``kind``'s collectives that carry only scalars (at most 8 bytes an array)."""
    return sum(c.total_bytes for c in compiled.collectives if c.kind == kind and c.bytes <= 8 * c.arrays)


def _recomputed_words(budget: int | None) -> str:
    if budget is None:
        return ""
    return (f"the plan's temporaries are over this compile's budget, {format_bytes(budget)}: XLA:GPU computed values "
            "again to come down to it (more compute), so it holds less than the step as written")


def _recomputed_budget(planned_temp: int, compiled: CompiledStep) -> int | None:
    """XLA:GPU's budget in ``compiled``'s compile where it held fewer temporaries than the plan's ``planned_temp``
    because they are over it (:func:`~.gpu_memory_budget.recomputed_toward_budget`); None otherwise."""
    budget = compiled.xla_gpu_budget
    return budget if budget is not None and recomputed_toward_budget(planned_temp, compiled.temp_bytes, budget) \
        else None


def _temporaries_words(compiled: CompiledStep, words: str) -> str:
    if compiled.reported_temp_bytes is not None and compiled.hbm_block_bytes is not None:  # libtpu (tpu_buffers)
        words += (f"; compiler: the block its buffer assignment keeps in HBM, {format_bytes(compiled.hbm_block_bytes)} "
                  f"(its memory analysis estimates {format_bytes(compiled.reported_temp_bytes)})")
        if compiled.on_chip_bytes:
            words += f", and {format_bytes(compiled.on_chip_bytes)} more in on-chip VMEM, apart from HBM"
    if not compiled.temp_bytes:
        return f"{words}; the compiler reports 0 B of temporaries for {compiled.target}: no ratio"
    return words


__all__ = ["ComparedFigure", "PlanComparison", "compare_plan"]
