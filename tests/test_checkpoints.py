"""Checkpoints with real Orbax on 8 simulated devices: a stopped run resumed equals an uninterrupted one, an
fsdp checkpoint restores straight into dp-tp and dp-pmap layouts, and every fault gives one clear message."""

import dataclasses
import itertools
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from workbench.cli.main import main
from workbench.errors import WorkbenchError
from workbench.training.checkpoints import (
    CheckpointError, checkpoint_steps, checkpoints_folder, latest_checkpoint, restore_state, state_signature,
)
from workbench.layout.paths import leaves_with_paths
from workbench.training.config import TrainConfig
from workbench.training.layout_change import checkpoint_layout_change, layout_change_text
from workbench.training.data import load_dataset
from workbench.training.runs import load_run
from workbench.training.step import build_step
from workbench.training.trainer import Trainer
from helpers import TwoLayer, my_loss  # a user's own module and loss, as the trainer tests train it

TOLERANCE = 1e-5  # the modes' exactness tolerance (relative) against one another
CONFIG = TrainConfig(model="mlp", data="digits", mode="fsdp", mesh="data=8", batch=64, steps=40, log_every=5,
                     eval_every=0, sync_every=0, checkpoint_every=10, keep_checkpoints=2)
STOP_AT = 25  # the cut run stops here: its latest checkpoint is step 20, its metrics of 21-25 are dropped on resume


def _losses(run_dir):
    return [(m["step"], m["loss"]) for m in load_run(run_dir).metrics if "loss" in m]


def _params(trainer):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.state.params)]


