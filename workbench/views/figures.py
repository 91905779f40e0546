"""Plotly figures of layouts: the array's tiling beside the device mesh, and bytes per device.

:func:`layout_figure` draws two things side by side. Left, the array, one cell per block: a block held
by one device is in that device's :func:`~workbench.views.colors.device_color` and labelled with its id;
a block held by several devices (replication) is in a neutral grey (:data:`~workbench.views.colors.SHARED_COLORS`)
and labelled with its holders and the copy count, and a fully replicated array is one grey block
labelled "whole array on every device (×N)". Right, the mesh: first axis as rows, the other axes
flattened into columns, each device in its own colour. Hovering shows holders, mesh coordinates, index
ranges and bytes.

Arrays of 3 or more dimensions are drawn as small multiples: the last two dimensions are the picture,
and there is one small panel per distinct block of the leading dimensions (at most ``max_panels``; the
title says how many were left out). We chose this over a 3-D plot because blocks are boxes in a grid,
and flat panels show every block without occlusion or camera controls. A 1-D array is one row of
blocks, a scalar one cell.

Every panel is one ``Heatmap`` trace (a cell per block), not one shape per device, so a 1,024-device
mesh builds in well under a second and keeps per-cell hover text. Output is deterministic: the same
layout gives the same figure data. Plotly is imported only here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .colors import PALETTE, SHARED_COLORS, device_color, palette_index
from ..layout.array_layout import ArrayLayout, DeviceSlice, Interval
from ..layout.tree_layout import TreeLayout
from ..formatting import format_bytes, format_bytes_exact, format_shape
from .text import describe_array, format_coords, format_device_ids, format_index

MAX_HOLDERS_IN_HOVER = 8  # a fully replicated array on 1,024 devices would otherwise list 1,024 per cell
MAX_TICKS = 16
MAX_MESH_CELLS = 16  # rows and columns of the mesh panel: a larger mesh is drawn in blocks of neighbours
# Cell labels are drawn only while they fit, else they overlap into a smudge (hover still names every
# device): lines of text down a panel of the default height, characters across a full-width one.
MAX_LABEL_LINES = 16
MAX_LABEL_CHARACTERS = 56  # a 650-px figure beside JupyterLab's sidebar: 12-px labels need ~7 px a character
WHOLE_ARRAY_FONT_SIZE = 20  # the one label of a fully replicated array is the figure's message: make it big
PANEL_COLUMNS = 4
BAR_PATTERNS = ("", "/", "x", ".", "\\", "+", "-", "|")

# Heatmap cells carry colour positions (devices' palette positions, then the shared-block greys); this
# step colour scale maps each position to its exact colour.
_COLORS = PALETTE + SHARED_COLORS
_COLORSCALE = [[edge / len(_COLORS), color] for number, color in enumerate(_COLORS) for edge in (number, number + 1)]


@dataclasses.dataclass(frozen=True)
class _Block:
    """One block of a panel: its rows and columns in the picture, its full index, and its holders."""

    rows: Interval
    columns: Interval
    index: tuple[Interval, ...]
    holders: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Panel:
    title: str
    blocks: tuple[_Block, ...]


def _picture_axes(index: tuple[Interval, ...]) -> tuple[Interval, Interval]:
    """The (rows, columns) a block covers in the picture: the last two dimensions; 1-D is one row."""
    if not index:
        return (0, 1), (0, 1)
    if len(index) == 1:
        return (0, 1), index[0]
    return index[-2], index[-1]


def _panels(layout: ArrayLayout, max_panels: int) -> tuple[list[_Panel], int]:
    """The small multiples (one panel for rank <= 2) and how many leading-dimension blocks exist."""
    groups: dict[tuple[Interval, ...], list[_Block]] = {}
    for index, holders in layout.holders().items():
        rows, columns = _picture_axes(index)
        groups.setdefault(index[:-2], []).append(_Block(rows, columns, index, tuple(holders)))
    keys = sorted(groups)
    panels = []
    for key in keys[:max_panels]:
        title = "x[" + ", ".join([f"{a}:{b}" for a, b in key] + [":", ":"]) + "]" if key else "array blocks by device"
        panels.append(_Panel(title, tuple(sorted(groups[key], key=lambda b: (b.rows, b.columns)))))
    return panels, len(keys)


def _edges(intervals: Sequence[Interval]) -> list[int]:
    """Cell edges for sorted, touching intervals."""
    return [start for start, _ in intervals] + [intervals[-1][1]]


def _color_heatmap(
    colors: list[list[int]], device_ids: list[list[int]], x_edges, y_edges, hover: list[list[str]],
    labels: list[list[str]], *, font_size: int | None = None, width_share: float = 1.0,
) -> go.Heatmap:
    """A grid of cells, each in the colour at its position of :data:`_COLORS`, labelled while labels fit.

    ``device_ids`` ride along as ``customdata``: a click on a cell names a device holding it.
    ``width_share`` is the part of the figure's width the panel gets (small multiples get less).
    """
    lines = [line for row in labels for label in row for line in label.split("<br>")]
    lines_per_cell = max((label.count("<br>") + 1 for row in labels for label in row), default=1)
    widest = max((len(line) for line in lines), default=0) + 1
    labelled = (
        len(labels) * lines_per_cell <= MAX_LABEL_LINES
        and len(labels[0]) * widest <= MAX_LABEL_CHARACTERS * width_share
    )
    return go.Heatmap(
        z=[[position + 0.5 for position in row] for row in colors],
        x=x_edges,
        y=y_edges,
        zmin=0,
        zmax=len(_COLORS),
        colorscale=_COLORSCALE,
        showscale=False,
        customdata=device_ids,
        text=labels,
        texttemplate="%{text}" if labelled else None,
        textfont=dict(size=font_size) if font_size else None,
        hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>",
        xgap=1 if len(x_edges) <= 65 else 0,
        ygap=1 if len(y_edges) <= 65 else 0,
    )


def _holders_text(holders: Sequence[int], devices: Mapping[int, DeviceSlice]) -> str:
    shown = [f"  {d} ({format_coords(devices[d].coords)})" for d in holders[:MAX_HOLDERS_IN_HOVER]]
    if len(holders) > MAX_HOLDERS_IN_HOVER:
        shown.append(f"  … and {len(holders) - MAX_HOLDERS_IN_HOVER:,} more")
    return f"held by {len(holders):,} device{'s' if len(holders) != 1 else ''}:<br>" + "<br>".join(shown)


def block_label(holders: Sequence[int], num_devices: int) -> str:
    """The label of one block in :func:`layout_figure`: its device, or who holds copies of it and how many.

    Example:
        >>> block_label([3], 8), block_label(range(8), 8), block_label([0, 1], 8)
        ('3', 'whole array on every device (×8)', 'on devices 0,1<br>2 copies')
    """
    holders = list(holders)
    if len(holders) == 1:
        return str(holders[0])
    if len(holders) == num_devices:  # every device holds the same block, so nothing is cut: it is the array
        return f"whole array on every device (×{num_devices:,})"
    return f"on devices {format_device_ids(holders)}<br>{len(holders):,} copies"


def _tiling_trace(
    panel: _Panel, layout: ArrayLayout, devices: Mapping[int, DeviceSlice], width_share: float = 1.0
) -> go.Heatmap:
    """One panel of the array: a cell per block, in its device's colour, or grey when several hold it."""
    row_ranges = sorted({b.rows for b in panel.blocks})
    column_ranges = sorted({b.columns for b in panel.blocks})
    row_of = {r: n for n, r in enumerate(row_ranges)}
    column_of = {c: n for n, c in enumerate(column_ranges)}
    colors = [[0] * len(column_ranges) for _ in row_ranges]
    ids = [[0] * len(column_ranges) for _ in row_ranges]
    hover = [[""] * len(column_ranges) for _ in row_ranges]
    labels = [[""] * len(column_ranges) for _ in row_ranges]
    shard = f"shard {format_shape(layout.shard_shape)}, {format_bytes_exact(layout.bytes_per_device)}"
    for block in panel.blocks:
        row, column = row_of[block.rows], column_of[block.columns]
        first = block.holders[0]
        about = f"block {format_index(block.index)}<br>{shard}<br>{_holders_text(block.holders, devices)}"
        if len(block.holders) == 1:
            colors[row][column] = palette_index(first)
            hover[row][column] = f"<b>device {first}</b> ({format_coords(devices[first].coords)})<br>{about}"
        else:  # greys alternate like a chessboard, so neighbouring shared blocks never merge into one
            colors[row][column] = len(PALETTE) + (row + column) % len(SHARED_COLORS)
            hover[row][column] = f"<b>{len(block.holders):,} copies</b><br>{about}"
        ids[row][column] = first
        labels[row][column] = block_label(block.holders, layout.num_devices)
    whole = layout.is_fully_replicated and layout.num_devices > 1
    return _color_heatmap(
        colors, ids, _edges(column_ranges), _edges(row_ranges), hover, labels,
        font_size=WHOLE_ARRAY_FONT_SIZE if whole else None, width_share=width_share,
    )


