"""The plan beside the compiler as a plotly figure: two bars per figure, the plan's and the compiler's.

:func:`comparison_figure` draws a :class:`~workbench.analysis.plan_comparison.PlanComparison`: on the left
the memory of one device (arguments, outputs, aliased, temporaries, the peak), on the right the bytes each
kind of collective moves per step (the rows named ``"<kind> bytes"``). The plan's bar is hatched and carries
the ratio; a figure the plan does not model has no plan bar and says so. The chip's memory is a dashed line.
FLOPs stay in the table.

Example (``plan``: ``plan_training("mlp", {}, "data=8", "dp", hardware="cpu", verify="cpu")``, verified):
    >>> figure = comparison_figure(plan.comparison, capacity_bytes=plan.device_memory)
    >>> [trace.name for trace in figure.data]  # memory, then the collectives' bytes
    ['plan (analytic)', 'compiler', 'plan (analytic)', 'compiler']
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis.plan_comparison import ComparedFigure, PlanComparison
from ..formatting import BYTE_UNITS, format_bytes, format_bytes_exact

ANALYTIC_COLOR = "#0072b2"  # Okabe-Ito blue, hatched: told apart without colour too
COMPILER_COLOR = "#d55e00"  # Okabe-Ito vermillion
ANALYTIC_NAME, COMPILER_NAME = "plan (analytic)", "compiler"
COLLECTIVE_SUFFIX = " bytes"  # plan_comparison names a collective row "<kind> bytes"
CAPACITY_SCALE = 8  # the device memory is drawn as a line up to this many times the tallest memory bar


def _split(rows: Sequence[ComparedFigure]) -> tuple[list[ComparedFigure], list[ComparedFigure]]:
    """(memory rows, collective rows) among the rows counted in bytes."""
    in_bytes = [row for row in rows if row.unit == "bytes"]
    memory = [row for row in in_bytes if not row.figure.endswith(COLLECTIVE_SUFFIX)]
    return memory, [row for row in in_bytes if row.figure.endswith(COLLECTIVE_SUFFIX)]


def _unit(largest: float) -> tuple[str, int]:
    """The binary unit that shows ``largest`` bytes as a number between 1 and 1024."""
    power = 0
    while largest >= 1024 and power < len(BYTE_UNITS) - 1:
        largest /= 1024
        power += 1
    return BYTE_UNITS[power], 1024 ** power


def _ratio_text(row: ComparedFigure) -> str:
    if row.analytic is None:
        return "not modelled"
    return "" if row.ratio is None else f"×{row.ratio:.2f}"


def _hover(row: ComparedFigure, value: float | None, side: str) -> str:
    shown = "not modelled" if value is None else format_bytes_exact(int(value))
    ratio = "" if row.ratio is None else f"<br>plan / compiler = {row.ratio:.2f}"
    return f"<b>{row.figure}</b>, {side}: {shown}{ratio}<br>{row.note}"


def _bar_pair(figure: go.Figure, rows: list[ComparedFigure], scale: int, column: int, show_legend: bool) -> None:
    labels = [row.figure.removesuffix(COLLECTIVE_SUFFIX) if column == 2 else row.figure for row in rows]
    figure.add_trace(go.Bar(
        x=labels, y=[(row.analytic or 0) / scale for row in rows], name=ANALYTIC_NAME, legendgroup="analytic",
        showlegend=show_legend, marker=dict(color=ANALYTIC_COLOR, pattern=dict(shape="/")),
        text=[_ratio_text(row) for row in rows], textposition="outside", cliponaxis=False,
        hovertext=[_hover(row, row.analytic, "plan") for row in rows], hovertemplate="%{hovertext}<extra></extra>",
    ), row=1, col=column)
    figure.add_trace(go.Bar(
        x=labels, y=[(row.compiler or 0) / scale for row in rows], name=COMPILER_NAME, legendgroup="compiler",
        showlegend=show_legend, marker=dict(color=COMPILER_COLOR),
        hovertext=[_hover(row, row.compiler, "compiler") for row in rows], hovertemplate="%{hovertext}<extra></extra>",
    ), row=1, col=column)


def comparison_figure(comparison: PlanComparison, *, capacity_bytes: int | None = None,
                      title: str | None = None) -> go.Figure:
    """Grouped bars, plan against compiler, for one device: memory (left) and collective bytes per step (right).

    ``capacity_bytes`` (the chip's memory) draws a dashed line over the memory bars (named in the title
    instead when it is more than :data:`CAPACITY_SCALE` times the tallest bar). Traces come in pairs,
    plan then compiler: ``data[0:2]`` memory, ``data[2:4]`` collectives (when the step has any).

    Example:
        >>> from types import SimpleNamespace as Row
        >>> rows = [Row(figure="peak", unit="bytes", analytic=3 * 2**20, compiler=4 * 2**20, ratio=0.75, note=""),
        ...         Row(figure="all-reduce bytes", unit="bytes", analytic=2**10, compiler=2**10, ratio=1.0, note="")]
        >>> compiled = Row(target="cpu", devices=8, mesh="data=8")
        >>> figure = comparison_figure(Row(rows=rows, compiled=compiled), capacity_bytes=16 * 2**20)
        >>> [(trace.name, list(trace.x), list(trace.y)) for trace in figure.data[:2]]
        [('plan (analytic)', ['peak'], [3.0]), ('compiler', ['peak'], [4.0])]
    """
    memory, collectives = _split(comparison.rows)
    compiled = comparison.compiled
    largest = max([row.analytic or 0 for row in memory] + [row.compiler or 0 for row in memory])
    # The chip's memory as a line only where it is on the bars' scale: a 95 GiB line would flatten 200 KiB bars.
    capacity = capacity_bytes or 0  # 0: no chip memory given
    capacity_shown = bool(capacity) and capacity <= CAPACITY_SCALE * max(largest, 1)
    figure = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1,
                           subplot_titles=("memory per device", "collectives: bytes per device per step"))
    unit, scale = _unit(max(largest, capacity if capacity_shown else 0))
    _bar_pair(figure, memory, scale, 1, True)
    if collectives:
        moved, moved_scale = _unit(max([row.analytic or 0 for row in collectives]
                                       + [row.compiler or 0 for row in collectives]))
        _bar_pair(figure, collectives, moved_scale, 2, False)
        figure.update_yaxes(title_text=moved, row=1, col=2)
    else:
        figure.add_annotation(text="no collectives: each device computes alone", showarrow=False,
                              xref="x2 domain", yref="y2 domain", x=0.5, y=0.5)
        figure.update_xaxes(visible=False, row=1, col=2)
        figure.update_yaxes(visible=False, row=1, col=2)
    if capacity_shown:
        # plotly leaves row and col unannotated: pyright reads their default "all" as the type, not subplot numbers.
        figure.add_hline(y=capacity / scale, line_dash="dash", row=1, col=1,  # pyright: ignore[reportArgumentType]
                         annotation_text=f"device memory {format_bytes(capacity)}",
                         annotation_position="top left")
    subtitle = "the plan's bars carry plan / compiler"
    if capacity_bytes and not capacity_shown:
        subtitle += f"; the device memory, {format_bytes(capacity_bytes)}, is off this scale"
    figure.update_yaxes(title_text=unit, row=1, col=1, rangemode="tozero")
    figure.update_layout(
        barmode="group", plot_bgcolor="white", height=420, margin=dict(t=90, b=60),
        title=title or (f"the plan beside the compiler: {compiled.target}, {compiled.devices:,} devices "
                        f"({compiled.mesh})<br><sup>{subtitle}</sup>"),
    )
    return figure


__all__ = ["ANALYTIC_NAME", "COMPILER_NAME", "comparison_figure"]