def _close(a, b):
    return all(np.allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE * np.max(np.abs(x))) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and the same run stopped after step 25 (checkpoints 10 and 20 kept)."""
    root = tmp_path_factory.mktemp("runs")
    full = Trainer(CONFIG, run_root=str(root))
    full.run(name="full")
    cut = Trainer(CONFIG, run_root=str(root))
    cut.subscribe(lambda event: cut.stop() if event.kind == "metrics" and event.step == STOP_AT else None)
    cut.run(name="cut")
    return {"root": root, "full": full, "cut": root / "cut"}


def _copy(runs, tmp_path, name="copy"):
    """A copy of the cut run to resume (resuming changes its folder)."""
    return shutil.copytree(runs["cut"], tmp_path / name)


def test_checkpoints_are_saved_every_k_steps_keeping_the_newest(runs):
    assert checkpoint_steps(runs["root"] / "full") == [30, 40]  # keep_checkpoints=2
    assert checkpoint_steps(runs["cut"]) == [10, 20]
    info = latest_checkpoint(runs["cut"])
    assert info.step == 20 and info.meta["data_position"] == {"batches": 20, "seed": 0}
    assert info.config["mode"] == "fsdp"
    assert info.meta["state"] == state_signature(runs["full"].state)


def test_reading_checkpoints_says_nothing_but_other_orbax_warnings_still_show(runs, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="absl"):
        latest_checkpoint(runs["cut"])  # opens the folder read-only: Orbax said so twice, in red, every time
        logging.getLogger("absl").warning("a warning a user must act on")
    assert [record.getMessage() for record in caplog.records] == ["a warning a user must act on"]


def test_a_resumed_run_equals_the_uninterrupted_run(runs, tmp_path):
    run_dir = _copy(runs, tmp_path)
    resumed = Trainer.resuming(run_dir)
    summary = resumed.run()
    assert summary["steps"] == 40 and summary["resumed_from_step"] == 20 and resumed.status == "finished"
    full_losses, resumed_losses = _losses(runs["root"] / "full"), _losses(run_dir)
    assert [s for s, _ in resumed_losses] == [s for s, _ in full_losses]  # 21-25 of the stopped run were dropped
    np.testing.assert_allclose([loss for _, loss in resumed_losses], [loss for _, loss in full_losses], rtol=TOLERANCE)
    assert _close(_params(runs["full"]), _params(resumed))
    run = load_run(run_dir)
    assert run.status == "finished" and run.config["resumed_from_step"] == 20
    assert checkpoint_steps(run_dir) == [30, 40]


@pytest.mark.parametrize("mode, mesh", [("dp-tp", "data=4,model=2"), ("dp-pmap", "data=8"),
                                        ("fsdp-tp", "data=4,model=2")])
def test_an_fsdp_checkpoint_continues_in_another_layout(runs, tmp_path, mode, mesh):
    run_dir = _copy(runs, tmp_path)
    resumed = Trainer.resuming(run_dir, mode=mode, mesh=mesh)
    resumed.run()
    assert resumed.status == "finished" and load_run(run_dir).config["mode"] == mode
    assert _close(_params(runs["full"]), _params(resumed))


def test_an_fsdp_tp_checkpoint_continues_in_fsdp(runs, tmp_path):
    """The other way: saved sharded over both axes, restored sharded over 'data' alone."""
    config = dataclasses.replace(CONFIG, mode="fsdp-tp", mesh="data=4,model=2")
    cut = Trainer(config, run_root=str(tmp_path))
    cut.subscribe(lambda event: cut.stop() if event.kind == "metrics" and event.step == STOP_AT else None)
    cut.run(name="cut")
    resumed = Trainer.resuming(tmp_path / "cut", mode="fsdp", mesh="data=8")
    resumed.run()
    assert resumed.status == "finished" and load_run(tmp_path / "cut").config["resumed_from_step"] == 20
    assert _close(_params(runs["full"]), _params(resumed))


def test_the_state_is_read_straight_into_the_new_shardings(runs):
    built = build_step(dataclasses.replace(CONFIG, mode="dp-tp", mesh="data=4,model=2"))
    shardings = built.mode.restore_shardings(built.state)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), built.state, shardings)
    restored = restore_state(latest_checkpoint(runs["cut"]), target)
    for leaf, sharding in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings), strict=True):
        assert leaf.sharding == sharding
    assert any("model" in str(leaf.sharding.spec) for leaf in jax.tree.leaves(restored.params))


def test_the_layout_before_and_after_a_restore_is_the_one_each_mode_reads_into(runs):
    config = dataclasses.replace(CONFIG, mode="dp-tp", mesh="data=4,model=2")
    info = latest_checkpoint(runs["cut"])
    change = checkpoint_layout_change(info, config)
    assert (change.before, change.after) == ("fsdp on data=8", "dp-tp on data=4,model=2")
    for before_after, mode_config in ((0, CONFIG), (1, config)):  # the arrays a restore into each mode gives
        built = build_step(mode_config)
        shardings = built.mode.restore_shardings(built.state)
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                              built.state, shardings)
        restored = [path_leaf for path_leaf in leaves_with_paths(restore_state(info, target))]
        assert [path for path, _ in restored] == [leaf.path for leaf in change.leaves]
        for (path, array), leaf in zip(restored, change.leaves, strict=True):
            shard = leaf.shard_after if before_after else leaf.shard_before
            assert tuple(array.addressable_shards[0].data.shape) == shard, path
    assert any(leaf.moved for leaf in change.leaves) and not all(leaf.moved for leaf in change.leaves)
    text = layout_change_text(change, only_moved=True)
    assert text.splitlines()[0].startswith("fsdp on data=8 -> dp-tp on data=4,model=2 (")
    kernel = change.leaf("params/hidden1/kernel")
    assert f"{list(kernel.shard_before)} -> P(None, model) {list(kernel.shard_after)}" in text


def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(runs):
    built = build_step(dataclasses.replace(CONFIG, model_options={"hidden": 32}))
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), built.state)
    with pytest.raises(CheckpointError,
                       match=r"another state .* is \[\d+, \d+\] float32 there, \[\d+, 32\] float32 here"):
        restore_state(latest_checkpoint(runs["cut"]), target)


def test_changing_what_a_resumed_run_keeps_is_refused(runs):
    with pytest.raises(CheckpointError, match="saved with lr=0.001, not 0.1"):
        Trainer.resuming(runs["cut"], lr=0.1)
    with pytest.raises(CheckpointError, match="already at step 20 of steps=20: resume it with more steps"):
        Trainer.resuming(runs["cut"], steps=20)


def test_missing_empty_and_partial_checkpoint_folders_each_say_what_to_do(runs, tmp_path):
    with pytest.raises(CheckpointError, match="no run folder"):
        latest_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no complete checkpoint .*\(--checkpoint-every K\)"):
        latest_checkpoint(tmp_path / "empty")
    run_dir = _copy(runs, tmp_path)
    # A kill mid-save leaves Orbax's temporary folder: ignored, the previous checkpoint is the latest.
    shutil.copytree(checkpoints_folder(run_dir) / "20", checkpoints_folder(run_dir) / "30.orbax-checkpoint-tmp-1234")
    assert latest_checkpoint(run_dir).step == 20
    # A step folder without Orbax's commit marker (copied in part) is named, with the way back to step 20.
    partial = shutil.copytree(checkpoints_folder(run_dir) / "20", checkpoints_folder(run_dir) / "30")
    (partial / "commit_success.txt").unlink()
    with pytest.raises(CheckpointError, match=r"30' is incomplete .* delete that folder to resume from step 20"):
        latest_checkpoint(run_dir)
    shutil.rmtree(partial)
    assert checkpoint_steps(run_dir) == [10, 20]


def test_a_truncated_checkpoint_file_is_named_and_the_earlier_one_stays_usable(runs, tmp_path):
    run_dir = _copy(runs, tmp_path)
    data = checkpoints_folder(run_dir) / "20" / "state"
    for chunk in data.rglob("d/*"):
        if chunk.is_file():
            chunk.write_bytes(chunk.read_bytes()[:10])
    with pytest.raises(CheckpointError, match=r"20' cannot be read .* delete it to resume from step 10"):
        Trainer.resuming(run_dir).run()
    assert load_run(run_dir).status == "stopped"  # nothing of the run changed
    shutil.rmtree(checkpoints_folder(run_dir) / "20")
    assert Trainer.resuming(run_dir, steps=12).run()["steps"] == 12


def test_skipping_batches_gives_the_batches_an_uninterrupted_run_reads():
    dataset = load_dataset("digits")
    per_epoch = dataset.steps_per_epoch(256)
    for skip in (3, per_epoch, 2 * per_epoch + 1):
        replayed = next(itertools.islice(dataset.batches(256, seed=1), skip, None))
        skipped = next(dataset.batches(256, seed=1, skip=skip))
        for key in replayed:
            np.testing.assert_array_equal(skipped[key], replayed[key])


@pytest.mark.parametrize("field, value, message", [
    ("checkpoint_every", -1, "checkpoint_every=-1 must be a whole number >= 0"),
    ("keep_checkpoints", 0, "keep_checkpoints=0 must be a whole number > 0"),
])
def test_bad_checkpoint_settings_are_refused(field, value, message):
    with pytest.raises(WorkbenchError, match=message):
        TrainConfig(**{"checkpoint_every": 10, field: value}).validated()


def test_cli_resumes_in_another_layout_and_refuses_bad_input_in_one_line(runs, tmp_path, capsys):
    run_dir = _copy(runs, tmp_path)
    status = main(["train", "--resume", str(run_dir), "--mode", "dp-tp", "--mesh", "data=4,model=2", "--json"])
    assert status == 0 and load_run(run_dir).summary["steps"] == 40
    capsys.readouterr()
    for argv, message in (
        (["--resume", str(tmp_path / "nowhere")], "no run folder"),
        (["--resume", str(run_dir), "--lr", "0.5"], "saved with lr=0.001, not 0.5"),
        (["--checkpoint-every", "-3"], "checkpoint_every=-3"),
    ):
        assert main(["train", "--run-dir", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def _checkpointing_cli(tmp_path, name, **popen):
    """``workbench train`` in a child process, saving every two steps for as long as it is let run."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "WORKBENCH_CPU_DEVICES": "8"}
    argv = [sys.executable, "-m", "workbench", "train", "--model", "mlp", "--mode", "dp", "--batch", "64",
            "--steps", "100000", "--log-every", "1000", "--eval-every", "0", "--sync-every", "0",
            "--checkpoint-every", "2", "--keep-checkpoints", "2", "--run-dir", str(tmp_path), "--name", name]
    return subprocess.Popen(argv, env=env, **{"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen})


def _wait_for_checkpoints(process, run_dir, saves, seconds=90):
    """Until the run has saved ``saves`` times (every two steps). Counted by the newest step, not by the
    folders present: with ``--keep-checkpoints 2`` a third folder shows only between a save and the pruning."""
    import time

    def saved():
        steps = checkpoint_steps(run_dir)
        return max(steps) // 2 if steps else 0

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and saved() < saves and process.poll() is None:
        time.sleep(0.05)
    assert saved() >= saves, f"the run saved {saved()} times before the deadline, not {saves}"


def test_a_run_killed_while_saving_every_two_steps_resumes_from_a_complete_checkpoint(tmp_path):
    """SIGKILL lands during a save or between saves: either way the newest checkpoint is whole."""
    import signal

    process, run_dir = _checkpointing_cli(tmp_path, "killed"), tmp_path / "killed"
    try:
        _wait_for_checkpoints(process, run_dir, 3)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    latest = latest_checkpoint(run_dir)
    resumed = Trainer.resuming(run_dir, steps=latest.step + 2, checkpoint_every=0)
    assert resumed.run()["steps"] == latest.step + 2 and resumed.status == "finished"


FULL_DISK_FILE_BYTES = 16 * 1024  # room for the run's JSON files, not for a checkpoint's array files


def test_a_disk_that_fills_during_a_save_fails_the_run_in_one_line_keeping_the_earlier_checkpoints(tmp_path):
    """The file-size limit of the running process is lowered after two checkpoints (SIGXFSZ ignored, so a
    write past it fails with EFBIG as on a full disk): the next save fails, the run fails with one message
    naming that checkpoint and the intact ones, and those restore."""
    import re
    import resource
    import signal
    import subprocess

    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited (no preexec_fn: it forks JAX's threads)
    try:
        process = _checkpointing_cli(tmp_path, "full-disk", stderr=subprocess.PIPE, text=True, restore_signals=False)
    finally:
        signal.signal(signal.SIGXFSZ, before)
    run_dir = tmp_path / "full-disk"
    try:
        _wait_for_checkpoints(process, run_dir, 2)
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (FULL_DISK_FILE_BYTES, resource.RLIM_INFINITY))
        _, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
    assert process.returncode == 1
    # Tensorstore's threads print tracebacks of their own writes cut short, which may run into the CLI's line.
    found = re.findall(r"error: run full-disk failed: (the checkpoint of step (\d+) "
                       r"\('[^']*/checkpoints/\d+'\) could not "
                       r"be written \(the disk refused a write: \[Errno 27\] File too large\); "
                       r"the checkpoints of steps "
                       r"\[([\d, ]*)\] are intact and the run's metrics are kept: free disk space and resume from the "
                       r"latest \(workbench train --resume <run>\))", err)
    assert len(found) == 1, err[-3000:]
    message, failed, intact = found[0][0], int(found[0][1]), [int(step) for step in found[0][2].split(", ")]
    assert intact == checkpoint_steps(run_dir) and len(intact) == 2 and failed > intact[-1]
    run = load_run(run_dir)
    assert run.status == "failed" and run.summary["error"] == message
    assert [m["step"] for m in run.metrics if "loss" in m][-1] >= intact[-1]  # every line still parses
    built = build_step(dataclasses.replace(CONFIG, mode="dp", mesh="data=8"))
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), built.state)
    for step in intact:  # each intact checkpoint reads back whole
        state = restore_state(dataclasses.replace(latest_checkpoint(run_dir), step=step), target)
        leaves = jax.tree.leaves(state.params)
        assert leaves and all(np.all(np.isfinite(leaf)) for leaf in leaves)
    resumed = Trainer.resuming(run_dir, steps=intact[-1] + 2, checkpoint_every=0)
    assert resumed.run()["steps"] == intact[-1] + 2 and resumed.status == "finished"