def _mesh_grid(layout: ArrayLayout) -> tuple[go.Heatmap, dict, dict, str]:
    """The device mesh as a grid trace, with x and y axis settings (ticks naming axes and coordinates), and
    the words the panel's title adds.

    Up to :data:`MAX_MESH_CELLS` rows and columns every device has its cell. A larger mesh (512 devices are
    64 rows of 8) would be stripes too thin to read or click, so each cell then stands for a block of
    neighbouring devices (the title says how many): its colour is its first device's, its hover names the
    block's devices and coordinates, and a click picks its first device.
    """
    names, sizes = layout.mesh.names, layout.mesh.sizes
    rows, columns = sizes[0], math.prod(sizes[1:])
    row_block, column_block = math.ceil(rows / MAX_MESH_CELLS), math.ceil(columns / MAX_MESH_CELLS)
    grid_rows, grid_columns = math.ceil(rows / row_block), math.ceil(columns / column_block)
    devices = layout.devices
    shard = f"shard {format_shape(layout.shard_shape)}, {format_bytes_exact(layout.bytes_per_device)}"
    ids, hover, labels = [], [], []
    for row in range(grid_rows):
        for grid in (ids, hover, labels):
            grid.append([])
        for column in range(grid_columns):
            cell = [devices[r * columns + c]  # row-major: the first axis varies slowest
                    for r in range(row * row_block, min((row + 1) * row_block, rows))
                    for c in range(column * column_block, min((column + 1) * column_block, columns))]
            first = cell[0]
            ids[-1].append(first.device_id)
            if len(cell) == 1:
                hover[-1].append(f"<b>device {first.device_id}</b><br>{format_coords(first.coords)}<br>"
                                 f"holds {format_index(first.index)}<br>{shard}")
                labels[-1].append(str(first.device_id))
            else:
                spans = ", ".join(_span(name, [d.coords[name] for d in cell]) for name in names)
                hover[-1].append(f"<b>{len(cell)} devices: {format_device_ids([d.device_id for d in cell])}</b>"
                                 f"<br>{spans}<br>each: {shard}")
                labels[-1].append("")
    colors = [[palette_index(d) for d in row] for row in ids]
    trace = _color_heatmap(colors, ids, list(range(grid_columns + 1)), list(range(grid_rows + 1)), hover, labels)

    def ticks(count: int, block: int, label) -> dict:
        step = max(1, math.ceil(count / MAX_TICKS))
        chosen = sorted(set(range(0, count, step)) | {count - 1})
        return dict(tickmode="array", tickvals=[n + 0.5 for n in chosen], ticktext=[label(n * block) for n in chosen])

    other_axes = names[1:]
    column_coords = [devices[c].coords for c in range(columns)]
    x_axis = dict(
        title=" × ".join(other_axes) if other_axes else "",
        **ticks(grid_columns, column_block, lambda c: ", ".join(f"{a}={column_coords[c][a]}" for a in other_axes)),
    )
    # Row labels on the right: on the left they would crowd the last array panel.
    y_axis = dict(title=names[0], side="right", autorange="reversed",
                  **ticks(grid_rows, row_block, lambda r: f"{names[0]}={r}"))
    blocks = row_block * column_block
    note = f"<br><sup>{layout.mesh.size:,} devices: a cell per {blocks} neighbours</sup>" if blocks > 1 else ""
    return trace, x_axis, y_axis, note


