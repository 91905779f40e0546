"""Views of layouts: text tables, the tiling picture, JAX's captured picture, plotly figures, colours.

Every view is checked against the layout record it draws from (exact index ranges, holders, device ids),
not just for "it runs".
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rich.console
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding

import workbench as wb
from workbench import WorkbenchError, build_mesh, layout_array, layout_tree, parse_spec
from workbench.analysis.compiled_step import read_compiled_step
from workbench.analysis.plan_comparison import compare_plan
from workbench.formatting import BYTE_UNITS
from workbench.views.comparison_figure import ANALYTIC_NAME, COMPILER_NAME, comparison_figure
from workbench.views.colors import PALETTE, SHARED_COLORS, device_color, text_color_for
from workbench.views.jax_picture import JaxPicture, capture_visualize_sharding
from workbench.views.figures import block_label, layout_figure, memory_bar_figure
from workbench.views.text import format_device_ids, layout_table, tiling_picture, tree_table

BIG_MESH = "data=64,model=16"  # 1,024 devices: far more than the 8 simulated ones


def data_model_3d():
    return layout_array((8, 16, 32), "data=2,model=4", "data, None, model")


# --- helpers that read figures and pictures back --------------------------------------------------


def heatmap_cells(trace):
    """(device id, colour, hover text) for every cell of a heatmap trace, decoding z via its colour scale."""
    cells = []
    for ids, zs, hovers in zip(trace.customdata, trace.z, trace.hovertext, strict=True):
        for device, z, hover in zip(ids, zs, hovers, strict=True):
            index = int(z)  # z is palette position + 0.5
            assert trace.colorscale[2 * index][1] == trace.colorscale[2 * index + 1][1]
            cells.append((int(device), trace.colorscale[2 * index][1], hover))
    return cells


def cell_colours(trace):
    """Each cell's colour, row by row, read through the trace's colour scale (z is a position + 0.5)."""
    return [[trace.colorscale[2 * int(z)][1] for z in row] for row in trace.z]


def cell_labels(trace):
    return [list(row) for row in trace.text]


def tiling_traces(figure):
    """The array panels of a layout figure (everything but the mesh grid, which comes last)."""
    return list(figure.data[:-1])


def picture_cells(picture: str) -> list[list[str]]:
    """The labels of a tiling picture's boxes, row by row."""
    rows = []
    for line in picture.splitlines():
        if "│" in line:
            rows.append([cell.strip() for cell in line.split("│")[1:-1]])
    return rows


def relative_luminance(color):
    def linear(c):
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(int(color[i : i + 2], 16)) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# --- colours -------------------------------------------------------------------------------------------


def test_device_colors_are_distinct_hex_and_cycle():
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in PALETTE)
    assert len({device_color(d) for d in range(8)}) == 8
    assert len({device_color(d) for d in range(len(PALETTE))}) == len(PALETTE)
    assert "#000000" not in PALETTE  # Okabe-Ito's black is replaced so labels stay readable
    assert device_color(3) == device_color(3 + len(PALETTE))


def test_shared_block_greys_are_no_device_colour_and_carry_readable_labels():
    assert len(set(SHARED_COLORS)) == 2 and not set(SHARED_COLORS) & set(PALETTE)
    for grey in SHARED_COLORS:
        assert text_color_for(grey) == "#000000"
        assert (relative_luminance(grey) + 0.05) / 0.05 >= 4.5  # WCAG AA for black labels


def test_text_color_contrasts_with_every_palette_colour():
    assert text_color_for("#f0e442") == "#000000"
    assert text_color_for("#332288") == "#ffffff"
    for color in PALETTE:
        text = text_color_for(color)
        lighter, darker = sorted([relative_luminance(color), relative_luminance(text)], reverse=True)
        assert (lighter + 0.05) / (darker + 0.05) >= 4.5, color  # WCAG AA for normal text


def test_same_device_same_colour_across_arrays_and_views():
    matrix = layout_array((8, 16), "data=2,model=4", "data, model")
    vector = layout_array((16,), "data=2,model=4", "(model, data),")  # 8 blocks, one device each
    colours = {}
    for layout in (matrix, vector):
        for trace in layout_figure(layout).data:
            for device, colour, _ in heatmap_cells(trace):
                colours.setdefault(device, set()).add(colour)
    assert set(colours) == set(range(8))
    for device, seen in colours.items():
        assert seen == {device_color(device)}
    picture = capture_visualize_sharding(matrix)
    for device in range(8):
        assert f"background-color: {device_color(device)}" in picture.html


