"""Plain-text views of layouts: a per-device table, a per-leaf tree table, and a tiling picture.

Everything here is drawn from :class:`~workbench.layout.array_layout.ArrayLayout` and
:class:`~workbench.layout.tree_layout.TreeLayout` records; nothing recomputes layout maths. The tiling picture
is our own: JAX's ``visualize_sharding`` needs real devices, while this one works on abstract meshes of
any size (``data=64,model=16`` on a laptop).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import WorkbenchError
from ..formatting import align_columns, format_bytes, format_bytes_exact, format_shape
from ..layout.array_layout import ArrayLayout, Interval
from ..layout.specs import format_spec
from ..layout.tree_layout import TreeLayout

ELLIPSIS = "…"


# --- small formatters of layout parts (bytes, shapes, tables: workbench.formatting) --------------------


def format_index(index: Sequence[Interval]) -> str:
    """One device's slice as Python slice text, ``[0:4, 0:16, 8:16]``; a scalar is ``[]``.

    Example:
        >>> format_index(((0, 4), (8, 16)))
        '[0:4, 8:16]'
    """
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in index) + "]"


def format_coords(coords: dict[str, int]) -> str:
    """Mesh coordinates as ``data=0, model=1``."""
    return ", ".join(f"{name}={value}" for name, value in coords.items())


def format_device_ids(ids: Iterable[int], max_chars: int = 16) -> str:
    """A short label for a list of device ids: runs as ``0-7``, long lists as ``0,8,16,…(64)``.

    Runs of consecutive ids are joined with ``-``. When that is still longer than ``max_chars``, the
    first three ids are shown and the count follows in brackets.

    Example:
        >>> format_device_ids([0, 1, 2, 3, 8, 9, 10, 11])
        '0-3,8-11'
        >>> format_device_ids(range(0, 512, 8))
        '0,8,16,…(64)'
    """
    ids = list(ids)
    runs: list[list[int]] = []
    for device in ids:
        if runs and device == runs[-1][-1] + 1:
            runs[-1].append(device)
        else:
            runs.append([device])
    parts = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(str(d) for d in run)
    text = ",".join(parts)
    if len(text) <= max_chars:
        return text
    return ",".join(str(d) for d in ids[:3]) + f",{ELLIPSIS}({len(ids)})"


def describe_array(layout: ArrayLayout) -> str:
    """One line naming the array, its mesh and its spec: ``float32[8, 16] on data=2,model=4 as data, model``."""
    return f"{layout.dtype}{format_shape(layout.shape)} on {layout.mesh} as {format_spec(layout.spec)}"


def _elide(count: int, limit: int | None) -> list[int | None]:
    """Indices ``0..count-1``, or the first ``limit - 1``, a gap (None), and the last one."""
    if limit is None or count <= limit:
        return list(range(count))
    keep = max(limit - 1, 1)
    return [*range(keep), None, count - 1]


# --- one array --------------------------------------------------------------------------------------


def layout_header(layout: ArrayLayout) -> list[str]:
    """The summary lines above :func:`layout_table`: array, mesh, spec, shard, bytes, replication."""
    kind = "concrete" if layout.concrete else "abstract"
    blocks = " × ".join(str(n) for n in layout.shards_per_dim) or "1 (scalar)"
    copies = "device" if layout.replication == 1 else "devices"
    return [
        f"array        {layout.dtype}{format_shape(layout.shape)}, {format_bytes_exact(layout.total_bytes)}",
        f"mesh         {layout.mesh} ({layout.num_devices:,} devices, {kind})",
        f"spec         {format_spec(layout.spec)}",
        f"shard shape  {format_shape(layout.shard_shape)} (blocks per dimension: {blocks})",
        f"per device   {format_bytes_exact(layout.bytes_per_device)}",
        f"replication  {layout.replication} (each shard on {layout.replication} {copies})",
    ]


def layout_table(layout: ArrayLayout, *, max_devices: int | None = 16) -> str:
    """A text table of where an array lives: a summary, then one row per device.

    Rows give the device id, its mesh coordinates, the ``[start:stop]`` range it holds on every
    dimension, and its shard shape. Meshes with more than ``max_devices`` devices show the first and
    last rows around a ``… N more devices …`` line; ``max_devices=None`` shows every device.

    Example:
        >>> print(layout_table(layout_array((8, 16), "data=2", "data")))
        array        float32[8, 16], 512 B
        mesh         data=2 (2 devices, abstract)
        spec         data
        shard shape  [4, 16] (blocks per dimension: 2 × 1)
        per device   256 B
        replication  1 (each shard on 1 device)
        <BLANKLINE>
        device  coords  index        shard shape
        ------  ------  -----------  -----------
             0  data=0  [0:4, 0:16]  [4, 16]
             1  data=1  [4:8, 0:16]  [4, 16]
    """
    count = layout.num_devices
    head, hidden = count, 0
    if max_devices is not None and count > max_devices:
        head = max(max_devices // 2, 1)
        tail = max(max_devices - head, 1)
        hidden = count - head - tail
    shown = [*range(head), *range(head + hidden, count)]
    shard = format_shape(layout.shard_shape)
    rows = []
    for position in shown:  # only the rows shown: a 1,024-device table stays cheap
        device = layout.device_slice(position)
        rows.append([str(device.device_id), format_coords(device.coords), format_index(device.index), shard])
    lines = align_columns(["device", "coords", "index", "shard shape"], rows, right=[0])
    if hidden:
        lines.insert(2 + head, f"{ELLIPSIS} {hidden:,} more devices {ELLIPSIS}")  # after header, rule, head rows
    return "\n".join([*layout_header(layout), "", *lines])


# --- a whole tree -----------------------------------------------------------------------------------


TABLE_WIDTH = 100  # characters: what a notebook output shows beside a sidebar without wrapping


def tree_table(tree: TreeLayout, width: int = TABLE_WIDTH) -> str:
    """A text table of a pytree's layout: one row per leaf, then per-device totals and unused rules.

    Lines stay within ``width`` characters where the columns allow (a notebook wraps longer output lines
    mid-word): when each leaf's reason does not fit beside it, the reasons are numbered and listed once below.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> state = {"w": jax.ShapeDtypeStruct((16, 3), jnp.float32)}
        >>> for line in tree_table(layout_tree(state, "data=8", "shard")).splitlines()[2:6]:
        ...     print(line)
        w     [16, 3]  float32  data, None  [2, 3]             24 B       1    1
        <BLANKLINE>
        why:
          1. dimension 0 (16) sharded over 'data'
    """
    headers = ["path", "shape", "dtype", "spec", "shard shape", "per device", "copies", "why"]
    rows = [
        [row["path"], format_shape(row["shape"]), row["dtype"], row["spec"], format_shape(row["shard_shape"]),
         format_bytes(row["bytes_per_device"]), str(row["replication"]), row["reason"]]
        for row in tree.rows()
    ]
    lines = align_columns(headers, rows, right=[5, 6])
    if max(map(len, lines), default=0) > width:  # the reasons, once each, under the table
        reasons = list(dict.fromkeys(row[-1] for row in rows))
        numbered = [[*row[:-1], str(reasons.index(row[-1]) + 1)] for row in rows]
        lines = align_columns(headers, numbered, right=[5, 6, 7])
        lines += ["", "why:"] + [f"  {number}. {reason}" for number, reason in enumerate(reasons, 1)]
    lines += [
        "",
        f"per device   {format_bytes_exact(tree.bytes_per_device)} on each of {tree.mesh.size:,} devices ({tree.mesh})",
        f"held once    {format_bytes_exact(tree.total_bytes)} (the whole tree on one device, unsharded)",
    ]
    groups = tree.group_bytes_per_device(depth=1)
    if len(groups) > 1:
        lines.append("by group     " + ", ".join(f"{name} {format_bytes(n)}" for name, n in groups.items()))
    if tree.unused_rules and tree.rules is not None:
        lines.append("unused rules (matched no leaf):")
        lines += [f"  rule {i}: {tree.rules.rules[i]}" for i in tree.unused_rules]
    return "\n".join(lines)


# --- the tiling picture -----------------------------------------------------------------------------


def _box_grid(column_headers: Sequence[str], row_headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Cells in a box-drawing grid, with column headers above and row headers to the left."""
    width = max([len(c) for row in cells for c in row] + [len(h) for h in column_headers]) + 2
    margin = max([len(h) for h in row_headers], default=0)
    lead = " " * (margin + 1) if margin else ""
    columns = len(cells[0])

    def border(left: str, middle: str, right: str) -> str:
        return lead + left + middle.join("─" * width for _ in range(columns)) + right

    lines = []
    if any(column_headers):
        lines.append(lead + " " + " ".join(h.center(width) for h in column_headers).rstrip())
    lines.append(border("┌", "┬", "┐"))
    for number, (header, row) in enumerate(zip(row_headers, cells, strict=False)):
        prefix = header.rjust(margin) + " " if margin else ""
        lines.append(prefix + "│" + "│".join(c.center(width) for c in row) + "│")
        lines.append(border("├", "┼", "┤") if number < len(cells) - 1 else border("└", "┴", "┘"))
    return lines


