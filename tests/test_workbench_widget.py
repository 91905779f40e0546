"""The composed Workbench: one selection shared by every tab, so a change in one shows in the others."""

from __future__ import annotations

import workbench as wb
from widgets import Workbench


def test_workbench_composes_every_widget_on_one_selection():
    bench = Workbench()
    try:
        assert len(bench.tabs.children) == 5 and bench.tabs.titles[0] == "1 · Mesh"
        for part in (bench.mesh_picker, bench.mode_selector, bench.spec_editor, bench.inspector, bench.dashboard):
            assert part.selection is bench.selection
    finally:
        bench.close()


def test_changing_the_mesh_changes_the_inspectors_figure_in_place():
    bench = Workbench(mode="dp-tp", mesh="data=4,model=2")
    try:
        figure = bench.inspector.figure
        before = [trace.to_plotly_json() for trace in figure.data]
        bench.mesh_picker.mesh_text.value = "data=2,model=4"
        assert bench.inspector.model_layout.mesh == wb.parse_mesh("data=2,model=4")
        assert bench.inspector.figure is figure
        assert [trace.to_plotly_json() for trace in figure.data] != before
    finally:
        bench.close()


def test_choosing_fsdp_shows_fsdps_layout_in_the_inspector():
    bench = Workbench(mesh="data=8")
    try:
        bench.inspector.select("params", "hidden1/kernel")
        assert "P()" in bench.inspector.table.value or "replicated" in bench.inspector.table.value.lower()
        bench.mode_selector.mode.value = "fsdp"
        spec = bench.inspector.model_layout.params.leaf("hidden1/kernel").layout.spec
        assert spec == wb.parse_spec("None, data")
    finally:
        bench.close()


def test_invalid_spec_is_shown_inline_and_everything_else_kept():
    bench = Workbench(mesh="data=4")
    try:
        layout_before = bench.inspector.model_layout
        bench.spec_editor.apply_rules(".* => model")
        assert bench.spec_editor.rules_status.last[0] == "error"
        assert "names axis 'model'" in bench.spec_editor.rules_status.last[1]
        assert bench.selection.rules == [] and bench.inspector.model_layout is layout_before
    finally:
        bench.close()


def test_workbench_can_start_from_a_model_mesh_and_mode():
    bench = Workbench(model="transformer", mesh="data=64,model=8", mode="dp-tp")
    try:
        assert bench.inspector.model_layout.mesh.size == 512
        assert "512 devices" in bench.mesh_picker.status.last[1]
    finally:
        bench.close()
