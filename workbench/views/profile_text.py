"""Text tables of a profile: time per step, each collective's bytes and bandwidth, memory per device three ways.

:func:`profile_text` is the whole report as printed by a script or shown under the figures: the per-step
table, collective time by kind, the per-collective table (its ledger bytes beside its duration: the bandwidth
achieved), the memory table with its flags, and where the full trace is and how to open it. The tables take
a :class:`~workbench.analysis.timeline.Timeline` and a
:class:`~workbench.analysis.memory_comparison.MemoryComparison` (this layer formats, the analysis computes).

Example:
    >>> print(profile_text(read_profile("runs/mlp-dp")))
    profile of run mlp-dp: training steps ...
    ...
"""

from __future__ import annotations

from ..analysis.memory_comparison import DeviceMemory, MemoryComparison
from ..analysis.profile_report import ProfileReport
from ..analysis.timeline import Timeline
from ..formatting import align_columns, format_bandwidth, format_bytes, format_seconds

MAX_COLLECTIVE_ROWS = 20  # a transformer step has ~100 collectives: the ones taking the most time tell the story


def _us(microseconds: float) -> str:
    return format_seconds(microseconds * 1e-6)


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _step_lines(timeline: Timeline) -> list[str]:
    rows = [[str(timeline.first_step + s.step), _us(s.wall_us), _us(s.compute_us), _us(s.collective_us),
             _us(s.overlap_us), f"{s.collective_share:.0%}", f"{s.slowest_device} ({_us(s.slowest_compute_us)})"]
            for s in timeline.steps]
    headers = ["step", "wall", "compute", "collectives", "overlapped", "comm share", "most compute (device)"]
    return align_columns(headers, rows, right=range(6))


def _kind_lines(timeline: Timeline) -> list[str]:
    by_kind = timeline.collective_time_by_kind()
    wall = sum(s.wall_us for s in timeline.steps) / max(len(timeline.steps), 1)
    rows = []
    for kind, microseconds in by_kind.items():
        mine = [c for c in timeline.collectives if c.kind == kind]
        sent = sum((c.bytes or 0) * c.occurrences for c in mine)
        rows.append([kind, str(sum(c.occurrences for c in mine)), format_bytes(sent), _us(microseconds),
                     f"{microseconds / wall:.0%}" if wall else "-"])
    return align_columns(["kind", "ops/step", "bytes/step", "time/step", "of the step"], rows, right=range(1, 5))


def _collective_lines(timeline: Timeline, max_rows: int) -> list[str]:
    shown = timeline.collectives[:max_rows]
    rows = [[c.name, c.kind, _bytes(c.bytes), str(c.occurrences), _us(c.duration_us), _us(c.transfer_us),
             format_bandwidth(c.bandwidth), ",".join(c.axes) or "-", c.layer or "-"] for c in shown]
    headers = ["collective", "kind", "bytes", "per step", "duration", "transfer", "bandwidth", "axes", "layer"]
    lines = align_columns(headers, rows, right=range(2, 7))
    rest = timeline.collectives[max_rows:]
    if rest:
        lines.append(f"... {len(rest)} more collectives, {_us(sum(c.duration_us * c.occurrences for c in rest))} "
                     "per step in all")
    return lines


def timeline_table(timeline: Timeline, *, max_collectives: int = MAX_COLLECTIVE_ROWS) -> str:
    """The profiled steps' time as text: per step, per collective kind, and per collective op.

    Per step (mean over devices): wall time, compute, collectives, both at once (overlapped), the share of the
    step spent communicating and not computing, and the device with the most compute. Per collective (the ones
    taking the most time first, at most ``max_collectives``): its bytes per device from the compiled HLO (the
    ledger's figure), how often it runs per step, its median duration (waiting for the others included), its
    transfer (from the last device's arrival), the bandwidth that transfer achieved, its mesh axes and layer.

    Example:
        >>> from workbench.analysis import Timeline
        >>> from workbench.analysis.timeline import CollectiveTiming, StepTiming
        >>> timeline = Timeline("jit_step", (0, 1), (), (StepTiming(0, 1000.0, 600.0, 300.0, 0.0, 1, 650.0),),
        ...                     (CollectiveTiming("all-reduce.8", "all-reduce", 104_492, ("data",), None, 1, 300.0,
        ...                                       250.0),),
        ...                     "trace.json.gz", first_step=12)
        >>> print(timeline_table(timeline))
        time per step (mean over devices)
        step  wall  compute  collectives  overlapped  comm share  most compute (device)
        ----  ----  -------  -----------  ----------  ----------  ---------------------
          12  1 ms   600 us       300 us         0 s         30%  1 (650 us)
        <BLANKLINE>
        collective time per step, by kind
        kind        ops/step  bytes/step  time/step  of the step
        ----------  --------  ----------  ---------  -----------
        all-reduce         1   102.0 KiB     300 us          30%
        <BLANKLINE>
        collectives (bytes per device from the compiled step; bandwidth = bytes / transfer)
        collective    kind            bytes  per step  duration  transfer  bandwidth  axes  layer
        ------------  ----------  ---------  --------  --------  --------  ---------  ----  -----
        all-reduce.8  all-reduce  102.0 KiB         1    300 us    250 us   418 MB/s  data  -
    """
    lines = ["time per step (mean over devices)", *_step_lines(timeline), ""]
    if timeline.collectives:
        lines += ["collective time per step, by kind", *_kind_lines(timeline), "",
                  "collectives (bytes per device from the compiled step; bandwidth = bytes / transfer)",
                  *_collective_lines(timeline, max_collectives)]
    else:
        lines.append("no collectives: each device computes alone")
    return "\n".join(lines)