# --- text formatters -----------------------------------------------------------------------------------


def test_format_device_ids():
    assert format_device_ids([5]) == "5"
    assert format_device_ids([0, 4]) == "0,4"
    assert format_device_ids(range(8)) == "0-7"
    assert format_device_ids([0, 1, 2, 3, 8, 9, 10, 11]) == "0-3,8-11"
    assert format_device_ids(range(0, 512, 8)) == "0,8,16,…(64)"


# --- layout_table --------------------------------------------------------------------------------------


def table_rows(table: str) -> dict[int, list[str]]:
    """device id -> [coords, index, shard shape], read from the table's rows."""
    rows = {}
    for line in table.splitlines():
        match = re.fullmatch(r"\s*(\d+)  (.+?)  +(\[.*?\])  +(\[.*\])", line)
        if match:
            rows[int(match.group(1))] = [match.group(2).strip(), match.group(3), match.group(4)]
    return rows


def test_layout_table_has_every_devices_exact_ranges():
    table = layout_table(data_model_3d())
    assert "float32[8, 16, 32]" in table
    assert "data, None, model" in table
    assert "[4, 16, 8]" in table
    assert "2.0 KiB (2,048 B)" in table
    assert "replication  1" in table
    rows = table_rows(table)
    assert sorted(rows) == list(range(8))
    for device in range(8):
        data, model = divmod(device, 4)
        assert rows[device] == [
            f"data={data}, model={model}",
            f"[{4 * data}:{4 * data + 4}, 0:16, {8 * model}:{8 * model + 8}]",
            "[4, 16, 8]",
        ]


def test_layout_table_of_replicated_layout():
    table = layout_table(layout_array((8, 16), "data=2,model=4", "model"))
    assert "replication  2 (each shard on 2 devices)" in table
    rows = table_rows(table)
    for device in range(8):
        model = device % 4
        assert rows[device][1] == f"[{2 * model}:{2 * model + 2}, 0:16]"


def test_layout_table_collapses_a_1024_device_mesh():
    layout = layout_array((1024, 1024), BIG_MESH, "data, model")
    table = layout_table(layout)
    rows = table_rows(table)
    assert sorted(rows) == [*range(8), *range(1016, 1024)]
    assert "… 1,008 more devices …" in table
    assert rows[0] == ["data=0, model=0", "[0:16, 0:64]", "[16, 64]"]
    assert rows[1023] == ["data=63, model=15", "[1008:1024, 960:1024]", "[16, 64]"]
    assert "1,024 devices, abstract" in table
    everything = table_rows(layout_table(layout, max_devices=None))
    assert sorted(everything) == list(range(1024))
    assert everything[17][1] == "[16:32, 64:128]"  # data=1, model=1


def test_layout_table_of_a_concrete_mesh_uses_jax_device_ids():
    devices = jax.devices()[::-1]  # ids in reverse mesh order
    mesh = build_mesh("data=8", devices=devices)
    rows = table_rows(layout_table(layout_array((16,), mesh, "data")))
    assert rows[7][1] == "[0:2]" and rows[0][1] == "[14:16]"


# --- tree_table ----------------------------------------------------------------------------------------


def test_tree_table_lists_leaves_totals_and_unused_rules():
    state = {
        "params": {"w": jax.ShapeDtypeStruct((16, 3), jnp.float32), "b": jax.ShapeDtypeStruct((3,), jnp.float32)},
        "step": jax.ShapeDtypeStruct((), jnp.int32),
    }
    tree = layout_tree(state, "data=8", [(r"w$", "data"), (r"typo", "data"), (r".*", "")])
    table = tree_table(tree)
    lines = table.splitlines()
    w_line = next(line for line in lines if line.startswith("params/w"))
    assert re.search(r"\[16, 3\]\s+float32\s+data\s+\[2, 3\]\s+24 B\s+1\s+rule 0: w\$", w_line)
    b_line = next(line for line in lines if line.startswith("params/b"))
    assert re.search(r"P\(\)\s+\[3\]\s+12 B\s+8", b_line)
    assert "per device   40 B on each of 8 devices" in table
    assert "held once    208 B" in table
    assert "params 36 B, step 4 B" in table
    assert "rule 1: typo => data" in table