def test_a_save_asked_for_is_written_at_the_next_step_boundary_running_or_paused(tmp_path):
    import threading

    trainer = Trainer(dataclasses.replace(CONFIG, checkpoint_every=0, steps=20), run_root=str(tmp_path))
    with pytest.raises(WorkbenchError, match=r"no run to save \(idle\)"):
        trainer.save_checkpoint()
    trainer.subscribe(lambda event: trainer.save_checkpoint() if event.kind == "metrics" and event.step == 10 else None)
    summary = trainer.run(name="asked")
    saves = [(event.step, event.data["requested"]) for event in trainer.history if event.kind == "checkpoint"]
    assert saves == [(10, True), (20, False)] and summary["checkpoints"] == [10, 20]  # the last state, to go on
    assert [m["step"] for m in load_run(tmp_path / "asked").metrics][:3] == [1, 5, 10]  # metrics reach the save

    paused, saved = threading.Event(), threading.Event()
    trainer.subscribe(lambda event: {"paused": paused, "checkpoint": saved}.get(event.kind, threading.Event()).set())
    trainer.subscribe(lambda event: trainer.pause() if event.kind == "metrics" and event.step == 5 else None)
    trainer.start(name="paused")
    try:
        assert paused.wait(60)
        trainer.save_checkpoint()  # while paused: saved at once
        assert saved.wait(60) and trainer.status == "paused"
    finally:
        trainer.stop()
        trainer.wait(60)
    assert checkpoint_steps(tmp_path / "paused") == [5]


