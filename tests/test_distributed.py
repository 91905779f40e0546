"""Training across processes on jax.distributed: real worker processes (2 x 4 simulated CPU devices, gloo
collectives) train every multi-process mode to the one-process result; a killed worker fails the run in
bounded time and leaves nothing behind; bad input is refused before anything starts; the same-shard fault
is caught by the reference check across processes; one command per host joins a run. Stopping a run across
processes from the dashboard: tests/test_widgets_dashboard.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import workbench as wb
from helpers import mode_mesh
from workbench.child_processes import child_environment, stop_process_group
from workbench.cli.main import main
from workbench.servers import free_port
from workbench.training.modes import MODES, mode_class
from workbench.training.process_group import ProcessGroup, ProcessGroupError
from workbench.training.process_share import ProcessShare, batch_share

# Every mode that computes on more than one device trains across processes, on the mesh its axes ask for (tp over
# all 8 devices, so each process holds half of every split layer): a new mode joins the matrix.
PROCESS_MODES = tuple(name for name in MODES if not mode_class(name).one_device)
# fsdp reduce-scatters each gradient across the processes: 1024 x 1024 float32 weights are 4 MiB each, the
# size at which gloo's psum_scatter was reported to go wrong on rank 0.
OPTIONS = {"fsdp": {"hidden": 1024}, "fsdp-whole-tree": {"hidden": 1024}}
# The sync diagnostics gather every replica's gradient across processes: checked on a replicated, a stacked (pmap)
# and a sharded state, and on a two-axis mesh (each costs two more programs per process).
SYNCED = ("dp-pmap", "fsdp", "dp-tp")
EXACT = 1e-5  # the modes' exactness bound (tests/test_modes.py): relative to the loss, to each leaf's scale
ENDED_WITHIN_S = 20.0  # a killed worker's peers, and a stopped run, end within this (never JAX's 300 s)


def _config(mode: str = "dp", **changes) -> wb.TrainConfig:
    fields = dict(model="mlp", data="digits", mode=mode, mesh=mode_mesh(mode, model_width=8), steps=6, batch=64,
                  log_every=3, eval_every=0, sync_every=3, model_options=OPTIONS.get(mode, {}), processes=2)
    return wb.TrainConfig(**{**fields, **changes})


def _records(run_dir, key: str) -> list[tuple[int, object]]:
    return [(r["step"], r[key]) for r in wb.load_run(run_dir).metrics if key in r]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Worker processes that train are the e2e tier (`make test-e2e`); what is refused before anything starts, and the
# shares of rows, stay in `make test`.
@pytest.mark.e2e
@pytest.mark.parametrize("mode", PROCESS_MODES)
def test_every_mode_trains_across_two_processes_like_one(mode, tmp_path):
    config = _config(mode, sync_every=3 if mode in SYNCED else 0)
    group = ProcessGroup(config, tmp_path, "two", final_params=tmp_path / "params.npz")
    summary = group.wait(240)
    assert summary is not None and summary["status"] == "finished", (summary, group.failure)
    assert group.exit_codes == [0, 0]
    assert wb.load_run(group.path).config["processes"] == 2

    one = wb.Trainer(config, processes=1, run_root=str(tmp_path))
    one.run(name="one")
    losses, reference = _records(group.path, "loss"), _records(one.run_path, "loss")
    assert [s for s, _ in losses] == [s for s, _ in reference] == [1, 3, 6]
    worst = max(abs(a - b) / abs(b) for (_, a), (_, b) in zip(losses, reference, strict=True))
    assert worst <= EXACT, (losses, reference)

    saved = np.load(tmp_path / "params.npz", allow_pickle=False)
    expected = {jax.tree_util.keystr(k): np.asarray(v)
                for k, v in jax.tree_util.tree_leaves_with_path(one.state.params)}
    assert sorted(saved.files) == sorted(expected)
    for key, value in expected.items():
        scale = max(float(np.max(np.abs(value))), 1e-3)
        assert float(np.max(np.abs(saved[key] - value))) / scale <= EXACT, key

    if mode not in SYNCED:
        return
    # Gradient-sync diagnostics across processes: every replica's norm, the replicas in step with each other.
    across = _records(group.path, "sync_per_replica_grad_norms")
    alone = _records(one.run_path, "sync_per_replica_grad_norms")
    assert [s for s, _ in across] == [s for s, _ in alone] == [3, 6]
    for (_, norms), (_, expected_norms) in zip(across, alone, strict=True):
        np.testing.assert_allclose(norms, expected_norms, rtol=1e-4)
    assert _records(group.path, "sync_replica_divergence") == [(3, 0.0), (6, 0.0)]


@pytest.mark.e2e
def test_a_killed_worker_fails_the_run_in_bounded_time_and_leaves_nothing_behind(tmp_path, listening_addresses):
    group = ProcessGroup(_config("dp", steps=100_000, log_every=5, sync_every=0), tmp_path, "killed")
    deadline = time.monotonic() + 120
    while not _records(group.path, "loss") and time.monotonic() < deadline and group.running:
        time.sleep(0.2)
    assert _records(group.path, "loss"), group.failure
    assert listening_addresses(group.port) == {"0100007F"}  # the coordinator listens on loopback only
    pids = [process.pid for process in group._processes]
    os.kill(pids[1], signal.SIGKILL)
    summary = group.wait(ENDED_WITHIN_S)  # a bounded wait: its answer proves the group ended
    assert summary is not None, f"the processes did not end within {ENDED_WITHIN_S} s of the kill"
    assert summary["status"] == "failed"
    assert "process 1 of 2 was killed by SIGKILL" in summary["error"]
    assert not any(_alive(pid) for pid in pids)
    run = wb.load_run(group.path)  # everything written so far stays readable
    assert run.status == "failed" and [r["step"] for r in run.metrics if "loss" in r][0] == 1
    assert (group.path / "processes" / "0.log").read_text()


@pytest.mark.e2e
def test_the_same_shard_fault_is_caught_across_processes(capsys):
    # The correct step across processes is the mode matrix above; here the check names the fault, from the CLI.
    argv = ["check", "--mode", "dp", "--mesh", "data=8", "--batch", "64", "--model-options", "hidden=32",
            "--processes", "2", "--inject", "same-shard", "--json"]
    assert main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "problem"
    assert report["problems"][-1]["causes"][0] == "same-shard", report
    assert "process" in report["problems"][-1]["fix"]
    # Process 1's replicas computed process 0's rows: their gradient norms repeat replicas 0-3's.
    norms = report["per_replica_grad_norms"]
    assert norms[4:] == pytest.approx(norms[:4])


@pytest.mark.parametrize(("changes", "message"), [
    ({"processes": 3}, "processes=3 does not divide the 8 devices"),
    ({"mode": "single"}, "cannot run across processes=2"),
    ({"mode": "simulated"}, "cannot run across processes=2"),
    ({"batch": 62}, "global batch 62 does not split into 8 parts"),
    ({"mesh": "data=4,model=2", "processes": 8, "batch": 36}, "global batch 36 does not split into 8 processes"),
    ({"processes": 1, "faults": ("same-shard",)}, "needs several processes"),
])
def test_bad_process_settings_are_refused_before_anything_starts(tmp_path, changes, message):
    with pytest.raises(wb.WorkbenchError, match=message):
        ProcessGroup(_config(**{"mode": "dp", **changes}), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written, nothing started


def test_a_busy_coordinator_port_is_one_line_and_exit_2(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ProcessGroupError, match=f"port {port} is in use"):
            ProcessGroup(_config("dp"), tmp_path, port=port)
        assert main(["train", "--processes", "2", "--port", str(port), "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port} is in use" in err[0]


class _Device:
    def __init__(self, process_index: int):
        self.process_index = process_index


class _Mesh:
    """A mesh record whose devices belong to processes (what batch_share reads), for the row arithmetic."""

    def __init__(self, axes: dict[str, int], processes: int):
        size = int(np.prod(list(axes.values())))
        self.axis_names, self.shape = tuple(axes), dict(axes)
        per = size // processes
        self.devices = np.array([_Device(i // per) for i in range(size)], dtype=object).reshape(tuple(axes.values()))


@pytest.mark.parametrize(("axes", "processes"), [({"data": 8}, 2), ({"data": 8}, 4), ({"data": 4, "model": 2}, 2),
                                                  ({"data": 4, "model": 2}, 8), ({"data": 2, "model": 4}, 4)])
def test_process_shares_cover_the_batch_once_per_data_position(axes, processes):
    rows = 64
    shares = [batch_share(_Mesh(axes, processes), "data", rows, p) for p in range(processes)]
    per_part = rows // axes["data"]
    for share in shares:
        assert share.size % per_part == 0 and share.process_count == jax.process_count()
        assert share.rows.start % per_part == 0
    covered = sorted({r for share in shares for r in range(share.rows.start, share.rows.stop)})
    assert covered == list(range(rows))
    # Processes holding the same data positions (model replicas) load the same rows; others never overlap.
    for a in shares:
        for b in shares:
            same = a.rows == b.rows
            apart = a.rows.stop <= b.rows.start or b.rows.stop <= a.rows.start
            assert same or apart


def test_a_data_set_reads_only_a_process_rows():
    data = wb.load_dataset("digits")
    whole, part = next(data.batches(64, seed=3)), next(data.batches(64, seed=3, rows=slice(32, 64)))
    assert whole.keys() == part.keys() >= {"x", "y"}
    assert all(np.array_equal(whole[key][32:], part[key]) for key in whole)
    padded = list(data.eval_batches(256))[-1], list(data.eval_batches(256, rows=slice(128, 256)))[-1]
    assert padded[0].keys() == padded[1].keys() >= {"x", "y"}
    assert all(np.array_equal(padded[0][key][128:], padded[1][key]) for key in padded[0])
    assert ProcessShare(1, 2, slice(32, 64), 64).take(whole)["y"].tolist() == whole["y"][32:].tolist()
    with pytest.raises(wb.WorkbenchError, match="is not a part of a global batch of 64"):
        next(data.batches(64, seed=0, rows=slice(48, 80)))


def _hosts(tmp_path, env: dict[str, str], *options: str) -> tuple[list[int], list[str]]:
    """Two `workbench train --join` commands, as two hosts would run them: exit statuses and outputs."""
    port = free_port()
    argv = [sys.executable, "-m", "workbench", "train", "--mode", "fsdp", "--mesh", "data=8", "--steps", "4",
            "--batch", "64",
            "--log-every", "2", "--eval-every", "0", "--sync-every", "0", "--processes", "2",
            "--join", f"127.0.0.1:{port}", "--name", "joined", "--run-dir", str(tmp_path), *options]
    hosts = [subprocess.Popen([*argv, "--process-id", str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True) for i in range(2)]
    try:
        outputs = [host.communicate(timeout=240)[0].decode(errors="replace") for host in hosts]
    finally:
        for host in hosts:
            stop_process_group(host)
    return [host.returncode for host in hosts], outputs


@pytest.mark.e2e
def test_one_command_per_host_joins_the_same_run(tmp_path):
    """What the README says for real hosts (`--join HOST:PORT --process-id I`), here as two local processes
    that set no device count: each takes its share of the mesh (4 of data=8)."""
    env = child_environment(4)
    env.pop("WORKBENCH_CPU_DEVICES")
    codes, outputs = _hosts(tmp_path, env)
    assert codes == [0, 0], outputs
    run = wb.load_run(tmp_path / "joined")
    assert run.status == "finished" and run.config["processes"] == 2
    assert [r["step"] for r in run.metrics if "loss" in r] == [1, 2, 4]


def test_hosts_whose_devices_do_not_make_the_mesh_each_say_so_in_one_line(tmp_path):
    codes, outputs = _hosts(tmp_path, child_environment(3))  # 2 x 3 devices for a mesh of 8
    assert codes == [2, 2], outputs
    for output in outputs:
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "mesh data=8 has 8 devices but the 2 processes have 6" in errors[0], output
        assert "Traceback" not in output


@pytest.mark.e2e
def test_a_checkpoint_resumes_across_processes_onto_another_layout(tmp_path):
    """Saved by one process under fsdp on data=8, continued by two under dp-tp on data=4,model=2 (saving again,
    collectively): the uninterrupted one-process run's losses and parameters."""
    config = _config("fsdp", processes=1, steps=4, log_every=2, sync_every=0, checkpoint_every=2,
                     model_options={})
    first = wb.Trainer(config, run_root=str(tmp_path))
    first.run(name="resumed")
    resumed = wb.Trainer.resuming(first.run_path, steps=6, mode="dp-tp", mesh="data=4,model=2", processes=2)
    summary = resumed.run()
    assert summary["status"] == "finished" and summary["resumed_from_step"] == 4, summary
    assert resumed._group.exit_codes == [0, 0]
    assert wb.checkpoint_steps(first.run_path)[-1] == 6  # saved by both processes

    alone = wb.Trainer(dataclasses.replace(config, steps=6, checkpoint_every=0), run_root=str(tmp_path))
    alone.run(name="alone")
    losses, reference = _records(first.run_path, "loss"), _records(alone.run_path, "loss")
    assert [s for s, _ in losses] == [s for s, _ in reference] == [1, 2, 4, 6]
    assert max(abs(a - b) / abs(b) for (_, a), (_, b) in zip(losses, reference, strict=True)) <= EXACT

    from workbench.training.checkpoints import restore_state

    plain = alone.state  # read the processes' last checkpoint onto one device and compare
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=one_device), plain)
    restored = restore_state(wb.latest_checkpoint(first.run_path), target)
    for (path, value), (_, expected) in zip(wb.layout.leaves_with_paths(restored.params),
                                            wb.layout.leaves_with_paths(plain.params), strict=True):
        scale = max(float(np.max(np.abs(expected))), 1e-3)
        assert float(np.max(np.abs(np.asarray(value) - np.asarray(expected)))) / scale <= EXACT, path
