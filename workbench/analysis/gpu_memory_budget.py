"""XLA:GPU's memory budget: the temporaries over which the compiler recomputes values to fit (its own remat).

XLA:GPU schedules a step, and then rematerialises values (``HloRematerialization``: it frees a value and computes
it again where it is read), to keep the step under a limit it computes from the device's memory
(``GetSchedulerMemoryLimit`` in ``xla/service/gpu/gpu_hlo_schedule.cc``)::

    budget = (base - (arguments + outputs - aliased)) * xla_gpu_memory_limit_slop_factor / 100   (95 by default)

``base`` is the memory the compile is told about: the allocator's limit on a GPU (JAX's client passes it; JAX takes
75% of the GPU's memory by default, ``XLA_PYTHON_CLIENT_MEM_FRACTION``), and 80% of the target description's memory
in a compile without a GPU (``--verify gpu:...``). A step planned over its budget is not refused: the compiler
spends compute to come down to it, as far as it can (a scanned stack's saved activations are one loop's output and
are not recomputed). Measured, the 1.3B transformer unrolled, fsdp without remat, on 512 H100s compiled without a
GPU: planned 72.8 GiB, compiled 60.1 GiB with temporaries at the budget (59.9 GiB); the slop factor at 200 (no
recomputation) compiled 78.8 GiB, and at 50 (a budget of 31.5 GiB) 51.7 GiB: as far as its recomputation went.

Example:
    >>> budget = gpu_memory_budget(84_942_979_072, 2**30, xla_flags="", mem_fraction=None)
    >>> round(budget.on_gpu / 2**30, 1), round(budget.without_gpu / 2**30, 1)
    (55.4, 59.2)
"""

from __future__ import annotations

import dataclasses
import os
import re

from ..errors import WorkbenchError
from ..formatting import format_bytes

SLOP_FLAG = "xla_gpu_memory_limit_slop_factor"
DEFAULT_SLOP_PERCENT = 95  # XLA's default for SLOP_FLAG
DEVICELESS_BASE_PERCENT = 80  # XLA:GPU's base when the compile is told no allocator limit (no GPU)
LIFTED_SLOP_PERCENT = 1000  # a budget of 10x the memory: nothing is recomputed, the step compiles as written
LIFTED = {SLOP_FLAG: LIFTED_SLOP_PERCENT}  # the compiler options of that compile
AT_BUDGET = 0.98  # compiled temporaries from this fraction of the budget up: the compiler may have recomputed
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
DEFAULT_MEM_FRACTION = 0.75  # what JAX's GPU allocator takes of the memory unless MEM_FRACTION_ENV says otherwise


