"""Training runs on disk: written as they go, so a crashed kernel loses nothing; listed and reloaded.

Each run is one folder under a run root (``runs/`` by default)::

    runs/<name>/config.json     written once, at the start: the run's settings, plus "name" and "created"
    runs/<name>/metrics.jsonl   one JSON object per line, appended and flushed once per logging interval
    runs/<name>/summary.json    written at the end: "status", "ended" and the final figures

:class:`RunWriter` writes a run; :func:`load_run` reads one back as a :class:`Run` and :func:`list_runs`
reads them all (:mod:`workbench.training.run_reports` puts several side by side). A run with no
``summary.json`` crashed or is still going: its status is ``"incomplete"`` and its metrics are every line
that made it to disk. A crash mid-line leaves a truncated last line, which reading skips.

The files are strict JSON, never pickle: any tool can read them and loading one runs no code. Strict JSON
has no NaN or infinity, yet a diverging run logs exactly those, so they are written as the strings
``"nan"``, ``"inf"`` and ``"-inf"`` and read back as floats (in values, never in keys). A value that is
one of those strings to begin with therefore also reads back as a float.

This module needs only the standard library: it never imports JAX, so a notebook can browse past runs
without starting a backend.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from ..errors import RunError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
END_STATUSES = ("finished", "stopped", "failed")  # how a run can end; the trainer adds its live states
INCOMPLETE = "incomplete"  # the status of a run with no summary.json: crashed, or still running
_LISTED_NAMES = 10  # how many run names an error message lists

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    # Always with microseconds: ISO strings in one format sort as the times they name, even within a second.
    return moment.isoformat(timespec="microseconds")


# --- JSON with non-finite floats ---------------------------------------------------------------


def _encode(value: Any, what: str, where: str = "") -> Any:
    """``value`` as plain JSON data (non-finite floats as strings), or a RunError naming the key ``where``.

    ``what`` says whose value it is ("config", "metrics record", "summary"); ``where`` is the key path.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # an IntEnum or other int subclass writes as its number
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                inside = f"{what} key {where!r}" if where else what
                raise RunError(
                    f"{inside} has key {key!r} of type {type(key).__name__}: "
                    f"JSON keys must be strings, use {str(key)!r} instead"
                )
            encoded[key] = _encode(item, what, f"{where}.{key}" if where else key)
        return encoded
    if isinstance(value, (list, tuple)):
        return [_encode(item, what, f"{where}[{index}]") for index, item in enumerate(value)]
    item = getattr(value, "item", None)
    if callable(item):  # NumPy and JAX scalars, and arrays of one element
        try:
            number = item()
        except (ValueError, TypeError) as error:
            shape = getattr(value, "shape", "?")
            raise RunError(
                f"cannot write {what} key {where!r}: it is a {type(value).__name__} of shape {shape}, not one "
                f"number ({error}); log a number such as float(x.mean()), or x.tolist() for a short list"
            ) from None
        if type(number) is not type(value):  # a value whose item() is itself would recurse forever
            return _encode(number, what, where)
    raise RunError(
        f"cannot write {what} key {where!r}: a {type(value).__name__} ({value!r:.60}) is not JSON; "
        "use numbers, strings, booleans, None, lists or dicts (e.g. str(value) for a path)"
    )


def _decode(value: Any) -> Any:
    """Read-side inverse of :func:`_encode`: the strings "nan", "inf", "-inf" in values become floats."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {key: _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def _dumps(data: Any) -> str:
    # allow_nan=False: _encode has replaced every non-finite float, and this proves nothing slipped through.
    return json.dumps(data, allow_nan=False)


def _write_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so a reader sees the old file or the whole new one, never half."""
    _write_text_atomically(path, json.dumps(data, allow_nan=False, indent=2) + "\n")


