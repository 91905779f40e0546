"""Memory per device three ways: the layout engine's prediction, the compiler's estimate, and what is live.

* **Predicted**: the layout engine's simulation of the step (:func:`~.step_memory.planned_step_memory`):
  its arguments (the state and the batch, what lives between steps) and its peak (with the temporaries).
* **Compiled**: XLA's memory analysis of the step that trains (:func:`~.ledger.memory_figures`), the same two.
* **Live**: measured while training: the bytes of every array alive on each device, summed shard by shard
  over ``jax.live_arrays()`` (:func:`~workbench.training.profiling.live_bytes_by_device`), taken just before a
  profiled step is dispatched, when its arguments are all alive; where the backend keeps allocator statistics
  (GPU, TPU: ``Device.memory_stats()``) its bytes in use, peak and limit are read too. XLA:CPU keeps none.

Each live array has a role: the step's ``state`` or ``batch`` (by identity), a ``state copy`` (the shape and
dtype of a state leaf, in any layout, but not the state: an undonated old state, or a copy kept somewhere), a
``batch copy`` (a batch prefetched, or kept), or ``other``. A device whose live bytes differ from the predicted
arguments by more than :data:`FLAG_FRACTION` is flagged with the roles that make the difference.

Example:
    >>> sample = {"by_device": {0: {"state": 900, "batch": 100}}, "in_use": None, "peak_in_use": None}
    >>> compare_memory(None, None, [sample]).devices[0].live
    1000
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..formatting import format_bytes
from .step_memory import StepMemory

FLAG_FRACTION = 0.10
ROLES = ("state", "batch", "state copy", "batch copy", "other")
_WHAT = {
    "state copy": "arrays shaped like the state but not the state: undonated buffers (an old state the step did "
                  "not donate) or a leaked copy (an initial or earlier state still referenced)",
    "batch copy": "arrays shaped like the batch but not this step's batch: the batch prefetch, or batches kept",
    "other": "arrays neither the state nor a batch (metrics, evaluation results, a notebook's own arrays)",
}


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device's bytes three ways. ``live`` is the largest sample's total, ``live_roles`` that sample's
    bytes by role; ``predicted_*``/``compiled_*`` are None where unknown (a mode of several programs)."""

    device: int
    predicted_arguments: int | None
    predicted_peak: int | None
    compiled_arguments: int | None
    compiled_peak: int | None
    live: int
    live_roles: dict[str, int]
    in_use: int | None = None
    peak_in_use: int | None = None
    limit: int | None = None  # the most the allocator may hand out (``bytes_limit``), where it keeps one

    @property
    def live_vs_predicted(self) -> float | None:
        """live / predicted arguments - 1 (0.12: 12% more live than predicted)."""
        return self.live / self.predicted_arguments - 1 if self.predicted_arguments else None


@dataclasses.dataclass(frozen=True)
class MemoryComparison:
    """Per-device memory predicted, compiled and live (see the module docstring), and what differs.

    ``flags`` holds one sentence per device whose live bytes differ from the predicted arguments by more
    than :data:`FLAG_FRACTION`, naming what makes the difference.
    """

    devices: tuple[DeviceMemory, ...]
    flags: tuple[str, ...]
    predicted_note: str | None = None
    compiled_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"devices": [dataclasses.asdict(d) for d in self.devices], "flags": list(self.flags),
                "predicted_note": self.predicted_note, "compiled_note": self.compiled_note}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryComparison:
        return cls(tuple(DeviceMemory(**d) for d in data["devices"]), tuple(data["flags"]),
                   data.get("predicted_note"), data.get("compiled_note"))


def _flag(device: DeviceMemory) -> str | None:
    """Why ``device``'s live bytes differ from the prediction by more than the threshold (None: they do not)."""
    change, predicted = device.live_vs_predicted, device.predicted_arguments
    if change is None or predicted is None or abs(change) <= FLAG_FRACTION:  # change: None without a prediction
        return None
    words = (f"device {device.device}: {format_bytes(device.live)} live, {change:+.0%} against the predicted "
             f"{format_bytes(predicted)} (state and batch)")
    if change < 0:
        return (f"{words}: less than predicted: the layout engine counts arrays this step does not hold live "
                "(e.g. a batch already consumed, or state the mode keeps on the host)")
    noticeable = FLAG_FRACTION / 2 * predicted
    causes = [f"{format_bytes(device.live_roles[role])} of {_WHAT[role]}"
              for role in ("state copy", "batch copy", "other")
              if device.live_roles.get(role, 0) > noticeable]
    return f"{words}: {'; '.join(causes) if causes else 'the state or batch is larger than the layout predicts'}"


