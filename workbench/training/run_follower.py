"""Follow a run folder as it grows and emit the Trainer's events, rebuilt from its files.

A run written by :class:`~workbench.training.runs.RunWriter` (in this kernel, in another process, from
the CLI, or on another machine sharing the folder) is followed by a daemon thread that polls
``metrics.jsonl`` and ``summary.json``. Only complete lines are read: a half-written last line waits for
its newline. Events are the :class:`~workbench.training.events.TrainEvent` records the in-process Trainer
emits, so one subscriber serves both: ``start``, ``compiled``, ``metrics``, ``eval``, ``sync`` and ``end``,
plus ``silent`` when nothing new arrived for ``silent_after`` seconds.

What the files do not hold, and so a follower cannot emit: ``paused``/``resumed`` events, and the compile
time on ``compiled`` while the run is still going (it is in ``summary.json`` only; None until then). The
``end`` event carries the whole ``summary.json``, so it also has ``status`` and ``ended``.
Standard library only: a notebook can watch a run without starting JAX.

Example:
    >>> follower = follow_run("mlp-dp")
    >>> follower.wait(600)["status"]
    'finished'
    >>> [(event.kind, event.step) for event in follower.history][:3]
    [('start', 0), ('compiled', 1), ('metrics', 1)]
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RunError, WorkbenchError
from .events import TrainEvent, deliver
from .runs import CONFIG_FILE, END_STATUSES, METRICS_FILE, SUMMARY_FILE, Run, _is_number, _read_json_file
from .runs import parse_record, run_folder

POLL_INTERVAL_S = 0.25
SILENT_AFTER_S = 30.0
APPEAR_TIMEOUT_S = 60.0  # how long a run folder may take to appear (a launcher creates it after starting up)
STATUSES = ("running", "silent", *END_STATUSES)
SYNC_PREFIX = "sync_"  # the trainer logs sync diagnostics with this prefix and emits them without it

NOT_STARTED_HERE = (
    "run {name!r} was not started here: stop it where it runs (Ctrl-C in its terminal, or end the processes "
    "writing {path}); following it shows how it ends"
)
CANNOT_PAUSE = (
    "run {name!r} is followed from its files in {path}: a followed run cannot be paused from here; "
    "pause it where it runs"
)


class RunFollower:
    """Follows one run folder in a daemon thread and emits its events; see the module docstring.

    Args:
        run: a run name under ``run_root``, a run folder's path, or a :class:`~workbench.training.runs.Run`.
        run_root: where bare names are looked up.
        poll_interval: seconds between two looks at the files.
        silent_after: seconds with no new line and no summary before the status is ``"silent"``.
        appear_timeout: seconds to wait for the folder's ``config.json`` before the follow fails.
        stopper: what :meth:`stop` calls (a launcher that started the run's processes passes one).

    Raises:
        RunError: a bad ``run``, ``poll_interval``, ``silent_after`` or ``appear_timeout``.

    Example:
        >>> follower = RunFollower("mlp-dp", run_root="runs")
        >>> unsubscribe = follower.subscribe(print)
        >>> follower.start().wait(60)["status"]
        TrainEvent(kind='start', step=0, ...)
        ...
        'finished'
    """

    def __init__(self, run: str | os.PathLike | Run, run_root: str | os.PathLike = "runs", *,
                 poll_interval: float = POLL_INTERVAL_S, silent_after: float = SILENT_AFTER_S,
                 appear_timeout: float = APPEAR_TIMEOUT_S, stopper: Callable[[], Any] | None = None):
        for name, value in (("poll_interval", poll_interval), ("silent_after", silent_after),
                            ("appear_timeout", appear_timeout)):
            if not _is_number(value) or not value > 0:
                raise RunError(f"{name}={value!r} must be a number of seconds > 0, e.g. {name}=1.0")
        self.run_path: Path = run_folder(run.path if isinstance(run, Run) else run, run_root, "follow_run")
        self.run_name: str = self.run_path.name
        self.poll_interval, self.silent_after, self.appear_timeout = poll_interval, silent_after, appear_timeout
        self.history: list[TrainEvent] = []
        self.subscriber_errors: list[str] = []
        self.skipped_lines: list[str] = []  # complete lines that were not JSON objects: "line N: why"
        self._stopper = stopper
        self._subscribers: list[Callable[[TrainEvent], None]] = []
        self._status = "running"
        self._summary: dict[str, Any] | None = None
        self._error: RunError | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader = _LineReader(self.run_path / METRICS_FILE)
        self._step = 0
        self._compiled = False
        self._final: dict[str, Any] | None = None  # summary.json once seen, read before the last lines

    def __repr__(self) -> str:
        return f"RunFollower({str(self.run_path)!r}, status={self._status!r})"

    # --- the Trainer's surface ---------------------------------------------------------------------

    @property
    def status(self) -> str:
        """The run as last seen: ``running``, ``silent``, ``finished``, ``stopped`` or ``failed``."""
        return self._status

    @property
    def following(self) -> bool:
        """Whether the thread still follows the run (False once it ended or :meth:`close` was called)."""
        return self._thread is not None and self._thread.is_alive()

    def subscribe(self, callback: Callable[[TrainEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event from now on (events so far are in :attr:`history`);
        returns an unsubscribe. A callback that raises is dropped, its error kept in :attr:`subscriber_errors`.

        Example:
            >>> follower = RunFollower("mlp-dp")
            >>> unsubscribe = follower.subscribe(lambda event: print(event.kind))
            >>> follower.start().wait(60)["status"]
            start
            compiled
            metrics
            ...
            end
            'finished'
        """
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def start(self) -> RunFollower:
        """Start following in a daemon thread; returns the follower. Subscribe first to see every event."""
        if self._thread is not None:
            raise RunError(f"already following run {self.run_name!r}: make a new RunFollower to follow it again")
        self._thread = threading.Thread(target=self._follow, daemon=True, name="workbench-follower")
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until the run ends (or ``timeout`` seconds pass, or :meth:`close`); its summary, or None.

        Raises:
            RunError: the run could not be followed (e.g. its folder never appeared): the message says why.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return None
        if self._error is not None:
            raise self._error
        return self._summary

    def close(self) -> None:
        """Stop following (the run itself goes on); the thread ends within ``poll_interval``."""
        self._closing.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.poll_interval + 5.0)  # bounded: one look at the files is all it finishes

    def pause(self) -> None:
        """Refused: a followed run is paused where it runs."""
        raise WorkbenchError(CANNOT_PAUSE.format(name=self.run_name, path=self.run_path))

    def resume(self) -> None:
        """Refused, as :meth:`pause`."""
        raise WorkbenchError(CANNOT_PAUSE.format(name=self.run_name, path=self.run_path))

    def stop(self) -> None:
        """Ask the run to stop through the ``stopper`` given at construction; its ``end`` event follows.

        Raises:
            WorkbenchError: no stopper: the run was not started here, and the message says where to stop it.
        """
        if self._stopper is None:
            raise WorkbenchError(NOT_STARTED_HERE.format(name=self.run_name, path=self.run_path))
        self._stopper()

    # --- the following thread ----------------------------------------------------------------------

    def _emit(self, kind: str, step: int, **data: Any) -> None:
        event = TrainEvent(kind, step, data, self.run_name)
        self.history.append(event)
        deliver(event, self._subscribers, self.subscriber_errors)

    def _follow(self) -> None:
        try:
            config = self._wait_for_config()
            if config is None:
                return  # closed before the run appeared
            self._emit("start", 0, mode=config.get("mode"), mesh=config.get("mesh"), steps=config.get("steps"),
                       sync_every=config.get("sync_every"), run_dir=str(self.run_path))
            self._follow_lines()
        except Exception as error:  # noqa: BLE001 - the follow fails, the kernel lives on
            if not isinstance(error, RunError):
                error = RunError(f"cannot follow run {self.run_name!r} in {str(self.run_path)!r}: "
                                 f"{type(error).__name__}: {error}")
            self._error, self._status = error, "failed"
            self._emit("end", self._step, status="failed", error=str(error))

    def _wait_for_config(self) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.appear_timeout
        config_path = self.run_path / CONFIG_FILE
        while not config_path.is_file():
            if time.monotonic() >= deadline:
                raise RunError(
                    f"no run in {str(self.run_path)!r} after {self.appear_timeout:g} s (no {CONFIG_FILE} there): "
                    "check the name against list_runs(), or pass appear_timeout= for a run that starts slowly"
                )
            if self._closing.wait(self.poll_interval):
                return None
        return _read_json_file(config_path, "run config")

    def _follow_lines(self) -> None:
        last_news = time.monotonic()
        while not self._closing.is_set():
            summary_path = self.run_path / SUMMARY_FILE
            # The summary is read before the lines: every line is written before it, so none is missed.
            if summary_path.is_file():
                self._final = _read_json_file(summary_path, "run summary")
            lines = self._reader.read_lines(final=self._final is not None)
            for number, line in lines:
                self._consume(number, line)
            if self._final is not None:
                self._end(self._final)
                return
            now = time.monotonic()
            if self._reader.grew:
                last_news = now
                if self._status == "silent":
                    self._status = "running"
            elif self._status == "running" and now - last_news >= self.silent_after:
                self._status = "silent"
                self._emit("silent", self._step, silent_after=self.silent_after, run_dir=str(self.run_path))
            self._closing.wait(self.poll_interval)

    def _consume(self, number: int, line: bytes) -> None:
        try:
            record = parse_record(line)
        except ValueError as error:
            self.skipped_lines.append(f"line {number}: {error}")
            return
        step = record.get("step")
        self._step = int(step) if _is_number(step) else self._step
        if not self._compiled:  # the trainer emits "compiled" just before its first record
            self._compiled = True
            compile_s = (self._final or {}).get("compile_s")
            self._emit("compiled", self._step, compile_s=round(compile_s, 3) if _is_number(compile_s) else None)
        data = {key: value for key, value in record.items() if key != "step"}
        if any(key.startswith("eval_") for key in data):
            self._emit("eval", self._step, **data)
        elif any(key.startswith(SYNC_PREFIX) for key in data):
            self._emit("sync", self._step, **{key.removeprefix(SYNC_PREFIX): value for key, value in data.items()})
        else:
            self._emit("metrics", self._step, **data)

    def _end(self, summary: dict[str, Any]) -> None:
        steps = summary.get("steps")
        step = int(steps) if _is_number(steps) else self._step
        self._summary = {"run": self.run_name, "run_dir": str(self.run_path), **summary}
        self._status = str(summary.get("status", "finished"))
        self._emit("end", step, **summary)


