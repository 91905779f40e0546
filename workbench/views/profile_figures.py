"""Plotly figures of a profile: one step's ops per device in time, and memory per device three ways.

:func:`timeline_figure` draws a :class:`~workbench.analysis.timeline.Timeline` step as one lane per device, each
op a horizontal bar from its start: compute in grey, each collective kind in its own colour (thinner, on top,
so an overlap with compute shows). There is one bar trace per kind, not per op, so a transformer step of
thousands of ops builds in a fraction of a second. :func:`memory_figure` draws a
:class:`~workbench.analysis.memory_comparison.MemoryComparison`: per device the predicted, compiled and live
bytes side by side, live stacked by role, the predicted and compiled peaks as markers, and the flags.
This layer draws, the analysis layer computes. Plotly is imported only here.

Example:
    >>> report = read_profile("runs/mlp-dp")
    >>> timeline_figure(report.timeline, step=1).show(); memory_figure(report.memory).show()  # doctest: +SKIP
"""

from __future__ import annotations

import html
from collections import defaultdict
import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

from ..analysis.memory_comparison import MemoryComparison
from ..analysis.timeline import TimedOp, Timeline
from ..errors import WorkbenchError
from ..formatting import format_bandwidth, format_bytes, format_bytes_exact, format_seconds
from .colors import OKABE_ITO, op_kind_color
from .profile_text import missing_figures

COMPUTE = "compute"
MS_AXIS_FROM_US = 2000  # a step this long is read in milliseconds, a shorter one in microseconds
LANE_WIDTH = {True: 0.45, False: 0.8}  # by is-collective: a collective is thinner, drawn over compute
SOURCE_STYLE = {"predicted": ("#56b4e9", "/"), "compiled": ("#e69f00", "x")}  # Okabe-Ito sky blue, orange; hatched
ROLE_COLORS = {
    "state": OKABE_ITO[4],  # blue
    "batch": OKABE_ITO[2],  # bluish green
    "state copy": OKABE_ITO[5],  # vermillion: copies are what a flag is about
    "batch copy": OKABE_ITO[6],  # reddish purple
    "other": OKABE_ITO[7],  # grey
}
MAX_FLAGS_SHOWN = 3  # flags of many devices repeat each other: the rest are counted
FLAG_LINE_CHARACTERS = 130
NOTE_LINE_PX = 16
AXIS_LABELS_PX = 100  # the two rows of x labels (sources upright, then devices) the notes go under


def _us(microseconds: float) -> str:
    return format_seconds(microseconds * 1e-6)


def _lane(device: int) -> str:
    return f"device {device}"


def _op_hover(op: TimedOp, bandwidth: dict[str, float | None]) -> str:
    lines = [f"<b>{html.escape(op.name)}</b> · {op.kind} on device {op.device}",
             f"layer {html.escape(op.layer) if op.layer else '-'}",
             f"{_us(op.duration_us)}, from {_us(op.start_us)} to {_us(op.end_us)}"]
    if op.kind != COMPUTE:
        sent = format_bytes_exact(op.bytes) if op.bytes is not None else "bytes unknown"
        lines.append(f"{sent} per device · bandwidth {format_bandwidth(bandwidth.get(op.name))}")
    return "<br>".join(lines)


def _step_title(timeline: Timeline, step: int) -> str:
    timing = timeline.steps[step]
    words = (f"training step {timeline.first_step + step}: {_us(timing.wall_us)} wall, "
             f"{timing.collective_share:.0%} communicating (not overlapped with compute)")
    detail = (f"per device: compute {_us(timing.compute_us)}, collectives {_us(timing.collective_us)}, overlapped "
              f"{_us(timing.overlap_us)}; most compute on device {timing.slowest_device} "
              f"({_us(timing.slowest_compute_us)}) · profiled step {step + 1} of {len(timeline.steps)}")
    return f"{words}<br><sup>{detail}</sup>"


