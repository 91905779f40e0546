"""The record of a training run planned on an abstract mesh (:class:`TrainingPlan`), its figures per device and
its JSON form; :func:`~.planning.plan_training` builds it and :mod:`.plan_text` draws it as text.

Example:
    >>> plan = plan_training("mlp", {"hidden": 256}, "data=8", "fsdp", hardware="cpu")
    >>> plan.total_bytes == plan.params_bytes + plan.grads_bytes + plan.opt_state_bytes
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.sharding import PartitionSpec

from ..layout.lint import LayoutWarning
from ..layout.mesh import MeshShape
from ..layout.rules import RuleTable
from ..layout.specs import spec_to_json
from ..layout.tree_layout import TreeLayout
from .compiled_step import CompiledStep
from .compiler_rules import CompilerRules, compiler_rules
from .cost_model import ComputeBoundTest, Hardware, compute_time
from .gpu_memory_budget import GpuMemoryBudget, gpu_memory_budget
from .gpu_target import chip_for_hardware
from .plan_comparison import PlanComparison, compare_plan
from .plan_text import plan_text, rules_code
from .planned_collectives import PlannedCollective
from .step_memory import StepMemory


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingPlan:
    """A training run planned on an abstract mesh. Build it with :func:`plan_training`.

    Byte figures are per device. ``total_bytes`` is the training state (parameters + gradients +
    optimizer state); ``peak_bytes`` adds the rough transients (``activation_bytes``, one microbatch's and None
    when not estimated, ``transient_params_bytes`` and ``accumulator_bytes``), and ``fits`` compares ``peak_bytes``
    with ``device_memory``.
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
    compiled: CompiledStep | None = None  # the compiler's CompiledStep of the same step, when verified
    memory: StepMemory | None = None  # the step's memory, simulated from its jaxpr (None: see memory_caveat)
    memory_caveat: str | None = None  # why the step's memory is not simulated
    compiler: str = "cpu"  # the compile target kind whose rules ``memory`` follows (see .compiler_rules)
    accum: int = 1  # microbatches per step (gradient accumulation)
    remat: str = "none"  # what each block keeps for the backward pass (workbench.training.remat)
    remat_flops_per_device: float = 0.0  # of flops_per_device: what the remat policy computes again

    @property
    def memory_rules(self) -> CompilerRules:
        """The compiler whose buffers ``memory`` simulates (:mod:`.compiler_rules`)."""
        return compiler_rules(self.compiler)

    def with_compiled(self, compiled: CompiledStep) -> TrainingPlan:
        """This plan with the compiler's figures for its step attached (a :class:`~.compiled_step.CompiledStep`
        from :func:`~.verification.verify_plan` or a :class:`~.verification.VerificationJob`)."""
        return dataclasses.replace(self, compiled=compiled)

    @property
    def comparison(self) -> PlanComparison | None:
        """The analytic figures beside the compiler's (:class:`~.plan_comparison.PlanComparison`); None unverified."""
        return None if self.compiled is None else compare_plan(self, self.compiled)

    @property
    def gpu_budget(self) -> GpuMemoryBudget | None:
        """XLA:GPU's budget for the step's temporaries (:mod:`.gpu_memory_budget`), for a step simulated as XLA:GPU
        stores it; None otherwise. From the chip's memory as XLA reads it (the preset's chip), or the plan's own
        ``device_memory`` where it was given another."""
        if self.memory_rules.kind != "gpu" or self.memory is None:
            return None
        chip = chip_for_hardware(self.hardware.name)
        memory = chip.memory_bytes if chip is not None and self.device_memory == self.hardware.memory_bytes \
            else self.device_memory
        step = self.memory
        return gpu_memory_budget(memory, step.argument_bytes + step.output_bytes - step.alias_bytes)

    @property
    def params_bytes(self) -> int:
        return self.params_layout.bytes_per_device

    @property
    def grads_bytes(self) -> int:
        """Gradients: float32 and laid out like the parameters they belong to."""
        return self.params_layout.bytes_per_device

    @property
    def accumulator_bytes(self) -> int:
        """The gradients summed over the microbatches (the accumulation loop's carry, beside each microbatch's own
        gradients): laid out like them; 0 without accumulation."""
        return self.grads_bytes if self.accum > 1 else 0

    @property
    def microbatch_examples_per_device(self) -> int:
        """Examples (sequences) one device computes at a time: its share of one microbatch."""
        return self.examples_per_device // self.accum

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
        return self.total_bytes + (self.activation_bytes or 0) + self.transient_params_bytes + self.accumulator_bytes

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
            "accumulator_bytes": self.accumulator_bytes,
            "peak_bytes": self.peak_bytes,
            "simulated": None if self.memory is None else self.memory.to_json(),
            "memory_caveat": self.memory_caveat, "memory_compiler": self.memory_rules.name,
            "xla_gpu_budget": None if self.gpu_budget is None else self.gpu_budget.to_json(),
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
        return rules_code(self, name)

    def to_json(self) -> dict[str, Any]:
        """The plan as one JSON object (the CLI's ``plan --json`` format)."""
        comparison = self.comparison
        return {
            "model": self.model,
            "model_options": dict(self.model_options),
            "mesh": self.mesh.axes,
            "devices": self.mesh.size,
            "mode": self.mode,
            "optimizer": self.optimizer,
            "precision": self.precision,
            "remat": self.remat,
            "params": self.params,
            "per_device": self.per_device,
            "device_memory": self.device_memory,
            "fits": self.fits,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "global_batch_tokens": self.global_batch * self.seq_len if self.seq_len else None,
            "accum": self.accum,
            "data_parallel_size": self.data_parallel_size,
            "examples_per_device": self.examples_per_device,
            "microbatch_examples_per_device": self.microbatch_examples_per_device,
            "tokens_per_device": self.tokens_per_device,
            "collectives": [c.to_json() for c in self.collectives],
            "predicted_step_comm_s": self.predicted_step_comm_s,
            "flops_per_device": self.flops_per_device,
            "remat_flops_per_device": self.remat_flops_per_device,
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
            "compiler": None if comparison is None else comparison.to_json(),
        }

    def to_text(self, *, with_code: bool = True) -> str:
        """A readable summary: what fits, what a step sends and computes, then the rules code
        (:func:`~.plan_text.plan_text`)."""
        return plan_text(self, with_code=with_code)


__all__ = ["TrainingPlan"]
