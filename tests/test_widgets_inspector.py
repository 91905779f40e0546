"""The sharding inspector widget, headless: real layouts, table text, figure data and the compiler's estimate.

Runs on the 8 simulated CPU devices of conftest.py. Widgets work without a browser: ipywidgets keeps
their state in Python, so tests read the table's HTML, the FigureWidget's traces and the status area.
"""

from __future__ import annotations

import html
import re

import pytest

import workbench as wb
from widgets.common import Selection
from widgets.inspector import ShardingInspector
from widgets.mode_selector import ModeSelector
from workbench.views.text import format_index
from helpers import TableRows


def _dict_rows(html: str) -> list[dict[str, str]]:
    """A rendered table's body rows as {header: cell}; the unnamed marker column is "mark"."""
    parser = TableRows()
    parser.feed(html)
    header, *rows = parser.rows
    header = ["mark", *header[1:]]
    return [dict(zip(header, row, strict=True)) for row in rows]


def table(html: str) -> dict[str, dict[str, str]]:
    """The leaf table by path."""
    return {row["path"]: row for row in _dict_rows(html)}


def device_rows(html: str) -> dict[tuple[str, str], dict[str, str]]:
    """The device panel by (tree, path)."""
    return {(row["tree"], row["path"]): row for row in _dict_rows(html)}


def test_default_selection_then_fsdp_updates_the_table_and_the_same_figure():
    selection = Selection()  # mlp, data=8, dp
    inspector = ShardingInspector(selection)
    figure = inspector.figure
    inspector.select("params", "hidden1/kernel")

    rows = table(inspector.table.value)
    assert {"hidden1/kernel", "hidden1/bias", "hidden2/kernel", "output/kernel"} <= set(rows)
    kernel = rows["hidden1/kernel"]
    assert (kernel["spec"], kernel["replication"]) == ("P()", "8")
    assert (kernel["shape"], kernel["shard shape"]) == ("[64, 128]", "[64, 128]")
    assert kernel["mark"] == "▶" and rows["hidden1/bias"]["mark"] == ""  # the selected leaf is highlighted
    assert inspector.leaf_picker.value == "hidden1/kernel"
    assert "hidden1/kernel" in figure.layout.title.text
    # Replicated: one grey block that says so, not stripes in the 8 holders' colours.
    assert [list(row) for row in figure.data[0].text] == [["whole array on every device (×8)"]]
    assert [list(row) for row in figure.data[0].customdata] == [[0]]  # a click shows a device holding it

    selection.mode = "fsdp"

    assert inspector.status.last == ("info", "mlp laid out on data=8 for fsdp")  # the verdict above holds the ✓
    assert inspector.model_layout.mode == "fsdp"
    kernel = table(inspector.table.value)["hidden1/kernel"]
    assert (kernel["spec"], kernel["replication"], kernel["shard shape"]) == ("P(None, 'data')", "1", "[64, 16]")
    assert inspector.leaf_picker.value == "hidden1/kernel"  # the selected array survives a redraw
    assert inspector.figure is figure  # updated in place: the browser keeps the same view
    # Sharded over data along dimension 1: one row of 8 blocks, devices 0..7 in order.
    assert [list(row) for row in figure.data[0].customdata] == [list(range(8))]
    assert "as None, data" in figure.layout.title.text


def test_two_d_mesh_splits_kernels_over_model_and_the_batch_over_data():
    selection = Selection(mesh="data=4,model=2", mode="dp-tp")
    inspector = ShardingInspector(selection)
    inspector.select("params", "hidden1/kernel")

    kernel = table(inspector.table.value)["hidden1/kernel"]
    assert (kernel["spec"], kernel["shard shape"], kernel["replication"]) == ("P(None, 'model')", "[64, 64]", "4")
    # JAX's own picture: a 2-D array on a mesh that fits the 8 local devices.
    assert "jax.debug.visualize_array_sharding" in inspector.jax_picture.value
    assert "CPU 1" in inspector.jax_picture.value

    inspector.tree_picker.value = "batch"  # as a click on the toggle would
    assert inspector.leaf_picker.options == ("mask", "x", "y")
    inspector.leaf_picker.value = "x"
    x = table(inspector.table.value)["x"]
    assert (x["spec"], x["shape"], x["shard shape"], x["replication"]) == ("P('data')", "[256, 64]", "[64, 64]", "2")
    assert x["mark"] == "▶"
    assert inspector.model_layout.batch.leaf("x").layout.shard_shape == (64, 64)


def test_a_4d_leaf_gets_a_figure_and_a_note_instead_of_jax_picture():
    inspector = ShardingInspector(Selection(model="cnn", mode="fsdp"))
    inspector.select("opt_state", "inner_state/0/mu/conv2/kernel")

    leaf = inspector.model_layout.opt_state.leaf("inner_state/0/mu/conv2/kernel").layout
    assert len(leaf.shape) == 4
    heatmaps = [trace for trace in inspector.figure.data if trace.type == "heatmap"]
    assert len(heatmaps) >= 2  # the array's panel(s) and the device mesh
    assert "only 1-D and 2-D arrays" in inspector.jax_picture.value
    assert "4-D" in inspector.jax_picture.value
    assert "jax.debug.visualize_array_sharding</b>" not in inspector.jax_picture.value
    assert "shard shape" in inspector.jax_picture.value  # the workbench's text view is shown instead


