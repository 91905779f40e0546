"""The trainer: runs a parallel mode's steps in a background thread and streams metric events.

* **Responsive.** :meth:`Trainer.start` returns at once; steps run in a thread, so a notebook cell
  finishes and widgets keep updating. :meth:`Trainer.run` does the same in the caller's thread.
* **No host sync per step.** JAX dispatch is asynchronous: a step returns device arrays before they are
  computed. Metrics are read (one ``device_get``) every ``log_every`` steps and at the end only. At most
  :data:`~workbench.training.in_flight.MAX_IN_FLIGHT` steps are queued ahead of the devices: more deadlocks XLA's
  CPU collectives and aborts the process (see :mod:`workbench.training.in_flight`).
* **Control.** :meth:`pause`, :meth:`resume` and :meth:`stop` act at the next step boundary. One run at
  a time: starting while a run is active raises :class:`TrainerBusyError`.
* **Failures end the run, not the kernel.** An exception in a step, or a non-finite loss, ends the run
  with an ``"end"`` event whose ``error`` says what happened; for NaN/inf, the step and the first
  gradient or parameter that went non-finite.
* **Nothing is lost.** Every run is written as it goes to ``<run_root>/<name>/`` (``config.json``,
  ``metrics.jsonl`` appended at each logging interval, ``summary.json`` at the end); see
  :mod:`workbench.training.runs` to list, reload and compare runs.
* **Across processes.** With ``config.processes`` >= 2, :meth:`Trainer.start` launches that many worker
  processes on ``jax.distributed`` (:mod:`workbench.distributed`) and relays the events rebuilt from process
  0's run files: the same events, the same files. Stop ends every process; pause is refused.
* **Checkpoints.** With ``config.checkpoint_every`` the state is saved with Orbax every K steps (without
  waiting for the disk) into ``runs/<name>/checkpoints/``, and :meth:`Trainer.save_checkpoint` saves it at the
  next step boundary on request; :meth:`Trainer.resuming` continues a run from its
  latest checkpoint, on the same or another mesh and mode (:mod:`workbench.training.checkpoints`).
* **Profiles.** :meth:`Trainer.profile` (or ``start(profile=N)``) captures N steady-state steps with JAX's
  profiler into ``runs/<name>/profile/step-<S>/``, with what is live on each device, while the run goes on
  (:mod:`workbench.training.profiling`; :func:`workbench.analysis.profile_report.read_profile` reads it).
* **Compiled once.** A built mode (and its compiled step) is kept per compile key (mode, mesh, model
  shapes, optimizer kind, batch size, accumulation, precision); a new learning rate or seed reuses it.

Events are :class:`TrainEvent` records: ``start``, ``compiled`` (first step, with ``compile_s``),
``metrics``, ``eval``, ``checkpoint`` (a save started: ``path``, ``requested``), ``profile`` (a profile
taken: ``folder``, ``first_step``, ``steps``, ``error``), ``sync`` (gradient-sync diagnostics every ``sync_every``
steps: per-replica and synchronised gradient norms, cosines, replica divergence, noise scale), ``paused``,
``resumed`` and ``end`` (``status`` finished/stopped/failed).

Example:
    >>> trainer = Trainer(TrainConfig(model="mlp", data="digits", mode="dp", steps=300))
    >>> unsubscribe = trainer.subscribe(lambda event: print(event.kind, event.step, event.data.get("loss")))
    >>> name = trainer.start(); trainer.wait()["eval"]["accuracy"] > 0.9
    start 0 None
    compiled 1 None
    metrics 1 ...
    metrics 10 ...
    ...
    eval 300 None
    end 300 None
    True
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from .checkpoints import CheckpointError, CheckpointInfo, CheckpointWriter, validate_resumable, checkpoint_meta
from .checkpoints import checkpoint_steps, checkpoints_folder, latest_checkpoint, restore_state
from .process_group import ProcessGroup
from .process_share import host_values
from .profiling import Capture, ProfileCapture, ProfileError, ProfileRequest, validate_profile_steps
from ..errors import RunError, WorkbenchError
from .events import TrainEvent as TrainEvent
from .events import deliver
from .in_flight import InFlight
from .modes.core import LossFn, TrainState, add_sums, first_non_finite
from .models import param_count
from .run_follower import RunFollower
from .runs import END_STATUSES, RunWriter
from .step import BuiltStep, CustomModel, build_step
from .sync_diagnostics import sync_report
from .config import ResolvedConfig, TrainConfig, resolve_config

ACTIVE_STATUSES = ("running", "paused")  # a run holds the trainer: it may pause, save, profile or be stopped
STATUSES = ("idle", *ACTIVE_STATUSES, *END_STATUSES)
FOLLOWER_CATCH_UP_S = 5.0  # after the processes end, how long the follower may take to read the last lines
FOLLOWER_SILENT_S = 120.0  # a run across processes compiles in every process before its first line
__all__ = ["ACTIVE_STATUSES", "NonFiniteError", "STATUSES", "TrainEvent", "Trainer", "TrainerBusyError"]


class TrainerBusyError(WorkbenchError):
    """A run was started while another run of the same trainer is active."""


class NonFiniteError(WorkbenchError):
    """The loss, a gradient or a parameter became NaN or infinite."""


@dataclasses.dataclass
class _Control:
    """Requests from other threads, read by the training thread at step boundaries."""

    pause: threading.Event = dataclasses.field(default_factory=threading.Event)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    wake: threading.Event = dataclasses.field(default_factory=threading.Event)
    save: threading.Event = dataclasses.field(default_factory=threading.Event)


class Trainer:
    """Trains a model in a parallel mode; see the module docstring.

    Args:
        config: a :class:`~workbench.training.config.TrainConfig` (fields may also be given as keywords), or
            the record :meth:`~workbench.TrainConfig.resolved` made of one where it entered (the CLI's).
        run_root: where runs are written (``runs/`` by default).
        model: your own ``nnx.Module`` instead of ``config.model``; every run starts from its current
            parameters. Needs ``loss`` unless it is a workbench model.
        loss: ``(model, batch) -> (loss, aux)``; ``aux`` may hold ``"weight"`` (examples counted, for
            exact masking) and scalar metrics such as ``"accuracy"``.
        batches: your training data instead of ``config.data``: a callable ``seed -> iterator of
            batches`` (dicts of NumPy arrays of global batch size), or an iterable used once.
        eval_batches: held-out batches (a callable ``() -> iterable`` or a list) for your data.
        tp_rules: ``(regex, spec)`` pairs for ``tp``/``dp-tp`` on your own model.
        coordinator_port: with ``processes`` >= 2, the port of ``jax.distributed``'s coordinator on 127.0.0.1
            (default a free one).

    Example:
        >>> trainer = Trainer(model=my_module, loss=my_loss, batches=my_batches, mode="dp", batch=64)
        >>> summary = trainer.run(steps=100)
        >>> trainer.status, summary["steps"]
        ('finished', 100)
    """

    ACTIVE_STATUSES = ACTIVE_STATUSES  # the module's tuple, for code that holds a Trainer (the dashboard)

    def __init__(
        self,
        config: TrainConfig | ResolvedConfig | None = None,
        *,
        run_root: str = "runs",
        model: nnx.Module | None = None,
        loss: LossFn | None = None,
        batches: Callable[[int], Iterator[Any]] | Iterable[Any] | None = None,
        eval_batches: Callable[[], Iterable[Any]] | Iterable[Any] | None = None,
        tp_rules: Iterable[tuple[str, str]] | None = None,
        coordinator_port: int | None = None,
        **overrides: Any,
    ):
        if isinstance(config, ResolvedConfig):
            resolved, config = config, config.config
        else:
            resolved = None
        config = dataclasses.replace(config or TrainConfig(), **overrides)
        if model is not None:
            config = dataclasses.replace(config, model=f"custom:{type(model).__name__}")
        if resolved is not None and resolved.config == config:
            self._resolved = resolved  # resolved where it entered, and unchanged since
        else:
            self.config = config  # checked and resolved once, here (see the setter)
        self.run_root = run_root
        self.coordinator_port = coordinator_port
        self._custom = None
        if model is not None or batches is not None:
            # None batches too: CustomModel refuses them (after a missing loss) with the message to show.
            self._custom = CustomModel(model, loss, cast(Any, batches), eval_batches, tuple(tp_rules or ()))
        self._modes: dict[tuple, Any] = {}  # built modes by compile key: a new lr or seed reuses one
        self._subscribers: list[Callable[[TrainEvent], None]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._control = _Control()
        self._status = "idle"
        self._summary: dict[str, Any] | None = None
        self.history: list[TrainEvent] = []
        self.run_name: str | None = None
        self.run_path = None
        self.state: TrainState | None = None  # the latest state (exported), after a run in this process
        self._group = None  # the worker processes of a run across processes, and the follower of their files
        self._follower = None
        self._resume_from: CheckpointInfo | None = None  # the checkpoint the next run continues from
        self._profile: ProfileRequest | None = None  # a profile asked for, taken by the loop when steady
        self.subscriber_errors: list[str] = []

    @classmethod
    def resuming(cls, run: str | Any, **settings: Any) -> Trainer:
        """A trainer whose next :meth:`run` or :meth:`start` continues the run in folder ``run`` from its
        latest checkpoint, appending to that folder: metrics go on at the next step (later ones, written
        after the checkpoint, are dropped) and the summary is rewritten at the end.

        ``settings`` change the saved config (``mode``, ``mesh``, ``steps``, ``log_every``, ...: the state is
        read straight into the new mode's layout) or are the trainer's own (``model``, ``loss``, ``batches``
        for a run of your own model). On the same mesh and mode the run ends as an uninterrupted one would.

        Raises:
            CheckpointError: no such folder, no complete checkpoint, a changed model, data or optimizer setting,
                or no steps left (pass a larger ``steps``).

        Example:
            >>> Trainer.resuming("runs/mlp-fsdp", mode="dp-tp", mesh="data=4,model=2", steps=30).run()["steps"]
            30
        """
        info = latest_checkpoint(run)
        own = {k: settings.pop(k) for k in ("model", "loss", "batches", "eval_batches", "tp_rules") if k in settings}
        saved_model = str(info.config.get("model"))
        if saved_model.startswith("custom:") and own.get("model") is None:
            raise CheckpointError(f"run {info.run_path.name!r} trained your own model ({saved_model[7:]}): "
                                  "pass it again, "
                                  "with its loss and batches: Trainer.resuming(run, model=..., loss=..., batches=...)")
        trainer = cls(TrainConfig.from_json(info.config), run_root=str(info.run_path.parent), **own, **settings)
        validate_resumable(info, trainer.config)
        trainer._resume_from = info
        return trainer

    # --- public control --------------------------------------------------------------------------

    @property
    def config(self) -> TrainConfig:
        """The checked settings of the next run; setting it checks and resolves the new ones
        (:meth:`~workbench.TrainConfig.resolved`), once: the runs below take the records, not the text. A record
        resolved where the settings entered (a :class:`~workbench.training.ResolvedConfig`) is taken as it is."""
        return self._resolved.config

    @config.setter
    def config(self, config: TrainConfig | ResolvedConfig) -> None:
        self._resolved = resolve_config(config)

    @property
    def status(self) -> str:
        """``idle``, ``running``, ``paused``, ``finished``, ``stopped`` or ``failed``."""
        return self._status

    @property
    def is_active(self) -> bool:
        """Whether a run holds this trainer (``running`` or ``paused``: :data:`ACTIVE_STATUSES`)."""
        return self._status in ACTIVE_STATUSES

    @property
    def compiled_modes(self) -> int:
        """How many distinct compiled steps this trainer has built (a new lr or seed adds none)."""
        return len(self._modes)

    def subscribe(self, callback: Callable[[TrainEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event (from the training thread); returns an unsubscribe.

        A callback that raises is dropped, and its error kept in :attr:`subscriber_errors`: a broken
        plot must not break training.
        """
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def configure(self, **changes: Any) -> TrainConfig:
        """Change settings for the next run (refused while a run is active); returns the new config."""
        self._refuse_if_active("change the settings")
        self.config = dataclasses.replace(self.config, **changes)
        return self.config

    def start(self, steps: int | None = None, *, name: str | None = None, profile: int | None = None) -> str:
        """Start a run in a background thread; returns its name. Checks everything before starting.
        ``profile=N`` profiles N steps as soon as the run's steps are compiled (see :meth:`profile`).

        Raises:
            TrainerBusyError: a run is active (pause/stop it first).
            WorkbenchError: a bad setting (mode, mesh, batch, model/data mismatch, ...).
        """
        with self._lock:
            self._refuse_if_active("start another run")
            if self._across_processes():
                self._refuse_profile_across_processes(profile)
                return self._start_processes(steps, name)
            prepared = self._prepare(steps, name, profile)
            self._status = "running"
        self._thread = threading.Thread(target=self._run_safely, args=prepared, daemon=True, name="workbench-trainer")
        self._thread.start()
        return self._current_run

    def run(self, steps: int | None = None, *, name: str | None = None, profile: int | None = None) -> dict[str, Any]:
        """Run to the end in this thread; returns the summary (also in ``summary.json``). ``profile=N``
        profiles N steps once they are compiled (the ``profile`` event says where)."""
        if self._across_processes():
            self.start(steps, name=name, profile=profile)
            self.wait()
            return self._ended_summary()
        with self._lock:
            self._refuse_if_active("start another run")
            prepared = self._prepare(steps, name, profile)
            self._status = "running"
        self._run_safely(*prepared)
        return self._ended_summary()

    def _ended_summary(self) -> dict[str, Any]:
        """The summary of the run that has just ended (a run in this process always leaves one)."""
        if self._summary is None:  # across processes: they ended, but their summary was not read in time
            raise RunError(f"run {self.run_name!r} ended without a summary that could be read: see {self.run_path}")
        return self._summary

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until the run ends (or ``timeout`` seconds pass); returns the summary, or None."""
        if self._group is not None and self._follower is not None:  # set together: a run across processes
            begun = time.monotonic()
            if self._group.wait(timeout) is None:
                return None
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - begun))
            self._follower.wait(left if left is not None else FOLLOWER_CATCH_UP_S)
            return self._summary
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return None
        return self._summary

    def pause(self) -> None:
        """Pause at the next step boundary (metrics so far are logged first). Refused across processes."""
        if self._group is not None and self.is_active:
            raise WorkbenchError(
                f"run {self.run_name!r} trains across {self.config.processes} processes, which cannot pause (the "
                "others would wait in a collective until it timed out): stop it instead")
        self._control.pause.set()

    def resume(self) -> None:
        """Resume a paused run."""
        self._control.pause.clear()
        self._control.wake.set()

    def save_checkpoint(self) -> None:
        """Save the running (or paused) run's state at the next step boundary, whatever ``checkpoint_every``
        says (keeping the last ``keep_checkpoints``); a ``checkpoint`` event says when the save has started.

        Raises:
            WorkbenchError: no run is active, or the run trains across processes (they save on their schedule only).

        Example:
            >>> name = trainer.start(steps=20); trainer.save_checkpoint()
            >>> trainer.wait()["checkpoints"][-2:]  # every checkpoint_every=10 steps, after the one asked for
            [10, 20]
            >>> Trainer.resuming(trainer.run_path, steps=40).run()["steps"]
            40
        """
        if not self.is_active:
            raise WorkbenchError(f"no run to save ({self._status}): start one, then save it while it trains")
        if self._group is not None:
            raise WorkbenchError(f"run {self.run_name!r} trains across {self.config.processes} processes, which save "
                                 "on their schedule only (checkpoint_every): a request would have to reach every "
                                 "process at the same step; set checkpoint_every before starting")
        self._control.save.set()
        self._control.wake.set()  # a paused run saves at once

    def profile(self, steps: int = 5, *, wait: bool = True,
                timeout: float | None = 120.0) -> ProfileCapture | ProfileRequest:
        """Profile ``steps`` steps of the running run with JAX's profiler, from the next step boundary after its
        steps are compiled (never the compiling one), into ``runs/<name>/profile/step-<S>/``; the run and its
        metrics go on. Also sampled: the bytes alive on each device (see :mod:`workbench.training.profiling`).
        A ``profile`` event follows when the capture is on disk.

        Returns the :class:`~workbench.training.profiling.ProfileCapture` (``wait=False``, or when called from
        the training thread, e.g. in a subscriber: the :class:`~workbench.training.profiling.ProfileRequest`,
        whose ``result(timeout)`` waits for it). Read it with :func:`workbench.read_profile`.

        Raises:
            ProfileError: no run is active, a profile is being taken, ``steps`` is not 1..100, the run trains
                across processes, or (waiting) the run ended first or the capture failed.

        Example:
            >>> name = trainer.start(steps=1000); report = read_profile(trainer.profile(steps=5))
            >>> trainer.stop(); summary = trainer.wait(); trainer.status
            'stopped'
            >>> len(report.timeline.steps), 0 < report.timeline.steps[0].collective_share < 1
            (5, True)
        """
        steps = validate_profile_steps(steps)
        with self._lock:
            if not self.is_active:
                raise ProfileError(f"no run to profile ({self._status}): start a run, then profile it while it trains "
                                   "(or start(profile=N), workbench train --profile N)")
            if self._group is not None:
                self._refuse_profile_across_processes(steps)
            if self._profile is not None and not self._profile.done:
                raise ProfileError(f"a profile of {self._profile.steps} steps of run {self.run_name!r} is being taken: "
                                   "wait for its profile event, then profile again")
            request = self._profile = ProfileRequest(steps)
        if not wait or threading.current_thread() is self._thread:
            return request  # the training thread takes it: waiting here would wait forever
        return request.result(timeout)

    def _refuse_profile_across_processes(self, steps: int | None) -> None:
        if steps:
            raise ProfileError(f"run {self.run_name or 'this run'!r} trains across {self.config.processes} processes: "
                               "profile it with processes=1 on the same mesh (the steps and collectives are the same "
                               "programs), or profile one process with jax.profiler")

    def stop(self) -> None:
        """Stop at the next step boundary; the run ends with status ``stopped``. Across processes every process
        stops at the next logging step, and any still running a few seconds later is killed."""
        if self._group is not None:
            threading.Thread(target=self._group.stop, daemon=True, name="workbench-group-stop").start()
            return
        self._control.stop.set()
        self._control.wake.set()

    # --- across processes -----------------------------------------------------------------------------

    def _across_processes(self) -> bool:
        """Whether a run starts worker processes: it asks for several, and this is not one of them."""
        return self.config.processes > 1 and jax.process_count() == 1

    def _start_processes(self, steps: int | None, name: str | None) -> str:
        """Start the run's processes (:class:`~workbench.training.process_group.ProcessGroup`) and relay the events
        rebuilt from process 0's files, so subscribers see what they see of a run in this process."""
        if self._custom is not None:
            raise WorkbenchError("a run across processes builds its model from the config in every process: your own "
                                 "model and batches train in this process (processes=1)")
        if steps is not None:
            self.config = dataclasses.replace(self.config, steps=steps)
        # ProcessGroup checks everything it can before any process starts: bad input raises here.
        self._release_processes()
        resumed, self._resume_from = self._resume_from, None  # the processes continue it; a later run starts afresh
        if resumed is not None:
            validate_resumable(resumed, self.config)
        group = ProcessGroup(self._resolved, self.run_root, name, port=self.coordinator_port, resume=resumed)
        follower = RunFollower(group.path, stopper=group.stop, silent_after=FOLLOWER_SILENT_S)
        follower.subscribe(self._relay)
        self._group, self._follower = group, follower
        self.run_name, self.run_path = group.name, group.path
        self.history, self._summary, self.state, self._status = [], None, None, "running"
        follower.start()
        return group.name

    def _release_processes(self) -> None:
        """Forget an earlier run's processes (ended: a new run starts only when none is active)."""
        if self._follower is not None:
            self._follower.close()
        self._group = self._follower = None

    def _relay(self, event: TrainEvent) -> None:
        if event.kind == "end":
            self._summary = {"run": self.run_name, "run_dir": str(self.run_path), **event.data}
            self._status = event.data.get("status", "failed")
        self._emit(event.kind, event.step, **event.data)

    # --- preparation (in the caller's thread, so bad input raises there) --------------------------

    def _refuse_if_active(self, what: str) -> None:
        if self.is_active:
            raise TrainerBusyError(
                f"cannot {what}: run {self.run_name!r} is {self._status} (one run at a time per trainer): "
                "call stop() and wait(), or use another Trainer"
            )

    def build(self) -> BuiltStep:
        """The step this trainer's next run trains (:func:`~workbench.training.step.build_step`), with its
        built modes kept: what :meth:`check` checks and the ledger compiles is exactly what is trained."""
        return build_step(self._resolved, custom=self._custom, modes=self._modes)

    def _prepare(self, steps: int | None, name: str | None, profile: int | None = None):
        config = self.config
        if steps is not None:
            self.config = dataclasses.replace(config, steps=steps)
            config = self.config
        self._profile = ProfileRequest(validate_profile_steps(profile)) if profile is not None else None
        built = self.build()  # raises on a bad combination, before anything is written
        self._release_processes()  # this run trains here: stop, pause and wait act on it, not on an earlier group
        dataset, resumed, state = built.dataset, self._resume_from, built.state
        if resumed is not None:  # read before the run folder changes: a foreign checkpoint changes nothing
            validate_resumable(resumed, config)
            state = self._restored_state(built.mode, state, resumed)
        record = {
            **config.to_json(),
            "model_options": built.model_options,
            "param_count": param_count(built.model),
            "data_description": dataset.description if dataset else "custom batches",
            "unigram_entropy": dataset.unigram_entropy() if dataset and dataset.kind == "language" else None,
            "devices": f"{len(jax.devices())} x {jax.devices()[0].platform}",
            "jax_version": jax.__version__,
        }
        if resumed is not None:
            record["resumed_from_step"] = resumed.step
            writer = self._reopen_writer(resumed, record)
            self._resume_from = None  # a later run of this trainer starts afresh
        else:
            writer = self._open_writer(name, record)
        self.run_name, self.run_path = writer.name, writer.path
        # The last run's state goes: kept, it would sit on the devices beside this run's (a copy a profile flags).
        self.history, self._summary, self._control, self.state = [], None, _Control(), None
        start = _Start(state, resumed.step if resumed is not None else 0)
        return writer, built.mode, start, built.train_batches, built.eval_batches, dataset

    @staticmethod
    def _restored_state(mode, state: TrainState, info: CheckpointInfo) -> TrainState:
        """The checkpoint's state read into ``mode``'s layout (``state`` gives the tree, shapes and dtypes)."""
        shardings = mode.restore_shardings(state)
        target = jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype,
                                                                          sharding=sharding),
                              state, shardings)
        return mode.place_restored(restore_state(info, target))

    def _reopen_writer(self, resumed: CheckpointInfo, record: dict[str, Any]) -> RunWriter:
        """Where a resumed run goes on: its own folder, after the checkpoint's step (a process of a run across
        processes goes on in the folder its launcher reopened instead)."""
        return RunWriter.reopen(resumed.run_path, record, through_step=resumed.step)

    def _open_writer(self, name: str | None, record: dict[str, Any]) -> RunWriter:
        """Where the run is written: a new folder under ``run_root`` (a process of a multi-process run
        writes into the folder its launcher reserved instead)."""
        return RunWriter(self.run_root, name, record)

    # --- the training thread ---------------------------------------------------------------------

    @property
    def _current_run(self) -> str:
        """The name of the run this trainer holds (it is named before it starts or emits anything)."""
        if self.run_name is None:
            raise WorkbenchError("this trainer has not started a run")
        return self.run_name

    def _emit(self, kind: str, step: int, **data: Any) -> None:
        event = TrainEvent(kind, step, data, self._current_run)
        self.history.append(event)
        deliver(event, self._subscribers, self.subscriber_errors)

    def _run_safely(self, writer: RunWriter, mode, start: _Start, train_batches, eval_batches, dataset) -> None:
        loop = _Loop(self, writer, mode, start, train_batches, eval_batches)
        status, error = "finished", None
        try:
            status = loop.run()
        except Exception as exc:  # noqa: BLE001 - the run fails, the kernel lives on
            status, error = "failed", _error_text(exc)
            loop.traceback = traceback.format_exc()
        loop.end_profile(ended=status)  # a profile cut short still stops JAX's profiler and says so
        try:
            loop.close_checkpoints()  # the last save is on disk before the run says it ended
        except WorkbenchError as exc:
            status, error = "failed", error or _error_text(exc)
        summary = loop.summary(status, error)
        self._summary = {"run": writer.name, "run_dir": str(writer.path), **summary}
        writer.finish(status, **summary)
        self.state = loop.exported_state()
        self._status = status
        self._emit("end", loop.step, **summary)