class _LineReader:
    """The complete lines appended to a file since the last read, numbered from 1 (a half-written last
    line is kept until its newline arrives)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""
        self.numbered = 0
        self.grew = False

    def read_lines(self, final: bool = False) -> list[tuple[int, bytes]]:
        """The new complete lines; with ``final`` (the writer has finished), a last line without newline too."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        self.grew = bool(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial.strip():
            lines, self.partial = [*lines, self.partial], b""  # a crash mid-line: tried, skipped if garbled
        numbered = []
        for line in lines:
            self.numbered += 1
            if line.strip():
                numbered.append((self.numbered, line))
        return numbered


def follow_run(run: str | os.PathLike | Run, run_root: str | os.PathLike = "runs", *,
               poll_interval: float = POLL_INTERVAL_S, silent_after: float = SILENT_AFTER_S,
               appear_timeout: float = APPEAR_TIMEOUT_S, stopper: Callable[[], Any] | None = None) -> RunFollower:
    """Start following a run (see :class:`RunFollower` for the arguments); events so far are in ``history``.

    Example:
        >>> follower = follow_run("mlp-dp", silent_after=60)
        >>> follower.wait(300)["status"], [event.kind for event in follower.history][:3]
        ('finished', ['start', 'compiled', 'metrics'])
    """
    follower = RunFollower(run, run_root, poll_interval=poll_interval, silent_after=silent_after,
                           appear_timeout=appear_timeout, stopper=stopper)
    return follower.start()