def test_a_wide_tree_table_fits_a_notebook_line_and_lists_each_reason_once():
    leaves = {f"opt_state/0/mu/block_{i}/kernel": jax.ShapeDtypeStruct((64, 128), jnp.float32) for i in range(3)}
    leaves["opt_state/0/count"] = jax.ShapeDtypeStruct((), jnp.int32)
    leaves["opt_state/0/mu/head/bias"] = jax.ShapeDtypeStruct((10,), jnp.float32)
    table = tree_table(layout_tree(leaves, "data=8", "shard"))
    lines = table.splitlines()
    # JupyterLab at 1,400 px beside its file browser shows ~110 characters, and wraps longer lines mid-word.
    assert max(len(line) for line in lines) <= 110
    why = lines[lines.index("why:") + 1:]
    reasons = [line.split(". ", 1)[1] for line in why[:3]]
    assert reasons == ["replicated: scalar", "dimension 1 (128) sharded over 'data'",
                       "replicated: no dimension of (10,) is divisible by 'data' (8)"]
    kernel = next(line for line in lines if line.startswith("opt_state/0/mu/block_0"))
    assert kernel.split()[-1] == "2"  # the row names its reason by number
    assert tree_table(layout_tree(leaves, "data=8", "shard"), width=200).splitlines()[0].endswith("why")


# --- tiling_picture --------------------------------------------------------------------------------


def test_tiling_picture_labels_each_block_with_its_device():
    layout = layout_array((8, 16), "data=2,model=4", "data, model")
    picture = tiling_picture(layout)
    assert picture_cells(picture) == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    assert "0:4" in picture and "12:16" in picture
    # Transposed: dimension 0 over 'model', dimension 1 over 'data'.
    transposed = tiling_picture(layout_array((8, 16), "data=2,model=4", "model, data"))
    assert picture_cells(transposed) == [[str(data * 4 + model) for data in range(2)] for model in range(4)]


def test_tiling_picture_of_replicated_1d_and_scalar():
    vector = tiling_picture(layout_array((16,), "data=2,model=4", "data"))
    assert picture_cells(vector) == [["0-3 ×4", "4-7 ×4"]]  # two blocks, four copies of each
    assert "replication 4: each box is held whole by 4 devices (×4), not split between them" in vector.splitlines()
    scalar = tiling_picture(layout_array((), "data=2,model=4"))
    assert picture_cells(scalar) == [["all 8 devices"]]
    strided = tiling_picture(layout_array((16,), BIG_MESH, "model"))
    assert picture_cells(strided)[0][0] == "0,16,32,… ×64"  # the shortened list names the count once
    assert tiling_picture(layout_array((), "data=1")).splitlines()[-2] == "│ 0 │"  # one device: no copies


def test_tiling_picture_of_a_replicated_bias_is_one_box_saying_so():
    bias = tiling_picture(layout_array((16,), "data=8", ""))
    assert picture_cells(bias) == [["all 8 devices"]]
    assert bias.splitlines()[1:3] == [
        "columns: dimension 0 (16) in 1 block of 16",
        "replicated: the whole array on each of the 8 devices, one box",
    ]
    sharded = tiling_picture(layout_array((16,), "data=8", "data"))
    assert picture_cells(sharded) == [[str(d) for d in range(8)]] and "replicat" not in sharded


def test_tiling_picture_elides_large_meshes_but_keeps_the_last_block():
    layout = layout_array((1024, 1024), BIG_MESH, "model, data")
    cells = picture_cells(tiling_picture(layout))
    assert len(cells) == 16  # 16 row blocks (model), not elided
    assert len(cells[0]) == 9 and cells[0][7] == "…"  # 64 column blocks (data): 7, a gap, the last
    assert cells[0][:3] == ["0", "16", "32"] and cells[15][-1] == "1023"
    rows = picture_cells(tiling_picture(layout_array((1024,  8), BIG_MESH, "data")))
    assert len(rows) == 17 and rows[15] == ["⋮"] and rows[16] == ["1008-1023 ×16"]


def test_tiling_picture_refuses_3d():
    with pytest.raises(WorkbenchError, match="layout_figure"):
        tiling_picture(data_model_3d())


# --- JAX's own picture -----------------------------------------------------------------------------