def _allocator_flags(device: DeviceMemory) -> list[str]:
    """Where the allocator's own figures (GPU, TPU) disagree with the arrays counted or the compiled peak by more
    than :data:`FLAG_FRACTION`: the allocator is the truth for what the device holds."""
    flags = []
    if device.in_use is not None and abs(device.in_use - device.live) > FLAG_FRACTION * max(device.live, 1):
        more = device.in_use - device.live
        why = ("buffers no live array owns: the last step's outputs or temporaries still held, or the runtime's own"
               if more > 0 else "arrays counted that the allocator does not hold (shared or not yet placed)")
        flags.append(f"device {device.device}: the allocator has {format_bytes(device.in_use)} in use and the arrays "
                     f"counted are {format_bytes(device.live)} ({more:+,} B): {why}")
    needed = max(filter(None, (device.compiled_peak, device.predicted_peak)), default=None)
    if device.limit and needed and needed > device.limit:
        flags.append(f"device {device.device}: the step needs {format_bytes(needed)} at its peak and the allocator may "
                     f"hand out {format_bytes(device.limit)}: a larger batch or model will not fit (XLA_PYTHON_CLIENT_"
                     "MEM_FRACTION raises the limit; a smaller batch, fsdp or remat lowers the need)")
    if (device.peak_in_use is not None and device.compiled_peak
            and abs(device.peak_in_use - device.compiled_peak) > FLAG_FRACTION * device.compiled_peak):
        flags.append(f"device {device.device}: the allocator's peak is {format_bytes(device.peak_in_use)} and the "
                     f"compiled step's {format_bytes(device.compiled_peak)}: the peak includes what else the process "
                     "held (other programs, evaluation, arrays of the notebook)")
    return flags


def _total(sample: Mapping[str, Any], device: int) -> int:
    return sum(sample["by_device"].get(device, {}).values())


def _by_device(samples: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """JSON turned the device ids into strings: back to ints."""
    return [{**s, **{key: {int(d): v for d, v in s[key].items()}
                     for key in ("by_device", "in_use", "peak_in_use", "limit")
                     if s.get(key)}} for s in samples]


def compare_memory(predicted: StepMemory | None, compiled: Mapping[str, int] | None,
                   samples: Sequence[Mapping[str, Any]], *,
                   predicted_note: str | None = None, compiled_note: str | None = None) -> MemoryComparison:
    """Put the three together, per device, and flag differences beyond :data:`FLAG_FRACTION`.

    Args:
        predicted: a :class:`~.step_memory.StepMemory` (per device), or None.
        compiled: the compiled step's memory analysis (:func:`~.ledger.memory_figures`), or None.
        samples: live samples (:func:`~workbench.training.profiling.live_bytes_by_device`); per device the
            sample with the most bytes is kept.
        predicted_note, compiled_note: why a figure is missing, shown in its place.

    Example:
        >>> sample = {"by_device": {0: {"state": 900, "batch": 100}}, "in_use": None, "peak_in_use": None}
        >>> compare_memory(StepMemory(1000, 900, 900, 50), None, [sample]).flags
        ()
    """
    def peak(memory: Mapping[str, int]) -> int:
        return memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"]

    samples = _by_device(samples)
    devices, flags = [], []
    for device in sorted({d for sample in samples for d in sample["by_device"]}):
        largest = max(samples, key=lambda sample: _total(sample, device))
        peaks = [s["peak_in_use"].get(device, 0) for s in samples if s.get("peak_in_use")]
        row = DeviceMemory(
            device,
            predicted.argument_bytes if predicted is not None else None,
            predicted.peak_bytes if predicted is not None else None,
            compiled["argument_bytes"] if compiled else None,
            peak(compiled) if compiled else None,
            _total(largest, device), dict(largest["by_device"].get(device, {})),
            largest["in_use"].get(device) if largest.get("in_use") else None,
            max(peaks) if peaks else None,
            largest["limit"].get(device) if largest.get("limit") else None,
        )
        devices.append(row)
        flags += [flag for flag in (_flag(row), *_allocator_flags(row)) if flag]
    return MemoryComparison(tuple(devices), tuple(flags), predicted_note, compiled_note)


__all__ = ["DeviceMemory", "FLAG_FRACTION", "MemoryComparison", "ROLES", "compare_memory"]
