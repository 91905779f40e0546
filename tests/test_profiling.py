"""Profiling a running step: a real trace of 8 simulated CPU devices read into per-device timelines, memory
predicted / compiled / live, and the ways a profile is refused or fails without touching the run."""

from __future__ import annotations

import gzip
import json
import re
import shutil

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.analysis.memory_comparison import FLAG_FRACTION, compare_memory
from workbench.analysis.profile_report import read_profile
from workbench.analysis.timeline import COMPUTE, find_trace_file, read_timeline
from workbench.cli.main import main
from workbench.training.profiling import ProfileError, read_capture

CONFIG = wb.TrainConfig(model="mlp", data="digits", mode="dp", mesh="data=8", batch=64, steps=40, log_every=10,
                        eval_every=0, sync_every=0)
PROFILED_STEPS = 3


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A run profiled from its second step, and the same run unprofiled."""
    root = tmp_path_factory.mktemp("profiled")
    trainer = wb.Trainer(CONFIG, run_root=str(root))
    events = []
    trainer.subscribe(lambda event: events.append(event) if event.kind == "profile" else None)
    summary = trainer.run(name="profiled", profile=PROFILED_STEPS)
    plain = wb.Trainer(CONFIG, run_root=str(root))
    plain_summary = plain.run(name="plain")
    return {"trainer": trainer, "summary": summary, "events": events, "plain": plain, "plain_summary": plain_summary,
            "report": read_profile(events[0].data["folder"]), "root": root}


def test_profiling_never_changes_the_trained_result(profiled):
    assert profiled["summary"]["final_loss"] == profiled["plain_summary"]["final_loss"]
    for a, b in zip(jax.tree.leaves(profiled["trainer"].state.params), jax.tree.leaves(profiled["plain"].state.params),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    metrics = [json.loads(line) for line in (profiled["root"] / "profiled" / "metrics.jsonl").read_text().splitlines()]
    plain = [json.loads(line) for line in (profiled["root"] / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [m["step"] for m in plain]  # the metrics went on as always


def test_the_profile_event_names_the_folder_of_steady_steps(profiled):
    (event,) = profiled["events"]
    assert event.data["error"] is None and event.data["steps"] == PROFILED_STEPS
    assert event.data["first_step"] == 2  # step 1 compiles: never profiled
    folder = profiled["root"] / "profiled" / "profile" / "step-000002"
    assert event.data["folder"] == str(folder) and find_trace_file(folder).name == "perfetto_trace.json.gz"


def test_a_real_trace_gives_every_device_a_lane_and_each_step_its_all_reduce(profiled):
    timeline = profiled["report"].timeline
    assert timeline.devices == tuple(range(8)) and len(timeline.steps) == PROFILED_STEPS
    ledger = wb.ledger_for_config(CONFIG)
    gradient_bytes = max(row.bytes for row in ledger.collectives if row.kind == "all-reduce")
    for step in range(PROFILED_STEPS):
        ops = timeline.step_ops(step)
        reduces = [op for op in ops if op.kind == "all-reduce" and op.bytes == gradient_bytes]
        assert sorted(op.device for op in reduces) == list(range(8))  # the gradients' all-reduce, on every device
        # Layers from the HLO metadata, unless JAX's cache gave a step compiled by code naming ops otherwise (keyed
        # without metadata: a developer's cache from older versions), which the report must then say.
        named = any(op.kind == COMPUTE and op.layer == "hidden1" for op in ops)
        assert named or "names no layer" in " ".join(profiled["report"].notes)
        assert all(op.duration_us >= 0 and op.start_us >= 0 for op in ops)
        timing = timeline.steps[step]
        assert 0 < timing.compute_us <= timing.wall_us and 0 < timing.collective_us <= timing.wall_us
        assert 0 <= timing.overlap_us <= min(timing.compute_us, timing.collective_us)
        assert 0 < timing.collective_share < 1 and timing.slowest_device in range(8)
    gradients = next(c for c in timeline.collectives if c.bytes == gradient_bytes)
    assert gradients.kind == "all-reduce" and gradients.axes == ("data",) and gradients.occurrences == 1
    assert 0 < gradients.transfer_us <= gradients.duration_us * 8  # medians over devices and steps
    assert gradients.bandwidth == pytest.approx(gradient_bytes / (gradients.transfer_us * 1e-6))


def test_trace_op_names_are_the_compiled_steps_and_the_parse_is_kept(profiled):
    report = profiled["report"]
    capture = read_capture(report.folder)
    hlo_names = set(re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", "\n".join(capture["programs"].values()), re.M))
    assert {op.name for op in report.timeline.ops} <= hlo_names
    again = read_profile(report.folder)  # from timeline.json / memory.json, no parsing
    assert again.timeline == report.timeline and again.memory == report.memory
    bare = read_timeline(report.perfetto_file)  # without the HLO: collectives still told by their names
    assert {op.kind for op in bare.ops} == {COMPUTE, "all-reduce"}


def test_memory_live_matches_the_prediction_and_the_compiler(profiled):
    """The step's own arrays (its state and batch) are what the layout engine and the compiler predict. Live also
    counts every other array of the process (in a test session, other tests' too), so only these are compared."""
    memory = profiled["report"].memory
    assert [d.device for d in memory.devices] == list(range(8))
    for device in memory.devices:
        assert device.predicted_arguments == device.compiled_arguments  # the state and batch, per device
        own = device.live_roles["state"] + device.live_roles["batch"]
        assert device.live_roles["state"] > 0 and device.live_roles["batch"] > 0
        assert abs(own / device.predicted_arguments - 1) <= FLAG_FRACTION and device.live >= own
        assert device.predicted_peak > device.predicted_arguments and device.compiled_peak > device.compiled_arguments
        assert device.in_use is None  # XLA:CPU keeps no allocator statistics
    assert len(memory.flags) == sum(abs(d.live_vs_predicted) > FLAG_FRACTION for d in memory.devices)


def test_a_kept_copy_of_the_state_is_flagged_as_one(profiled):
    """The same run profiled without, then with, a copy of the state kept on device 0: the second profile has
    exactly that copy more on device 0, named as a state copy, and flagged."""
    trainer = profiled["trainer"]
    kept = jax.device_put(trainer.state, jax.devices()[0])  # a notebook holding the last run's state on device 0
    copy_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(kept) if leaf.ndim)  # scalars are taken for metrics
    del kept
    before = read_profile(profiled["root"] / trainer.run(name="without-copy", profile=2)["run"]).memory
    kept = jax.device_put(trainer.state, jax.devices()[0])
    summary = trainer.run(name="with-copy", profile=2)
    assert summary["final_loss"] == profiled["summary"]["final_loss"]
    after = read_profile(profiled["root"] / "with-copy").memory
    extra = {d.device: d.live_roles.get("state copy", 0) - b.live_roles.get("state copy", 0)
             for d, b in zip(after.devices, before.devices, strict=True)}
    assert extra == {0: copy_bytes, **{device: 0 for device in range(1, 8)}}
    (flag,) = [f for f in after.flags if f.startswith("device 0:")]
    assert "undonated buffers" in flag and "leaked copy" in flag
    del kept


