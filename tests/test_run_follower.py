"""Following a run from its files: the Trainer's own events rebuilt from a real run, runs written line by
line in another thread, half-written lines, silence, a run that appears late or never, and the controls a
followed run refuses."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import workbench as wb
from workbench.training.config import TrainConfig
from workbench.training.trainer import Trainer
from helpers import poll

FAST = 0.01  # poll interval: every wait below is bounded, and short because of it
SMALL = dict(model="mlp", data="digits", mode="dp", mesh="data=8", batch=64, model_options={"hidden": 16})
ROOT = Path(__file__).resolve().parents[1]


def kinds(follower: wb.training.RunFollower) -> list[str]:
    return [event.kind for event in follower.history]


@pytest.fixture
def follow(tmp_path):
    """follow_run under tmp_path with a fast poll; every follower is closed when the test ends."""
    made = []

    def start(run, **options) -> wb.training.RunFollower:
        follower = wb.follow_run(run, run_root=tmp_path, **{"poll_interval": FAST, **options})
        made.append(follower)
        return follower

    yield start
    for follower in made:
        follower.close()
        assert not follower.following  # the thread ended: nothing is left behind


def test_a_finished_run_is_replayed_as_the_trainer_emitted_it(tmp_path, follow):
    trainer = Trainer(TrainConfig(**SMALL, steps=20, log_every=5, eval_every=10, sync_every=10), run_root=tmp_path)
    summary = trainer.run()
    follower = follow(trainer.run_name)
    assert follower.wait(30) == {**summary, "status": "finished", "ended": follower.history[-1].data["ended"]}
    assert follower.status == "finished" and not follower.skipped_lines

    # Everything the Trainer emitted is in the files, except what end adds: the summary's status and end time.
    replayed = [(e.kind, e.step, e.data) for e in follower.history]
    ended = replayed[-1][2]
    replayed[-1] = ("end", replayed[-1][1], {k: v for k, v in ended.items() if k not in ("status", "ended")})
    assert replayed == [(e.kind, e.step, e.data) for e in trainer.history]
    assert {"start", "compiled", "metrics", "eval", "sync", "end"} <= set(kinds(follower))
    assert all(event.run == trainer.run_name for event in follower.history)


def test_a_run_written_line_by_line_in_another_thread_is_followed_as_it_grows(tmp_path, follow):
    records = []
    for step in range(1, 31):
        records.append({"step": step, "loss": 1.0 / step, "examples_per_s": 100.0 + step})
        if step % 10 == 0:
            records.append({"step": step, "eval_loss": 2.0 / step, "eval_accuracy": step / 30})
            records.append({"step": step, "sync_replicas": 2, "sync_per_replica_grad_norms": [0.5, 0.25 * step]})
    writer = wb.training.RunWriter(tmp_path, "live", {"mode": "dp", "mesh": "data=2", "steps": 30})
    follower = follow("live")
    seen_while_running = []
    follower.subscribe(lambda event: seen_while_running.append(writer.finished))

    def write():
        for record in records:
            writer.append(record)
            time.sleep(0.002)  # lines arrive across many polls, as a training run writes them
        writer.finish("finished", steps=30, final_loss=records[-3]["loss"], compile_s=1.23456)

    thread = threading.Thread(target=write)
    thread.start()
    summary = follower.wait(30)
    thread.join(10)
    assert summary["status"] == "finished" and summary["run"] == "live" and summary["final_loss"] == 1 / 30
    assert any(not finished for finished in seen_while_running)  # events came while the run was writing

    events = follower.history
    # The run's config names no sync_every.
    assert events[0].data == {"mode": "dp", "mesh": "data=2", "steps": 30, "sync_every": None,
                              "run_dir": str(tmp_path / "live")}
    assert events[1].kind == "compiled" and events[1].step == 1
    assert events[-1].kind == "end" and events[-1].step == 30 and follower.status == "finished"
    body = events[2:-1]
    assert len(body) == len(records)
    for event, record in zip(body, records, strict=True):
        assert event.step == record["step"]
        data = {k: v for k, v in record.items() if k != "step"}
        if "eval_loss" in record:
            assert event.kind == "eval" and event.data == data  # keys kept as the trainer emits them
        elif "sync_replicas" in record:
            assert event.kind == "sync" and event.data == {"replicas": 2,
                                                           "per_replica_grad_norms": [0.5, 0.25 * event.step]}
        else:
            assert event.kind == "metrics" and event.data == data


def test_a_half_written_line_is_read_when_its_newline_arrives(tmp_path, follow):
    writer = wb.training.RunWriter(tmp_path, "half", {"steps": 3})
    writer.append({"step": 1, "loss": 0.5})
    follower = follow("half")
    assert poll(lambda: "metrics" in kinds(follower))
    metrics_file = writer.path / "metrics.jsonl"
    with open(metrics_file, "ab") as file:
        file.write(b'{"step": 2, "lo')
        file.flush()
        seen = len(follower.history)
        time.sleep(10 * FAST)  # ten looks at the file: none may consume the half line
        assert len(follower.history) == seen and not follower.skipped_lines
        file.write(b'ss": 0.25}\n')
        file.flush()
        assert poll(lambda: follower.history[-1].data == {"loss": 0.25})
        assert follower.history[-1].step == 2
        file.write(b'{"step": 3, "lo')  # a writer killed mid-line: its launcher then ends the run
    writer.finish("failed", steps=2, error="worker 1 exited with signal 9")
    summary = follower.wait(10)
    assert summary["status"] == "failed" and follower.status == "failed"
    assert follower.history[-1].data["error"] == "worker 1 exited with signal 9"
    assert len(follower.skipped_lines) == 1 and follower.skipped_lines[0].startswith("line 3:")


def test_a_run_that_stops_writing_goes_silent_once_and_comes_back(tmp_path, follow):
    writer = wb.training.RunWriter(tmp_path, "quiet", {"steps": 10})
    writer.append({"step": 1, "loss": 1.0})
    follower = follow("quiet", silent_after=0.2)
    assert poll(lambda: follower.status == "silent")
    silent = [event for event in follower.history if event.kind == "silent"]
    assert len(silent) == 1 and silent[0].step == 1
    assert silent[0].data == {"silent_after": 0.2, "run_dir": str(writer.path)}
    time.sleep(0.3)  # longer than silent_after again: still one event, it is said once
    assert kinds(follower).count("silent") == 1 and follower.wait(0) is None

    writer.append({"step": 2, "loss": 0.5})
    assert poll(lambda: follower.status == "running" and follower.history[-1].step == 2)
    assert poll(lambda: follower.status == "silent")  # silent again, and said again
    assert kinds(follower).count("silent") == 2
    writer.finish("stopped", steps=2)
    assert follower.wait(10)["status"] == "stopped" and follower.status == "stopped"


def test_a_run_folder_that_appears_late_is_followed_and_one_that_never_does_fails_clearly(tmp_path, follow):
    late = follow("late", appear_timeout=10)
    time.sleep(5 * FAST)
    assert late.status == "running" and late.history == []  # waiting for the launcher to create it
    with wb.training.RunWriter(tmp_path, "late", {"steps": 1}) as writer:
        writer.append({"step": 1, "loss": 0.1})
    assert late.wait(10)["status"] == "finished" and kinds(late) == ["start", "compiled", "metrics", "end"]

    never = follow("never", appear_timeout=0.1)
    with pytest.raises(wb.RunError, match=r"no run in '.*never' after 0.1 s \(no config.json there\)"):
        never.wait(10)
    assert never.status == "failed" and kinds(never) == ["end"]
    assert "list_runs()" in never.history[-1].data["error"]


def test_close_ends_the_thread_within_a_poll_and_leaves_the_run_going(tmp_path, follow):
    writer = wb.training.RunWriter(tmp_path, "going", {"steps": 10})
    follower = follow("going", poll_interval=600.0)
    assert poll(lambda: kinds(follower) == ["start"])
    closing = threading.Thread(target=follower.close, daemon=True)
    closing.start()
    closing.join(60)  # a bounded wait: close() returns once the thread ends, which unwoken takes its 600 s poll
    assert not closing.is_alive() and not follower.following
    assert follower.wait(0) is None and follower.status == "running"  # the run was not ended by closing
    writer.append({"step": 1, "loss": 0.5})  # the run itself goes on
    writer.finish("finished", steps=1)


def test_a_followed_run_refuses_pause_and_stop_unless_given_a_stopper(tmp_path, follow):
    wb.training.RunWriter(tmp_path, "elsewhere", {"steps": 10})
    follower = follow("elsewhere")
    for control in (follower.pause, follower.resume):
        with pytest.raises(wb.WorkbenchError, match="a followed run cannot be paused from here"):
            control()
    with pytest.raises(wb.WorkbenchError, match="run 'elsewhere' was not started here: stop it where it runs"):
        follower.stop()

    stops = []
    launched = follow("elsewhere", stopper=lambda: stops.append("stop"))
    launched.stop()
    assert stops == ["stop"]


def test_a_broken_subscriber_is_dropped_and_the_others_still_hear(tmp_path, follow):
    with wb.training.RunWriter(tmp_path, "done", {"steps": 2}) as writer:
        writer.append({"step": 1, "loss": 0.5})
        writer.append({"step": 2, "loss": 0.25})
    follower = wb.training.RunFollower("done", tmp_path, poll_interval=FAST)
    heard = []

    def broken(event):
        raise ValueError("plot gone")

    follower.subscribe(broken)
    unsubscribe_heard = follower.subscribe(heard.append)
    follower.start()
    assert follower.wait(10)["status"] == "finished"
    assert [e.kind for e in heard] == ["start", "compiled", "metrics", "metrics", "end"]
    assert follower.subscriber_errors == ["broken: ValueError('plot gone')"]
    unsubscribe_heard()
    with pytest.raises(wb.RunError, match="already following"):
        follower.start()


@pytest.mark.parametrize(("option", "value"), [("poll_interval", 0), ("silent_after", -1), ("appear_timeout", "5")])
def test_bad_settings_are_refused_with_the_fix(tmp_path, option, value):
    with pytest.raises(wb.RunError, match=f"{option}={value!r} must be a number of seconds > 0"):
        wb.training.RunFollower("any", tmp_path, **{option: value})


def test_the_follower_and_its_events_import_without_jax():
    # The package's __init__ starts JAX's configuration, so the modules are loaded under a bare package.
    code = (
        "import sys, types\n"
        f"for name, path in (('workbench', {str(ROOT / 'workbench')!r}), "
        f"('workbench.training', {str(ROOT / 'workbench' / 'training')!r})):\n"
        "    package = types.ModuleType(name); package.__path__ = [path]; sys.modules[name] = package\n"
        "import workbench.training.run_follower\n"
        "print(sorted({'jax', 'numpy', 'flax'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
