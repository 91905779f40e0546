"""MeshPicker, SpecEditor and ModeSelector driven headlessly: set values as a user would, assert the
selection (engine state) and what is shown; invalid input is shown inline and the last valid state kept."""

from __future__ import annotations

import html
import re

import pytest
from jax.sharding import PartitionSpec

import workbench as wb
from widgets.common import Selection, StatusArea, guarded
from widgets.mesh_picker import MeshPicker, device_grid_html
from widgets.inspector import ShardingInspector
from widgets.mesh_verdict import MeshVerdict
from widgets.mode_selector import ModeSelector, describe_mode
from widgets.spec_editor import SpecEditor


def test_guarded_callbacks_show_errors_instead_of_raising():
    status = StatusArea()

    @guarded(status)
    def broken(_):
        return 1 / 0

    assert broken(None) is None
    assert status.last == ("error", "ZeroDivisionError: division by zero")
    assert "✗" in status.value


def test_the_selection_computes_a_layout_once_per_choice():
    selection = Selection(mesh="data=8", mode="fsdp")
    first = selection.model_layout()
    assert selection.model_layout() is first
    selection.mode = "dp"
    assert selection.model_layout() is not first and selection.model_layout().mode == "dp"


# --- MeshPicker ------------------------------------------------------------------------------------------


def test_mesh_presets_text_and_axis_rows_write_valid_meshes():
    picker = MeshPicker()
    picker.preset.value = "2-D: data x model"
    assert picker.selection.mesh == "data=4,model=2"
    assert [row.children[0].value for row in picker.axes_box.children] == ["data", "model"]
    picker.axes_box.children[1].children[1].value = 4  # resize 'model' in its row
    assert picker.selection.mesh == "data=4,model=4"
    picker.axes_box.children[0].children[0].value = "batch"  # rename an axis
    assert picker.selection.mesh == "batch=4,model=4"
    picker.add_axis.click()
    assert picker.selection.mesh == "batch=4,model=4,seq=2"
    picker.axes_box.children[2].children[2].click()  # remove it again
    assert picker.selection.mesh == "batch=4,model=4"
    picker.axis_types.value = "explicit"
    assert picker.selection.axis_types == "explicit"


def test_invalid_mesh_is_shown_inline_and_the_last_valid_one_kept():
    picker = MeshPicker()
    picker.mesh_text.value = "data=0"
    assert picker.selection.mesh == "data=8"
    level, text = picker.status.last
    assert level == "error" and "data" in text and "size 0" in text
    picker.axes_box.children[0].children[0].value = "bad name!"
    assert picker.selection.mesh == "data=8" and picker.status.last[0] == "error"


def test_a_mesh_larger_than_the_machine_is_allowed_for_planning_and_says_how_to_train():
    picker = MeshPicker()
    picker.mesh_text.value = "data=64,model=8"
    assert picker.selection.mesh == "data=64,model=8"
    level, text = picker.status.last
    assert level == "warning" and "512 devices" in text and "WORKBENCH_CPU_DEVICES=512" in text
    assert "showing 256 of 512 devices" in picker.grid.value


def test_device_grid_uses_the_shared_device_colours():
    grid = device_grid_html(wb.parse_mesh("data=2,model=4"))
    for device in range(8):
        assert wb.views.device_color(device) in grid
    assert "model=3" in grid and "data=1" in grid


# --- SpecEditor ------------------------------------------------------------------------------------------


def test_spec_text_and_dimension_pickers_agree():
    selection = Selection(mesh="data=4,model=2")
    editor = SpecEditor(selection, shape="8, 16, 32", spec="data")
    assert editor.layout.shard_shape == (2, 16, 32)
    editor.set_dimension(2, ["model"])
    assert editor.spec_text.value == "data, None, model"
    assert editor.layout.shard_shape == (2, 16, 16)
    editor.set_dimension(2, [])
    editor.set_dimension(0, ["data", "model"])  # two axes on one dimension, in order
    assert editor.layout.spec == PartitionSpec(("data", "model"))
    assert editor.layout.shard_shape == (1, 16, 32)
    editor.dims_box.children[0].children[1].value = ["model"]  # the dimension's own picker, as a user would
    assert editor.spec_text.value == "model" and editor.layout.shard_shape == (4, 16, 32)
    editor.dims_box.children[1].children[1].value = ["model"]  # 'model' twice: refused, last spec kept
    assert editor.status.last[0] == "error" and editor.spec_text.value == "model"


