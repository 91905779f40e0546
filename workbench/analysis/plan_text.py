"""A :class:`~.training_plan.TrainingPlan` as text (the CLI's ``plan`` output): what fits, what a step sends
and computes, then its layout as a rule table of PartitionSpecs to paste into a training script.

It lives beside the plan rather than in ``views/``, which sits below ``analysis/`` and cannot read the record.

Example:
    >>> plan = plan_training("linear", {}, "data=8", "dp", hardware="cpu")
    >>> plan_text(plan, with_code=False).splitlines()[0]
    'plan         linear, 17 parameters, mode dp, adamw, bf16'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..formatting import align_columns, format_bytes, format_seconds
from ..layout.lint import lint_text
from ..layout.specs import format_spec
from ..training.modes import mode_class
from ..training.remat import REMAT_MEANINGS
from .gpu_memory_budget import MEM_FRACTION_ENV, SLOP_FLAG, GpuMemoryBudget

if TYPE_CHECKING:
    from .training_plan import TrainingPlan


def plan_text(plan: TrainingPlan, *, with_code: bool = True) -> str:
    """A readable summary: what fits, what a step sends and computes, then the rules code."""
    lines = [*_summary_lines(plan), "", *_memory_lines(plan), "", *_collective_lines(plan), *_time_lines(plan)]
    if plan.warnings:
        lines += ["", "layout warnings"] + [lint_text(list(plan.warnings))]
    if plan.notes:
        lines += ["", "notes"] + [f"  - {note}" for note in plan.notes]
    comparison = plan.comparison  # None unless the compiler's figures are attached
    if comparison is not None:
        lines += ["", comparison.to_text()]
    if with_code:
        lines += ["", rules_code(plan)]
    return "\n".join(lines)


def rules_code(plan: TrainingPlan, name: str = "SHARDING_RULES") -> str:
    """Python a production script can paste: the plan's specs as ``(regex, PartitionSpec)`` pairs, named
    ``name`` (see :meth:`~.training_plan.TrainingPlan.rules_code`)."""
    options = ",".join(f"{k}={v}" for k, v in plan.model_options.items())
    example = plan.params_layout.leaves[-1].path if plan.params_layout.leaves else "kernel"
    lines = [
        f"# Partition specs for {plan.model}{f' ({options})' if options else ''} on {plan.mesh}, mode {plan.mode}",
        "# (from the workbench planner). The first matching regex wins; paths look like",
        f"# {example!r}, and optimizer moments end the same way.",
        "from jax.sharding import PartitionSpec as P",
        "",
        f"{name} = [",
    ]
    lines += [f"    ({_string_literal(r.pattern)}, {format_spec(r.spec, 'code')})," for r in plan.rule_table.rules]
    return "\n".join(lines + ["]"])


def _summary_lines(plan: TrainingPlan) -> list[str]:
    """What is planned: model, mode, mesh, hardware and batch."""
    tokens = "tokens" if plan.seq_len else "examples"
    batch = f"{plan.global_batch:,} " + (f"sequences x {plan.seq_len:,} tokens" if plan.seq_len else "examples")
    if plan.seq_len:
        batch += f" = {plan.global_batch * plan.seq_len:,} tokens"
    if plan.accum > 1:
        batch += f", in {plan.accum} microbatches"
    return [
        f"plan         {plan.model}, {plan.params:,} parameters, mode {plan.mode}, {plan.optimizer}, {plan.precision}"
        + (f", remat {plan.remat}" if plan.remat != "none" else ""),
        f"mesh         {plan.mesh} ({plan.mesh.size:,} devices, abstract)",
        f"hardware     {plan.hardware.summary()}",
        f"batch        {batch} per step; {plan.tokens_per_device:,} {tokens} per device "
        f"(data-parallel size {plan.data_parallel_size})",
    ]


def _budget_words(budget: GpuMemoryBudget) -> str:
    """How XLA:GPU's budget for the temporaries comes about (:mod:`.gpu_memory_budget`)."""
    return (f"for the temporaries on the GPU: JAX's allocator's {budget.mem_fraction:.0%} ({MEM_FRACTION_ENV}) of "
            f"{format_bytes(budget.device_memory)}, less arguments and outputs, x {budget.slop_percent}% "
            f"({SLOP_FLAG}); over it, XLA:GPU computes values again to fit (compiled without the GPU: "
            f"{format_bytes(budget.without_gpu)}, from 80%)")


