"""The Inspect tab's "Verify with the compiler", headless, with the real engine: a child process compiles the
step for a mesh twice the size of the 8 local devices while the kernel stays free; the panel shows the
engine's comparison, marks it stale when the selection changes, cancels at once, and shows bad input inline.

Waits are generous and nothing is timed: the machine may be busy.
"""

from __future__ import annotations

import html
import re

import pytest

import workbench as wb
from widgets.common import Selection
from widgets.inspector import ShardingInspector
from widgets.verify_panel import VerifyPanel
from widgets.workbench_widget import Workbench
from workbench.analysis.compile_target import INSTALL_LIBTPU, libtpu_installed
from workbench.formatting import BYTE_UNITS
from workbench.views.comparison_figure import ANALYTIC_NAME, COMPILER_NAME
from helpers import TableRows

WAIT_S = 600  # the child imports JAX and compiles: seconds when quiet, far more on a busy machine
SMALL = dict(model="mlp", mesh="data=16", mode="fsdp", options={"batch": 64})  # 16 devices: twice this machine's


def table_rows(markup: str) -> dict[str, dict[str, str]]:
    """The side-by-side table by figure: {figure: {header: cell}}."""
    parser = TableRows()
    parser.feed(markup)
    header, *rows = parser.rows
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def shown(widget) -> str:
    """The text an HTML widget shows (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", widget.value))


def test_verify_compiles_a_mesh_larger_than_the_machine_in_the_background_then_marks_it_stale(resolutions, monkeypatch):
    selection = Selection(**SMALL)
    inspector = ShardingInspector(selection)
    panel = inspector.verification  # hosted by the Inspect tab
    assert panel.target.options == ("cpu", *wb.analysis.topologies_for(16), *wb.analysis.gpu_targets_for(16))
    assert {"tpu:v5e:4x4", "gpu:h100:16"} <= set(panel.target.options)

    resolutions.clear()  # counted from here: the click
    panel.verify_button.click()
    # The click resolves the selection once: its staleness key, the compile's check and the plan take the record.
    assert len(resolutions) == 1

    job = panel.job
    assert panel.running and not job.done  # the click came back while the child compiles
    assert panel.verify_button.disabled and not panel.cancel_button.disabled
    assert "⏳" in shown(panel.progress)
    plan = panel.wait(WAIT_S)
    assert len(resolutions) == 2  # and once more at the end: has the selection moved on while it compiled?
    monkeypatch.undo()

    assert job.done and not panel.running and plan is panel.plan
    assert not panel.verify_button.disabled and panel.cancel_button.disabled
    assert job.progress and "16 cpu devices" in " ".join(job.progress)  # the engine's messages were shown
    compiled = plan.compiled
    assert (compiled.target, compiled.mesh, compiled.devices) == ("cpu", "data=16", 16)
    # The analytic side is the engine's plan of the same step, planned on the chip picked, its memory simulated for
    # the compiler that verifies it (XLA:CPU).
    reference = wb.plan_training("mlp", {}, "data=16", "fsdp", optimizer="adam", hardware=panel.chip.value,
                                 global_batch=64, precision="fp32", compiler="cpu")
    assert (plan.peak_bytes, plan.device_memory) == (reference.peak_bytes, reference.device_memory)
    # The compiled step's inputs are exactly the state and the batch the inspector lays out.
    assert compiled.argument_bytes == sum(inspector.model_layout.bytes_per_device().values())
    level, text = panel.status.last
    assert level == "ok" and f"peak {wb.format_bytes(compiled.peak_bytes)}" in text and "fits" in text
    assert "compiled for cpu" in shown(panel.progress) and "16 devices" in shown(panel.progress)

    # The table: every row of the engine's comparison, both sides and the ratio.
    comparison = plan.comparison
    rows = table_rows(panel.table.value)
    assert list(rows) == [row.figure for row in comparison.rows]
    peak = comparison.row("peak")
    assert rows["peak"]["analytic"] == wb.format_bytes(peak.analytic)
    assert rows["peak"]["compiler"] == wb.format_bytes(compiled.peak_bytes)
    assert rows["peak"]["ratio"] == f"{peak.ratio:.2f}"
    assert rows["aliased"]["analytic"] == wb.format_bytes(comparison.row("aliased").analytic)  # the donated state
    # The figure: two bars per figure, plan then compiler, memory then collectives, in the axis' unit.
    traces = panel.figure.data
    assert [trace.name for trace in traces] == [ANALYTIC_NAME, COMPILER_NAME] * 2
    memory_rows = [row for row in comparison.rows if row.unit == "bytes" and not row.figure.endswith(" bytes")]
    assert list(traces[1].x) == [row.figure for row in memory_rows]
    scale = 1024 ** BYTE_UNITS.index(panel.figure.layout.yaxis.title.text)
    assert [round(y * scale) for y in traces[1].y] == [row.compiler for row in memory_rows]
    collective_rows = [row for row in comparison.rows if row.figure.endswith(" bytes")]
    assert list(traces[3].x) == [row.figure.removesuffix(" bytes") for row in collective_rows]
    assert set(compiled.bytes_by_kind()) <= set(traces[3].x)  # every kind the compiler emitted
    assert "all-gather" in shown(panel.collectives)

    selection.options = {**selection.options, "batch": 128}  # another step: the shown one is stale
    assert panel.is_stale and "Stale" in shown(panel.stale) and "batch 64" in shown(panel.stale)
    selection.options = {**selection.options, "batch": 64}  # back: it is this selection's again
    assert not panel.is_stale and shown(panel.stale) == ""
    panel.target.value = "tpu:v5e:4x4"  # another target is another compile too
    assert panel.is_stale
    panel.target.value = "cpu"
    selection.options = {**selection.options, "lr": 0.5}  # the learning rate does not change the step
    assert not panel.is_stale


def test_cancel_kills_the_child_at_once_and_keeps_the_last_result():
    selection = Selection(**SMALL)
    panel = VerifyPanel(selection)
    panel.verify_button.click()
    first = panel.wait(WAIT_S)
    assert first is not None

    selection.mesh = "data=32"
    panel.verify_button.click()
    job = panel.job
    assert job.done is False
    panel.cancel_button.click()

    assert job.done  # cancel() returns once the child has been killed and reaped
    with pytest.raises(wb.VerificationError, match="cancelled"):
        job.result(timeout=0)
    panel.wait(WAIT_S)
    level, text = panel.status.last
    assert level == "warning" and text.startswith("cancelled after") and "the last result stays" in text
    assert panel.plan is first and panel.is_stale  # the data=16 result stays, marked as another selection's
    assert "data=16" in shown(panel.stale)
    assert not panel.verify_button.disabled and panel.cancel_button.disabled and shown(panel.progress) == ""


@pytest.mark.parametrize(("selection", "target", "message"), [
    (SMALL, "tpu:v5p:8x8x8", "has 16 devices but TPU topology v5p:8x8x8 has 512"),
    (SMALL, "tpu:v7x:2x2", "unknown TPU generation 'v7x'"),
    ({**SMALL, "mesh": "data=4096", "options": {"batch": 4096}}, "cpu", "at most 2,048 simulated devices"),
    ({**SMALL, "mode": "simulated"}, "cpu", "simulated"),
])
def test_bad_input_is_shown_inline_before_any_process_starts(selection, target, message):
    panel = VerifyPanel(Selection(**selection))
    panel.target.value = target

    # Said before any click, with the button off: the engine's own check, nothing started.
    assert shown(panel.readiness).startswith("✗ Verify refuses this: ") and message in shown(panel.readiness)
    assert panel.verify_button.disabled
    with pytest.raises(wb.WorkbenchError, match=re.escape(message)):
        panel.verify()  # a script that calls it anyway gets the same message, in the API's way
    assert panel.job is None and panel.plan is None
    assert panel.target.value == target  # the user's input stays, to correct it
    panel.target.value = "cpu" if target != "cpu" else target
    if selection is SMALL:
        assert shown(panel.readiness) == "" and not panel.verify_button.disabled


def test_a_compile_past_its_time_limit_is_stopped_and_said_inline():
    selection = Selection(**SMALL)
    panel = VerifyPanel(selection, timeout=0.5)  # no child imports JAX in half a second

    panel.verify_button.click()
    panel.wait(WAIT_S)

    level, text = panel.status.last
    assert level == "error" and "took longer than 0.5 s" in text
    assert panel.job.done and panel.plan is None and not panel.verify_button.disabled
    assert selection.mesh == "data=16" and panel.target.value == "cpu"


def test_an_error_in_the_child_process_comes_back_inline():
    selection = Selection(**{**SMALL, "model_options": {"hidden": 0}})  # refused only when the child builds the model
    panel = VerifyPanel(selection)

    panel.verify_button.click()
    assert panel.job is not None  # the child was started: the parent does not build the model
    panel.wait(WAIT_S)

    level, text = panel.status.last
    assert level == "error" and "hidden=0 must be positive" in text
    assert panel.plan is None and not panel.verify_button.disabled and panel.cancel_button.disabled
    assert selection.model_options == {"hidden": 0}


def test_closing_the_workbench_stops_a_running_verification():
    workbench = Workbench(model="mlp", mesh="data=16", mode="fsdp")
    panel = workbench.inspector.verification
    panel.verify_button.click()
    job = panel.job

    workbench.close()

    assert job.done
    with pytest.raises(wb.VerificationError, match="cancelled"):
        job.result(timeout=0)


needs_libtpu = pytest.mark.skipif(not libtpu_installed(),
                                  reason="the tpu extra is not installed (pip install -e '.[tpu]')")


@needs_libtpu
def test_a_tpu_topology_compiles_with_the_tpu_compiler_and_its_chip():
    panel = VerifyPanel(Selection(model="mlp", mesh="data=4", mode="fsdp", options={"batch": 16}))
    assert "tpu:v5e:2x2" in panel.target.options
    panel.target.value = "tpu:v5e:2x2"

    panel.verify_button.click()
    plan = panel.wait(WAIT_S)

    assert plan is not None, panel.status.last
    assert plan.compiled.target == "tpu:v5e:2x2" and "TPU" in plan.compiled.device_kind
    assert plan.hardware.name == "tpu-v5e"  # the chip follows the topology, whatever the chip box says
    assert panel.status.last[0] == "ok" and "tpu-v5e" in panel.status.last[1]
    assert [trace.name for trace in panel.figure.data][:2] == [ANALYTIC_NAME, COMPILER_NAME]


@pytest.mark.skipif(libtpu_installed(), reason="libtpu is installed: the message for its absence cannot show")
def test_without_the_tpu_extra_a_tpu_target_says_how_to_get_it():
    panel = VerifyPanel(Selection(model="mlp", mesh="data=4", mode="fsdp"))
    panel.target.value = "tpu:v5e:2x2"
    panel.verify_button.click()
    assert panel.status.last == ("error", INSTALL_LIBTPU) and panel.job is None


def test_where_xla_gpu_recomputed_to_its_budget_the_verdict_says_so(gpu_compiler, monkeypatch):
    # XLA:GPU's budget at 0 B (slop factor 0): it recomputes what it can, and holds clearly less than the plan.
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_memory_limit_slop_factor=0")
    lm = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 256}
    panel = VerifyPanel(Selection(model="transformer", model_options=lm, mesh="data=8", mode="fsdp",
                                  options={"batch": 16, "precision": "bf16"}))
    panel.target.value = "gpu:h100:8"
    panel.verify_button.click()
    plan = panel.wait(WAIT_S)

    assert plan is not None, panel.status.last
    assert plan.comparison.recomputed_to_budget == 0
    assert "over this compile's budget, 0 B: XLA:GPU computed values again" in panel.status.last[1]
    assert "XLA:GPU computed values again" in shown(panel.table)
