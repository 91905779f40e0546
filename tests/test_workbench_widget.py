"""The composed Workbench: one selection shared by every tab, so a change in one shows in the others."""

from __future__ import annotations

import workbench as wb
from widgets import Workbench


def test_workbench_composes_every_widget_on_one_selection():
    bench = Workbench()
    try:
        assert len(bench.tabs.children) == 6 and bench.tabs.titles[0] == "1 · Mesh"
        for part in (bench.mesh_picker, bench.mode_selector, bench.spec_editor, bench.inspector, bench.dashboard,
                     bench.recommender):
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


def test_view_only_changes_and_a_second_run_compile_nothing(tmp_path):
    """Looking around (another array, another device, another mesh or spec, a past run overlaid) and running
    again with a new learning rate, seed or logging schedule reuse every compiled program. The layout views
    trace abstract states (``jax.eval_shape``); nothing is lowered or compiled, and the run traces nothing."""
    from jax import monitoring
    from jax._src import dispatch

    bench = Workbench(run_root=str(tmp_path))
    phase = ["first run"]  # its compiles are expected; only what follows is held to nothing
    events: list[tuple[str, str]] = []

    def on_duration(event: str, _seconds: float, **kwargs) -> None:
        if event in (dispatch.JAXPR_TRACE_EVENT, dispatch.JAXPR_TO_MLIR_MODULE_EVENT, dispatch.BACKEND_COMPILE_EVENT):
            events.append((phase[0], f"{event.rsplit('/', 1)[-1]} of {kwargs.get('fun_name', '?')}"))

    monitoring.register_event_duration_secs_listener(on_duration)
    try:
        options = {"steps": 30, "batch": 64, "log_every": 5, "eval_every": 10, "sync_every": 10}
        first = bench.dashboard.start(**options)
        bench.dashboard.wait()
        phase[0] = "looking"
        bench.inspector.select("opt_state", "inner_state/0/mu/hidden1/kernel")
        bench.inspector.show_device(5)
        bench.mesh_picker.mesh_text.value = "data=4,model=2"  # every layout changes; no step is involved
        bench.mesh_picker.mesh_text.value = "data=8"
        bench.spec_editor.spec_text.value = "data, None"
        bench.dashboard.runs_select.value = (first,)  # overlay the finished run
        phase[0] = "training"
        bench.dashboard.start(**{**options, "lr": 3e-3, "seed": 1, "log_every": 3, "steps": 40})
        summary = bench.dashboard.wait()
        assert summary["steps"] == 40 and bench.dashboard.trainer.compiled_modes == 1
        compiled = [what for when, what in events
                    if when != "first run" and not what.startswith("jaxpr_trace_duration")]
        assert compiled == [], compiled
        assert [what for when, what in events if when == "training"] == []
        assert any(when == "looking" for when, _ in events)  # the listener did hear the layout views
    finally:
        monitoring.unregister_event_duration_listener(on_duration)
        bench.close()