def test_a_512_device_mesh_is_planned_and_says_training_needs_512_devices():
    selection = Selection(mesh="data=64,model=8", model="transformer", mode="dp-tp")
    inspector = ShardingInspector(selection)

    assert inspector.model_layout.mesh.size == 512
    assert inspector.verdict.fit.level == "plan"
    assert shown(inspector.verdict.line).startswith("ℹ plan and verify only: mesh data=64,model=8 has 512 devices")
    assert "training needs 512" in shown(inspector.verdict.line)
    assert inspector.verdict.fix_labels == ["use mesh data=1,model=8"]
    assert inspector.status.last == ("info",
                                     "transformer laid out on data=64,model=8 for dp-tp (abstract: nothing allocated)")
    inspector.select("params", "blocks/0/mlp/up/kernel")
    row = table(inspector.table.value)["blocks/0/mlp/up/kernel"]
    assert (row["spec"], row["shard shape"], row["replication"]) == ("P(None, 'model')", "[128, 64]", "64")
    mesh_grid = inspector.figure.data[-1]
    assert (len(mesh_grid.customdata), len(mesh_grid.customdata[0])) == (16, 8)  # a cell per 4 devices: readable
    picture = inspector.jax_picture.value
    assert "jax.debug.visualize_array_sharding</b>" not in picture
    assert "this mesh has 512" in picture and "┌" in picture  # why, then our own text picture

    inspector.compile_button.click()  # cannot compile here: the engine's message, the figure unchanged
    level, text = inspector.status.last
    assert level == "error" and "512" in text
    assert inspector.ledger is None and len(inspector.memory_figure.data) == 3


def test_show_device_lists_each_arrays_slice_and_a_click_on_the_grid_does_the_same():
    inspector = ShardingInspector(Selection(mesh="data=4,model=2", mode="dp-tp"))
    layout = inspector.model_layout

    inspector.show_device(3)

    rows = device_rows(inspector.device_panel.value)
    leaves = [(name, leaf) for name, tree in layout.trees().items() for leaf in tree.leaves]
    assert len(rows) == len(leaves)
    for name, leaf in leaves:
        assert rows[(name, leaf.path)]["index (its slice)"] == format_index(leaf.layout.devices[3].index)
    # Device 3 is data=1, model=1: the second half of a model-split kernel, its own quarter of the batch.
    assert rows[("params", "hidden1/kernel")]["index (its slice)"] == "[0:64, 64:128]"
    assert rows[("batch", "x")]["index (its slice)"] == "[64:128, 0:64]"
    assert "data=1, model=1" in inspector.device_panel.value

    # A click in the browser arrives as this message; cell [row 1, column 0] of the mesh grid is device 2.
    grid = len(inspector.figure.data) - 1
    inspector.figure._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {"trace_indexes": [grid], "point_indexes": [[1, 0]], "xs": [0.5], "ys": [1.5]},
    }
    assert inspector.device_position == 2
    assert "data=1, model=0" in inspector.device_panel.value


def test_memory_bars_match_the_engine_then_the_compiler_estimate_is_added(resolutions, monkeypatch):
    inspector = ShardingInspector(Selection())  # mlp, data=8, dp
    predicted = inspector.model_layout.bytes_per_device()

    bars = inspector.memory_figure.data
    assert [bar.name for bar in bars] == ["params", "opt_state", "batch"]
    assert [list(bar.y) for bar in bars] == [[predicted[name]] * 8 for name in ("params", "opt_state", "batch")]
    assert list(bars[0].x) == [str(d) for d in range(8)]

    resolutions.clear()  # counted from here: the click
    inspector.compile_button.click()
    assert len(resolutions) == 1  # the click resolves the selection once; the compile takes the record
    monkeypatch.undo()

    assert inspector.status.last[0] == "ok", inspector.status.last
    memory = inspector.ledger.memory
    estimate = [trace for trace in inspector.memory_figure.data if "compiler estimate" in (trace.name or "")]
    assert len(estimate) == 1
    assert list(estimate[0].y) == [memory["argument_bytes"]] * 8
    # The compiled step's arguments are exactly the state and the batch the engine predicted.
    assert memory["argument_bytes"] == sum(predicted.values())

    # A changed selection drops the old estimate: it belonged to the old layout.
    inspector.selection.mode = "fsdp"
    assert inspector.ledger is None
    assert not any("compiler estimate" in (trace.name or "") for trace in inspector.memory_figure.data)


def test_a_mode_with_no_single_compiled_step_shows_the_engines_message():
    inspector = ShardingInspector(Selection(mode="simulated"))
    inspector.compile_button.click()
    level, text = inspector.status.last
    assert level == "error" and "simulated" in text
    assert len(inspector.memory_figure.data) == 3