def _span(name: str, coords: list[int]) -> str:
    """``data=4..7`` (or ``data=4`` when all equal): the coordinates a block of devices spans on one axis."""
    low, high = min(coords), max(coords)
    return f"{name}={low}" if low == high else f"{name}={low}..{high}"


def _replication_words(layout: ArrayLayout) -> str:
    """The title's words for replication, naming what the grey blocks mean when there are any."""
    if layout.replication == 1:
        return "replication 1 (every block on one device)"
    if layout.is_fully_replicated:
        return f"replicated: the whole array on each of the {layout.num_devices:,} devices (grey)"
    return f"replication {layout.replication}: each block on {layout.replication:,} devices (grey)"


def _tiling_axes(layout: ArrayLayout) -> tuple[dict, dict]:
    rank = len(layout.shape)
    if rank == 0:
        hidden = dict(showticklabels=False, ticks="", title="scalar")
        return hidden, dict(hidden, title="", autorange="reversed")
    x_axis = dict(title=f"dimension {rank - 1}")
    if rank == 1:
        return x_axis, dict(showticklabels=False, ticks="", autorange="reversed")
    return x_axis, dict(title=f"dimension {rank - 2}", autorange="reversed")


def layout_figure(layout: ArrayLayout, *, title: str | None = None, max_panels: int = 16) -> go.Figure:
    """A figure of a layout: the array's blocks by device (left) and the device mesh (right).

    See the module docstring for how replication, 3-D+ arrays and scalars are drawn. Every block's
    hover text names its holders with their mesh coordinates, the index ranges and bytes.

    Args:
        layout: from :func:`~workbench.layout.array_layout.layout_array`; abstract meshes of any size work.
        title: the figure title (default: array, mesh, spec, shard and bytes per device).
        max_panels: most small multiples drawn for a 3-D+ array.

    Example:
        >>> fig = layout_figure(layout_array((8, 16, 32), "data=2,model=4", "data, None, model"))
        >>> len(fig.data)  # two leading-dimension blocks, then the mesh
        3
    """
    devices = {d.device_id: d for d in layout.devices}
    panels, total = _panels(layout, max_panels)
    panel_columns = min(len(panels), PANEL_COLUMNS)
    panel_rows = math.ceil(len(panels) / panel_columns)
    specs = [[{} if r * panel_columns + c < len(panels) else None for c in range(panel_columns)]
             for r in range(panel_rows)]
    specs[0].append({"rowspan": panel_rows})
    for row in specs[1:]:
        row.append(None)
    grid, grid_x, grid_y, grid_note = _mesh_grid(layout)
    titles = [p.title for p in panels[:panel_columns]] + [f"device mesh {layout.mesh}{grid_note}"]
    titles += [p.title for p in panels[panel_columns:]]
    figure = make_subplots(
        rows=panel_rows,
        cols=panel_columns + 1,
        specs=specs,
        column_widths=[0.58 / panel_columns] * panel_columns + [0.42],
        subplot_titles=titles,
        horizontal_spacing=0.06 if panel_columns == 1 else 0.04,
        vertical_spacing=min(0.08, 0.3 / panel_rows),
    )
    x_axis, y_axis = _tiling_axes(layout)
    for number, panel in enumerate(panels):
        row, column = divmod(number, panel_columns)
        figure.add_trace(_tiling_trace(panel, layout, devices, 1 / panel_columns), row=row + 1, col=column + 1)
        # Axis titles once per panel column and row, not on every small multiple.
        bottom_of_column = number + panel_columns >= len(panels)
        figure.update_xaxes(x_axis if bottom_of_column else {**x_axis, "title": ""}, row=row + 1, col=column + 1)
        figure.update_yaxes(y_axis if column == 0 else {**y_axis, "title": ""}, row=row + 1, col=column + 1)
    figure.add_trace(grid, row=1, col=panel_columns + 1)
    figure.update_xaxes(grid_x, row=1, col=panel_columns + 1)
    figure.update_yaxes(grid_y, row=1, col=panel_columns + 1)

    if title is None:
        title = (
            f"{describe_array(layout)}<br><sup>shard {format_shape(layout.shard_shape)}, "
            f"{format_bytes(layout.bytes_per_device)} per device, {_replication_words(layout)}</sup>"
        )
    if total > len(panels):
        title += f"<br><sup>showing {len(panels)} of {total} blocks of the leading dimensions</sup>"
    figure.update_layout(
        title=dict(text=title, x=0.01),
        height=max(380, 260 * panel_rows + 140),
        autosize=True,  # as wide as the output it sits in: a fixed width cut the mesh off beside a sidebar
        margin=dict(t=110 if total > len(panels) else 90),
        plot_bgcolor="white",
    )
    return figure