def missing_figures(memory: MemoryComparison) -> list[str]:
    """Why the predicted or compiled figure is missing from a memory comparison, one line each (none: both known).

    Example:
        >>> from workbench.analysis.memory_comparison import MemoryComparison
        >>> missing_figures(MemoryComparison((), (), compiled_note="the mode runs several programs"))
        ['no compiled figure: the mode runs several programs']
    """
    notes = (("predicted", memory.predicted_note), ("compiled", memory.compiled_note))
    return [f"no {source} figure: {note}" for source, note in notes if note]


def _roles(device: DeviceMemory) -> str:
    """The live bytes by role, largest first."""
    roles = sorted(((n, role) for role, n in device.live_roles.items() if n), reverse=True)
    return ", ".join(f"{role} {format_bytes(n)}" for n, role in roles) or "-"


def _device_ranges(devices: list[int]) -> str:
    """``0-7`` for a run of consecutive ids, else the ids: ``0,2,5``."""
    if len(devices) > 2 and devices == list(range(devices[0], devices[-1] + 1)):
        return f"{devices[0]}-{devices[-1]}"
    return ",".join(map(str, devices))


def memory_table(memory: MemoryComparison) -> str:
    """Memory per device as text: predicted and compiled arguments and peaks, live bytes (against the predicted
    arguments, and by role, largest first), then the flags and why a figure is missing. Devices with the same
    figures share a row (``0-7``).

    Example:
        >>> from workbench.analysis.memory_comparison import compare_memory
        >>> sample = {"by_device": {0: {"state": 900, "state copy": 900}}, "in_use": None, "peak_in_use": None}
        >>> print(memory_table(compare_memory(None, None, [sample], predicted_note="your own model")))
        device  predicted args  predicted peak  compiled args  compiled peak     live  vs predicted  live by role
        ------  --------------  --------------  -------------  -------------  -------  ------------  -----------------------------
             0               -               -              -              -  1.8 KiB             -  state copy 900 B, state 900 B
        no predicted figure: your own model
    """  # noqa: E501 - the example's output is the table itself, 130 characters wide
    # An accelerator's allocator (GPU, TPU) reports what the device holds; XLA:CPU keeps no such figures.
    allocator = any(d.in_use is not None or d.peak_in_use is not None for d in memory.devices)
    same: dict[tuple[str, ...], list[int]] = {}
    for d in memory.devices:
        change = d.live_vs_predicted
        cells = (_bytes(d.predicted_arguments), _bytes(d.predicted_peak), _bytes(d.compiled_arguments),
                 _bytes(d.compiled_peak), format_bytes(d.live), "-" if change is None else f"{change:+.0%}",
                 *((_bytes(d.in_use), _bytes(d.peak_in_use), _bytes(d.limit)) if allocator else ()), _roles(d))
        same.setdefault(cells, []).append(d.device)
    rows = [[_device_ranges(devices), *cells] for cells, devices in same.items()]
    headers = ["device", "predicted args", "predicted peak", "compiled args", "compiled peak", "live", "vs predicted",
               *(("allocator in use", "allocator peak", "allocator limit") if allocator else ()), "live by role"]
    lines = align_columns(headers, rows, right=range(len(headers) - 1))
    lines += [f"flag: {flag}" for flag in memory.flags] + missing_figures(memory)
    return "\n".join(lines)


def profile_text(report: ProfileReport) -> str:
    """A :class:`~workbench.analysis.profile_report.ProfileReport` as text: what was profiled, the
    :func:`timeline_table` (or why the trace could not be read), the :func:`memory_table`, and how to open the
    full trace.

    Example:
        >>> name = trainer.start(steps=1000); report = read_profile(trainer.profile(steps=5))
        >>> trainer.stop(); summary = trainer.wait(); trainer.status
        'stopped'
        >>> print(profile_text(report))
        profile of run mlp-dp-...: training steps ... (5 steps) in runs/mlp-dp-.../profile/step-...
        ...
    """
    last = report.first_step + report.steps - 1
    lines = [f"profile of run {report.run}: training steps {report.first_step} to {last} ({report.steps} steps) "
             f"in {report.folder}"]
    if report.capture_error:
        lines.append(f"the capture failed: {report.capture_error} (the raw files are kept in {report.folder})")
    lines += [f"note: {note}" for note in getattr(report, "notes", ())]
    lines.append("")
    if report.timeline is not None:
        lines.append(timeline_table(report.timeline))
    else:
        lines.append(f"no timeline: {report.timeline_error}")
    lines += ["", "memory per device: predicted (layout engine), compiled (XLA), live (while training)",
              memory_table(report.memory), "", report.how_to_open()]
    return "\n".join(lines)


__all__ = ["memory_table", "missing_figures", "profile_text", "timeline_table"]
