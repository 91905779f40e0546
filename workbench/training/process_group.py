"""Start the processes of a run on this machine, watch them, and end them together.

:class:`ProcessGroup` reserves the run's folder, picks a free loopback port for ``jax.distributed``'s
coordinator, and starts ``processes`` workers (:mod:`workbench.distributed.worker`), each with its share of the
mesh's simulated devices and its log in ``runs/<name>/processes/<i>.log``. A thread watches them: when one dies
the others are killed at once (never left waiting in a collective or JAX's 5-minute barrier) and the run is
marked failed, naming the process and why. :meth:`ProcessGroup.stop` asks process 0 to stop (every process ends at
the same logging step) and kills whatever is still running after a grace period. No worker outlives the
group: each ends when its stdin (a pipe from here) closes.

Example:
    >>> group = ProcessGroup(TrainConfig(mode="fsdp", processes=2, steps=100))  # doctest: +SKIP
    >>> group.wait(600)["status"]  # doctest: +SKIP
    'finished'
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..child_processes import child_environment, stop_process_group
from ..errors import WorkbenchError
from ..servers import HOST, validated_port
from .config import ResolvedConfig, TrainConfig, resolve_config
from .models import model_config
from .modes import StepSetup
from .runs import SUMMARY_FILE, RunWriter, load_run

STOP_GRACE_S = 5.0  # after a stop request, how long the processes have to agree and exit before being killed
POLL_S = 0.1
LOG_TAIL_LINES = 4
CHECK_FILE = "check.json"  # where process 0 of a check writes its report


class ProcessGroupError(WorkbenchError):
    """A run across processes could not start (e.g. its coordinator port is taken)."""


def validate_before_start(config: TrainConfig | ResolvedConfig) -> None:
    """Everything about ``config`` that can be refused without devices or data (the mode on the mesh, the batch
    split, the model's options and tensor-parallel rules), so no process starts only to fail.

    Example:
        >>> validate_before_start(TrainConfig(mode="dp", mesh="data=8", batch=62, processes=2))
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: global batch 62 does not split into 8 parts over 'data' (8 equal parts): ...
    """
    resolved = resolve_config(config)
    config = resolved.config
    options = model_config(config.model, **config.model_options).options  # refuses a "custom:..." model
    if resolved.model_class is None:
        raise WorkbenchError(f"model {config.model!r} is not a registered model: processes train registered ones")
    rules = tuple(resolved.model_class.tensor_parallel_rules(options=options))
    resolved.mode_class.validate(StepSetup(None, None, None, resolved.mesh_shape, config.batch, config.accum,
                                       config.precision, rules, config.faults))


class ProcessGroup:
    """The ``config.processes`` workers of one run on this machine; see the module docstring.

    Args:
        config: the run (``processes`` >= 2); checked before anything starts.
        run_root, name: where the run is written (``run_root/name``, the name made unique as a Trainer does).
        port: the coordinator's port on 127.0.0.1; None picks a free one. A taken port raises at once.
        final_params: a path where process 0 writes the final parameters (``.npz``), e.g. to compare runs.
        resume: a checkpoint (:func:`~workbench.training.checkpoints.latest_checkpoint`) the processes continue
            from, in its run's folder (metrics after it are dropped first, as for a run resumed in one process).
        task: ``"train"``, or ``"check"``: the reference check instead
            (:func:`~workbench.analysis.process_check.check_across_processes`).

    Attributes:
        name, path: the run's name and folder (followed with :func:`~workbench.follow_run`).
        port: the coordinator's port.
    """

    def __init__(self, config: TrainConfig | ResolvedConfig, run_root: str | os.PathLike = "runs",
                 name: str | None = None, *,
                 port: int | None = None, final_params: str | os.PathLike | None = None, task: str = "train",
                 check_steps: int | None = None, resume: Any = None):
        resolved = resolve_config(config)
        validate_before_start(resolved)
        config = resolved.config
        if config.processes < 2:
            raise ProcessGroupError(f"a process group needs processes >= 2, got {config.processes}: train in this "
                                    "process with Trainer(config) instead")
        try:
            self.port = validated_port(0 if port is None else port)
        except WorkbenchError as error:
            raise ProcessGroupError(f"coordinator {error}") from None
        self.config, self.task, self._check_steps = config, task, check_steps
        record = {**config.to_json(), "processes": config.processes}
        if resume is not None:  # the run goes on in its own folder, after the checkpoint
            writer = RunWriter.reopen(resume.run_path, {**record, "resumed_from_step": resume.step}, resume.step)
        else:
            writer = RunWriter(run_root, name, record)
        self.name, self.path = writer.name, writer.hand_over()  # process 0 adopts the folder
        self._resume = resume
        (self.path / "processes").mkdir(exist_ok=True)
        self._stop_requested = False
        self._failure: str | None = None
        self._done = threading.Event()
        self._processes = [self._start(index, final_params) for index in range(config.processes)]
        self._watcher = threading.Thread(target=self._watch, daemon=True, name=f"workbench-group-{self.name}")
        self._watcher.start()

    def _start(self, index: int, final_params: Any) -> subprocess.Popen:
        config = self.config
        argv = [sys.executable, "-m", "workbench.distributed.worker", "--coordinator", f"{HOST}:{self.port}",
                "--process-id", str(index), "--processes", str(config.processes), "--run-dir", str(self.path),
                "--config", json.dumps(config.to_json()), "--watch-parent", "--task", self.task]
        if self._resume is not None:
            argv += ["--resume-step", str(self._resume.step)]
        if self._check_steps is not None:
            argv += ["--check-steps", str(self._check_steps)]
        if final_params is not None:  # gathering is a collective: every process takes part, process 0 writes
            argv += ["--final-params", str(final_params)]
        devices = config.mesh_shape.size // config.processes
        with open(self.log_path(index), "wb") as log:
            return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    env=child_environment(devices), start_new_session=True)

    def log_path(self, index: int) -> Path:
        """Process ``index``'s output (stdout and stderr)."""
        return self.path / "processes" / f"{index}.log"

    # --- watching -----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether any process is still running."""
        return not self._done.is_set()

    @property
    def failure(self) -> str | None:
        """Why the group failed (which process, how, its last output), or None."""
        return self._failure

    @property
    def exit_codes(self) -> list[int | None]:
        """Each process's exit status (None while it runs; negative: killed by that signal)."""
        return [process.poll() for process in self._processes]

    def _watch(self) -> None:
        try:
            while True:
                codes = self.exit_codes
                failed = [(index, code) for index, code in enumerate(codes) if code not in (None, 0)]
                if failed and not self._stop_requested:
                    self._failure = self._why(*failed[0])
                    break
                if all(code is not None for code in codes):
                    break
                time.sleep(POLL_S)
        finally:
            self._end_all()
            self._record_end()
            self._done.set()

    def _why(self, index: int, code: int) -> str:
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return f"process {index} of {self.config.processes} {how}{self._log_tail(index)}"

    def _log_tail(self, index: int) -> str:
        try:
            text = self.log_path(index).read_text(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("[Gloo]")]
        tail = " | ".join(line[:200] for line in lines[-LOG_TAIL_LINES:])
        return f" (its last output: {tail})" if tail else ""

    def _end_all(self) -> None:
        for process in self._processes:
            stop_process_group(process)
            if process.stdin is not None:
                try:
                    process.stdin.close()
                except OSError:
                    pass

    def _record_end(self) -> None:
        """Write the summary process 0 could not: a failure (naming the process) or a forced stop."""
        if (self.path / SUMMARY_FILE).exists() or (self.task == "check" and self._failure is None):
            return
        run = load_run(self.path)
        steps = max([record["step"] for record in run.metrics if "step" in record] or [0])
        status = "stopped" if self._stop_requested and self._failure is None else "failed"
        error = self._failure or ("" if status == "stopped" else "the processes ended without a summary")
        summary = {"model": self.config.model, "data": self.config.data, "mode": self.config.mode,
                   "mesh": self.config.mesh_shape.axes, "steps": steps, "processes": self.config.processes,
                   "remat": self.config.remat}
        RunWriter.adopt(self.path).finish(status, **summary, **({"error": error} if error else {}))

    # --- control ------------------------------------------------------------------------------------

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop every process: process 0 is asked, they end together at the next logging step; whatever still
        runs after ``grace`` seconds is killed (the run is then marked stopped by this group)."""
        if not self.running:
            return
        self._stop_requested = True
        try:
            self._processes[0].send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
        if not self._done.wait(grace):
            self._end_all()
            self._done.wait(grace)

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until every process has ended (or ``timeout`` seconds pass); the run's summary, or None."""
        if not self._done.wait(timeout):
            return None
        return dict(load_run(self.path).summary or {})  # a check writes no summary when it succeeds

    def close(self) -> None:
        """Kill every process now (what leaving a notebook does); the run keeps what was written."""
        if self.running:
            self._stop_requested = True
            self._end_all()
            self._done.wait(10.0)

    def __del__(self):
        for process in getattr(self, "_processes", ()):
            if process.poll() is None:
                stop_process_group(process)


__all__ = ["CHECK_FILE", "ProcessGroup", "ProcessGroupError", "STOP_GRACE_S", "validate_before_start"]