def test_invalid_spec_is_flagged_with_the_engines_message_and_the_last_valid_spec_kept():
    editor = SpecEditor(Selection(mesh="data=4"), shape="6, 8", spec="None, data")
    editor.spec_text.value = "data, None"  # 6 is not divisible by 4
    level, text = editor.status.last
    assert level == "error" and "dimension 0 of size 6 is not divisible by mesh axis 'data' (4)" in text
    assert wb.layout.format_spec(editor.layout.spec) == "None, data"
    editor.spec_text.value = "model"
    assert "names axis 'model'" in editor.status.last[1]
    assert wb.layout.format_spec(editor.layout.spec) == "None, data"


def test_rule_table_shows_what_each_rule_matched_and_refuses_bad_rules():
    selection = Selection(mesh="data=4,model=2", mode="dp-tp")
    editor = SpecEditor(selection)
    assert "hidden1/kernel" in editor.matches.value
    assert editor.apply_rules("kernel$ => None, model\nnothing_here => data\n.* => P()")
    assert selection.rules[0] == ("kernel$", "None, model")
    assert "matched nothing" in editor.matches.value
    layout = selection.model_layout()
    assert wb.layout.format_spec(layout.params.leaf("hidden2/kernel").layout.spec) == "None, model"
    assert not editor.apply_rules("kernel$ => data, data")
    assert editor.rules_status.last[0] == "error"
    assert selection.rules[0] == ("kernel$", "None, model")  # kept
    editor.mode_rules_button.click()
    assert selection.rules == []


# --- ModeSelector ----------------------------------------------------------------------------------------


def test_choosing_a_mode_applies_its_standard_specs():
    selection = Selection(mesh="data=8", rules=[(".*", "P()")])
    selector = ModeSelector(selection)
    selector.mode.value = "fsdp"
    assert selection.mode == "fsdp" and selection.rules == []
    spec = selection.model_layout().params.leaf("hidden1/kernel").layout.spec
    assert "data" in wb.layout.format_spec(spec)
    assert "reduce-scatter" in selector.explanation.value and "all-gather" in selector.explanation.value