def test_memory_flags_say_what_is_missing_or_extra():
    from workbench.analysis.step_memory import StepMemory

    predicted = StepMemory(1000, 900, 900, 100)
    extra = {"by_device": {"0": {"state": 900, "batch": 100, "batch copy": 400}}}  # as read back from JSON
    less = {"by_device": {"0": {"state": 700}}}
    (flag,) = compare_memory(predicted, None, [extra]).flags
    assert flag.startswith("device 0: 1.4 KiB live, +40%") and "batch prefetch" in flag
    (flag,) = compare_memory(predicted, None, [less]).flags
    assert "-30%" in flag and "less than predicted" in flag


def test_profiling_while_idle_twice_or_with_bad_steps_is_refused(profiled):
    trainer = profiled["trainer"]
    with pytest.raises(ProfileError, match=r"no run to profile \(finished\): start a run"):
        trainer.profile(5)
    with pytest.raises(ProfileError, match=r"profile steps=0 must be a whole number from 1 to 100"):
        trainer.run(profile=0)
    slow = wb.Trainer(CONFIG, run_root=str(profiled["root"]), steps=100_000, log_every=1000)
    slow.start(name="twice")
    try:
        request = slow.profile(2, wait=False)
        with pytest.raises(ProfileError, match="a profile of 2 steps of run 'twice' is being taken"):
            slow.profile(2)
        assert request.result(timeout=120).error is None
    finally:
        slow.stop()
        slow.wait(timeout=60)


