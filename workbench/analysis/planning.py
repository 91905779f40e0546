"""Production planning on abstract meshes: will a model train in a mode on a mesh, and what will a step cost?

:func:`plan_training` lays out the model's parameters and optimizer state (shapes only, nothing allocated)
the way the mode would, and adds up memory per device, the collectives a step runs (ring model) and its
compute time into a :class:`TrainingPlan`, whose :meth:`~TrainingPlan.rules_code` exports the layout as a
rule table to paste. What it assumes and adds up: docs/design/production-planning.md.

A mode and mesh are judged as the trainer judges them (:func:`~workbench.mesh_fit`): a pair that cannot
train raises the trainer's error; devices along axes the mode does not use hold copies, and the notes say so.

Example:
    >>> plan = plan_training("transformer", {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000},
    ...                      "data=64,model=8", "fsdp")
    >>> plan.params, plan.fits, format_bytes(plan.total_bytes)
    (1339674624, True, '319.4 MiB')
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import jax
from jax.sharding import PartitionSpec

from .collectives import CountedCollective
from .compiler_rules import CompilerRules, compiler_rules
from .cost_model import (
    DEFAULT_UTILISATION,
    ComputeBoundTest,
    Hardware,
    collective_time,
    compute_bound_test,
    compute_time,
    group_spans_hosts,
    hardware as lookup_hardware,
)
from ..errors import MeshError, WorkbenchError, nearest_multiples
from ..layout.lint import DEFAULT_MIN_BYTES, LayoutWarning, lint_layout, lint_text
from ..layout.mesh import DATA_AXIS, MODEL_AXIS, MeshShape, abstract_mesh, parse_mesh
from ..layout.rules import RuleTable
from ..layout.specs import entry_axes, format_spec, spec_entries, spec_to_json
from ..layout.tree_layout import TreeLayout, layout_tree
from ..formatting import align_columns, format_bytes, format_seconds

# Examples (sequences for the transformer) per data-parallel replica when no global batch is given:
# small enough to fit activations of a 1B model on a 16 GiB chip at the preset's 128 tokens.
DEFAULT_EXAMPLES_PER_REPLICA = 16
GRADIENT_BYTES = 4  # float32: gradients arrive in the master weights' dtype under bf16 compute too
COMPUTE_BYTES = {"fp32": 4, "bf16": 2}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]i?b|b)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, **{f"{p}b": 1000**i for i, p in enumerate("kmgtp", 1)}, **{f"{p}ib": 1024**i for i, p in enumerate("kmgtp", 1)}}


def parse_byte_size(value: Any, what: str = "device memory") -> int:
    """Bytes from ``16GiB``, ``80GB``, ``512MiB``, ``1.5 TiB`` or a plain number of bytes.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` powers of 1024; letters may be any case.
    Raises :class:`~workbench.errors.WorkbenchError` naming the value otherwise.

    Example:
        >>> parse_byte_size("16GiB"), parse_byte_size("80GB"), parse_byte_size(512)
        (17179869184, 80000000000, 512)
    """
    fix = "write e.g. 16GiB, 80GB or 512MiB"
    if isinstance(value, bool):
        raise WorkbenchError(f"{what} {value!r} is not a size: {fix}")
    if isinstance(value, (int, float)):
        number, multiplier = value, 1
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise WorkbenchError(f"{what} {value!r} is not a size: {fix}")
        number, multiplier = float(match.group(1)), _UNITS[(match.group(2) or "b").lower()]
    size = round(number * multiplier) if math.isfinite(number) else 0
    if size < 1:
        raise WorkbenchError(f"{what} {value!r} must be at least one byte: {fix}")
    return int(size)


@dataclasses.dataclass(frozen=True)
class PlannedCollective(CountedCollective):
    """One kind of collective a step runs, in theory.

    Attributes:
        kind: ``all-reduce``, ``all-gather`` or ``reduce-scatter``.
        what: what it moves, in words.
        bytes: ``V`` of the ring formula: the full array on each device, for one occurrence.
        axes: the mesh axes of the group.
        group_size: devices in each group.
        count: occurrences per step.
        time_each_s: ring-model seconds for one occurrence.
    """

    kind: str
    what: str
    bytes: int
    axes: tuple[str, ...]
    group_size: int
    count: int
    time_each_s: float

    @property
    def time_s(self) -> float:
        """Seconds per step for all ``count`` occurrences."""
        return self.count * self.time_each_s

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "what": self.what, "bytes": self.bytes, "axes": list(self.axes),
            "group_size": self.group_size, "count": self.count, "time_each_s": self.time_each_s, "time_s": self.time_s,
        }


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingPlan:
    """A training run planned on an abstract mesh. Build it with :func:`plan_training`.

    Byte figures are per device. ``total_bytes`` is the training state (parameters + gradients +
    optimizer state); ``peak_bytes`` adds the rough transients (``activation_bytes``, None when not
    estimated, and ``transient_params_bytes``), and ``fits`` compares ``peak_bytes`` with
    ``device_memory``.
    """

    model: str
    model_options: dict[str, Any]
    mesh: MeshShape
    mode: str
    optimizer: str
    precision: str
    hardware: Hardware
    device_memory: int
    utilisation: float
    params: int
    global_batch: int
    seq_len: int | None
    data_parallel_size: int
    examples_per_device: int
    tokens_per_device: int
    params_layout: TreeLayout
    opt_state_layout: TreeLayout
    rule_table: RuleTable
    activation_bytes: int | None
    transient_params_bytes: int
    flops_per_device: float
    collectives: tuple[PlannedCollective, ...]
    compute_bound: ComputeBoundTest | None
    notes: tuple[str, ...]
    warnings: tuple[LayoutWarning, ...] = ()
    compiled: Any = None  # the compiler's CompiledStep of the same step, when verified
    memory: Any = None  # the step's StepMemory, simulated from its jaxpr (None: not modelled, see memory_caveat)
    memory_caveat: str | None = None  # why the step's memory is not simulated
    compiler: str = "cpu"  # the compile target kind whose rules ``memory`` follows (see .compiler_rules)

    @property
    def memory_rules(self) -> CompilerRules:
        """The compiler whose buffers ``memory`` simulates (:mod:`.compiler_rules`)."""
        return compiler_rules(self.compiler)

    def with_compiled(self, compiled: Any) -> "TrainingPlan":
        """This plan with the compiler's figures for its step attached (a :class:`~.compiled_step.CompiledStep`
        from :func:`~.verification.verify_plan` or a :class:`~.verification.VerificationJob`)."""
        return dataclasses.replace(self, compiled=compiled)

    @property
    def comparison(self):
        """The analytic figures beside the compiler's (:class:`~.plan_comparison.PlanComparison`); None unverified."""
        from .plan_comparison import compare_plan

        return None if self.compiled is None else compare_plan(self, self.compiled)

    @property
    def params_bytes(self) -> int:
        return self.params_layout.bytes_per_device

    @property
    def grads_bytes(self) -> int:
        """Gradients: float32 and laid out like the parameters they belong to."""
        return self.params_layout.bytes_per_device

    @property
    def opt_state_bytes(self) -> int:
        return self.opt_state_layout.bytes_per_device

    @property
    def total_bytes(self) -> int:
        """The training state on each device: parameters + gradients + optimizer state."""
        return self.params_bytes + self.grads_bytes + self.opt_state_bytes

    @property
    def peak_bytes(self) -> int:
        """The step's peak per device, simulated from its jaxpr (:mod:`.step_memory`: arguments + outputs -
        donated + temporaries, as the compiler counts); where it is not (``memory_caveat`` says why),
        ``total_bytes`` plus rough transients (activations, gathered or cast parameters)."""
        if self.memory is not None:
            return self.memory.peak_bytes
        return self.total_bytes + (self.activation_bytes or 0) + self.transient_params_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.device_memory

    @property
    def predicted_step_comm_s(self) -> float:
        """Ring-model seconds of every collective of a step, added up (no overlap)."""
        return sum(c.time_s for c in self.collectives)

    @property
    def predicted_step_compute_s(self) -> float:
        """Seconds of a step's maths on one device at ``utilisation`` of the peak."""
        return compute_time(self.flops_per_device, self.hardware, self.utilisation)

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        """Parameter path -> the spec the plan chose."""
        return self.params_layout.specs

    @property
    def per_device(self) -> dict[str, Any]:
        return {
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "opt_state_bytes": self.opt_state_bytes,
            "total_bytes": self.total_bytes,
            "activation_bytes": self.activation_bytes,
            "transient_params_bytes": self.transient_params_bytes,
            "peak_bytes": self.peak_bytes,
            "simulated": None if self.memory is None else self.memory.to_json(),
            "memory_caveat": self.memory_caveat, "memory_compiler": self.memory_rules.name,
        }

    def rules_code(self, name: str = "SHARDING_RULES") -> str:
        """Python a production script can paste: the plan's specs as ``(regex, PartitionSpec)`` pairs.

        The first matching regex wins; patterns match from a path boundary, so the same table lays out
        the optimizer's moments (``.../mu/blocks/0/...``) like their parameters.

        Example:
            >>> print(plan_training("linear", {}, "data=8", "dp").rules_code())
            # Partition specs for linear on data=8, mode dp
            # (from the workbench planner). The first matching regex wins; paths look like
            # 'linear/kernel', and optimizer moments end the same way.
            from jax.sharding import PartitionSpec as P
            <BLANKLINE>
            SHARDING_RULES = [
                (r'.*', P()),
            ]
        """
        options = ",".join(f"{k}={v}" for k, v in self.model_options.items())
        example = self.params_layout.leaves[-1].path if self.params_layout.leaves else "kernel"
        lines = [
            f"# Partition specs for {self.model}{f' ({options})' if options else ''} on {self.mesh}, mode {self.mode}",
            "# (from the workbench planner). The first matching regex wins; paths look like",
            f"# {example!r}, and optimizer moments end the same way.",
            "from jax.sharding import PartitionSpec as P",
            "",
            f"{name} = [",
        ]
        lines += [f"    ({_string_literal(r.pattern)}, {format_spec(r.spec, 'code')})," for r in self.rule_table.rules]
        return "\n".join(lines + ["]"])

    def to_json(self) -> dict[str, Any]:
        """The plan as one JSON object (the CLI's ``plan --json`` format)."""
        return {
            "model": self.model,
            "model_options": dict(self.model_options),
            "mesh": self.mesh.axes,
            "devices": self.mesh.size,
            "mode": self.mode,
            "optimizer": self.optimizer,
            "precision": self.precision,
            "params": self.params,
            "per_device": self.per_device,
            "device_memory": self.device_memory,
            "fits": self.fits,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "data_parallel_size": self.data_parallel_size,
            "examples_per_device": self.examples_per_device,
            "tokens_per_device": self.tokens_per_device,
            "collectives": [c.to_json() for c in self.collectives],
            "predicted_step_comm_s": self.predicted_step_comm_s,
            "flops_per_device": self.flops_per_device,
            "utilisation": self.utilisation,
            "predicted_step_compute_s": self.predicted_step_compute_s,
            "predicted_step_s": self.predicted_step_compute_s + self.predicted_step_comm_s,
            "predicted_step_s_overlapped": max(self.predicted_step_compute_s, self.predicted_step_comm_s),
            "compute_bound": self.compute_bound.to_json() if self.compute_bound else None,
            "hardware": self.hardware.to_json(),
            "rules": [{"pattern": r.pattern, "spec": spec_to_json(r.spec)} for r in self.rule_table.rules],
            "replicated_leaves": len(self.params_layout.replicated_leaves),
            "warnings": [w.to_json() for w in self.warnings],
            "notes": list(self.notes),
            "compiler": None if self.compiled is None else self.comparison.to_json(),
        }

    def to_text(self, *, with_code: bool = True) -> str:
        """A readable summary: what fits, what a step sends and computes, then the rules code."""
        lines = [*self._summary_lines(), "", *self._memory_lines(), "", *self._collective_lines(), *self._time_lines()]
        if self.warnings:
            lines += ["", "layout warnings"] + [lint_text(list(self.warnings))]
        if self.notes:
            lines += ["", "notes"] + [f"  - {note}" for note in self.notes]
        if self.compiled is not None:
            lines += ["", self.comparison.to_text()]
        if with_code:
            lines += ["", self.rules_code()]
        return "\n".join(lines)

    def _summary_lines(self) -> list[str]:
        """What is planned: model, mode, mesh, hardware and batch."""
        tokens = "tokens" if self.seq_len else "examples"
        batch = f"{self.global_batch:,} " + (f"sequences x {self.seq_len:,} tokens" if self.seq_len else "examples")
        return [
            f"plan         {self.model}, {self.params:,} parameters, mode {self.mode}, {self.optimizer}, {self.precision}",
            f"mesh         {self.mesh} ({self.mesh.size:,} devices, abstract)",
            f"hardware     {self.hardware.summary()}",
            f"batch        {batch} per step; {self.tokens_per_device:,} {tokens} per device "
            f"(data-parallel size {self.data_parallel_size})",
        ]

    def _memory_lines(self) -> list[str]:
        """Bytes per device, part by part, and whether the peak fits the device's memory."""
        verdict = f"of {format_bytes(self.device_memory)}: {'fits' if self.fits else 'does NOT fit'}"
        rows = [
            ("parameters", self.params_bytes, "float32 master weights"),
            ("gradients", self.grads_bytes, "float32, laid out like the parameters"),
            ("optimizer state", self.opt_state_bytes, self.optimizer),
            ("training state", self.total_bytes, "the three above"),
        ]
        if self.memory is not None:
            batch = self.memory.argument_bytes - self.params_bytes - self.opt_state_bytes
            rows += [
                ("batch", batch, "this device's share (an argument of the step)"),
                ("temporaries", self.memory.temp_bytes, f"simulated from the step's jaxpr as "
                 f"{self.memory_rules.name} stores them: the buffers live at once beside the arguments "
                 "(gradients, activations, gathered parameters)"),
                ("peak", self.peak_bytes, verdict + " (arguments + outputs - donated + temporaries)"
                 + (f"; rough: {self.memory_rules.trust}" if self.memory_rules.trust else "")),
            ]
        else:
            rows += [
                ("activations", self.activation_bytes,
                 _activation_words(self.mode) if self.activation_bytes is not None else f"for {self.model}"),
                ("transient params", self.transient_params_bytes, _transient_words(self.mode, self.precision)),
                ("peak", None, f"not modelled: {self.memory_caveat}; the state and the rough transients above "
                 f"add up to {format_bytes(self.peak_bytes)}, {verdict}"),
            ]
        lines = ["per device"]
        for label, value, words in rows:
            shown = ("not modelled" if label == "peak" else "not estimated") if value is None else format_bytes(value)
            lines.append(f"  {label:<17} {shown:>13}  {words}")
        return lines

    def _collective_lines(self) -> list[str]:
        """The collectives a step runs, as a table priced with the ring model, and their total."""
        lines = ["collectives per step (ring model)"]
        if self.collectives:
            rows = [
                [c.kind, c.what, ",".join(c.axes), str(c.group_size), f"{c.count:,}", format_bytes(c.bytes),
                 format_seconds(c.time_s)]
                for c in self.collectives
            ]
            headers = ["kind", "what", "axes", "group", "count", "bytes each", "time"]
            lines += ["  " + line for line in align_columns(headers, rows, right=range(3, 7))]  # numbers right-aligned
        else:
            lines.append("  none")
        lines.append(f"  total comm   {format_seconds(self.predicted_step_comm_s)}")
        return lines

    def _time_lines(self) -> list[str]:
        """Compute time per step, the whole step with and without overlap, and which one bounds it."""
        compute, comm = self.predicted_step_compute_s, self.predicted_step_comm_s
        lines = [
            f"compute      {format_seconds(compute)} per step "
            f"({self.flops_per_device:.3g} FLOPs per device at {self.utilisation:.0%} of peak)",
            f"step         {format_seconds(compute + comm)} without overlap, "
            f"{format_seconds(max(compute, comm))} with full overlap",
        ]
        if self.compute_bound is not None:
            lines.append(f"             {self.compute_bound.sentence}")
        return lines


def _string_literal(text: str) -> str:
    """``text`` as Python source: a raw string where that is exact (regexes read better), else repr."""
    if "'" not in text and "\n" not in text and not text.endswith("\\"):
        return f"r'{text}'"
    return repr(text)


def _activation_words(mode: str) -> str:
    from ..training.modes import mode_class

    if mode_class(mode).parameter_gathering == "per-layer":
        return "rough estimate, layers recomputed in the backward pass"
    return "rough estimate, no rematerialisation"


def _transient_words(mode: str, precision: str) -> str:
    from ..training.modes import mode_class

    gathering = mode_class(mode).parameter_gathering
    copy = " plus its bf16 copy" if precision == "bf16" else ""
    if gathering == "whole-tree":
        return "the whole float32 parameter tree gathered for the step" + copy
    if gathering == "per-layer":
        return "the largest layer's float32 parameters and gradients, gathered one layer at a time" + copy
    return "the bf16 compute copy of the parameters" if precision == "bf16" else "none (fp32 computes on the master weights)"


# --- the rule table the plan exports ----------------------------------------------------------------


def _pattern(path: str, generalise: bool) -> str:
    """A regex matching ``path`` from a path boundary; with ``generalise``, any layer number."""
    parts = [r"\d+" if generalise and part.isdigit() else re.escape(part) for part in path.split("/")]
    return "(^|/)" + "/".join(parts) + "$"


def _rules_for_specs(layout: TreeLayout, generalise: bool) -> RuleTable:
    """Exact-path rules (``\\d+`` for layer numbers where every layer agrees) for the chosen specs.

    Longer paths come first, so a path whose tail is another parameter's path still meets its own rule
    first; every parameter gets a rule (replicated ones ``P()`` too), and ``.*`` replicates the rest
    (optimizer counters and the like).
    """
    groups: dict[str, list] = {}
    for leaf in layout.leaves:
        groups.setdefault(_pattern(leaf.path, True), []).append(leaf)
    rules = []
    for key, leaves in groups.items():
        specs = {leaf.layout.spec for leaf in leaves}
        if generalise and len(specs) == 1:
            rules.append((key.count("/"), key, leaves[0].layout.spec))
        else:
            rules += [(_pattern(l.path, False).count("/"), _pattern(l.path, False), l.layout.spec) for l in leaves]
    rules.sort(key=lambda rule: -rule[0])  # stable: tree order within one depth
    return RuleTable([(pattern, spec) for _, pattern, spec in rules] + [(".*", PartitionSpec())])


def _same_specs(table: RuleTable, trees: list[tuple[Any, TreeLayout]], mesh: Any) -> bool:
    return all(layout_tree(tree, mesh, table).specs == layout.specs for tree, layout in trees)


def _export_table(placement: str, tp_rules: list, trees: list[tuple[Any, TreeLayout]], mesh: Any,
                  custom: RuleTable | None = None) -> RuleTable:
    """The plan's layout as a rule table that reproduces it (leaves that did not fit: as planned, replicated)."""
    valid = all(leaf.problem is None for _, layout in trees for leaf in layout.leaves)
    if placement == "custom" and valid:
        catch_all = custom.rules and custom.rules[-1].pattern in (".*", "")
        return custom if catch_all else RuleTable([(r.pattern, r.spec) for r in custom.rules] + [(".*", PartitionSpec())])
    if placement == "replicate":
        return RuleTable([(".*", PartitionSpec())])
    if placement == "tensor-parallel" and valid:
        return RuleTable(list(tp_rules) + [(".*", PartitionSpec())])
    params_layout = trees[0][1]
    for generalise in (True, False):  # compact first; exact paths if a pattern reaches too far
        table = _rules_for_specs(params_layout, generalise)
        if _same_specs(table, trees, mesh):
            return table
    raise WorkbenchError(  # not reached for the registered models: exact paths reproduce any layout
        "could not express the plan's layout as a rule table (optimizer state paths clash with parameter "
        "paths): lay out with layout_tree(state, mesh, 'shard') instead"
    )


def _own_model(model: Any, model_options: Any) -> Any:
    """A user's ``nnx.Module`` (instance, or a builder traced with ``nnx.eval_shape``), checked."""
    from flax import nnx

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


# --- the plan --------------------------------------------------------------------------------------


def _check_mesh(mesh: MeshShape, declared: type) -> list[str]:
    """The trainer's own verdict on mode ``declared`` (its class) x ``mesh`` (:func:`~workbench.mesh_fit`): its
    MeshError when the mode cannot train there, else notes for devices that only repeat others' work or stay idle."""
    from ..training.modes import mesh_fit

    fit = mesh_fit(declared, mesh)
    if not fit.ok:
        raise MeshError(fit.message)
    return [fit.message] if fit.level == "warning" or "idle" in fit.message else []


def _batch(global_batch: int | None, parts: int) -> int:
    if global_batch is None:
        return DEFAULT_EXAMPLES_PER_REPLICA * parts
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise WorkbenchError(f"global batch {global_batch!r} must be a whole number >= 1: use e.g. --batch {16 * parts}")
    if global_batch % parts:
        nearest = nearest_multiples(global_batch, parts)
        raise WorkbenchError(
            f"global batch {global_batch} does not split over {parts} data-parallel devices: use a batch of {nearest} "
            f"(a multiple of {parts})"
        )
    return global_batch


def _whole_seq_len(seq_len: Any) -> int | None:
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise WorkbenchError(f"seq_len {seq_len!r} must be a whole number >= 1: use e.g. --seq-len 1024")
    return seq_len


def _seq_len(model: str, seq_len: int | None, options: dict[str, Any]) -> int | None:
    """Tokens per sequence: the transformer's ``max_len`` by default; None for models without sequences."""
    if model != "transformer":
        if seq_len is not None:
            raise WorkbenchError(f"model {model!r} reads no sequences: drop --seq-len (it is for the transformer)")
        return None
    if seq_len is None:
        return options["max_len"]
    _whole_seq_len(seq_len)
    if seq_len > options["max_len"]:
        raise WorkbenchError(
            f"seq_len {seq_len} exceeds the model's max_len={options['max_len']}: add max_len={seq_len} to "
            "--config (positions are computed, so it adds no parameters)"
        )
    return seq_len


def _split_over(leaf, axis: str) -> bool:
    return any(axis in entry_axes(entry) for entry in spec_entries(leaf.layout.spec))


def _needs(mode_cls, custom: bool) -> list:
    """The collectives to price: the mode's declaration; with your own rule table, the data-axis ones
    follow the table (leaves split over 'data' are gathered and reduce-scattered, the rest all-reduced),
    and activations are not estimated (the table's split is unknown to the model)."""
    from ..training.modes.fsdp_whole_tree import WholeTreeShardedDataParallel

    needs = list(mode_cls.collectives)
    if custom:
        needs = [n for n in needs if n.carries != "activations" and n.axis != DATA_AXIS]
        if mode_cls.batch_axis == DATA_AXIS and not mode_cls.one_device:
            needs += list(WholeTreeShardedDataParallel.collectives)
    return needs


def _step_collectives(
    mode_cls, mesh: MeshShape, params_layout: TreeLayout, hw: Hardware,
    block_activation: int | None, n_layers: int, notes: list[str], custom: bool = False,
    gathered_bytes_per_float: int = 4,
) -> tuple[list[PlannedCollective], int]:
    """The mode's declared collectives (:attr:`ParallelMode.collectives`), sized from the layout and
    priced with the ring model, and the per-device gradient bytes synchronised over 'data'.

    Sizes by what each carries: the gradients of leaves not split over the axis (their per-device
    bytes); leaves split over the axis, gathered or reduce-scattered whole; a transformer block's
    activations, 4 times per block (2 forward, 2 backward). XLA combines small collectives, so each kind
    is priced as one bucketed collective. ``gathered_bytes_per_float``: the bytes a gathered float32
    parameter takes on the wire (2 where the compiler casts to bf16 before gathering: XLA:GPU).
    """
    collectives: list[PlannedCollective] = []
    synced = 0
    for need in _needs(mode_cls, custom):
        group = mesh.axis_size(need.axis) if need.axis in mesh.names else 1
        split = [leaf for leaf in params_layout.leaves if _split_over(leaf, need.axis)]
        split_bytes = sum(leaf.layout.bytes_per_device for leaf in split)
        count = need.times  # fsdp gathers its parameters for the forward and again for the backward pass
        if need.carries == "sharded-parameters":
            nbytes = split_bytes * group * gathered_bytes_per_float // 4
        elif need.carries == "sharded-gradients":
            nbytes = split_bytes * group
        elif need.carries in ("gradients", "whole-gradients"):
            nbytes = params_layout.bytes_per_device - split_bytes
        else:  # activations
            nbytes, count = block_activation or 0, 4 * n_layers
        if need.axis == DATA_AXIS and need.carries != "sharded-parameters":
            synced += nbytes
        if nbytes > 0 and group > 1 and count > 0:
            what = need.what.split(":")[0]
            collectives.append(PlannedCollective(need.kind, what, int(nbytes), (need.axis,), group, count,
                                                 collective_time(need.kind, nbytes, group, hw, spans_hosts=(
                                                     group_spans_hosts(mesh, (need.axis,), hw.devices_per_host)))))
    whole = [leaf for leaf in params_layout.leaves if not _split_over(leaf, DATA_AXIS)]
    if mode_cls.state_placement == "shard" and whole and not custom:
        notes.append(f"{len(whole)} parameter(s) have no dimension divisible by data={mesh.axis_size(DATA_AXIS)} "
                     "and stay whole on every device (their gradients are all-reduced)")
    return collectives, synced


def _activation_bytes(model: Any, examples: int, seq_len: int, split: int, compute_bytes: int,
                      recomputed: bool = False) -> int:
    """Activations a transformer keeps for the backward pass on one device.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), eq. 2:
    ``s b h (10 + 24/t + 5 a s / (h t))`` bytes per layer for 16-bit activations and tensor parallelism
    ``t`` (without sequence parallelism), scaled here to the compute dtype, plus the logits held in the
    compute dtype and as float32 for the loss. Their constants include dropout masks this model does not
    have, so this errs high: a rough figure. With ``recomputed`` layers (fsdp recomputes each layer in
    the backward pass) only each layer's input ``s b h`` is kept, plus one layer's activations at a time.
    The loss computes the logits ``loss_tile`` words of the vocabulary at a time
    (:meth:`~workbench.training.lm_head.OutputHead.cross_entropy_sums`), so one tile's logits are held.
    """
    s, b, h, a = seq_len, examples, model.d_model, model.n_heads
    per_layer = s * b * h * (10 + 24 / split + 5 * a * s / (h * split)) * compute_bytes / 2
    logits = s * b * min(model.vocab, model.loss_tile) * (compute_bytes + 4)
    if recomputed:
        return int(model.n_layers * s * b * h * compute_bytes + per_layer + logits)
    return int(model.n_layers * per_layer + logits)


@dataclasses.dataclass(frozen=True)
class _PlannedModel:
    """The model being planned, resolved once: its name, preset overrides and abstract module."""

    name: str
    options: dict[str, Any]
    resolved: dict[str, Any]  # every option of a registered model's preset, overrides applied
    abstract: Any
    registered: bool

    @property
    def is_lm(self) -> bool:
        return self.registered and self.name == "transformer"


def _resolve_model(model: Any, model_options: Any, seq_len: int | None, notes: list[str]) -> _PlannedModel:
    """A registered model's name and options, or your own module, as one record (abstract: nothing allocated)."""
    from ..training.models import model_class, model_config, parse_model_options

    if isinstance(model, str):
        model_class(model)  # unknown name: the registry's own message, listing the models
        options = parse_model_options(model_options, model) if isinstance(model_options, str) else dict(model_options or {})
        return _PlannedModel(model, options, model_config(model, **options).options,
                             _registered_abstract_model(model, options), registered=True)
    abstract = _own_model(model, model_options)
    name = type(abstract).__name__
    notes.append(f"compute of your {name} is estimated as 6 FLOPs per parameter per "
                 f"{'token' if seq_len else 'example'}; its activations are not estimated")
    return _PlannedModel(name, {}, {}, abstract, registered=False)


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
    from ..training.models import abstract_model

    return abstract_model(name, **{k: v for k, _, v in key})


def _tensor_parallel_rules(declared, planned: _PlannedModel, custom_rules: RuleTable | None) -> list:
    """The model's tensor-parallel rules when the mode splits layers over 'model' (and you gave no table)."""
    if declared.state_placement != "tensor-parallel" or custom_rules is not None:
        return []
    from ..training.models import tensor_parallel_rules

    tp_rules = tensor_parallel_rules(planned.name, MODEL_AXIS, planned.resolved) if planned.registered else []
    if not tp_rules:
        raise WorkbenchError(
            f"mode {declared.name!r} splits layers over the 'model' axis, but model {planned.name!r} has no splittable "
            "layer pair: choose mlp, cnn or transformer, pass rules=[(regex, spec), ...] for your own model, "
            "or plan a data-parallel mode"
        )
    return tp_rules


def _flops_per_device(planned: _PlannedModel, n_params: int, seq_len: int | None, tokens: int, model_size: int,
                      notes: list[str], recomputed: bool = False) -> float:
    """FLOPs of one step on one device: the transformer's own count, else 6 per parameter per example/token.
    ``recomputed``: the backward pass runs each layer's forward pass again (fsdp), all but the output head's
    (a single matmul, whose backward pass needs none of it)."""
    if planned.is_lm:
        abstract = planned.abstract
        head = 2 * abstract.d_model * abstract.vocab  # the output head is replicated by the tp rules
        forward = (abstract.flops_per_token(seq_len) - head) / model_size + head
        return (3.0 * forward + (forward - head if recomputed else 0.0)) * tokens  # backward = 2 forwards (6N)
    if recomputed and planned.registered:
        notes.append(f"{planned.name!r}'s layers are single matmuls or convolutions, which fsdp does not recompute")
    elif recomputed:
        notes.append("fsdp recomputes each layer of your model in the backward pass; compute counts no recomputation")
    if model_size > 1:
        notes.append(f"compute assumes every parameter of {planned.name!r} splits {model_size} ways: an approximation")
    return 6.0 * n_params * tokens / model_size


def _tensor_parallel_notes(planned: _PlannedModel, tensor_parallel: bool, model_size: int) -> list[str]:
    """What the plan leaves out or warns about when layers split over 'model'."""
    if not tensor_parallel or model_size == 1:
        return []
    if not planned.is_lm:
        return [f"the activation all-reduces after {planned.name!r}'s row-parallel layers are not estimated "
                "(only the transformer's are)"]
    heads = planned.abstract.n_heads
    if heads % model_size:
        return [f"n_heads={heads} does not divide by model={model_size}: devices would split heads; choose n_heads "
                "divisible by the model axis"]
    return []


def _bound_by_compute(declared, sync_bytes: int, data_size: int, flops: float, tokens: int, seq_len: int | None,
                      hw: Hardware, utilisation: float, notes: list[str]) -> ComputeBoundTest | None:
    """Whether the gradient sync hides behind the step's compute (None where nothing syncs over 'data')."""
    if sync_bytes and data_size > 1:
        synced_params = sync_bytes / GRADIENT_BYTES
        return compute_bound_test(
            tokens, hw, bytes_per_param=GRADIENT_BYTES, flops_per_param_per_token=flops / tokens / synced_params,
            group_size=data_size, utilisation=utilisation, unit="tokens" if seq_len else "examples",
        )
    if not declared.one_device:
        notes.append("no gradient synchronisation over 'data': the compute-bound test does not apply (tp's "
                     "activation all-reduces grow with the batch as its compute does)")
    return None


def _transient_params_bytes(declared, params_layout: TreeLayout, precision: str, notes: list[str],
                            model: Any = None) -> int:
    """Parameters a step holds beside the state, as the mode declares it gathers them
    (``parameter_gathering``), and/or the bf16 compute copy."""
    bf16 = precision == "bf16"
    if declared.parameter_gathering == "whole-tree":
        full_params = params_layout.total_bytes
        notes.append(f"{declared.name} gathers the whole parameter tree for the step; fsdp gathers one layer at a time")
        return full_params + (full_params // 2 if bf16 else 0)
    if declared.parameter_gathering == "per-layer":
        from ..training.modes.param_gathering import layer_bytes

        sizes = layer_bytes(model)
        own = sizes.pop(None, 0)
        largest, path = max(((size, path) for path, size in sizes.items()), default=(0, None))
        if path is not None:
            notes.append(f"{declared.name} holds one layer's parameters and gradients whole at a time: the largest "
                         f"layer, {path!r}, is {format_bytes(largest)}")
        if own:
            notes.append(f"{format_bytes(own)} of parameters belong to no layer of the model and are gathered for "
                         "the whole step")
        gathered = largest + own
        return 2 * gathered + (gathered // 2 if bf16 else 0)  # gathered, its gradients, its bf16 copy
    return params_layout.bytes_per_device // 2 if bf16 else 0


@functools.lru_cache(maxsize=None)
def _optimizer_for_shapes(name: str) -> Any:
    """One optimizer per name for tracing the state's shapes, so JAX's trace cache answers a re-plan of the
    same model (a 65B model's 2,568 moment leaves take 0.5 s to trace)."""
    from ..training.config import make_optimizer

    return make_optimizer(name, 1e-3)


def _assumption_note(precision: str, utilisation: float) -> str:
    slower = ""
    if precision == "fp32":
        slower = " (fp32 matmuls run slower: TF32 at half rate on H100, several bf16 passes on TPU)"
    return (f"compute assumes the chip's bf16 peak at {utilisation:.0%} utilisation{slower}; collectives use one "
            "ring per mesh axis, and nothing overlaps")


def plan_training(
    model: Any,
    model_options: dict[str, Any] | str | None,
    mesh: Any,
    mode: str | type,
    optimizer: str = "adamw",
    hardware: str | Hardware | None = None,
    device_memory: int | str | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    precision: str = "bf16",
    utilisation: float = DEFAULT_UTILISATION,
    rules: Any = None,
    lint_min_bytes: int = DEFAULT_MIN_BYTES,
    verify: Any = None,
    loss: Any = None,
    example_batch: Any = None,
    compiler: str | None = None,
) -> TrainingPlan:
    """Plan training ``model`` in ``mode`` on ``mesh`` (of any size): memory, collectives, step time.

    Nothing is allocated and no device is needed: parameters and optimizer state are ``ShapeDtypeStruct``
    leaves laid out on an abstract mesh.

    Args:
        model, model_options: a registered model's name and overrides of its preset (a dict, or
            ``key=value,...`` text as ``--config`` takes); or your own ``nnx.Module``: an instance (real
            or from ``nnx.eval_shape``) or a function of no arguments that builds one, which is only
            ever traced (a 70B model costs no memory). Give ``model_options`` as None for your own.
            Its compute is estimated as 6 FLOPs per parameter per example (per token with ``seq_len``)
            and its activations are not estimated.
        mesh: e.g. ``"data=64,model=8"``.
        mode: a parallel mode (see :data:`workbench.training.modes.MODES`), or its class where the name was
            resolved already (:func:`~workbench.mode_class`).
        optimizer: ``sgd``, ``adam`` or ``adamw`` (what its state holds is read from optax itself).
        hardware: a preset name of :data:`workbench.analysis.cost_model.HARDWARE` or a ``Hardware``;
            default ``tpu-v5p``, or the preset of the TPU topology ``verify`` names.
        device_memory: bytes per device (or text like ``"16GiB"``); default: the hardware's memory.
        global_batch: examples (sequences) per step over all devices; default
            ``DEFAULT_EXAMPLES_PER_REPLICA`` (16) per data-parallel replica.
        seq_len: tokens per sequence for the transformer; default its ``max_len``.
        precision: ``bf16`` (bfloat16 compute, float32 master weights, as the trainer does) or ``fp32``.
        utilisation: assumed fraction of peak FLOP/s the maths reaches (MFU).
        rules: your own rule table (a :class:`~workbench.layout.rules.RuleTable` or ``(regex, spec)`` pairs)
            instead of the mode's placement; the mode still decides where the batch goes. A leaf whose
            spec does not fit is planned replicated and reported in ``warnings``, with every other.
        lint_min_bytes: the smallest replicated leaf the layout linter warns about
            (:func:`~workbench.layout.lint.lint_layout`).
        verify: also compile the real step for this mesh and attach the compiler's figures (``compiled``,
            ``comparison``): ``"cpu"`` (simulated CPU devices, up to 2048) or ``"tpu:v5p:8x8x8"`` (any
            topology libtpu knows; needs the ``tpu`` extra), or :class:`~.verification.VerifySettings`
            for a time limit and progress messages. Registered models only, without ``rules``; see
            :mod:`workbench.analysis.verification` to run it in the background.
        loss, example_batch: for your own module, ``loss(model, batch) -> (value, aux)`` (default: the
            module's ``loss`` method) and a batch of its input (arrays or ``ShapeDtypeStruct``s, any
            number of rows), so that its step can be traced and its memory simulated; without them its
            peak is not modelled.
        compiler: whose buffers the simulated peak follows: ``"cpu"`` (XLA:CPU), ``"gpu"`` (XLA:GPU) or
            ``"tpu"`` (libtpu) (:mod:`.compiler_rules`); default: ``verify``'s target, else the hardware's.

    Raises :class:`~workbench.errors.WorkbenchError` (or a subclass) naming the bad argument and a fix.

    Example:
        >>> plan = plan_training("mlp", {"hidden": 256}, "data=8", "fsdp", hardware="cpu")
        >>> plan.params_bytes * 8 >= plan.params_layout.total_bytes
        True
    """
    from flax import nnx

    from ..training.modes import PRECISIONS, mode_class
    from ..training.modes.base import placement_argument

    from .verification import planned_hardware, verify_settings

    settings = None if verify is None else verify_settings(verify)
    hw = lookup_hardware(planned_hardware(hardware, settings))
    memory_rules = compiler_rules(compiler or (settings.target.kind if settings is not None else hw.compiler))
    memory = hw.memory_bytes if device_memory is None else parse_byte_size(device_memory)
    compute_time(0.0, hw, utilisation)  # checks utilisation now, not when the plan is printed
    declared = mode if isinstance(mode, type) else mode_class(mode)  # unknown: the modes' message, listing them
    mode = declared.name
    if precision not in PRECISIONS:
        raise WorkbenchError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    mesh_shape = parse_mesh(mesh)  # parsed once, here; everything below takes the record
    if settings is not None:
        _check_verifiable(settings, mesh_shape, declared, model, rules)
    notes = _check_mesh(mesh_shape, declared)
    custom_rules = RuleTable(rules) if rules is not None else None
    planned = _resolve_model(model, model_options, seq_len, notes)
    abstract = planned.abstract
    tp_rules = _tensor_parallel_rules(declared, planned, custom_rules)

    # The state, laid out exactly as the mode builds it (ShardedJitMode.state_layout), from the same declaration.
    params = nnx.state(abstract, nnx.Param)
    opt_state = jax.eval_shape(_optimizer_for_shapes(optimizer).init, params)
    target = abstract_mesh(mesh_shape)
    if custom_rules is not None:
        placement, kind = custom_rules, "custom"
    else:
        placement, kind = placement_argument(declared.state_placement, tp_rules), declared.state_placement
    params_layout = layout_tree(params, target, placement, data_axis=DATA_AXIS, on_invalid="replicate")
    opt_layout = layout_tree(opt_state, target, placement, data_axis=DATA_AXIS, on_invalid="replicate")
    warnings = lint_layout(params_layout, min_bytes=lint_min_bytes, optimizer_state=opt_layout)
    table = _export_table(kind, tp_rules, [(params, params_layout), (opt_state, opt_layout)], target, custom_rules)

    # The batch and the maths one device does with it.
    tensor_parallel = declared.state_placement == "tensor-parallel"
    data_size = 1 if declared.one_device else declared.batch_parts(mesh_shape)
    model_size = mesh_shape.axis_size(MODEL_AXIS) if tensor_parallel else 1
    batch = _batch(global_batch, data_size)
    examples = batch // data_size
    n_params = sum(math.prod(leaf.layout.shape) for leaf in params_layout.leaves)  # no second walk of the model
    # Your own model: tokens per sequence only if you say so (then compute counts tokens, not examples).
    seq_len = _seq_len(planned.name, seq_len, planned.resolved) if planned.registered else _whole_seq_len(seq_len)
    tokens = examples * seq_len if seq_len else examples
    recomputed = declared.parameter_gathering == "per-layer"  # each layer run again in the backward pass
    flops = _flops_per_device(planned, n_params, seq_len, tokens, model_size, notes, recomputed)

    # What a step sends, and whether its compute hides it.
    compute_bytes = COMPUTE_BYTES[precision]
    # (B_local, T, d_model) activations summed over 'model' after each row-parallel layer of a block
    block_activation = examples * seq_len * abstract.d_model * compute_bytes if planned.is_lm else None
    collectives, sync_bytes = _step_collectives(
        declared, mesh_shape, params_layout, hw, block_activation, abstract.n_layers if planned.is_lm else 0, notes,
        custom=custom_rules is not None,
        gathered_bytes_per_float=2 if memory_rules.casts_before_gathering and precision == "bf16" else 4,
    )
    notes += _tensor_parallel_notes(planned, tensor_parallel, model_size)
    bound = _bound_by_compute(declared, sync_bytes, data_size, flops, tokens, seq_len, hw, utilisation, notes)

    # Memory beside the training state.
    activations = None
    if planned.is_lm:
        activations = _activation_bytes(abstract, examples, seq_len, model_size, compute_bytes, recomputed)
    elif planned.registered:
        notes.append(f"activations of {planned.name!r} are not estimated (small for this model at these batch sizes)")
    transient = _transient_params_bytes(declared, params_layout, precision, notes, abstract)
    simulated, caveat = _simulated_memory(planned, declared, mesh_shape, batch, seq_len, precision, optimizer,
                                          custom_rules, loss, example_batch, memory_rules)
    notes.append(_assumption_note(precision, utilisation))

    plan = TrainingPlan(
        model=planned.name, model_options=planned.options, mesh=mesh_shape, mode=mode, optimizer=optimizer,
        precision=precision, hardware=hw, device_memory=memory, utilisation=utilisation, params=n_params,
        global_batch=batch, seq_len=seq_len, data_parallel_size=data_size, examples_per_device=examples,
        tokens_per_device=tokens, params_layout=params_layout, opt_state_layout=opt_layout, rule_table=table,
        activation_bytes=activations, transient_params_bytes=int(transient), flops_per_device=float(flops),
        collectives=tuple(collectives), compute_bound=bound, notes=tuple(notes), warnings=tuple(warnings),
        memory=simulated, memory_caveat=caveat, compiler=memory_rules.kind,
    )
    if settings is None:
        return plan
    from ..training.models import model_class
    from .verification import verify_step

    # The step the plan describes, from the records read above: the compile checks it without reading text again.
    step = _step_config(planned.name, dict(planned.options), declared, mesh_shape, batch, precision, optimizer,
                        model_class(planned.name))
    return plan.with_compiled(verify_step(step, settings.target, seq_len=seq_len, timeout=settings.timeout,
                                          on_progress=settings.on_progress))


def _simulated_memory(planned: "_PlannedModel", declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                      precision: str, optimizer: str, custom_rules: Any, loss: Any, example_batch: Any,
                      compiler: CompilerRules):
    """(the step's simulated :class:`~.step_memory.StepMemory`, None) or (None, why it is not modelled)."""
    from .step_memory import NotSimulated

    try:
        return _simulate_memory(planned, declared, mesh, batch, seq_len, precision, optimizer, custom_rules, loss,
                                example_batch, compiler)
    except NotSimulated as reason:
        return None, str(reason)


def _simulate_memory(planned: "_PlannedModel", declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                     precision: str, optimizer: str, custom_rules: Any, loss: Any, example_batch: Any,
                     compiler: CompilerRules):
    from ..training.step import check_compiles_ahead

    try:
        check_compiles_ahead(declared)
    except WorkbenchError:
        return None, f"mode {declared.name!r} is not one jit program, so there is no single step to simulate"
    if custom_rules is not None:
        return None, "the step lays out the mode's own state, not your rule table"
    if planned.registered:
        key = (planned.name, tuple(sorted(planned.options.items())), declared, mesh, batch, seq_len, precision,
               optimizer, compiler.kind)
        try:
            hash(key)
        except TypeError:  # an option value that cannot be a key: simulate afresh
            return _registered_memory.__wrapped__(*key), None
        return _registered_memory(*key), None
    if example_batch is None:
        return None, (f"your {planned.name}'s step needs the shapes of its input to be traced: pass "
                      "example_batch=<a batch of its input> (and loss=fn unless it has a loss method)")
    from ..training.step import CustomModel
    from .step_memory import planned_step_memory

    if loss is None and not hasattr(type(planned.abstract), "loss"):
        raise WorkbenchError(f"your {planned.name} has no loss method: pass loss=fn with fn(model, batch) -> "
                             "(loss, aux) to simulate its step")
    config = _step_config(f"custom:{planned.name}", {}, declared, mesh, batch, precision, optimizer, None)
    custom = CustomModel(planned.abstract, loss, batches=())
    return planned_step_memory(config, custom=custom, example_batch=example_batch, compiler=compiler), None


@functools.lru_cache(maxsize=32)
def _registered_memory(name: str, options: tuple, declared: type, mesh: MeshShape, batch: int, seq_len: int | None,
                       precision: str, optimizer: str, compiler: str):
    """A registered model's simulated step memory, once per model, options, mode, mesh, batch and precision."""
    from ..training.models import model_class
    from .step_memory import planned_step_memory

    config = _step_config(name, dict(options), declared, mesh, batch, precision, optimizer, model_class(name))
    return planned_step_memory(config, seq_len=seq_len, compiler=compiler)


def _step_config(model: str, options: dict, declared: type, mesh: MeshShape, batch: int, precision: str,
                 optimizer: str, model_cls: type | None):
    """The step :func:`plan_training` simulates, as the resolved record the trainer's would be: built from what
    the planner has checked and parsed already (mode, mesh, batch, precision, optimizer), not from text again."""
    from ..training.config import ResolvedConfig, TrainConfig

    config = TrainConfig(model=model, model_options=options, mode=declared.name, mesh=str(mesh), batch=batch,
                         precision=precision, optimizer=optimizer)
    return ResolvedConfig(config, mesh, declared, model_cls)


def _check_verifiable(settings: Any, mesh: MeshShape, declared: type, model: Any, rules: Any) -> None:
    """Bad ``verify`` input, before anything is planned: the target against the mesh, a mode that is not one
    program, your own model or rules."""
    from ..training.step import check_compiles_ahead
    from .compile_target import check_target

    check_compiles_ahead(declared)
    check_target(settings.target, mesh)
    if not isinstance(model, str):
        raise WorkbenchError("verify compiles the workbench's own step, which cannot rebuild your module in another "
                             "process: verify a registered model of similar size, or drop verify")
    if rules is not None:
        raise WorkbenchError("verify compiles the mode's own layout, not your rule table: drop rules to verify, or "
                             "drop verify to plan your table")

__all__ = [
    "DEFAULT_EXAMPLES_PER_REPLICA", "PlannedCollective", "TrainingPlan", "parse_byte_size", "plan_training",
]