def _bar_series(memory: TreeLayout | Mapping[int, int], depth: int) -> tuple[list[int], dict[str, list[int]]]:
    """Device ids and, per stacked series, bytes per device."""
    if isinstance(memory, TreeLayout):
        ids = sorted(memory.per_device_bytes)
        # Specs divide evenly, so each group weighs the same on every device.
        return ids, {group: [n] * len(ids) for group, n in memory.group_bytes_per_device(depth).items()}
    ids = sorted(memory)
    return ids, {"bytes": [memory[d] for d in ids]}


def memory_bar_figure(
    memory: TreeLayout | Mapping[int, int],
    *,
    depth: int = 1,
    capacity_bytes: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Bytes per device as bars in each device's colour.

    A :class:`~workbench.layout.tree_layout.TreeLayout` is stacked by the first ``depth`` path components
    (e.g. ``params`` and ``opt_state``, told apart by hatching); a dict ``{device_id: bytes}`` gives one
    bar per device. ``capacity_bytes`` draws the device's memory as a dashed line.

    Example:
        >>> fig = memory_bar_figure({0: 2048, 1: 1024})
        >>> list(fig.data[0].y)
        [2048, 1024]
    """
    ids, series = _bar_series(memory, depth)
    labels = [str(d) for d in ids]
    colors = [device_color(d) for d in ids]
    figure = go.Figure()
    for number, (name, values) in enumerate(series.items()):
        figure.add_trace(
            go.Bar(
                x=labels,
                y=values,
                name=name,
                marker=dict(color=colors, pattern=dict(shape=BAR_PATTERNS[number % len(BAR_PATTERNS)])),
                hovertext=[f"device {d}: {name} {format_bytes_exact(v)}" for d, v in zip(ids, values, strict=True)],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    if capacity_bytes is not None:
        figure.add_hline(
            y=capacity_bytes,
            line_dash="dash",
            annotation_text=f"capacity {format_bytes(capacity_bytes)}",
            annotation_position="top left",
        )
    totals = [sum(values[i] for values in series.values()) for i in range(len(ids))]
    figure.update_layout(
        barmode="stack",
        title=title or f"bytes per device (most: {format_bytes_exact(max(totals, default=0))})",
        xaxis=dict(title="device", type="category"),
        yaxis=dict(title="bytes per device"),
        showlegend=len(series) > 1,
        plot_bgcolor="white",
    )
    return figure
