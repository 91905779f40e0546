"""One process of a run across processes: ``python -m workbench.distributed.worker``.

Each process joins ``jax.distributed`` (bounded waits: never JAX's 300 s defaults), builds the same step
with :func:`~workbench.training.step.build_step` (every process the same program, in the same order), loads
only its own rows of every batch and trains. Process 0 writes the run (metrics, summary) into the folder
the launcher reserved; the others write nothing but their log. Exit status: 0 finished or stopped, 1 failed.

On one machine :class:`~workbench.training.process_group.ProcessGroup` starts the workers. On real hosts run
one per host with ``--coordinator HOST:PORT`` (or ``--coordinator auto`` where JAX detects the cluster, e.g.
SLURM), the same ``--config`` and ``--run-dir`` (a shared folder) everywhere; see the README.

Example:
    $ python -m workbench.distributed.worker --coordinator 127.0.0.1:4711 --process-id 0 --processes 2 \\
          --run-dir runs/mlp-dp-2p --config '{"model": "mlp", "mode": "dp", "processes": 2}'
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..analysis.reference_check import check_built_step
from ..child_processes import exit_when_parent_goes
from ..devices import ENV_VAR
from ..errors import WorkbenchError
from ..training.checkpoints import CheckpointInfo, read_meta
from ..training.config import TrainConfig
from ..training.process_group import CHECK_FILE
from ..training.process_share import host_values
from ..training.runs import RunWriter
from ..training.step import build_step
from ..training.trainer import Trainer

INIT_TIMEOUT_S = 60  # every process must join within this (JAX's default is 300 s)
HEARTBEAT_TIMEOUT_S = 10  # a process silent this long is dead: the others fail instead of waiting
SHUTDOWN_TIMEOUT_S = 10
TASKS = ("train", "check")


def join(coordinator: str, processes: int, process_id: int, *, bind_loopback: bool) -> None:
    """Join ``jax.distributed`` with bounded waits. ``coordinator="auto"`` lets JAX detect the cluster.

    With ``bind_loopback`` process 0's coordinator listens on 127.0.0.1 only (JAX's default binds every
    interface): right for processes on one machine.
    """
    timeouts: dict[str, Any] = dict(initialization_timeout=INIT_TIMEOUT_S,
                                    heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
                                    shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)
    if coordinator == "auto":
        jax.distributed.initialize(**timeouts)
        return
    port = coordinator.rsplit(":", 1)[1]
    bind = f"127.0.0.1:{port}" if bind_loopback else None
    jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id,
                               coordinator_bind_address=bind, **timeouts)


def _process_trainer(config: Any, run_dir: Path):
    """A Trainer whose run is written into ``run_dir`` by process 0 only."""

    class _Silent:
        """Processes other than 0 keep no files: process 0's are the run."""

        def __init__(self):
            self.name, self.path = run_dir.name, run_dir

        def append(self, record: Any) -> None:
            pass

        def finish(self, status: str, **summary: Any) -> None:
            pass

    class ProcessTrainer(Trainer):
        def _reopen_writer(self, resumed: Any, record: dict[str, Any]) -> Any:
            # The launcher reopened the run (metrics after the checkpoint dropped): process 0 goes on writing it.
            return RunWriter.adopt(run_dir, record) if jax.process_index() == 0 else _Silent()

        def _open_writer(self, name: Any, record: dict[str, Any]) -> Any:
            if jax.process_index() != 0:
                return _Silent()
            if not (run_dir / "config.json").exists():  # on real hosts no launcher reserved the folder
                return RunWriter(run_dir.parent, run_dir.name, record)
            return RunWriter.adopt(run_dir, record)

    return ProcessTrainer(config, run_root=str(run_dir.parent))


def _write_params(trainer: Any, path: Path) -> None:
    """The final parameters, gathered from every process, as NumPy ``.npz`` (process 0 writes it)."""
    values = host_values(trainer.state.params)  # a collective: every process takes part
    if jax.process_index() == 0:
        leaves: dict[str, Any] = {jax.tree_util.keystr(key): np.asarray(leaf)
                                  for key, leaf in jax.tree_util.tree_leaves_with_path(values)}
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as handle:
            np.savez(handle, **leaves)
        os.replace(partial, path)