def test_your_own_module_saves_and_resumes_like_a_workbench_model(tmp_path):
    data = load_dataset("regression")
    own = dict(model=TwoLayer(nnx.Rngs(0)), loss=my_loss,
               batches=lambda seed: data.batches(64, seed=seed, drop_remainder=True))
    config = TrainConfig(mode="fsdp", batch=64, steps=12, lr=1e-2, log_every=3, eval_every=0, sync_every=0)
    full = Trainer(config, run_root=str(tmp_path), **own)
    full.run(name="full")
    cut = Trainer(dataclasses.replace(config, steps=6, checkpoint_every=3), run_root=str(tmp_path), **own)
    cut.run(name="cut")
    with pytest.raises(CheckpointError, match="pass it again"):  # your own model is yours to give back
        Trainer.resuming(tmp_path / "cut", steps=12)
    resumed = Trainer.resuming(tmp_path / "cut", steps=12, mode="dp-tp", mesh="data=4,model=2",
                               tp_rules=[(r"a/kernel", "P(None, 'model')"), (r"b/kernel", "P('model', None)")], **own)
    resumed.run()
    assert resumed.status == "finished" and load_run(tmp_path / "cut").config["model"] == "custom:TwoLayer"
    cut_losses, full_losses = _losses(tmp_path / "cut"), _losses(tmp_path / "full")
    assert cut_losses and [s for s, _ in cut_losses] == [s for s, _ in full_losses]
    assert all(abs(a - b) <= TOLERANCE * abs(b) for (_, a), (_, b) in zip(cut_losses, full_losses, strict=True))
    assert _close(_params(resumed), _params(full))