def test_capture_visualize_sharding_of_an_abstract_layout(capsys):
    picture = capture_visualize_sharding(layout_array((8, 16), "data=2,model=4", "data, model"))
    assert isinstance(picture, JaxPicture)
    for device in range(8):
        assert f"CPU {device}" in picture.text
    assert "┌" in picture.text  # the plain form has box lines
    assert "background-color: #" in picture.html and "CPU 5" in picture.html
    assert picture._repr_html_() == picture.html
    assert "\x1b[" in picture.ansi
    assert capsys.readouterr().out == ""  # nothing leaked to the console
    assert rich.console.Console.__name__ == "Console"  # rich is left as it was


def test_capture_shows_replicated_tiles_like_the_layout():
    layout = layout_array((8, 16), "data=2,model=4", "model")
    picture = capture_visualize_sharding(layout)
    for holders in layout.holders().values():
        assert "CPU " + ",".join(str(d) for d in sorted(holders)) in picture.text
    # Each tile's label sits on the colour of its lowest holder, in a readable text colour.
    labels = re.findall(r'<span style="color: (#\w+);[^"]*background-color: (#\w+)">\s*CPU ([\d,]+)\s*</span>',
                        picture.html)
    assert sorted(label for _, _, label in labels) == ["0,4", "1,5", "2,6", "3,7"]
    for text_colour, background, label in labels:
        assert background == device_color(int(label.split(",")[0]))
        assert text_colour == text_color_for(background)


def test_capture_of_a_real_array_and_a_shape_dtype_struct():
    mesh = build_mesh("data=8")
    sharding = NamedSharding(mesh, parse_spec("data"))
    array = jax.device_put(jnp.arange(16.0), sharding)
    assert "CPU 7" in capture_visualize_sharding(array).text
    abstract = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=sharding)
    text = capture_visualize_sharding(abstract).text
    assert all(f"CPU {d}" in text for d in range(8))


def test_capture_inside_jupyter_still_returns_the_picture(monkeypatch, capsys):
    # In a notebook rich would display straight into the page and skip stdout; the capture must not.
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    picture = capture_visualize_sharding(layout_array((8,), "data=8", "data"))
    assert "CPU 3" in picture.text and "background-color: #" in picture.html
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "layout, message",
    [
        (lambda: data_model_3d(), "3-D"),
        (lambda: layout_array((), "data=8"), "0-D"),
        (lambda: layout_array((64, 64), BIG_MESH, "data, model"), "1,024 devices"),
    ],
)
def test_capture_refuses_what_jax_cannot_draw(layout, message):
    with pytest.raises(WorkbenchError, match=message) as error:
        capture_visualize_sharding(layout())
    assert isinstance(error.value, ValueError)
    assert "tiling_picture" in str(error.value) or "layout_figure" in str(error.value)
    assert rich.console.Console.__name__ == "Console"


def test_capture_refuses_a_3d_array():
    with pytest.raises(WorkbenchError, match="3-D"):
        capture_visualize_sharding(jnp.zeros((2, 2, 2)))


# --- plotly figures --------------------------------------------------------------------------------


def test_layout_figure_of_3d_array_has_one_panel_per_leading_block():
    layout = data_model_3d()
    figure = layout_figure(layout)
    panels = tiling_traces(figure)
    assert len(panels) == 2  # dimension 0 is cut in two: x[0:4, :, :] and x[4:8, :, :]
    titles = [a.text for a in figure.layout.annotations]
    assert titles[:2] == ["x[0:4, :, :]", "x[4:8, :, :]"]
    hover = " ".join(h for trace in panels for _, _, h in heatmap_cells(trace))
    for device in layout.devices:
        assert f"device {device.device_id}</b>" in hover
        assert f"block {'[' + ', '.join(f'{a}:{b}' for a, b in device.index) + ']'}" in hover
    assert "2.0 KiB (2,048 B)" in hover


def test_layout_figure_small_multiples_grid_and_elision():
    four_d = layout_array((6, 8, 16, 32), "data=2,model=4", "data, model, None, None")
    assert len(tiling_traces(layout_figure(four_d))) == 8
    many = layout_array((64, 8, 16, 32), BIG_MESH, "data, None, None, model")
    figure = layout_figure(many)
    assert len(tiling_traces(figure)) == 16
    assert "showing 16 of 64" in figure.layout.title.text