def test_a_profile_outlasting_the_run_says_so_and_a_session_already_open_is_named(profiled, tmp_path):
    trainer = wb.Trainer(CONFIG, run_root=str(tmp_path), steps=4)
    notes = []
    trainer.subscribe(lambda event: notes.append(event.data) if event.kind == "profile" else None)
    trainer.run(name="short", profile=10)
    (note,) = notes
    assert note["steps"] == 3 and note["error"] is None
    assert note["note"] == "run 'short' finished after 3 of 10 profiled steps"
    jax.profiler.start_trace(str(tmp_path / "mine"))  # a session of the user's own: JAX runs one at a time
    try:
        trainer.run(name="busy", profile=2)
    finally:
        jax.profiler.stop_trace()
    assert trainer.status == "finished"  # the run went on without its profile
    assert notes[-1]["folder"] is None and notes[-1]["error"].startswith("JAX's profiler could not start")
    assert "jax.profiler.stop_trace()" in notes[-1]["error"]


def test_op_names_from_another_compile_are_named_as_such(profiled, tmp_path):
    """JAX's compilation cache keys programs without their op metadata: a step compiled by code that named its ops
    otherwise comes back with those names. Its HLO, stripped of the layer scopes, must say so, not just show none."""
    run = tmp_path / "stale-run"  # a run folder: its config.json names the model, whose layers are expected
    folder = run / "profile" / profiled["report"].folder.name
    shutil.copytree(profiled["report"].folder, folder)
    shutil.copy(profiled["report"].folder.parent.parent / "config.json", run / "config.json")
    (folder / "timeline.json").unlink()
    hlo = folder / "step.hlo.txt"
    unnamed = re.sub(r"/(hidden1|hidden2|output)/", "/", hlo.read_text())
    hlo.write_text(re.sub(r"\((hidden1|hidden2|output)\)", "()", unnamed))
    report = read_profile(folder)
    assert {op.layer for op in report.timeline.ops} == {None}
    (note,) = report.notes
    assert "names no layer" in note and "workbench cache --clear" in note and f"note: {note}" in wb.profile_text(report)


def test_a_trace_that_does_not_parse_keeps_the_raw_files_and_says_so(profiled, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(profiled["report"].folder, folder)
    for saved in ("timeline.json", "memory.json"):
        (folder / saved).unlink()
    trace = find_trace_file(folder)
    trace.write_bytes(gzip.compress(b'{"displayTimeUnit": "ns", "events": []}'))
    report = read_profile(folder)
    assert report.timeline is None and f"the trace {trace} has no traceEvents list" in report.timeline_error
    assert trace.exists() and report.memory.devices  # the raw files stay; memory is read all the same
    trace.write_bytes(b"not gzip")
    assert "could not be read" in read_profile(folder, reparse=True).timeline_error


def test_cli_profiles_prints_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    argv = ["train", "--model", "mlp", "--mode", "dp", "--mesh", "data=8", "--batch", "64", "--steps", "12",
            "--eval-every", "0", "--run-dir", str(tmp_path), "--name", "cli"]
    assert main([*argv, "--profile", "2"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce" in out and "perfetto_trace.json.gz" in out
    assert main(["profile", str(tmp_path / "cli"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["steps"] == 2 and record["collectives"][0]["kind"] == "all-reduce"
    for bad, message in (([*argv, "--profile", "0"], "profile steps=0"),
                         (["profile", str(tmp_path / "nowhere")], "no profile in"),
                         ([*argv, "--processes", "2", "--profile", "2"], "trains across 2 processes")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