def _write_text_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())  # on disk before the rename, or a power cut could leave an empty file
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _read_json_file(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunError(f"{what} {str(path)!r} is not valid JSON ({error}): fix or delete the file") from None
    if not isinstance(data, dict):
        raise RunError(f"{what} {str(path)!r} holds a {type(data).__name__}, not a JSON object: fix or delete it")
    return _decode(data)


# --- names -------------------------------------------------------------------------------------


def _check_name(name: Any) -> str:
    """``name`` if it is one plain folder name, else a RunError: a run never writes outside its run root."""
    if not isinstance(name, str) or not name.strip():
        raise RunError(f"run name {name!r} is empty or not a string: pass e.g. name='mlp-baseline', or name=None")
    if "/" in name or "\\" in name or (os.altsep and os.altsep in name) or ".." in name or name == ".":
        raise RunError(
            f"run name {name!r} contains a path separator or '..': a run name is one folder name such as "
            "'mlp-baseline'; choose the folder with run_root= instead"
        )
    if "\0" in name:
        raise RunError(f"run name {name!r} contains a NUL character: use letters, digits, '.', '_' and '-'")
    return name


def _clean_name(text: str) -> str:
    """``text`` reduced to letters, digits, '.', '_' and '-', with no '--', '..' or leading/trailing marks."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)
    cleaned = re.sub(r"-{2,}", "-", re.sub(r"\.{2,}", ".", cleaned)).strip("-.")
    return cleaned or "run"


def _auto_name(config: Mapping[str, Any], moment: datetime) -> str:
    return _clean_name(f"{config.get('model', 'run')}-{config.get('mode', '')}-{moment:%Y%m%d-%H%M%S}")


def _make_run_folder(root: Path, name: str) -> tuple[str, Path]:
    """Create ``root/name``, or ``root/name-2``, ``-3``, ... if taken; return the name and folder used."""
    if root.exists() and not root.is_dir():
        raise RunError(f"run_root {str(root)!r} is a file, not a folder: pass a folder path such as 'runs'")
    root.mkdir(parents=True, exist_ok=True)
    candidate, suffix = name, 1
    while True:
        try:
            # mkdir either creates the folder or fails: two writers starting at once never share one.
            (root / candidate).mkdir()
            return candidate, root / candidate
        except FileExistsError:
            suffix += 1
            candidate = f"{name}-{suffix}"


# --- writing -----------------------------------------------------------------------------------


class RunWriter:
    """Writes one training run to ``<run_root>/<name>/`` as it goes.

    Creating the writer makes the folder and writes ``config.json`` (with ``"name"`` and ``"created"``,
    an ISO-8601 UTC time, added; they replace any keys of those names in ``config``). :meth:`append`
    adds one line to ``metrics.jsonl`` and flushes it, so a crash loses at most the line being written.
    :meth:`finish` writes ``summary.json`` and closes the metrics file.

    An existing run is never overwritten: if the folder is taken, ``-2``, ``-3``, ... is appended to
    the name, even when the name was passed explicitly. Read :attr:`name` for the name actually used.

    As a context manager it always ends the run: an exception finishes it as ``"failed"`` (a
    ``KeyboardInterrupt``, i.e. stopping the kernel, as ``"stopped"``) with the error text in
    ``summary["error"]``, and is re-raised; leaving the block normally finishes it as ``"finished"``
    unless :meth:`finish` was already called.

    Args:
        run_root: the folder holding all runs, created if missing.
        name: the run's folder name; None makes ``<model>-<mode>-<UTC time>`` from ``config``.
        config: the run's settings (JSON values, NumPy scalars allowed).

    Attributes:
        name: the folder name actually used.
        path: the run's folder, ``Path(run_root) / name``.
        config: the config as written, with ``"name"`` and ``"created"``.

    Raises:
        RunError: a name that is empty or holds a path separator or '..', or a config value that is not JSON.

    Example:
        >>> with RunWriter("runs", config={"model": "mlp", "mode": "dp", "lr": 1e-3}) as run:
        ...     for step in range(100):
        ...         run.append({"step": step, "loss": 1.0 / (step + 1)})
        ...     run.finish("finished", final_loss=0.01)
        >>> run.name  # <model>-<mode>-<UTC time>
        'mlp-dp-...'
    """

    def __init__(self, run_root: str | os.PathLike = "runs", name: str | None = None, config: Mapping | None = None):
        config = {} if config is None else config
        if not isinstance(config, Mapping):
            raise RunError(f"config must be a dict, got {type(config).__name__}: pass e.g. config={{'model': 'mlp'}}")
        encoded = _encode(dict(config), "config")  # check before creating anything: a bad config leaves no folder
        created = _utc_now()
        wanted = _check_name(_auto_name(config, created) if name is None else name)
        self.name, self.path = _make_run_folder(Path(run_root), wanted)
        self.config = {**dict(config), "name": self.name, "created": _iso(created)}
        _write_atomically(self.path / CONFIG_FILE, {**encoded, "name": self.name, "created": _iso(created)})
        # Kept open in append mode for the whole run; every line is flushed by append().
        self._metrics = open(self.path / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        self._status: str | None = None

    @classmethod
    def adopt(cls, path: str | os.PathLike, config: Mapping | None = None) -> RunWriter:
        """A writer for the run already begun in ``path`` (by another process: a launcher reserves the folder,
        one of its workers writes the run). ``config``, if given, replaces ``config.json`` (``name`` and
        ``created`` kept); metrics are appended after any already written.

        Raises:
            RunError: ``path`` holds no run (no ``config.json``) or the run has ended (``summary.json``).

        Example:
            >>> folder = RunWriter("runs", "mlp-dp-workers", {"model": "mlp"}).hand_over()  # the launcher's
            >>> writer = RunWriter.adopt(folder, {"model": "mlp", "processes": 2})  # a worker's
            >>> writer.append({"step": 10, "loss": 0.52}); writer.finish("finished")
            >>> load_run("mlp-dp-workers").config["processes"]
            2
        """
        path = Path(path)
        begun = _read_json_file(path / CONFIG_FILE, "config") if (path / CONFIG_FILE).is_file() else None
        if begun is None:
            raise RunError(f"{str(path)!r} holds no run (no {CONFIG_FILE}): start one with RunWriter(run_root, name)")
        if (path / SUMMARY_FILE).exists():
            raise RunError(f"run {path.name!r} has already ended ({SUMMARY_FILE} exists): start a new run")
        return cls._continuing(path, begun, config)

    @classmethod
    def _continuing(cls, path: Path, begun: Mapping[str, Any], config: Mapping | None) -> RunWriter:
        """A writer appending to the run begun in ``path`` (its config ``begun``), with ``config`` written over it."""
        writer = cls.__new__(cls)
        writer.name, writer.path = path.name, path
        writer.config = {**dict(config if config is not None else begun), "name": begun["name"],
                         "created": begun["created"]}
        if config is not None:
            _write_atomically(path / CONFIG_FILE, _encode(writer.config, "config"))
        writer._metrics = open(path / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        writer._status = None
        return writer

    @classmethod
    def reopen(cls, path: str | os.PathLike, config: Mapping[str, Any], through_step: int) -> RunWriter:
        """A writer continuing the run in ``path`` after step ``through_step`` (resumed from a checkpoint):
        metrics of later steps are dropped, ``summary.json`` is removed (the run is going again and writes
        it at its end), ``config.json`` is replaced by ``config`` (``name`` and ``created`` kept).

        Raises:
            RunError: ``path`` holds no run (no ``config.json``).

        Example:
            >>> with RunWriter("runs", "mlp-dp-resumed", {"model": "mlp"}) as run:
            ...     for step in (100, 200, 300):
            ...         run.append({"step": step, "loss": 1 / step})
            >>> writer = RunWriter.reopen("runs/mlp-dp-resumed", {"model": "mlp"}, through_step=200)
            >>> again = load_run("mlp-dp-resumed")
            >>> [record["step"] for record in again.metrics], again.status
            ([100, 200], 'incomplete')
        """
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise RunError(f"{str(path)!r} holds no run (no {CONFIG_FILE}): pass a run's folder, e.g. runs/<name>")
        begun = _read_json_file(path / CONFIG_FILE, "config")
        kept = [record for record in _read_metrics(path / METRICS_FILE) if record.get("step", 0) <= through_step]
        _write_text_atomically(path / METRICS_FILE, "".join(_dumps(_encode(r, "metrics record")) + "\n" for r in kept))
        (path / SUMMARY_FILE).unlink(missing_ok=True)
        return cls._continuing(path, begun, config)

    def hand_over(self) -> Path:
        """Close this writer without ending the run, for another process to :meth:`adopt` it; its folder."""
        self._check_open("hand it over")
        self._metrics.close()
        self._status = "handed over"
        return self.path

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` has run (by hand or on leaving a ``with`` block)."""
        return self._status is not None

    def __repr__(self) -> str:
        return f"RunWriter({str(self.path)!r}, status={self._status or 'running'!r})"

    def _check_open(self, action: str) -> None:
        if self._status is not None:
            raise RunError(
                f"cannot {action}: run {self.name!r} already ended with status {self._status!r}; "
                "start a new RunWriter for another run"
            )

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line of ``metrics.jsonl`` and flush it to the operating system.

        Raises:
            RunError: the run has ended, ``record`` is not a dict, or a value is not JSON (the key is named).

        Example:
            >>> run = RunWriter("runs", "mlp-dp-by-hand", {"model": "mlp"})
            >>> run.append({"step": 10, "loss": 0.52, "accuracy": 0.81})
            >>> load_run(run.name).metrics
            [{'step': 10, 'loss': 0.52, 'accuracy': 0.81}]
        """
        self._check_open("append a record")
        if not isinstance(record, Mapping):
            raise RunError(
                f"a metrics record must be a dict, got {type(record).__name__} {record!r:.60}: "
                "pass e.g. {'step': 10, 'loss': 0.5}"
            )
        line = _dumps(_encode(record, "metrics record")) + "\n"  # encoded in full first, so a bad record writes nothing
        self._metrics.write(line)
        self._metrics.flush()

    def finish(self, status: str, **summary: Any) -> None:
        """End the run: write ``summary.json`` (``status``, ``"ended"`` time, then ``summary``), close the metrics.

        Args:
            status: ``"finished"``, ``"stopped"`` (cut short on purpose) or ``"failed"``.
            **summary: final figures, e.g. ``final_loss=0.01``, ``error="..."``; a key ``ended`` is replaced.

        Raises:
            RunError: an unknown status, a summary value that is not JSON, or a run that already ended.

        Example:
            >>> run = RunWriter("runs", "mlp-dp-by-hand", {"model": "mlp"})
            >>> run.finish("finished", final_loss=0.012, steps_done=1000)
            >>> load_run(run.name).summary
            {'status': 'finished', 'final_loss': 0.012, 'steps_done': 1000, 'ended': '...'}
        """
        self._check_open("finish it again")
        if status not in END_STATUSES:
            raise RunError(f"run status {status!r} is not one of {', '.join(END_STATUSES)}: "
                           "e.g. run.finish('finished')")
        encoded = _encode(summary, "summary")  # before anything changes: a bad value leaves the run open to retry
        _write_atomically(self.path / SUMMARY_FILE, {"status": status, **encoded, "ended": _iso(_utc_now())})
        self._status = status
        self._metrics.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if self._status is None:
            if exc is None:
                self.finish("finished")
            else:
                status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
                self.finish(status, error=f"{exc_type.__name__}: {exc}")
        return False  # never swallow the exception


# --- reading -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """A run read back from disk.

    Attributes:
        name: the folder name (what :func:`load_run` accepts).
        path: the run's folder.
        config: ``config.json``, with ``"name"`` and ``"created"``.
        metrics: the records of ``metrics.jsonl``, in order.
        summary: ``summary.json``, or None if the run never finished (crashed, or still running).

    Example:
        >>> run = load_run("mlp-dp")
        >>> run.status, run.final["step"], run.config["mode"]
        ('finished', 20, 'dp')
    """

    name: str
    path: Path
    config: dict
    metrics: list[dict]
    summary: dict | None

    @property
    def status(self) -> str:
        """``"finished"``, ``"stopped"``, ``"failed"``, or ``"incomplete"`` when there is no summary."""
        if self.summary is None:
            return INCOMPLETE
        return str(self.summary.get("status", INCOMPLETE))

    @property
    def final(self) -> dict[str, Any]:
        """The last value logged for every key, across all records (keys in order of first appearance).

        Example:
            >>> Run("r", Path("r"), {}, [{"step": 1, "loss": 2.0, "eval": 3.0}, {"step": 2, "loss": 1.0}], None).final
            {'step': 2, 'loss': 1.0, 'eval': 3.0}
        """
        final: dict[str, Any] = {}
        for record in self.metrics:
            final.update(record)
        return final

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of ``key`` over the records that hold a number for both ``"step"`` and ``key``.

        Raises:
            RunError: no record has both; the message lists the keys that do have steps.

        Example:
            >>> Run("r", Path("r"), {}, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}], None).series("loss")
            ([1, 2], [2.0, 1.0])
        """
        steps, values = [], []
        for record in self.metrics:
            step, value = record.get("step"), record.get(key)
            if _is_number(step) and _is_number(value):
                steps.append(int(step))
                values.append(float(value))
        if not steps:
            stepped = {k for r in self.metrics if _is_number(r.get("step")) for k, v in r.items() if _is_number(v)}
            available = sorted(stepped - {"step"})
            raise RunError(
                f"run {self.name!r} has no numeric {key!r} logged with a 'step': "
                + (f"choose one of {', '.join(available)}" if available else "it has no stepped metrics yet")
            )
        return steps, values


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_record(line: bytes) -> dict:
    """One line of ``metrics.jsonl`` as a record; ValueError when it is not a JSON object.

    Example:
        >>> parse_record(b'{"step": 3, "loss": "nan"}')
        {'step': 3, 'loss': nan}
    """
    record = json.loads(line.decode("utf-8"))  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return _decode(record)


def _read_metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl``; a garbled last line (a crash mid-write) is dropped, any other is an error."""
    if not path.exists():
        return []
    # Read bytes: a crash can cut a line inside a multi-byte character, which would stop a text-mode read.
    lines = [(number, line) for number, line in enumerate(path.read_bytes().split(b"\n"), 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(lines):
        try:
            records.append(parse_record(line))
        except ValueError as error:
            if index == len(lines) - 1:
                break  # the line being written when the run crashed
            raise RunError(
                f"{str(path)!r} line {number} is not a JSON object ({error}): "
                "fix or delete that line (only a garbled last line is skipped, as a crash mid-write)"
            ) from None
    return records


def _read_run(folder: Path) -> Run:
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise RunError(
            f"{str(folder)!r} is not a run folder: it has no {CONFIG_FILE}; "
            "pass a folder that RunWriter made, or a run name from list_runs()"
        )
    config = _read_json_file(config_path, "run config")
    summary_path = folder / SUMMARY_FILE
    summary = _read_json_file(summary_path, "run summary") if summary_path.exists() else None
    return Run(folder.name, folder, config, _read_metrics(folder / METRICS_FILE), summary)


def _created(folder: Path) -> datetime:
    """When the run in ``folder`` started, from its config; the earliest time if unknown."""
    earliest = datetime.min.replace(tzinfo=UTC)
    try:
        created = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("created")
        moment = datetime.fromisoformat(created)
    except (OSError, ValueError, TypeError, AttributeError):
        return earliest
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _run_folders(run_root: str | os.PathLike) -> list[Path]:
    """Every subfolder of ``run_root`` with a config.json, oldest first by "created", then by name."""
    root = Path(run_root).expanduser()
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file()]
    return sorted(folders, key=lambda p: (_created(p), p.name))


def _candidate_folders(run: Any, run_root: str | os.PathLike, caller: str) -> list[Path]:
    """Where a run named ``run`` may be, in the order looked at: a bare name under ``run_root``, then in
    the working directory; a path is itself."""
    if not isinstance(run, (str, os.PathLike)):
        raise RunError(f"{caller} takes a run name or folder path, got {type(run).__name__} {run!r:.60}")
    given = Path(run).expanduser()
    bare_name = len(given.parts) == 1 and not given.is_absolute()
    return [Path(run_root).expanduser() / given, given] if bare_name else [given]


def run_folder(run: str | os.PathLike, run_root: str | os.PathLike = "runs", caller: str = "run_folder") -> Path:
    """The folder of ``run`` as :func:`load_run` finds it, or where it will be (``run_root/run`` for a bare
    name) when it does not exist yet: e.g. for following a run that is about to start.

    Example:
        >>> run_folder("mlp-dp", run_root="runs").as_posix(), run_folder("elsewhere/mlp-dp").as_posix()
        ('runs/mlp-dp', 'elsewhere/mlp-dp')
    """
    candidates = _candidate_folders(run, run_root, caller)
    found = [folder for folder in candidates if (folder / CONFIG_FILE).is_file()]
    return (found or [folder for folder in candidates if folder.is_dir()] or candidates)[0]


def load_run(run: str | os.PathLike, run_root: str | os.PathLike = "runs") -> Run:
    """Read one run: ``run`` is a run name under ``run_root``, or the path of a run folder.

    A bare name is looked for under ``run_root`` first, then as a folder of that name in the working
    directory. A run that never finished loads too, with status ``"incomplete"``.

    Raises:
        RunError: no such run (the message lists up to 10 of the newest runs there), a folder with no
            ``config.json``, or a garbled file (named, with the line number for ``metrics.jsonl``).

    Example:
        >>> run = load_run("mlp-dp")
        >>> steps, losses = run.series("loss")
        >>> steps  # the first step, then every log_every=5
        [1, 5, 10, 15, 20]
    """
    candidates = _candidate_folders(run, run_root, "load_run")
    for folder in candidates:
        if (folder / CONFIG_FILE).is_file():
            return _read_run(folder)
    for folder in candidates:
        if folder.is_dir():
            return _read_run(folder)  # raises: a folder, but not a run folder
    looked = " and ".join(repr(str(c)) for c in dict.fromkeys(candidates))
    names = [p.name for p in _run_folders(run_root)]
    if not names:
        raise RunError(
            f"no run {str(run)!r} (looked for {looked}), and there are no runs in {str(run_root)!r} yet: "
            f"a training run writes one there (RunWriter(run_root={str(run_root)!r}, config=...)); "
            "pass run_root= if they live elsewhere"
        )
    newest = names[::-1][:_LISTED_NAMES]
    which = f"the {len(newest)} newest of {len(names)} runs" if len(names) > len(newest) else "the runs, newest first,"
    raise RunError(
        f"no run {str(run)!r} (looked for {looked}): {which} in {str(run_root)!r} are "
        f"{', '.join(newest)}; pass one of these names, or a run folder's path"
    )


def list_runs(run_root: str | os.PathLike = "runs") -> list[Run]:
    """Every run under ``run_root`` (each subfolder with a ``config.json``), oldest first.

    Runs are ordered by their config's ``"created"`` time, then by name. A missing ``run_root`` gives
    ``[]``; folders without ``config.json`` are skipped.

    Raises:
        RunError: a run's files are garbled (see :func:`load_run`); fix or delete that run.

    Example:
        >>> [(run.name, run.status) for run in list_runs("runs")][:2]
        [('mlp-dp', 'finished'), ('mlp-fsdp', 'finished')]
    """
    return [_read_run(folder) for folder in _run_folders(run_root)]