def _error_text(exc: Exception) -> str:
    return str(exc) if isinstance(exc, WorkbenchError) else f"{type(exc).__name__}: {exc}"


@dataclasses.dataclass
class _Start:
    """Where a run starts: a host state at step 0, or a state restored (already placed) at a checkpoint's step.
    The loop lets go of ``state`` once placed: kept, it would hold the whole initial state on one device for the
    whole run (a profile's memory comparison found it: a "state copy" as large as the state on device 0)."""

    state: TrainState | None
    step: int = 0

    @property
    def placed(self) -> bool:
        return self.step > 0


class _Loop:
    """One run's loop and its bookkeeping (kept apart so the Trainer reads as its public surface)."""

    def __init__(self, trainer: Trainer, writer: RunWriter, mode, start: _Start, train_batches, eval_batches):
        self.trainer, self.writer, self.mode = trainer, writer, mode
        self.config, self.mesh_shape = trainer.config, trainer._resolved.mesh_shape
        self.train_batches, self.eval_batches = train_batches, eval_batches
        self.start = start
        self.state = None
        self.step = start.step
        self.checkpoints: CheckpointWriter | None = None
        self.saved_step = start.step if start.placed else 0  # the step whose state is on disk (0: none)
        self.pending: list[tuple[int, dict]] = []
        self.in_flight = InFlight()  # steps dispatched but maybe not run: bounded, see workbench.training.in_flight
        self.last: dict[str, Any] = {}
        self.evals: dict[str, float] = {}
        self.compile_s = None
        self.train_seconds = 0.0
        self.train_examples = 0
        self.traceback: str | None = None
        self.interval_start = time.perf_counter()
        self.capture: Capture | None = None  # a profile being taken

    def run(self) -> str:
        config = self.config
        resumed = {"resumed_from_step": self.start.step} if self.start.placed else {}
        self.trainer._emit("start", self.start.step, mode=config.mode, mesh=config.mesh, steps=config.steps,
                           sync_every=config.sync_every, run_dir=str(self.writer.path), **resumed)
        self.state = self.start.state if self.start.placed else self.mode.place_state(self.start.state)
        self.start.state = None  # placed: the initial copy is not needed any more
        if config.checkpoint_every:
            self.checkpoints = CheckpointWriter(self.writer.path, config.keep_checkpoints)
        batches = iter(self.train_batches(config.seed, self.start.step))  # one batch per step: skip those done
        self.restart_interval()
        while self.step < config.steps:
            if self.stop_requested():
                return "stopped"
            batch = self.next_batch(batches)
            self.begin_profile()
            self.train_step(batch)
            self.end_profile()
            self.side_work(batch)
            if self.saves_at(self.step):
                self.save_checkpoint()
            self.save_if_requested()
        self.evaluate()
        if self.checkpoints is not None and self.step != self.saved_step:
            self.save_checkpoint()  # a finished run's last state, to continue it with more steps
        return "finished"

    def saves_at(self, step: int) -> bool:
        """Whether a checkpoint is saved after ``step`` (such steps are logging steps too, so the metrics on
        disk reach the checkpoint and a resumed run's logging intervals are the uninterrupted run's)."""
        return bool(self.config.checkpoint_every) and step % self.config.checkpoint_every == 0

    def save_checkpoint(self, requested: bool = False) -> None:
        """Start saving the state (Orbax copies it off the devices, then writes in the background)."""
        if self.checkpoints is None:  # a save asked for in a run that saves no checkpoints of its own
            self.checkpoints = CheckpointWriter(self.writer.path, self.config.keep_checkpoints)
        state = self.mode.export_state(self.state)
        self.checkpoints.save(self.step, state, checkpoint_meta(self.config, self.step, state))
        self.saved_step = self.step
        self.trainer._emit("checkpoint", self.step, path=str(checkpoints_folder(self.writer.path) / str(self.step)),
                           requested=requested)
        self.restart_interval()

    def save_if_requested(self) -> None:
        """Act on :meth:`Trainer.save_checkpoint`: log the metrics so far (they reach the checkpoint), then save."""
        control = self.trainer._control
        if not control.save.is_set() or self.step == 0:  # before the first step: saved after it
            return
        control.save.clear()
        if self.step == self.saved_step:  # this state is saved already (or is the checkpoint resumed from)
            self.trainer._emit("checkpoint", self.step, path=str(checkpoints_folder(self.writer.path) / str(self.step)),
                               requested=True, already=True)
            return
        self.flush()
        self.save_checkpoint(requested=True)

    def close_checkpoints(self) -> None:
        """Wait for the last save to reach the disk (a CheckpointError if it could not)."""
        if self.checkpoints is not None:
            checkpoints, self.checkpoints = self.checkpoints, None
            checkpoints.close()

    def restart_interval(self) -> None:
        """Start timing training anew: work between steps (logging, diagnostics, evaluation, a pause)
        never counts in examples/s."""
        self.interval_start = time.perf_counter()

    def stop_requested(self) -> bool:
        """Act on Stop and Pause at this step boundary; True when the run must end."""
        control = self.trainer._control
        if jax.process_count() > 1:
            return self.agreed_stop()
        if control.stop.is_set():
            self.flush()
            return True
        if control.pause.is_set():
            self.flush()
            return self.wait_while_paused() == "stop"
        return False

    def agreed_stop(self) -> bool:
        """Across processes, every process must stop after the same step, or the others wait in a collective
        forever. Process 0's stop request is broadcast at each logging step (where the metrics are read
        anyway), so a stop acts within one logging interval."""
        if self.step % self.config.log_every:
            return False
        if not multihost_utils.broadcast_one_to_all(np.int32(self.trainer._control.stop.is_set())):
            return False
        self.flush()
        return True

    def next_batch(self, batches: Iterator[Any]) -> Any:
        try:
            return next(batches)
        except StopIteration:
            raise WorkbenchError(
                f"the training batches ran out after {self.step} steps of {self.config.steps}: give more data "
                "(an iterator that repeats) or fewer steps"
            ) from None

    def train_step(self, batch: Any) -> None:
        """One step, dispatched without waiting; metrics are read only at logging steps."""
        config, first = self.config, time.perf_counter()
        step = self.step + 1
        logging = step == 1 or step % config.log_every == 0 or step == config.steps or self.saves_at(step)
        placed = self.mode.place_batch(batch)
        if self.capture is not None:
            self.capture.before_step(self.mode, self.state, placed, logging)
        self.state, metrics = self.mode.step(self.state, placed, diagnostics=logging)
        self.step = step
        self.pending.append((step, metrics))
        self.in_flight.add(metrics["loss"])
        if step == self.start.step + 1:
            if logging:
                self.mode.precompile(self.state, placed)  # the ordinary step, compiled while this one runs
            jax.block_until_ready(metrics["loss"])  # the one early sync: compile time, shown once
            self.compile_s = time.perf_counter() - first
            self.trainer._emit("compiled", step, compile_s=round(self.compile_s, 3))
            if logging:
                self.flush(timed=False)
            else:  # a resumed run logs on the uninterrupted run's steps: this step joins the next record
                self.restart_interval()
        elif logging:
            self.flush()

    def begin_profile(self) -> None:
        """Start a requested profile once the run's steps are compiled: the first step compiles them."""
        request = self.trainer._profile
        if request is None or request.done or self.capture is not None or self.step <= self.start.step:
            return
        jax.block_until_ready(self.state)  # steps dispatched earlier must not run into the trace half-seen
        self.in_flight.clear()
        self.capture = Capture.begin(request, self.writer.name, self.writer.path, self.step + 1)
        if self.capture is None:  # the profiler would not start: say why, the run goes on
            self.trainer._emit("profile", self.step, run=self.writer.name, folder=None, first_step=self.step + 1,
                               steps=0, error=request.error)

    def end_profile(self, ended: str | None = None) -> None:
        """Finish the profile once its steps have run (or the run ends: ``ended`` says how), then say so."""
        request = self.trainer._profile
        if self.capture is None:
            if ended and request is not None and not request.done:
                request.finish(error=f"run {self.writer.name!r} {ended} at step {self.step}, before the profile began: "
                                     "profile a run with more steps left")
                self.trainer._emit("profile", self.step, run=self.writer.name, folder=None, first_step=None, steps=0,
                                   error=request.error)
            return
        if not (self.capture.complete or ended):
            return
        capture, self.capture = self.capture, None
        short = None if capture.complete else (f"run {self.writer.name!r} {ended} after {capture.taken} of "
                                               f"{capture.request.steps} profiled steps")
        taken = capture.end(self.mode, self.state, error=None if capture.taken else short)  # waits for the steps
        note = {"note": short} if short and capture.taken else {}
        self.trainer._emit("profile", self.step, **taken.to_json(), **note)
        self.restart_interval()

    def side_work(self, batch: Any) -> None:
        """Gradient-sync diagnostics and evaluation, each on its own schedule."""
        config = self.config
        if self.step > 1 and config.sync_every and self.step % config.sync_every == 0:
            self.report_sync(batch)
        if config.eval_every and self.step % config.eval_every == 0 and self.step < config.steps:
            self.evaluate()

    def wait_while_paused(self) -> str:
        control = self.trainer._control
        self.trainer._status = "paused"
        self.trainer._emit("paused", self.step)
        while control.pause.is_set() and not control.stop.is_set():
            control.wake.wait(0.5)
            control.wake.clear()
            self.save_if_requested()
        if control.stop.is_set():
            return "stop"
        self.trainer._status = "running"
        self.trainer._emit("resumed", self.step)
        self.restart_interval()
        return "resume"

    def flush(self, timed: bool = True) -> None:
        """Read the pending metrics (one host sync), check them, log one record and emit it.

        The record holds the mean loss over the interval's steps and the gradient norm of the last
        step (ordinary steps compute no gradient norms: see ``diagnostics`` in :mod:`workbench.training.modes.base`).
        """
        if not self.pending:
            return
        steps = [step for step, _ in self.pending]
        values = jax.device_get([metrics for _, metrics in self.pending])
        self.pending = []
        self.in_flight.clear()  # every step up to here has run
        self.validate_finite(steps, values)
        record = {"step": steps[-1], "loss": float(np.mean([v["loss"] for v in values]))}
        if "grad_norm" in values[-1]:
            record["grad_norm"] = float(values[-1]["grad_norm"])
        self.last = {"loss": float(values[-1]["loss"])}
        if timed:
            elapsed = time.perf_counter() - self.interval_start
            examples = len(steps) * self.config.batch
            self.train_seconds += elapsed
            self.train_examples += examples
            record.update(examples_per_s=examples / elapsed, step_time_s=elapsed / len(steps))
        self.writer.append(record)
        self.trainer._emit("metrics", steps[-1], **{k: v for k, v in record.items() if k != "step"})
        self.restart_interval()

    def validate_finite(self, steps: list[int], values: list[dict]) -> None:
        """NonFiniteError at the first step whose loss or gradient norms are not finite.

        It names the first non-finite gradient when that step computed gradient norms (a logging
        step), else the first non-finite parameter of the current state, read on the host only now.
        """
        for step, metrics in zip(steps, values, strict=True):
            grads_finite = np.isfinite(metrics.get("grad_sq_norms", np.zeros(0)))
            if np.isfinite(metrics["loss"]) and grads_finite.all():
                continue
            params = self.mode.export_state(self.state).params
            params_finite = [bool(np.all(np.isfinite(leaf))) for leaf in jax.tree.leaves(host_values(params))]
            culprit = first_non_finite(params, grads_finite, params_finite)
            if culprit and culprit.startswith("parameter") and steps[-1] != step:
                culprit += f" (read after step {steps[-1]})"
            loss = float(metrics["loss"])
            where = f"; first non-finite: {culprit}" if culprit else ""
            raise NonFiniteError(
                f"step {step}: loss is {loss}{where}. Lower the learning rate (now {self.config.lr}), check the "
                "data for NaN/inf, or use fp32 if this is bf16"
            )

    def report_sync(self, batch: Any) -> None:
        """Gradient-sync diagnostics on this step's batch (see :mod:`workbench.training.sync_diagnostics`)."""
        if self.state is None:  # run() places it before the first step
            raise WorkbenchError("gradient-sync diagnostics need the run's placed state: there is none yet")
        report = sync_report(self.mode, self.state, batch).to_json()
        record = {"step": self.step, **{f"sync_{k}": v for k, v in report.items()}}
        self.writer.append(record)
        self.trainer._emit("sync", self.step, **report)
        self.restart_interval()

    def evaluate(self) -> None:
        if self.eval_batches is None:
            return
        total, queue = None, InFlight()
        for batch in self.eval_batches():
            sums = self.mode.eval_sums(self.state, self.mode.place_batch(batch))
            queue.add(sums)  # each batch's evaluation is independent of the others: bound the queue
            total = sums if total is None else add_sums(total, sums)
        if total is None:
            return
        total = jax.device_get(total)
        weight = float(total["weight"]) or 1.0
        self.evals = {k: float(v) / weight for k, v in total["metrics"].items()}
        record = {"step": self.step, **{f"eval_{k}": v for k, v in self.evals.items()}}
        self.writer.append(record)
        self.trainer._emit("eval", self.step, **{k: v for k, v in record.items() if k != "step"})
        self.restart_interval()

    def summary(self, status: str, error: str | None) -> dict[str, Any]:
        config = self.config
        result = {
            "model": config.model, "data": config.data, "mode": config.mode, "mesh": self.mesh_shape.axes,
            "processes": config.processes, "remat": config.remat,
            "steps": self.step, "final_loss": self.last.get("loss"),
            "eval": dict(self.evals) or None,
            "examples_per_s": self.train_examples / self.train_seconds if self.train_seconds else None,
            "compile_s": self.compile_s,
        }
        if self.config.checkpoint_every or self.saved_step:
            result["checkpoints"] = checkpoint_steps(self.writer.path)
        if self.start.placed:
            result["resumed_from_step"] = self.start.step
        if error is not None:
            result["error"] = error
        return result

    def exported_state(self) -> TrainState | None:
        return self.mode.export_state(self.state) if self.state is not None else None