def test_invalid_rules_show_the_error_and_keep_the_last_good_view():
    selection = Selection()
    inspector = ShardingInspector(selection)
    inspector.select("params", "hidden2/kernel")
    before = (inspector.model_layout, inspector.table.value, inspector.figure.to_dict(), inspector.jax_picture.value)

    selection.rules = [(".*", "model")]  # no 'model' axis on data=8

    level, text = inspector.status.last
    assert level == "error" and "model" in text
    assert inspector.model_layout is before[0]
    assert (inspector.table.value, inspector.figure.to_dict(), inspector.jax_picture.value) == before[1:]

    selection.rules = [(r"hidden\d/kernel$", "None, data"), (".*", "")]  # a valid table: drawn again
    assert inspector.status.last[0] == "info" and "laid out" in inspector.status.last[1]
    assert table(inspector.table.value)["hidden2/kernel"]["spec"] == "P(None, 'data')"


@pytest.mark.parametrize("tree", ["opt_state", "batch"])
def test_switching_trees_selects_their_first_array(tree):
    inspector = ShardingInspector(Selection())
    inspector.tree_picker.value = tree
    first = inspector.model_layout.trees()[tree].leaves[0].path
    assert inspector.leaf_picker.value == first
    assert table(inspector.table.value)[first]["mark"] == "▶"


# --- the verdict: whether the mode trains on the mesh ----------------------------------------------------


def shown(widget) -> str:
    """The text an HTML widget shows (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", widget.value))


def click_fix(inspector: ShardingInspector, label: str) -> None:
    next(button for button in inspector.verdict.fix_buttons.children if button.description == label).click()


def test_a_pair_that_repeats_work_is_laid_out_under_a_warning_and_a_mode_fix_relays_it():
    selection = Selection(mesh="data=4,model=2", mode="dp")
    inspector = ShardingInspector(selection)
    selector = ModeSelector(selection)  # the Model & mode tab on the same selection

    assert shown(inspector.verdict.line) == f"⚠ {wb.mesh_fit('dp', 'data=4,model=2').message}"
    assert "identical copies" in shown(inspector.verdict.line)
    assert inspector.verdict.fix_labels == ["use mode dp-tp", "use mesh data=8"]
    assert inspector.showing_selection and inspector.model_layout.mode == "dp"  # it trains: laid out
    assert table(inspector.table.value)["hidden1/kernel"]["replication"] == "8"

    click_fix(inspector, "use mode dp-tp")

    assert selection.mode == "dp-tp" and selector.mode.value == "dp-tp"
    assert shown(inspector.verdict.line) == "✓ mode 'dp-tp' trains on mesh data=4,model=2"
    assert shown(selector.verdict.line) == shown(inspector.verdict.line) and inspector.verdict.fix_labels == []
    assert table(inspector.table.value)["hidden1/kernel"]["spec"] == "P(None, 'model')"
    assert inspector.status.last == ("info", "mlp laid out on data=4,model=2 for dp-tp")


@pytest.mark.parametrize(("mode", "mesh"), [("tp", "data=8"), ("dp-pmap", "data=4,model=2")])
def test_a_pair_the_trainer_refuses_shows_the_verdict_and_keeps_the_last_layout_marked(mode, mesh):
    selection = Selection(mesh="data=8", mode="dp")
    inspector = ShardingInspector(selection)
    inspector.select("params", "hidden1/kernel")
    before = (inspector.model_layout, inspector.table.value)
    shown_before = len(inspector.status.messages)

    with selection.hold_trait_notifications():  # as the Mesh and Model & mode tabs would
        selection.mesh, selection.mode = mesh, mode

    fit = wb.mesh_fit(mode, mesh)
    assert fit.level == "error"
    assert shown(inspector.verdict.line) == f"✗ {fit.message}" and inspector.verdict.fix_labels
    assert inspector.status.value == ""  # said once, in the verdict, in the trainer's own words
    assert all(level != "ok" for level, _ in inspector.status.messages[shown_before:])  # never ✓ laid out
    assert not inspector.showing_selection
    assert (inspector.model_layout, inspector.table.value) == before  # the last valid layout stays...
    summary = shown(inspector.summary)
    assert summary.startswith("Not this selection: below is the last valid layout (mode dp on mesh data=8)")
    assert f"mode {mode} on mesh {mesh} cannot run as it is" in summary  # ...marked as another selection's


def test_a_mesh_fix_lays_out_the_refused_pair_on_the_mesh_it_needs():
    selection = Selection(mesh="data=8", mode="tp")  # refused from the start: no layout yet
    inspector = ShardingInspector(selection)
    assert inspector.model_layout is None and not inspector.showing_selection
    assert "No layout" in shown(inspector.summary) and inspector.status.value == ""
    assert inspector.verdict.fix_labels == ["use mode dp", "use mesh model=8"]

    click_fix(inspector, "use mesh model=8")

    assert selection.mesh == "model=8" and inspector.showing_selection
    assert shown(inspector.verdict.line) == "✓ mode 'tp' trains on mesh model=8"
    assert inspector.status.last == ("info", "mlp laid out on model=8 for tp")
    assert table(inspector.table.value)["hidden1/kernel"]["spec"] == "P(None, 'model')"
    assert "Not this selection" not in shown(inspector.summary)