def test_layout_figure_draws_a_replicated_bias_as_one_grey_block_with_a_big_label():
    # The bug: P() on data=8 was 16 stripes in the 8 device colours, read as "sharded in 16 blocks".
    figure = layout_figure(layout_array((16,), "data=8", ""))
    tiling, grid = figure.data
    assert list(tiling.x) == [0, 16] and list(tiling.y) == [0, 1]  # one cell: the whole array
    assert cell_labels(tiling) == [["whole array on every device (×8)"]]
    assert tiling.texttemplate == "%{text}" and tiling.textfont.size == 20
    assert cell_colours(tiling) == [[SHARED_COLORS[0]]]
    assert "held by 8 devices" in tiling.hovertext[0][0] and "block [0:16]" in tiling.hovertext[0][0]
    assert len(figure.layout.shapes) == 0
    assert "the whole array on each of the 8 devices (grey)" in figure.layout.title.text
    # The mesh beside it still shows every device in its own colour.
    assert [colour for _, colour, _ in heatmap_cells(grid)] == [device_color(d) for d in range(8)]


def test_layout_figure_draws_a_partly_replicated_array_as_its_blocks_with_holders_and_copies():
    # P('data') on data=4,model=2: 4 blocks, each held by the 2 devices of one 'data' row.
    figure = layout_figure(layout_array((16,), "data=4,model=2", "data"))
    tiling = tiling_traces(figure)[0]
    assert list(tiling.x) == [0, 4, 8, 12, 16]  # 4 cells, no stripes
    assert cell_labels(tiling) == [[f"on devices {2 * b},{2 * b + 1}<br>2 copies" for b in range(4)]]
    assert [list(map(int, row)) for row in tiling.customdata] == [[0, 2, 4, 6]]  # a click shows a holder
    colours = cell_colours(tiling)[0]
    assert len(colours) == 4 and set(colours) <= set(SHARED_COLORS) and not set(colours) & set(PALETTE)
    assert all(left != right for left, right in zip(colours, colours[1:], strict=False))  # neighbours stay apart
    assert tiling.textfont.size is None  # only the whole-array label is big
    assert "each block on 2 devices (grey)" in figure.layout.title.text


def test_layout_figure_of_replicated_rows_of_a_matrix():
    layout = layout_array((8, 16), "data=2,model=4", "model")
    figure = layout_figure(layout)
    tiling = tiling_traces(figure)[0]
    assert list(tiling.y) == [0, 2, 4, 6, 8] and list(tiling.x) == [0, 16]
    assert cell_labels(tiling) == [[f"on devices {m},{m + 4}<br>2 copies"] for m in range(4)]
    assert [c[0] for c in cell_colours(tiling)] == [SHARED_COLORS[0], SHARED_COLORS[1]] * 2
    assert len(figure.layout.shapes) == 0
    top = tiling.hovertext[0][0]
    assert "held by 2 devices" in top and "4 (data=1, model=0)" in top and "block [0:2, 0:16]" in top


def test_sharded_and_replicated_layouts_look_different():
    sharded = tiling_traces(layout_figure(layout_array((8, 16), "data=2,model=4", "data, model")))[0]
    replicated = tiling_traces(layout_figure(layout_array((8, 16), "data=2,model=4", "data, None")))[0]
    assert [list(map(int, r)) for r in sharded.customdata] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cell_colours(sharded) == [[device_color(d) for d in row] for row in ([0, 1, 2, 3], [4, 5, 6, 7])]
    assert cell_labels(sharded) == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    assert cell_labels(replicated) == [["on devices 0-3<br>4 copies"], ["on devices 4-7<br>4 copies"]]
    assert cell_colours(replicated) == [[SHARED_COLORS[0]], [SHARED_COLORS[1]]]


def test_block_label():
    assert block_label([5], 8) == "5"
    assert block_label(range(8), 8) == "whole array on every device (×8)"
    assert block_label(range(0, 1024, 64), 1024) == "on devices 0,64,128,…(16)<br>16 copies"


def test_layout_figure_scalar_is_one_grey_cell():
    tiling = tiling_traces(layout_figure(layout_array((), "data=2,model=4")))
    assert len(tiling) == 1
    assert cell_labels(tiling[0]) == [["whole array on every device (×8)"]]
    assert cell_colours(tiling[0]) == [[SHARED_COLORS[0]]]
    assert list(tiling[0].y) == [0, 1]
    one_device = tiling_traces(layout_figure(layout_array((), "data=1")))[0]
    assert cell_labels(one_device) == [["0"]] and cell_colours(one_device) == [[device_color(0)]]