def _holders_label(holders: Sequence[int], num_devices: int, max_label: int) -> str:
    """A box's label: its device; ``all 8 devices`` for the whole array; else its holders and ``×copies``."""
    if len(holders) == 1:
        return str(holders[0])
    if len(holders) == num_devices:
        return f"all {num_devices:,} devices"
    count = f"({len(holders)})"
    ids = format_device_ids(holders, max_label).removesuffix(count)  # a shortened list ends with the count: say it once
    return f"{ids} ×{len(holders):,}"


def _replication_line(layout: ArrayLayout) -> list[str]:
    """A line saying what a box held by several devices means: copies, never a finer split."""
    if layout.replication == 1:
        return []
    if layout.is_fully_replicated:
        return [f"replicated: the whole array on each of the {layout.num_devices:,} devices, one box"]
    copies = layout.replication
    return [f"replication {copies}: each box is held whole by {copies:,} devices (×{copies:,}), not split between them"]


def _axis_line(role: str, dim: int, size: int, blocks: int) -> str:
    piece = size // blocks if blocks else size
    return f"{role}: dimension {dim} ({size}) in {blocks} block{'s' if blocks != 1 else ''} of {piece}"


def tiling_picture(layout: ArrayLayout, *, max_rows: int = 16, max_columns: int = 8, max_label: int = 16) -> str:
    """A plain-text picture of a 0-D, 1-D or 2-D array's blocks, each labelled with the devices holding it.

    Rows are dimension 0 and columns dimension 1 (a 1-D array is one row, a scalar one box). Row and
    column headers give each block's ``start:stop`` range. A block held by several devices is labelled
    with its holders and the copy count (``0,4 ×2``), a fully replicated array is one box (``all 8
    devices``), and a line above the grid says so. Long lists of holders are shortened by
    :func:`format_device_ids` (``0-7``, ``0,8,16,…(64)``); more than ``max_rows`` row blocks or
    ``max_columns`` column blocks are elided around a ``⋮`` / ``…`` line, keeping the last one. Works on
    abstract meshes of any size.

    Raises :class:`~workbench.errors.WorkbenchError` for 3-D and larger arrays.

    Example:
        >>> print(tiling_picture(layout_array((8, 16), "data=2,model=2", "data, model")))
        float32[8, 16] on data=2,model=2 as data, model
        rows: dimension 0 (8) in 2 blocks of 4; columns: dimension 1 (16) in 2 blocks of 8
              0:8    8:16
            ┌──────┬──────┐
        0:4 │  0   │  1   │
            ├──────┼──────┤
        4:8 │  2   │  3   │
            └──────┴──────┘
    """
    rank = len(layout.shape)
    if rank > 2:
        raise WorkbenchError(
            f"tiling_picture draws 0-D, 1-D and 2-D arrays, but this one has shape {layout.shape} "
            f"({rank}-D): use workbench.views.figures.layout_figure (small multiples) or layout_table"
        )
    holders = layout.holders()
    if rank == 0:
        label = _holders_label(holders[()], layout.num_devices, max_label)
        grid = _box_grid([""], [""], [[label]])
        return "\n".join([describe_array(layout), "scalar: one block, on every device", *grid])

    # Distinct [start, stop) ranges per dimension, in order: the grid's rows and columns.
    ranges = [sorted({index[dim] for index in holders}) for dim in range(rank)]
    column_ranges = ranges[-1]
    row_ranges = ranges[0] if rank == 2 else [None]
    columns = _elide(len(column_ranges), max_columns)
    rows = _elide(len(row_ranges), max_rows)

    def cell(row: int | None, column: int | None) -> str:
        if column is None:
            return ELLIPSIS
        if row is None:
            return "⋮"
        row_range = row_ranges[row]  # None in a 1-D array's one row
        key = (column_ranges[column],) if row_range is None else (row_range, column_ranges[column])
        return _holders_label(holders[key], layout.num_devices, max_label)

    def range_text(ranges_of_dim, number):
        return ELLIPSIS if number is None else f"{ranges_of_dim[number][0]}:{ranges_of_dim[number][1]}"

    column_headers = [range_text(column_ranges, c) for c in columns]
    if rank == 2:
        row_headers = ["⋮" if r is None else range_text(row_ranges, r) for r in rows]
        axes = (
            _axis_line("rows", 0, layout.shape[0], layout.shards_per_dim[0])
            + "; "
            + _axis_line("columns", 1, layout.shape[1], layout.shards_per_dim[1])
        )
    else:
        row_headers = [""]
        axes = _axis_line("columns", 0, layout.shape[0], layout.shards_per_dim[0])
    cells = [[cell(r, c) for c in columns] for r in rows]
    grid = _box_grid(column_headers, row_headers, cells)
    return "\n".join([describe_array(layout), axes, *_replication_line(layout), *grid])
