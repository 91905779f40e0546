"""A planned step's time under a stated overlap model, and what bounds it: the ranking figure of
:func:`~.recommender.recommend`.

The overlap model: the collectives over ``data`` (the gradient sync; fsdp's per-layer gathers and
reduce-scatters) run beside the maths, because each moves what the next or the previous layer needs while this
one computes (XLA's async collectives, the scaling book's assumption); the collectives over ``model`` (tp's
activation all-reduces) sit between one matmul and the next, on the critical path. So a step takes
``max(compute, data collectives) + model collectives``. Compute is the plan's FLOPs (recomputation included) at
its stated utilisation; each collective is priced on the link level it crosses (:func:`~.cost_model.collective_time`).

Example:
    >>> plan = plan_training("transformer", {"n_layers": 2}, "data=4,model=2", "dp-tp", hardware="h100-nvlink",
    ...                      simulate=False)
    >>> time = step_time(plan)
    >>> time.step_s == max(time.compute_s, time.overlapped_s) + time.exposed_s
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..formatting import format_bytes, format_seconds
from ..layout.mesh import DATA_AXIS
from .collectives import bytes_by_kind_and_axes
from .cost_model import Hardware, collective_time, group_spans_hosts

OVERLAP_MODEL = ("collectives over 'data' (gradient sync, fsdp's gathers) overlap the compute; those over 'model' "
                 "(tp's activation all-reduces) do not: step = max(compute, data collectives) + model collectives")


@dataclasses.dataclass(frozen=True)
class StepTime:
    """A step's predicted seconds, in parts.

    Attributes:
        compute_s: the maths, recomputation included, at the plan's utilisation.
        overlapped_s: collectives that run beside the maths (over ``data``).
        exposed_s: collectives on the critical path (over ``model``).
        bound: what the step waits on, in words: ``compute``, or a named collective on a named link.
        bound_kind: ``"compute"``, ``"overlapped"`` or ``"exposed"``: which part sets the time.
    """

    compute_s: float
    overlapped_s: float
    exposed_s: float
    bound: str
    bound_kind: str

    @property
    def step_s(self) -> float:
        """``max(compute, overlapped) + exposed`` (:data:`OVERLAP_MODEL`)."""
        return max(self.compute_s, self.overlapped_s) + self.exposed_s

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "step_s": self.step_s}


def link_words(hw: Hardware, spans_hosts: bool) -> str:
    """The link a collective runs on, in words, with its one-way bandwidth.

    Example:
        >>> from workbench.analysis.cost_model import hardware
        >>> link_words(hardware("h100-nvlink"), True), link_words(hardware("tpu-v5p"), False)
        ('the links between hosts (50 GB/s)', 'ICI (100 GB/s)')
    """
    if spans_hosts and hw.host_bandwidth:
        return f"the links between hosts ({hw.host_bandwidth / 1e9:g} GB/s)"
    name = {"gpu": "NVLink within a host", "tpu": "ICI"}.get(hw.compiler, "memory copies between devices")
    return f"{name} ({hw.bandwidth / 1e9:g} GB/s)"


def step_time(plan: Any, collectives: Sequence[Any] | None = None) -> StepTime:
    """The step time of ``plan`` (a :class:`~.training_plan.TrainingPlan`) under :data:`OVERLAP_MODEL`.

    ``collectives``: the compiler's (:class:`~.compiled_step.CompiledCollective` records, each with the mesh axes
    its groups span), to rank a verified layout on what was compiled: each planned collective is priced again on
    its share of the compiler's bytes of its kind over the same axes (its occurrences, so its latency, stay the
    plan's: the gradient sync one bucket, as XLA's combiners make it), and a kind over axes the plan has none of
    is priced with the ring model, each occurrence. So each is overlapped or exposed by its own axes: the
    all-gathers libtpu adds over ``model`` sit on the critical path, where scaling the plan's all-gathers over
    ``data`` by all the compiler's all-gather bytes hid them under the compute.

    Example:
        >>> plan = plan_training("transformer", {"n_layers": 2}, "data=8", "dp", hardware="tpu-v5p", global_batch=512,
        ...                      simulate=False)
        >>> step_time(plan).bound_kind
        'compute'
    """
    overlapped, exposed = [], []
    for seconds, collective in _priced(plan, collectives):
        (overlapped if DATA_AXIS in collective.axes else exposed).append((seconds, collective))
    compute = plan.predicted_step_compute_s
    overlapped_s, exposed_s = sum(s for s, _ in overlapped), sum(s for s, _ in exposed)
    if compute >= overlapped_s and compute >= exposed_s:
        hidden = f", which hides {format_seconds(overlapped_s)} of collectives over 'data'" if overlapped_s else ""
        if exposed_s:
            hidden += f"; then {format_seconds(exposed_s)} of collectives over 'model', not overlapped"
        return StepTime(compute, overlapped_s, exposed_s, f"compute: {format_seconds(compute)} of maths at "
                        f"{plan.utilisation:.0%} of peak{hidden}", "compute")
    part, kind = (overlapped, "overlapped") if overlapped_s - compute >= exposed_s else (exposed, "exposed")
    seconds, largest = max(part, key=lambda item: item[0])
    spans = group_spans_hosts(plan.mesh, largest.axes, plan.hardware.devices_per_host)
    axes = ",".join(largest.axes)
    total = overlapped_s if kind == "overlapped" else exposed_s
    words = (f"collectives over '{axes}'{'' if kind == 'overlapped' else ', not overlapped'}: "
             f"{format_seconds(total)} against {format_seconds(compute)} of maths; the largest, "
             f"{_described(largest)} ({largest.count} x {format_bytes(largest.bytes)} over "
             f"{largest.group_size} devices) on {link_words(plan.hardware, spans)}, takes {format_seconds(seconds)}")
    return StepTime(compute, overlapped_s, exposed_s, words, kind)


def _priced(plan: Any, compiled: Sequence[Any] | None) -> list[tuple[float, Any]]:
    """(seconds a step, record) for the plan's collectives, or for what the compiler placed (``step_time``)."""
    if compiled is None:
        return [(c.time_s, c) for c in plan.collectives]
    planned, measured = bytes_by_kind_and_axes(plan.collectives), bytes_by_kind_and_axes(compiled)
    # The bytes are scaled, not the seconds: the plan's latency terms (its occurrences) stand, where a tiny planned
    # all-reduce (the loss) scaled by the compiler's gradient all-reduces would multiply its latency too.
    scaled = [(_ring_seconds(c, plan, c.bytes * measured.get((c.kind, c.axes), 0) / planned[(c.kind, c.axes)]), c)
              for c in plan.collectives if planned[(c.kind, c.axes)]]
    return scaled + [(_ring_seconds(c, plan, c.bytes), c) for c in compiled if (c.kind, c.axes) not in planned]


def _ring_seconds(collective: Any, plan: Any, nbytes: float) -> float:
    """Ring-model seconds a step for ``collective``'s ``count`` occurrences of ``nbytes``, on the link its axes
    cross, as the plan prices its own (:func:`~.planned_collectives.step_collectives`)."""
    if collective.group_size <= 1 or nbytes <= 0:
        return 0.0
    spans = group_spans_hosts(plan.mesh, collective.axes, plan.hardware.devices_per_host)
    each = collective_time(collective.kind, nbytes, collective.group_size, plan.hardware, spans_hosts=spans)
    return collective.count * each


def _described(collective: Any) -> str:
    """A planned collective's kind and what it moves, or a compiled one's kind and where the compiler put it."""
    what = getattr(collective, "what", None)
    if what is not None:
        return f"{collective.kind} of {what.split(' (')[0]}"
    layers = ", ".join(collective.layers[:2]) + (" and more" if len(collective.layers) > 2 else "")
    return f"{collective.kind} the compiler placed {f'in {layers}' if layers else 'in no named layer'}"


__all__ = ["OVERLAP_MODEL", "StepTime", "link_words", "step_time"]