def test_layout_figure_labels_only_what_fits():
    # Two lines a label: 8 rows of them fit down the panel, 64 do not.
    few = tiling_traces(layout_figure(layout_array((1024, 1024), "data=128,model=8", "model")))[0]
    many = tiling_traces(layout_figure(layout_array((1024, 1024), BIG_MESH, "data")))[0]
    assert few.texttemplate == "%{text}" and many.texttemplate is None
    assert len(many.text) == 64  # hover and labels are still there for a zoomed-in view


def test_layout_figure_device_grid():
    figure = layout_figure(data_model_3d())
    grid = figure.data[-1]
    assert [list(map(int, row)) for row in grid.text] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    axis_x = figure.layout[grid.xaxis.replace("x", "xaxis")]
    axis_y = figure.layout[grid.yaxis.replace("y", "yaxis")]
    assert list(axis_x.ticktext) == [f"model={m}" for m in range(4)]
    assert list(axis_y.ticktext) == ["data=0", "data=1"]
    assert axis_x.title.text == "model" and axis_y.title.text == "data"
    hover = grid.hovertext[1][2]
    assert "device 6" in hover and "data=1, model=2" in hover and "[4:8, 0:16, 16:24]" in hover


def test_layout_figure_is_deterministic():
    first = layout_figure(data_model_3d()).to_dict()
    second = layout_figure(data_model_3d()).to_dict()
    assert first == second


def test_layout_figure_of_a_1024_device_mesh():
    layout = layout_array((1024, 1024), BIG_MESH, "data, model")
    figure = layout_figure(layout)
    tiling, grid = figure.data
    # The array keeps a cell per block; the mesh is summarised: 16 x 16 cells of 4 neighbouring devices each.
    assert np.shape(tiling.z) == (64, 16) and np.shape(grid.z) == (16, 16)
    assert "1,024 devices: a cell per 4 neighbours" in figure.layout.annotations[1].text
    assert "4 devices: 0,16,32,48" in grid.hovertext[0][0] and "data=0..3, model=0" in grid.hovertext[0][0]
    assert grid.customdata[15][15] == 60 * 16 + 15 and list(figure.layout.yaxis2.ticktext)[-1] == "data=60"
    cells = heatmap_cells(tiling)
    assert sorted(d for d, _, _ in cells) == list(range(1024))
    last = next(h for d, _, h in cells if d == 1023)
    assert "block [1008:1024, 960:1024]" in last and "data=63, model=15" in last
    assert len(figure.layout.xaxis2.ticktext) <= 17 and figure.layout.xaxis2.ticktext[-1] == "model=15"
    replicated = tiling_traces(layout_figure(layout_array((1024, 1024), BIG_MESH, "data")))[0]
    hover = replicated.hovertext[0][0]
    assert "held by 16 devices" in hover and "… and 8 more" in hover


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_device_is_drawn_in_its_colour_with_its_block(data):
    sizes = data.draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3))
    names = ["a", "b", "c"][: len(sizes)]
    rank = data.draw(st.integers(0, 4))
    free = list(names)
    entries, shape = [], []
    for _ in range(rank):
        axis = data.draw(st.sampled_from([None, *free]))
        if axis is not None:
            free.remove(axis)
        parts = sizes[names.index(axis)] if axis else 1
        shape.append(parts * data.draw(st.integers(1, 3)))
        entries.append(axis)
    mesh = ",".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True))
    layout = layout_array(tuple(shape), mesh, parse_spec(list(entries)))
    figure = layout_figure(layout, max_panels=10**6)
    traces = tiling_traces(figure)
    cells = [cell for trace in traces for cell in heatmap_cells(trace)]
    labels = [label for trace in traces for row in trace.text for label in row]
    holders = layout.holders()
    assert len(cells) == len(holders)  # one cell per block: never stripes that look like more blocks
    by_first_holder = {ids[0]: (index, ids) for index, ids in holders.items()}
    assert sorted(d for d, _, _ in cells) == sorted(by_first_holder)
    for (device, colour, hover), label in zip(cells, labels, strict=True):
        index, ids = by_first_holder[device]
        assert "block [" + ", ".join(f"{a}:{b}" for a, b in index) + "]" in hover
        if len(ids) == 1:
            assert colour == device_color(device) and label == str(device)
        elif len(ids) == layout.num_devices:
            assert colour in SHARED_COLORS and label == f"whole array on every device (×{len(ids)})"
        else:
            assert colour in SHARED_COLORS and label.endswith(f"<br>{len(ids)} copies")