def timeline_figure(timeline: Timeline, step: int = 0) -> go.Figure:
    """One profiled step as lanes of ops, one lane per device (see the module docstring).

    Hover names each op, its kind, layer, duration and, for a collective, its bytes per device and the
    bandwidth its transfers achieved. The legend toggles kinds.

    Args:
        timeline: a :class:`~workbench.analysis.timeline.Timeline` (``report.timeline``).
        step: which profiled step, 0 for the first (the title gives its training step).

    Raises:
        WorkbenchError: ``step`` is not one of the profiled steps.

    Example:
        >>> figure = timeline_figure(read_profile("runs/mlp-dp").timeline, step=0)
        >>> [trace.name for trace in figure.data]
        ['compute', 'all-reduce']
    """
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(timeline.steps):
        raise WorkbenchError(f"step={step!r} is not a profiled step: the timeline has {len(timeline.steps)}, "
                             f"numbered 0 to {len(timeline.steps) - 1} (training steps {timeline.first_step} on)")
    bandwidth = {c.name: c.bandwidth for c in timeline.collectives}
    unit, scale = ("ms", 1e-3) if timeline.steps[step].wall_us >= MS_AXIS_FROM_US else ("µs", 1.0)
    by_kind: dict[str, list[TimedOp]] = defaultdict(list)
    for op in timeline.step_ops(step):
        by_kind[op.kind].append(op)
    # Compute first, then collectives by the time they take: drawn in that order, collectives on top.
    kinds = sorted(by_kind, key=lambda kind: (kind != COMPUTE, -sum(op.duration_us for op in by_kind[kind])))
    figure = go.Figure()
    for kind in kinds:
        ops = by_kind[kind]
        figure.add_trace(go.Bar(
            orientation="h", name=kind, y=[_lane(op.device) for op in ops], base=[op.start_us * scale for op in ops],
            x=[op.duration_us * scale for op in ops], width=LANE_WIDTH[kind != COMPUTE],
            marker=dict(color=op_kind_color(kind), line=dict(width=0)),
            hovertext=[_op_hover(op, bandwidth) for op in ops], hovertemplate="%{hovertext}<extra></extra>",
        ))
    lanes = [_lane(device) for device in timeline.devices]
    figure.update_layout(
        title=dict(text=_step_title(timeline, step), x=0.01),
        barmode="overlay",
        xaxis=dict(title=f"{unit} from the step's first op", zeroline=False),
        yaxis=dict(type="category", categoryorder="array", categoryarray=lanes, autorange="reversed"),
        legend=dict(title="op kind", orientation="h", y=-0.15),
        height=max(300, 32 * len(lanes) + 190),
        margin=dict(t=90, l=80),
        plot_bgcolor="white",
        hoverlabel=dict(align="left"),
    )
    return figure


# --- memory -------------------------------------------------------------------------------------------


def _wrapped(text: str, width: int = FLAG_LINE_CHARACTERS) -> str:
    """``text`` escaped, broken into ``<br>``-separated lines of at most ``width`` characters at spaces."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(html.escape(part) for part in [*lines, line])


def _memory_notes(memory: MemoryComparison) -> list[str]:
    """The flags (a few of them) and why a figure is missing, as the lines under the figure."""
    notes = [f"⚠ {flag}" for flag in memory.flags[:MAX_FLAGS_SHOWN]]
    if len(memory.flags) > MAX_FLAGS_SHOWN:
        notes.append(f"… and {len(memory.flags) - MAX_FLAGS_SHOWN} more devices flagged")
    return notes + missing_figures(memory)


def _flag_summary(memory: MemoryComparison) -> str:
    """The title's line on the flags: how many devices, or that live matches (or that there is nothing to match)."""
    if memory.flags:
        return f"⚠ {len(memory.flags)} of {len(memory.devices)} devices differ from the prediction (below)"
    if all(d.predicted_arguments is None for d in memory.devices):
        return "no prediction to compare the live bytes with (below)"
    return "live matches the predicted arguments on every device"