@dataclasses.dataclass(frozen=True)
class GpuMemoryBudget:
    """XLA:GPU's budget for one step's temporaries, both ways it compiles (see the module docstring).

    Attributes:
        device_memory: the GPU's memory as its target description gives it (bytes).
        io_bytes: the step's arguments + outputs - aliased (bytes).
        slop_percent: ``xla_gpu_memory_limit_slop_factor``.
        mem_fraction: the fraction of the memory JAX's allocator takes on the GPU.
    """

    device_memory: int
    io_bytes: int
    slop_percent: int = DEFAULT_SLOP_PERCENT
    mem_fraction: float = DEFAULT_MEM_FRACTION

    @property
    def on_gpu(self) -> int:
        """The budget when the step is compiled on the GPU, from the allocator's limit."""
        return self._from_base(self.allocator_bytes)

    @property
    def allocator_bytes(self) -> int:
        """What JAX's allocator takes of the GPU: the most a step's peak may hold there."""
        return int(self.device_memory * self.mem_fraction)

    @property
    def without_gpu(self) -> int:
        """The budget of a compile without the GPU (``--verify gpu:...``), from 80% of the memory."""
        return self._from_base(self.device_memory * DEVICELESS_BASE_PERCENT // 100)

    def _from_base(self, base: int) -> int:
        return max(base - self.io_bytes, 0) * self.slop_percent // 100

    def to_json(self) -> dict[str, int | float]:
        return {**dataclasses.asdict(self), "on_gpu": self.on_gpu, "without_gpu": self.without_gpu}


def gpu_memory_budget(device_memory: int, io_bytes: int, *, xla_flags: str | None = None,
                      mem_fraction: str | None = None) -> GpuMemoryBudget:
    """The budget of a step whose arguments + outputs - aliased are ``io_bytes``, on a GPU of ``device_memory``
    bytes, under ``xla_flags`` and ``mem_fraction`` (default: this process's ``XLA_FLAGS`` and
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``, which a verification's compile inherits).

    Raises :class:`~workbench.errors.WorkbenchError` naming a slop factor or memory fraction that is not a number.

    Example:
        >>> gpu_memory_budget(100 * 2**30, 0, xla_flags=f"--{SLOP_FLAG}=50", mem_fraction=".5").on_gpu // 2**30
        25
    """
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    fraction = os.environ.get(MEM_FRACTION_ENV) if mem_fraction is None else mem_fraction
    slop = DEFAULT_SLOP_PERCENT
    for value in re.findall(rf"--{SLOP_FLAG}=(\S*)", flags):  # XLA reads the last one given
        if not value.isdigit():
            raise WorkbenchError(f"XLA_FLAGS gives --{SLOP_FLAG}={value}: it takes a whole percentage, e.g. "
                                 f"--{SLOP_FLAG}={DEFAULT_SLOP_PERCENT}")
        slop = int(value)
    share = DEFAULT_MEM_FRACTION
    if fraction not in (None, ""):
        try:
            share = float(fraction)
        except ValueError:
            raise WorkbenchError(f"{MEM_FRACTION_ENV}={fraction!r} is not a fraction: give one like .75") from None
        if not 0 < share <= 1:
            raise WorkbenchError(f"{MEM_FRACTION_ENV}={fraction!r} is outside (0, 1]: give one like .75")
    return GpuMemoryBudget(device_memory, io_bytes, slop, share)


def over_budget_note(budget: GpuMemoryBudget, temp_bytes: int, peak_bytes: int | None = None) -> str | None:
    """What a plan says when its step's temporaries (``temp_bytes``) are over XLA:GPU's budget on the GPU; None when
    they are within it. With the step's ``peak_bytes`` over what JAX's allocator takes, it says that too: unless the
    compiler's recomputation brings it down, the step runs out of memory there.

    Example:
        >>> over_budget_note(GpuMemoryBudget(80 * 2**30, 0), 10 * 2**30) is None
        True
    """
    if temp_bytes <= budget.on_gpu:
        return None
    allocator = ""
    if peak_bytes is not None and peak_bytes > budget.allocator_bytes:
        allocator = (f"; its peak, {format_bytes(peak_bytes)}, is over the {format_bytes(budget.allocator_bytes)} "
                     f"JAX's allocator takes ({budget.mem_fraction:.0%} of the GPU: {MEM_FRACTION_ENV} sets it)")
    return (f"the step's temporaries, {format_bytes(temp_bytes)}, are over XLA:GPU's budget of "
            f"{format_bytes(budget.on_gpu)} on the GPU: the compiler will compute values again to come down to it, "
            "time this plan does not count (and a scanned stack's saved activations are not recomputed: it may not "
            f"fit){allocator}; --remat block, a smaller batch or more devices keep the step within it")


def reached_budget(temp_bytes: int, budget: int) -> bool:
    """Whether a compile's temporaries (``temp_bytes``) are at its budget or over it (recomputing came down only so
    far): XLA:GPU may have computed values again, so a second compile with the budget lifted (:data:`LIFTED`) shows
    the step as written.

    Example:
        >>> reached_budget(64_308_286_424, 64_317_901_122), reached_budget(40 * 2**30, 60 * 2**30)
        (True, False)
    """
    return temp_bytes >= AT_BUDGET * budget


def recomputed_toward_budget(planned_temp: int, compiled_temp: int, budget: int) -> bool:
    """Whether a compile for a GPU holds fewer temporaries (``compiled_temp`` bytes) than planned because XLA:GPU
    recomputed values to come down to ``budget`` (its compile's): the plan's are over the budget and the compiler's
    clearly below them (at the budget, or as far down as its recomputation went).

    Example:
        >>> recomputed_toward_budget(78 * 2**30, 60 * 2**30, 60 * 2**30), recomputed_toward_budget(50, 49, 60)
        (True, False)
    """
    return planned_temp > budget and compiled_temp < planned_temp * 0.97


__all__ = ["GpuMemoryBudget", "LIFTED", "LIFTED_SLOP_PERCENT", "gpu_memory_budget", "over_budget_note",
           "reached_budget", "recomputed_toward_budget"]