# --- memory bars -----------------------------------------------------------------------------------


def test_memory_bar_figure_from_tree_and_dict():
    state = {
        "params": {"w": jax.ShapeDtypeStruct((16, 4), jnp.float32)},
        "opt_state": {"mu": jax.ShapeDtypeStruct((16, 4), jnp.float32)},
    }
    tree = layout_tree(state, "data=8", "shard")
    figure = memory_bar_figure(tree, capacity_bytes=1024)
    by_name = {trace.name: trace for trace in figure.data}
    assert set(by_name) == {"params", "opt_state"}
    assert list(by_name["params"].y) == [32] * 8
    assert list(by_name["params"].x) == [str(d) for d in range(8)]
    assert list(by_name["params"].marker.color) == [device_color(d) for d in range(8)]
    assert by_name["params"].marker.pattern.shape != by_name["opt_state"].marker.pattern.shape
    assert any("capacity 1.0 KiB" in (a.text or "") for a in figure.layout.annotations)
    plain = memory_bar_figure({3: 2048, 1: 1024})
    assert list(plain.data[0].x) == ["1", "3"] and list(plain.data[0].y) == [1024, 2048]
    assert "device 3: bytes 2.0 KiB (2,048 B)" in plain.data[0].hovertext


# --- the plan beside the compiler ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_comparison():
    """The plan of the mlp's fsdp step on data=8 and the compiler's record of that step, compiled here."""
    config = wb.TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64)
    step = wb.training.build_abstract_step(config)
    compiled = read_compiled_step(step.compile(), step.mode.mesh, step.layers)
    plan = wb.plan_training("mlp", {}, "data=8", "fsdp", optimizer="adam", hardware="cpu", global_batch=64,
                            precision="fp32")
    return compare_plan(plan, compiled)


def test_comparison_figure_puts_two_bars_per_figure_in_the_axis_unit(mlp_comparison):
    peak = mlp_comparison.row("peak")
    figure = comparison_figure(mlp_comparison, capacity_bytes=2 * peak.compiler)
    memory = [row for row in mlp_comparison.rows if row.unit == "bytes" and not row.figure.endswith(" bytes")]
    moved = [row for row in mlp_comparison.rows if row.figure.endswith(" bytes")]
    assert [trace.name for trace in figure.data] == [ANALYTIC_NAME, COMPILER_NAME] * 2
    assert {"arguments", "temporaries", "peak"} <= {row.figure for row in memory}
    unit = 1024 ** BYTE_UNITS.index(figure.layout.yaxis.title.text)
    assert [round(y * unit) for y in figure.data[0].y] == [row.analytic or 0 for row in memory]
    assert [round(y * unit) for y in figure.data[1].y] == [row.compiler for row in memory]
    # The plan's bars carry plan / compiler (the donated state: aliased in both).
    labels = dict(zip(figure.data[0].x, figure.data[0].text, strict=True))
    assert labels["peak"] == f"×{peak.ratio:.2f}"
    assert labels["aliased"] == f"×{mlp_comparison.row('aliased').ratio:.2f}" == "×1.00"
    assert list(figure.data[3].x) == [row.figure.removesuffix(" bytes") for row in moved]
    assert "all-gather" in figure.data[3].x
    assert figure.data[0].marker.pattern.shape != figure.data[1].marker.pattern.shape
    # The chip's memory: a dashed line while it is on the bars' scale, else named in the panel's title.
    assert any("device memory" in (a.text or "") for a in figure.layout.annotations) and figure.layout.shapes
    far = comparison_figure(mlp_comparison, capacity_bytes=10**12)
    assert not far.layout.shapes and "off this scale" in far.layout.title.text


def test_comparison_figure_of_a_step_without_collectives_says_so(mlp_comparison):
    alone = dataclasses.replace(mlp_comparison,
                                rows=tuple(r for r in mlp_comparison.rows if not r.figure.endswith(" bytes")))
    figure = comparison_figure(alone)
    assert len(figure.data) == 2 and not figure.layout.shapes
    assert any("no collectives" in (a.text or "") for a in figure.layout.annotations)