def shown(widget) -> str:
    """The text an HTML widget shows (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", widget.value))


def fix_button(verdict: MeshVerdict, label: str):
    return next(button for button in verdict.fix_buttons.children if button.description == label)


def test_a_mode_that_does_not_fit_the_mesh_is_chosen_and_the_verdict_says_why_with_fixes():
    selection = Selection(mesh="data=8")
    selector = ModeSelector(selection)
    picker = MeshPicker(selection)  # the Mesh tab, on the same selection
    assert shown(selector.verdict.line) == "✓ mode 'dp' trains on mesh data=8" and selector.verdict.fix_labels == []

    selector.mode.value = "tp"

    fit = wb.mesh_fit("tp", "data=8")
    assert selection.mode == "tp" and selector.mode.value == "tp"  # chosen, not reverted
    assert shown(selector.verdict.line) == f"✗ {fit.message}"
    assert "needs a mesh axis 'model'" in fit.message
    assert selector.verdict.fix_labels == [fix.label for fix in fit.fixes] == ["use mode dp", "use mesh model=8"]
    assert "error" in " ".join(selector.verdict._dom_classes)  # wb-verdict-error: what browser tests look for
    assert selector.status.last[0] != "ok"  # no ✓ anywhere for a pair the trainer refuses

    fix_button(selector.verdict, "use mesh model=8").click()

    assert selection.mesh == "model=8" and selection.mode == "tp"
    assert picker.mesh_text.value == "model=8"
    assert [row.children[0].value for row in picker.axes_box.children] == ["model"]
    assert shown(selector.verdict.line) == "✓ mode 'tp' trains on mesh model=8" and selector.verdict.fix_labels == []
    assert selector.status.last[0] == "ok" and "tp on model=8" in selector.status.last[1]


def test_a_pair_that_repeats_work_warns_and_a_mode_fix_sets_the_dropdown_specs_and_faults():
    selection = Selection(mesh="data=4,model=2", mode="dp-shard-map")
    selector = ModeSelector(selection)
    selector.faults.value = "psum"
    selection.rules = [(".*", "P()")]

    fit = wb.mesh_fit("dp-shard-map", "data=4,model=2")
    assert fit.level == "warning" and shown(selector.verdict.line) == f"⚠ {fit.message}"
    assert "identical copies" in fit.message
    assert selector.verdict.fix_labels == ["use mode dp-tp", "use mesh data=8"]
    assert selector.status.last[0] == "info"  # the options are fine; the ✓ belongs to a pair that uses every device

    fix_button(selector.verdict, "use mode dp-tp").click()

    assert selection.mode == "dp-tp" and selector.mode.value == "dp-tp"
    assert selection.rules == [] and selection.options["faults"] == () and selector.faults.value == ""
    assert "dp-tp" in selector.explanation.value
    assert shown(selector.verdict.line) == "✓ mode 'dp-tp' trains on mesh data=4,model=2"
    assert selector.status.last[0] == "ok"
    spec = selection.model_layout().params.leaf("hidden1/kernel").layout.spec
    assert wb.layout.format_spec(spec) == "None, model"


def test_a_fix_that_fails_is_shown_in_the_widget_and_the_selection_kept():
    selection = Selection(mesh="data=4,model=2", mode="dp")
    selector = ModeSelector(selection)
    broken = selector.verdict._button(wb.training.MeshFix("use mesh data=0", mesh="data=0"))  # as a bad fix would be
    broken.click()
    level, text = selector.status.last
    assert level == "error" and "'data' has size 0" in text
    assert (selection.mesh, selection.mode) == ("data=4,model=2", "dp")


def test_a_mode_the_model_cannot_have_is_chosen_and_the_verdict_says_why_with_a_fix():
    selector = ModeSelector(Selection(model="linear", mesh="model=8"))
    selector.mode.value = "tp"
    assert selector.selection.mode == "tp"
    assert shown(selector.verdict.line).startswith("✗ ") and "no splittable layer pair" in shown(selector.verdict.line)
    assert selector.verdict.fix_labels == ["use mode dp"] and selector.status.last[0] != "ok"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("lr", -1.0, "lr=-1.0 must be a number > 0"),
    ("steps", 0, "steps=0"),
    ("faults", "bogus", "unknown fault 'bogus': choose from skip-sync, psum"),
])
def test_invalid_options_are_shown_and_the_last_valid_options_kept(name, value, message):
    selector = ModeSelector(Selection())
    before = dict(selector.selection.options)
    getattr(selector, name).value = value
    assert selector.status.last[0] == "error" and message in selector.status.last[1]
    assert selector.selection.options == before


def test_a_batch_that_does_not_split_is_kept_and_the_verdict_offers_the_batches_that_do():
    selection = Selection(mesh="data=8")
    selector, inspector = ModeSelector(selection), ShardingInspector(selection)
    selector.batch.value = 100
    assert selection.options["batch"] == 100
    for verdict in (selector.verdict, inspector.verdict):
        assert shown(verdict.line).startswith("✗ global batch 100 does not split into 8 parts")
        assert verdict.fix_labels == ["use batch 96", "use batch 104"]
    assert selector.status.last[0] != "ok" and not inspector.showing_selection
    fix_button(selector.verdict, "use batch 104").click()
    assert selection.options["batch"] == 104 and selector.batch.value == 104
    assert shown(selector.verdict.line) == "✓ mode 'dp' trains on mesh data=8" and inspector.showing_selection


def test_faults_offered_are_those_the_mode_supports_and_off_by_default():
    selection = Selection(mesh="data=4")
    selector = ModeSelector(selection)
    assert selection.options["faults"] == () and selector.faults.description == "Teaching faults"
    selector.mode.value = "dp-shard-map"
    offered = {"psum", "vma-double-count", "optimizer-reset", "same-shard"}
    assert all(f"<code>{fault}</code>" in selector.fault_help.value for fault in offered)
    selector.faults.value = "vma-double-count"
    assert selection.train_config().faults == ("vma-double-count",)
    selector.mode.value = "dp"  # dp has no hand-written pmean: the fault is dropped
    assert selection.options["faults"] == () and selector.faults.value == ""


def test_mode_descriptions_name_the_collectives():
    assert "all-reduce" in describe_mode("dp")
    assert "none: one device" in describe_mode("single")
    assert "all-reduce</b> over model" in describe_mode("tp")


def test_processes_are_checked_as_they_change():
    selector = ModeSelector(Selection(mesh="data=8"))
    selector.processes.value = 3
    assert selector.status.last[0] == "error" and "processes=3 does not divide the 8 devices" in selector.status.last[1]
    assert selector.selection.options["processes"] == 1
    selector.processes.value = 2
    assert selector.selection.train_config().processes == 2


def test_the_remat_policy_is_offered_checked_against_the_model_and_dropped_for_a_model_without_blocks():
    selection = Selection(mesh="data=8")
    selector = ModeSelector(selection)
    assert selector.remat.options == wb.training.REMAT_POLICIES and selection.options["remat"] == "none"
    selector.remat.value = "block"  # the default mlp has no blocks: refused with the choices, none kept
    assert selector.status.last[0] == "error" and "model 'mlp' cannot apply remat 'block'" in selector.status.last[1]
    assert selection.options["remat"] == "none"
    selector.model.value = "transformer"
    selector.remat.value = "dots"
    assert selection.train_config().remat == "dots" and "remat dots" in selector.status.last[1]
    selector.model.value = "mlp"  # a policy the mlp cannot apply falls back to none
    assert selection.model == "mlp" and selection.options["remat"] == "none" and selector.remat.value == "none"