def _check(config: Any, run_dir: Path, steps: int | None) -> int:
    """The reference check of ``config`` across the processes; process 0 writes the report (JSON, with its text)."""
    report = check_built_step(build_step(config), steps=steps)
    if jax.process_index() == 0:
        partial = run_dir / (CHECK_FILE + ".partial")
        partial.write_text(json.dumps({**report.to_json(), "text": report.to_text()}))
        os.replace(partial, run_dir / CHECK_FILE)
    jax.distributed.shutdown()
    return 0


def _claim_cpu_share(config: Any) -> None:
    """On CPU, this process's share of the mesh's devices (mesh size / processes), unless the user set the count
    (``WORKBENCH_CPU_DEVICES``): a host started by hand (``--join``) gets the right count without setting it."""
    if os.environ.get(ENV_VAR) or config.processes < 1 or config.mesh_shape.size % config.processes:
        return
    try:
        jax.config.update("jax_num_cpu_devices", config.mesh_shape.size // config.processes)
    except RuntimeError:  # the backend already started: validate_devices says what to do
        pass


def validate_devices(config: Any) -> None:
    """WorkbenchError unless the processes together have exactly the mesh's devices (each process then holds
    its share: a process outside the mesh would load no rows and wait in the others' collectives)."""
    size, count, processes = config.mesh_shape.size, jax.device_count(), jax.process_count()
    if count != size:
        raise WorkbenchError(
            f"mesh {config.mesh} has {size} devices but the {processes} processes have {count} in all "
            f"({jax.local_device_count()} in process {jax.process_index()}): give each process {size // processes} "
            f"(on CPU hosts WORKBENCH_CPU_DEVICES={size // processes}), or use a mesh of {count} devices")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.distributed.worker",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--coordinator", required=True, help="HOST:PORT of process 0, or 'auto'")
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--run-dir", required=True, type=Path, help="the run's folder (reserved by the launcher)")
    parser.add_argument("--config", required=True, help="the TrainConfig as JSON")
    parser.add_argument("--final-params", type=Path, default=None, help="write the final parameters here (.npz)")
    parser.add_argument("--watch-parent", action="store_true", help="exit when stdin closes (the launcher went)")
    parser.add_argument("--resume-step", type=int, default=None,
                        help="continue from this checkpoint of the run in --run-dir (the launcher reopened the run)")
    parser.add_argument("--check-steps", type=int, default=None, help="steps the check compares (default its minimum)")
    parser.add_argument("--task", choices=TASKS, default="train",
                        help=f"train, or check: the reference check, written to <run-dir>/{CHECK_FILE} by process 0")
    args = parser.parse_args(argv)
    if args.watch_parent:
        threading.Thread(target=exit_when_parent_goes, daemon=True).start()
    config = TrainConfig.from_json(json.loads(args.config))
    _claim_cpu_share(config)
    # On one machine the coordinator listens on loopback only; on real hosts it must be reachable from the others.
    local = args.watch_parent or args.coordinator.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
    join(args.coordinator, args.processes, args.process_id, bind_loopback=local)
    try:
        validate_devices(config)
    except WorkbenchError as error:  # every process finds the same: each says it in one line, and they end together
        print(f"error: {error}", file=sys.stderr, flush=True)
        jax.distributed.shutdown()
        return 2
    if args.task == "check":
        return _check(config, args.run_dir, args.check_steps)
    trainer = _process_trainer(config, args.run_dir)
    if args.resume_step is not None:
        trainer._resume_from = CheckpointInfo(args.run_dir, args.resume_step, read_meta(args.run_dir, args.resume_step))
    # The launcher asks process 0 to stop; every process agrees at the next logging step (see the trainer).
    signal.signal(signal.SIGUSR1, lambda *_: trainer.stop())
    summary = trainer.run(name=args.run_dir.name)
    print(json.dumps({"status": trainer.status, **{k: v for k, v in summary.items() if k in ("steps", "error")}}),
          flush=True)
    if args.final_params is not None and trainer.state is not None and trainer.status != "failed":
        _write_params(trainer, args.final_params)
    jax.distributed.shutdown()
    return 1 if trainer.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