def _source_bars(memory: MemoryComparison, source: str, lanes: list[str]) -> list[BaseTraceType]:
    """The bar of the ``source`` (predicted or compiled) arguments per device, and its peak as a marker."""
    color, pattern = SOURCE_STYLE[source]
    rows = [(lane, d) for lane, d in zip(lanes, memory.devices, strict=True)
            if getattr(d, f"{source}_arguments") is not None]
    if not rows:
        return []
    x = [[lane for lane, _ in rows], [source] * len(rows)]
    arguments = [getattr(d, f"{source}_arguments") for _, d in rows]
    traces: list[BaseTraceType] = [go.Bar(
        x=x, y=arguments, name=f"{source}: arguments", marker=dict(color=color, pattern=dict(shape=pattern)),
        hovertext=[f"device {d.device}, {source} arguments (state and batch): {format_bytes_exact(n)}"
                   for (_, d), n in zip(rows, arguments, strict=True)],
        hovertemplate="%{hovertext}<extra></extra>",
    )]
    peaks = [getattr(d, f"{source}_peak") for _, d in rows]
    if any(peak is not None for peak in peaks):
        traces.append(go.Scatter(
            x=x, y=peaks, mode="markers", name=f"{source}: peak",
            marker=dict(symbol="diamond-wide", size=14, color=color, line=dict(color="#000000", width=1)),
            hovertext=[f"device {d.device}, {source} peak (with the step's temporaries): "
                       f"{format_bytes_exact(peak) if peak is not None else 'unknown'}"
                       for (_, d), peak in zip(rows, peaks, strict=True)],
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    return traces


def _live_bars(memory: MemoryComparison, lanes: list[str]) -> list[BaseTraceType]:
    """Live bytes per device, one stacked trace per role; the allocator's peak as a marker where it has one."""
    roles = [role for role in ROLE_COLORS if any(d.live_roles.get(role) for d in memory.devices)]
    roles += sorted({role for d in memory.devices for role in d.live_roles} - set(ROLE_COLORS))
    x = [lanes, ["live"] * len(lanes)]
    traces: list[BaseTraceType] = []
    for role in roles:
        values = [d.live_roles.get(role, 0) for d in memory.devices]
        traces.append(go.Bar(
            x=x, y=values, name=f"live: {role}", marker=dict(color=ROLE_COLORS.get(role, OKABE_ITO[3])),
            hovertext=[f"device {d.device}, live {role}: {format_bytes_exact(n)} of {format_bytes_exact(d.live)}"
                       for d, n in zip(memory.devices, values, strict=True)],
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    peaks = [d.peak_in_use for d in memory.devices]
    if any(peak is not None for peak in peaks):  # GPU and TPU keep allocator statistics; XLA:CPU does not
        traces.append(go.Scatter(
            x=x, y=peaks, mode="markers", name="live: allocator peak",
            marker=dict(symbol="diamond-wide", size=14, color=ROLE_COLORS["state"],
                        line=dict(color="#000000", width=1)),
            hovertext=[f"device {d.device}, the allocator's peak in use: "
                       f"{format_bytes_exact(d.peak_in_use) if d.peak_in_use is not None else 'unknown'}"
                       for d in memory.devices],
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    return traces


def memory_figure(memory: MemoryComparison) -> go.Figure:
    """Per device, bars side by side: predicted, compiled and live bytes (see the module docstring).

    The predicted and compiled bars are the step's arguments (state and batch, what lives between steps), with
    the peak (temporaries included) as a diamond above; live is what was alive on the device while training,
    stacked by role (state, batch, copies of either, other). Flagged devices and missing figures are written
    under the plot, their count in the title.

    Args:
        memory: a :class:`~workbench.analysis.memory_comparison.MemoryComparison` (``report.memory``).

    Example:
        >>> figure = memory_figure(read_profile("runs/mlp-dp").memory)
        >>> sorted({trace.name for trace in figure.data})[:3]
        ['compiled: arguments', 'compiled: peak', 'live: batch']
    """
    lanes = [_lane(d.device) for d in memory.devices]
    figure = go.Figure()
    for trace in (*_source_bars(memory, "predicted", lanes), *_source_bars(memory, "compiled", lanes),
                  *_live_bars(memory, lanes)):
        figure.add_trace(trace)
    largest = max((d.live for d in memory.devices), default=0)
    flagged = _flag_summary(memory)
    notes = "<br>".join(_wrapped(note) for note in _memory_notes(memory))
    note_lines = notes.count("<br>") + 1 if notes else 0
    figure.update_layout(
        title=dict(text=f"memory per device: predicted, compiled, live (most live: {format_bytes(largest)})"
                        f"<br><sup>{flagged}</sup>", x=0.01),
        barmode="stack",
        yaxis=dict(title="bytes per device"),
        legend=dict(traceorder="normal"),  # plotly reverses a stacked chart's legend by default
        height=420 + NOTE_LINE_PX * note_lines,
        margin=dict(t=90, b=AXIS_LABELS_PX + 20 + NOTE_LINE_PX * note_lines),
        plot_bgcolor="white",
    )
    if notes:  # under the two rows of device and source labels
        figure.add_annotation(text=notes, xref="paper", yref="paper", x=0, y=0, yshift=-AXIS_LABELS_PX, xanchor="left",
                              yanchor="top", showarrow=False, align="left", font=dict(size=11))
    return figure


__all__ = ["memory_figure", "timeline_figure"]
