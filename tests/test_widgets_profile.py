"""The dashboard's Profile control, driven headlessly on 8 simulated devices: a real run is profiled by JAX's
profiler and the panel shows what the engine read back; refusals are shown inline and change nothing."""

from __future__ import annotations

import gzip
import shutil

from helpers import dp_selection, errors, poll


def test_profile_during_a_run_shows_the_timeline_tables_and_memory_and_idle_refuses(make_dashboard, tmp_path):
    dashboard = make_dashboard(dp_selection(steps=100_000))
    panel = dashboard.profile_panel
    assert panel.profile_button.disabled and panel.steps.value == 5  # enabled only while a run is active
    panel.profile_button.click()
    assert panel.status.last[0] == "error" and "no run to profile" in panel.status.last[1]

    dashboard.start()
    assert not panel.profile_button.disabled
    panel.steps.value = 3
    panel.profile_button.click()  # returns at once: the loop takes the request at its next steady step
    assert panel.status.last == ("info", f"profiling 3 steps of {dashboard.trainer.run_name} at the next steady step…")
    panel.profile_button.click()  # a second one while the first is pending: the engine's refusal, inline
    assert panel.status.last[0] == "error" and "is being taken" in panel.status.last[1]

    assert poll(lambda: panel.report is not None, 60), panel.status.messages
    report = panel.wait(30)
    assert dashboard.trainer.status == "running"  # the run went on
    assert report.steps == 3 and report.timeline is not None and panel.status.last[0] == "ok", panel.status.messages
    lanes = {lane for trace in panel.timeline.data for lane in trace.y}
    assert lanes == {f"device {d}" for d in range(8)}
    assert "all-reduce" in {trace.name for trace in panel.timeline.data}
    assert [label for label, _ in panel.step_picker.options] == [
        f"step {report.first_step + i}" for i in range(3)]
    panel.step_picker.value = 2  # the timeline redraws that step
    assert f"training step {report.first_step + 2}:" in panel.timeline.layout.title.text
    assert "all-reduce" in panel.tables.value and "bandwidth" in panel.tables.value
    sources = {source for trace in panel.memory.data if trace.type == "bar" for source in trace.x[1]}
    assert sources == {"predicted", "compiled", "live"}
    assert panel.flags.value and str(report.perfetto_file) in panel.how_to_open.value

    dashboard.stop()
    assert dashboard.wait(30) is not None and panel.profile_button.disabled
    panel.profile_button.click()  # idle: the engine's ProfileError, inline; the last profile stays
    level, text = panel.status.last
    assert level == "error" and text.startswith("no run to profile (stopped)")
    assert panel.report is report and not errors(dashboard)

    # A trace this JAX version cannot parse: the message and the folder of the raw files; memory still shown.
    broken = tmp_path / "broken-profile"
    shutil.copytree(report.folder, broken)
    (broken / "timeline.json").unlink()  # the parsed copy: read the trace again
    perfetto = next(broken.rglob("perfetto_trace.json.gz"))
    perfetto.write_bytes(gzip.compress(b'{"displayTimeUnit": "ns"}'))
    panel.show_capture({"run": report.run, "folder": str(broken), "first_step": 2, "steps": 3, "error": None})
    shown = panel.wait(30)
    level, text = panel.status.last
    assert level == "error" and "the trace could not be read" in text and str(broken) in text
    assert shown.timeline is None and shown.memory == report.memory and "no timeline" in panel.tables.value

    # A profile never taken (the event the trainer sends when JAX's profiler would not start): why, inline.
    failed = {"run": report.run, "folder": None, "first_step": 9, "steps": 0,
              "error": "JAX's profiler could not start (RuntimeError: a trace is running)"}
    panel.show_capture(failed)
    assert panel.wait(30) is shown
    assert panel.status.last == ("error", f"no profile was taken: {failed['error']}")
