"""The profile's views, drawn from a real profile: 5 steps of the mlp under dp on 8 simulated devices, taken
once by JAX's profiler while the run trains. The figures and tables are checked against the timeline and
memory records they draw, and the collectives' bytes against the compiled step's communication ledger."""

from __future__ import annotations

import re

import pytest

import workbench as wb
from helpers import profile_while_training

DEVICES = 8


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(config, report) of one profiled mlp dp run (stopped once the profile is on disk)."""
    config = wb.TrainConfig(model="mlp", model_options={"hidden": 16}, mode="dp", mesh=f"data={DEVICES}", batch=64,
                            steps=100_000, log_every=50, eval_every=0)
    return config, profile_while_training(config, 5, tmp_path_factory.mktemp("runs"))


def trace(figure, name):
    return next(t for t in figure.data if t.name == name)


def test_the_timeline_has_one_lane_per_device_and_a_bar_per_op_of_the_step(profiled):
    _, report = profiled
    timeline = report.timeline
    step = 1
    figure = wb.timeline_figure(timeline, step=step)
    lanes = [f"device {d}" for d in range(DEVICES)]
    assert list(figure.layout.yaxis.categoryarray) == lanes
    assert {lane for t in figure.data for lane in t.y} == set(lanes)
    ops = timeline.step_ops(step)
    assert {t.name for t in figure.data} == {op.kind for op in ops} == {"compute", "all-reduce"}
    scale = 1e-3 if figure.layout.xaxis.title.text.startswith("ms") else 1.0
    for t in figure.data:
        mine = [op for op in ops if op.kind == t.name]
        assert len(t.x) == len(mine)  # one trace per kind, one bar per op
        assert list(t.base) == pytest.approx([op.start_us * scale for op in mine])
        assert list(t.x) == pytest.approx([op.duration_us * scale for op in mine])
    title = figure.layout.title.text
    assert f"training step {timeline.first_step + step}:" in title
    assert f"{timeline.steps[step].collective_share:.0%} communicating" in title


def test_an_all_reduce_bar_names_its_op_bytes_and_bandwidth(profiled):
    _, report = profiled
    timeline = report.timeline
    figure = wb.timeline_figure(timeline, step=0)
    all_reduce = trace(figure, "all-reduce")
    ops = [op for op in timeline.step_ops(0) if op.kind == "all-reduce"]
    bandwidth = {c.name: c.bandwidth for c in timeline.collectives}
    assert len(ops) == len(all_reduce.hovertext) == 2 * DEVICES  # the gradients' and the loss's, on each device
    for op, hover in zip(ops, all_reduce.hovertext, strict=True):
        assert f"<b>{op.name}</b> · all-reduce on device {op.device}" in hover
        assert wb.formatting.format_bytes_exact(op.bytes) in hover
        assert f"bandwidth {wb.formatting.format_bandwidth(bandwidth[op.name])}" in hover
    compute_hover = trace(figure, "compute").hovertext[0]
    assert "bandwidth" not in compute_hover and "layer" in compute_hover
    assert figure.layout.legend.title.text == "op kind"


def test_a_step_outside_the_profile_is_refused_with_the_range(profiled):
    _, report = profiled
    with pytest.raises(wb.WorkbenchError, match=r"step=5 is not a profiled step: .* numbered 0 to 4"):
        wb.timeline_figure(report.timeline, step=5)


def test_the_collective_table_gives_the_ledger_bytes_and_the_bandwidth(profiled):
    config, report = profiled
    timeline = report.timeline
    ledger = wb.ledger_for_config(config)
    ledger_bytes = sorted(c.bytes for c in ledger.collectives if c.kind == "all-reduce" for _ in range(c.count))
    assert sorted(c.bytes for c in timeline.collectives) == ledger_bytes
    text = wb.views.timeline_table(timeline)
    per_collective = text.split("collectives (bytes per device")[1].splitlines()
    for collective in timeline.collectives:
        row = next(line for line in per_collective if line.startswith(collective.name + " "))
        assert re.search(rf"\ball-reduce\s+{re.escape(wb.format_bytes(collective.bytes))}\s", row)
        assert wb.formatting.format_bandwidth(collective.bandwidth) in row and collective.bandwidth is not None
        assert row.split()[-2] == "data"  # the axis it reduces over
    for step in timeline.steps:  # one row per profiled step, by its training step
        assert re.search(rf"^\s*{timeline.first_step + step.step}\s+\S+ \S+\s", text, re.M)


def test_the_memory_figure_has_predicted_compiled_and_live_for_every_device(profiled):
    _, report = profiled
    memory = report.memory
    figure = wb.memory_figure(memory)
    bars = {}
    for t in figure.data:
        for lane, source, value in zip(t.x[0], t.x[1], t.y, strict=True):
            bars.setdefault((lane, source, t.type), []).append(value)
    for device in memory.devices:
        lane = f"device {device.device}"
        assert bars[(lane, "predicted", "bar")] == [device.predicted_arguments]
        assert bars[(lane, "compiled", "bar")] == [device.compiled_arguments]
        assert sum(bars[(lane, "live", "bar")]) == device.live > 0  # stacked by role
        assert bars[(lane, "predicted", "scatter")] == [device.predicted_peak]  # the peaks as markers
        assert bars[(lane, "compiled", "scatter")] == [device.compiled_peak]
    assert "live: state" in {t.name for t in figure.data}
    # Live counts every array of the process (other tests' too): the title says what the flags say.
    flagged = len(memory.flags)
    expected = (f"{flagged} of 8 devices differ from the prediction" if flagged
                else "live matches the predicted arguments on every device")
    assert expected in figure.layout.title.text


def test_the_profile_text_has_the_tables_the_memory_and_how_to_open_the_trace(profiled):
    _, report = profiled
    text = wb.profile_text(report)
    assert text.startswith(f"profile of run {report.run}: training steps {report.first_step} to "
                           f"{report.first_step + 4} (5 steps)")
    assert wb.views.timeline_table(report.timeline) in text and wb.views.memory_table(report.memory) in text
    assert text.endswith(report.how_to_open()) and str(report.perfetto_file) in text
    device = report.memory.devices[0]
    # Devices with the same figures share a row ("0-7" when nothing else lives on device 0 alone).
    assert re.search(rf"^\s+0(-\d+)?\s+{re.escape(wb.format_bytes(device.predicted_arguments))}\s", text, re.M)