def _memory_lines(plan: TrainingPlan) -> list[str]:
    """Bytes per device, part by part, and whether the peak fits the device's memory."""
    verdict = f"of {format_bytes(plan.device_memory)}: {'fits' if plan.fits else 'does NOT fit'}"
    rows = [
        ("parameters", plan.params_bytes, "float32 master weights"),
        ("gradients", plan.grads_bytes, "float32, laid out like the parameters"),
        ("optimizer state", plan.opt_state_bytes, plan.optimizer),
        ("training state", plan.total_bytes, "the three above"),
    ]
    if plan.memory is not None:
        rules = plan.memory_rules
        batch = plan.memory.argument_bytes - plan.params_bytes - plan.opt_state_bytes
        rows += [
            ("batch", batch, "this device's share (an argument of the step)"),
            ("temporaries", plan.memory.temp_bytes, f"simulated from the step's jaxpr as "
             f"{rules.name} stores them: the buffers live at once beside the arguments "
             "(gradients, activations, gathered parameters)"),
            ("peak", plan.peak_bytes, verdict + " (arguments + outputs - donated + temporaries)"
             + (f"; rough: {rules.trust}" if rules.trust else "")),
        ]
        if plan.gpu_budget is not None:
            rows.append(("XLA:GPU budget", plan.gpu_budget.on_gpu, _budget_words(plan.gpu_budget)))
    else:
        activations = (_activation_words(plan.remat) if plan.activation_bytes is not None
                       else f"for {plan.model}")
        rows += [
            ("activations", plan.activation_bytes, activations),
            ("transient params", plan.transient_params_bytes, _transient_words(plan.mode, plan.precision)),
            *([("accumulator", plan.accumulator_bytes, f"the gradients summed over {plan.accum} microbatches")]
              if plan.accum > 1 else []),
            ("peak", None, f"not modelled: {plan.memory_caveat}; the state and the rough transients above "
             f"add up to {format_bytes(plan.peak_bytes)}, {verdict}"),
        ]
    lines = ["per device"]
    for label, value, words in rows:
        shown = ("not modelled" if label == "peak" else "not estimated") if value is None else format_bytes(value)
        lines.append(f"  {label:<17} {shown:>13}  {words}")
    return lines


def _collective_lines(plan: TrainingPlan) -> list[str]:
    """The collectives a step runs, as a table priced with the ring model, and their total."""
    lines = ["collectives per step (ring model)"]
    if plan.collectives:
        rows = [
            [c.kind, c.what, ",".join(c.axes), str(c.group_size), f"{c.count:,}", format_bytes(c.bytes),
             format_seconds(c.time_s)]
            for c in plan.collectives
        ]
        headers = ["kind", "what", "axes", "group", "count", "bytes each", "time"]
        lines += ["  " + line for line in align_columns(headers, rows, right=range(3, 7))]  # numbers right-aligned
    else:
        lines.append("  none")
    lines.append(f"  total comm   {format_seconds(plan.predicted_step_comm_s)}")
    return lines


def _time_lines(plan: TrainingPlan) -> list[str]:
    """Compute time per step, the whole step with and without overlap, and which one bounds it."""
    compute, comm = plan.predicted_step_compute_s, plan.predicted_step_comm_s
    lines = [
        f"compute      {format_seconds(compute)} per step "
        f"({plan.flops_per_device:.3g} FLOPs per device at {plan.utilisation:.0%} of peak"
        + (f"; {plan.remat_flops_per_device:.3g} recomputed by remat {plan.remat}" if plan.remat_flops_per_device
           else "") + ")",
        f"step         {format_seconds(compute + comm)} without overlap, "
        f"{format_seconds(max(compute, comm))} with full overlap",
    ]
    if plan.compute_bound is not None:
        lines.append(f"             {plan.compute_bound.sentence}")
    return lines


def _string_literal(text: str) -> str:
    """``text`` as Python source: a raw string where that is exact (regexes read better), else repr."""
    if "'" not in text and "\n" not in text and not text.endswith("\\"):
        return f"r'{text}'"
    return repr(text)


def _activation_words(remat: str) -> str:
    if remat == "none":
        return "rough estimate, no rematerialisation"
    return f"rough estimate, remat {remat}: {REMAT_MEANINGS[remat]}"


def _transient_words(mode: str, precision: str) -> str:
    gathering = mode_class(mode).parameter_gathering
    copy = " plus its bf16 copy" if precision == "bf16" else ""
    if gathering == "whole-tree":
        return "the whole float32 parameter tree gathered for the step" + copy
    if gathering == "per-layer":
        return "the largest layer's float32 parameters and gradients, gathered one layer at a time" + copy
    if precision == "bf16":
        return "the bf16 compute copy of the parameters"
    return "none (fp32 computes on the master weights)"


__all__ = ["plan_text", "rules_code"]
