"""A profiled step in time, per device: which ops ran when, compute against collectives, read from a trace.

JAX's profiler writes a Perfetto (Chrome-trace JSON) file whose events include one per HLO op per device per
execution (``args``: ``hlo_module``, ``hlo_op``, ``device_ordinal``, ``run_id``). :func:`read_timeline` turns
them into a :class:`Timeline`: the ops of each profiled step on each device, and per step
(:class:`StepTiming`) the time in compute, in collectives and in both at once, and the slowest device; per
collective (:class:`CollectiveTiming`) its ledger bytes, its duration (waiting for the last device included),
the transfer after the last device arrived, and the bandwidth achieved. The step's optimised HLO names each
op's kind, bytes and model layer. A trace it cannot read raises :class:`TraceFormatError`; the raw files are
never touched. What the trace holds on XLA:CPU and how it is read: docs/design/profiling.md.

Example:
    >>> compiled = mode.compile_step(mode.place_state(state), mode.place_batch(batch))  # what runs/mlp-dp ran
    >>> timeline = read_timeline("runs/mlp-dp/profile", hlo_text=compiled.as_text(), mesh=mode.mesh)
    >>> len(timeline.steps), all(0 < step.collective_share < 1 for step in timeline.steps)
    (3, True)
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..training.layer_scopes import layer_of
from .collectives import COLLECTIVE_KINDS, CollectiveRecord
from .hlo import collective_ops

COMPUTE = "compute"
PERFETTO_FILE = "perfetto_trace.json.gz"
# An op's name starts with its kind, written with '-' or '_' (``all-reduce.8``, ``all_gather.207``).
_COLLECTIVE_NAME = re.compile("^(" + "|".join(kind.replace("-", "[-_]") for kind in COLLECTIVE_KINDS) + ")")
_OP_NAME = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?metadata=\{[^}]*?op_name="((?:[^"\\]|\\.)*)"', re.M)


class TraceFormatError(WorkbenchError):
    """A profiler trace this version of the workbench cannot read (JAX changes the format between versions)."""


@dataclasses.dataclass(frozen=True)
class TimedOp:
    """One HLO op on one device in one step; times in microseconds from the step's first op (any device).

    ``kind`` is ``"compute"`` or a collective kind (``"all-reduce"``, ...); ``layer`` the model layer its
    metadata names (None: the loss, the optimizer, or no HLO given); ``bytes`` a collective's bytes per device.
    """

    device: int
    step: int
    name: str
    kind: str
    start_us: float
    duration_us: float
    layer: str | None = None
    bytes: int | None = None

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us

    @property
    def is_collective(self) -> bool:
        return self.kind != COMPUTE


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """One step's time: ``wall_us`` from its first op's start to its last op's end (any device); ``compute_us``,
    ``collective_us`` and ``overlap_us`` the mean over devices of the time spent in compute, in collectives and
    in both at once; ``slowest_device`` the device with the most compute, ``slowest_compute_us`` its compute."""

    step: int
    wall_us: float
    compute_us: float
    collective_us: float
    overlap_us: float
    slowest_device: int
    slowest_compute_us: float

    @property
    def collective_share(self) -> float:
        """The fraction of the step spent communicating and not computing at the same time."""
        return (self.collective_us - self.overlap_us) / self.wall_us if self.wall_us else 0.0


@dataclasses.dataclass(frozen=True)
class CollectiveTiming(CollectiveRecord):
    """One collective op of the step, over every profiled step and device.

    ``duration_us`` is the median time each device spent in it (waiting for the others included);
    ``transfer_us`` the median time from the last device's arrival to each device's end: the exchange itself,
    and ``bandwidth`` = ``bytes`` / ``transfer_us`` in bytes per second (None when either is unknown or 0).
    """

    name: str
    kind: str
    bytes: int | None
    axes: tuple[str, ...]
    layer: str | None
    occurrences: int
    duration_us: float
    transfer_us: float

    @property
    def bandwidth(self) -> float | None:
        return self.bytes / (self.transfer_us * 1e-6) if self.bytes and self.transfer_us > 0 else None


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The profiled steps of one program: ops per device and step, and their summaries (see the module docstring).

    ``module`` is the HLO module name (``jit__step_fn``); ``first_step`` the training step of ``steps[0]`` when
    known (else 0); ``trace_file`` the Perfetto file read.
    """

    module: str
    devices: tuple[int, ...]
    ops: tuple[TimedOp, ...]
    steps: tuple[StepTiming, ...]
    collectives: tuple[CollectiveTiming, ...]
    trace_file: str
    first_step: int = 0

    def step_ops(self, step: int) -> list[TimedOp]:
        """The ops of profiled step ``step`` (0 = the first profiled), ordered by device then start."""
        return sorted((op for op in self.ops if op.step == step), key=lambda op: (op.device, op.start_us))

    def collective_time_by_kind(self) -> dict[str, float]:
        """Median microseconds per step in each collective kind (summed over its ops), largest first."""
        totals: dict[str, float] = defaultdict(float)
        for c in self.collectives:
            totals[c.kind] += c.duration_us * c.occurrences
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def collective_bytes_by_kind(self) -> dict[str, int]:
        """Bytes per device per step in each collective kind: each op's ledger bytes times how often it runs in a
        step, in :meth:`collective_time_by_kind`'s order (comparable with the ledger's ``bytes_by_kind()``).
        A kind whose bytes are unknown (the trace was read without the step's HLO) is left out."""
        totals: dict[str, int] = {}
        for kind in self.collective_time_by_kind():
            mine = [c for c in self.collectives if c.kind == kind]
            sizes = [c.bytes * c.occurrences for c in mine if c.bytes is not None]
            if len(sizes) == len(mine):  # every op's bytes are known
                totals[kind] = sum(sizes)
        return totals

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module, "devices": list(self.devices), "trace_file": self.trace_file,
            "first_step": self.first_step,
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "collectives": [{**dataclasses.asdict(c), "axes": list(c.axes)} for c in self.collectives],
            "ops": [dataclasses.astuple(op) for op in self.ops],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        return cls(
            module=data["module"], devices=tuple(data["devices"]), trace_file=data["trace_file"],
            first_step=data.get("first_step", 0),
            ops=tuple(TimedOp(*row) for row in data["ops"]),
            steps=tuple(StepTiming(**s) for s in data["steps"]),
            collectives=tuple(CollectiveTiming(**{**c, "axes": tuple(c["axes"])}) for c in data["collectives"]),
        )


# --- reading ---------------------------------------------------------------------------------------------


def find_trace_file(folder: str | Path) -> Path:
    """The newest ``perfetto_trace.json.gz`` under ``folder`` (JAX writes ``plugins/profile/<time>/``).

    Raises:
        TraceFormatError: there is none (the capture failed, or JAX wrote another format).
    """
    found = sorted(Path(folder).glob(f"**/{PERFETTO_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        kept = sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file())[:6]
        raise TraceFormatError(f"no {PERFETTO_FILE} under {folder} (found {kept or 'no files'}): this JAX may write "
                               "another format; the raw files are kept, open them with xprof or TensorBoard")
    return found[-1]


def trace_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a (gzipped) Chrome/Perfetto trace JSON file.

    Raises:
        TraceFormatError: the file is not gzipped JSON with a ``traceEvents`` list.
    """
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, EOFError, ValueError) as exc:
        raise TraceFormatError(f"the trace {path} could not be read ({type(exc).__name__}: {exc}); the raw files "
                               "are kept: open them with xprof or the Perfetto UI") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceFormatError(f"the trace {path} has no traceEvents list: this JAX writes another format; the raw "
                               "files are kept: open them with xprof or the Perfetto UI")
    return events


def op_layers(hlo_text: str, layers: Iterable[str]) -> dict[str, str | None]:
    """HLO instruction name -> the model layer its ``op_name`` metadata names (None: none of ``layers``).

    Example:
        >>> op_layers('%dot.3 = f32[8] dot(%a, %b), metadata={op_name="jit(f)/jvp(blocks/0)/mlp/dot_general"}',
        ...           ["blocks/0", "blocks/0/mlp"])
        {'dot.3': 'blocks/0/mlp'}
    """
    layers = list(layers)
    return {name: layer_of(op_name, layers) for name, op_name in _OP_NAME.findall(hlo_text)}


@dataclasses.dataclass
class _Raw:
    device: int
    run: str
    name: str
    start: float
    end: float


_GPU_PROCESS = re.compile(r"^/device:GPU:(\d+)$")


def _process_names(events: Sequence[dict[str, Any]]) -> dict[Any, str]:
    return {event.get("pid"): str(event.get("args", {}).get("name", "")) for event in events
            if isinstance(event, dict) and event.get("ph") == "M" and event.get("name") == "process_name"}


def _launch_runs(events: Sequence[dict[str, Any]]) -> dict[str, str]:
    """GPU traces: the run each kernel launch belongs to, by its ``correlation_id``.

    A GPU's kernels carry no run: their launch on the host does (``cuGraphLaunch``, ``cuLaunchKernel``, with the
    kernel's correlation id), inside the host's ``Execute`` event of one run (``run_id``). Launches outside
    every run are left out (their kernels then fall back to one run per correlation id).
    """
    runs = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e["args"]["run_id"]))
                  for e in events if isinstance(e, dict) and e.get("ph") == "X"
                  and isinstance(e.get("args"), dict) and "run_id" in e["args"] and "ts" in e)
    found: dict[str, str] = {}
    for event in events:
        args = event.get("args") if isinstance(event, dict) else None
        if not isinstance(args, dict) or "correlation_id" not in args or "hlo_op" in args or "ts" not in event:
            continue
        at = float(event["ts"])
        for start, end, run in runs:
            if start <= at <= end:
                found[str(args["correlation_id"])] = run
                break
    return found


def _device_events(events: Sequence[dict[str, Any]], module: str | None) -> tuple[str, list[_Raw]]:
    """The op events of the chosen program (``module``, else the one with the most op events).

    XLA:CPU's events name their device and run (``device_ordinal``, ``run_id``); a GPU's kernels lie on its
    stream threads in process ``/device:GPU:N`` and are tied to their run through their launch
    (:func:`_launch_runs`).
    """
    processes = _process_names(events)
    launches: dict[str, str] | None = None
    by_module: dict[str, list[_Raw]] = defaultdict(list)
    for event in events:
        args = event.get("args") if isinstance(event, dict) else None
        if event.get("ph") != "X" or not isinstance(args, dict) or "hlo_op" not in args:
            continue
        try:
            start, end = float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0.0))
            gpu = _GPU_PROCESS.match(processes.get(event.get("pid"), ""))
            if "device_ordinal" in args or gpu is None:
                raw = _Raw(int(args["device_ordinal"]), str(args["run_id"]), str(args["hlo_op"]), start, end)
            else:
                launches = _launch_runs(events) if launches is None else launches
                correlation = str(args["correlation_id"])
                raw = _Raw(int(gpu[1]), launches.get(correlation, f"launch {correlation}"), str(args["hlo_op"]),
                           start, end)
        except (KeyError, TypeError, ValueError):
            continue  # a field missing or renamed: counted below only if nothing is left
        by_module[str(args.get("hlo_module", ""))].append(raw)
    if not by_module:
        raise TraceFormatError("the trace holds no per-device HLO op events (XLA:CPU's args hlo_op, device_ordinal, "
                               "run_id, or kernels on a /device:GPU:N stream with hlo_op and correlation_id): this "
                               "JAX writes another format; the raw files are kept: open them with xprof or the "
                               "Perfetto UI")
    if module is None:
        module = max(by_module, key=lambda name: len(by_module[name]))
    elif module not in by_module:
        raise TraceFormatError(f"the trace holds no ops of program {module!r}, only of {sorted(by_module)}")
    return module, by_module[module]


def _merged(raw: list[_Raw]) -> list[_Raw]:
    """One interval per op, run and device: XLA:CPU splits an op over worker threads, each with its own event."""
    merged: dict[tuple, _Raw] = {}
    for r in raw:
        key = (r.run, r.device, r.name)
        if key in merged:
            seen = merged[key]
            seen.start, seen.end = min(seen.start, r.start), max(seen.end, r.end)
        else:
            merged[key] = _Raw(r.device, r.run, r.name, r.start, r.end)
    return list(merged.values())


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, high - low)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _step_timing(step: int, ops: list[TimedOp], devices: Sequence[int]) -> StepTiming:
    compute, collective, overlap = {}, {}, {}
    by_device: dict[int, list[TimedOp]] = defaultdict(list)
    for op in ops:
        by_device[op.device].append(op)
    for device in devices:
        mine = by_device[device]
        busy = _union((op.start_us, op.end_us) for op in mine if not op.is_collective)
        talking = _union((op.start_us, op.end_us) for op in mine if op.is_collective)
        compute[device], collective[device] = _length(busy), _length(talking)
        overlap[device] = _intersection(busy, talking)
    slowest = max(devices, key=lambda d: compute[d])
    mean = lambda values: sum(values.values()) / len(values)  # noqa: E731
    wall = max(op.end_us for op in ops) - min(op.start_us for op in ops)
    return StepTiming(step, wall, mean(compute), mean(collective), mean(overlap), slowest, compute[slowest])


def _collective_timings(ops: list[TimedOp], axes: dict[str, tuple[str, ...]],
                        steps: int) -> tuple[CollectiveTiming, ...]:
    by_name: dict[str, list[TimedOp]] = defaultdict(list)
    for op in ops:
        if op.is_collective:
            by_name[op.name].append(op)
    rows = []
    for name, mine in by_name.items():
        transfers, by_step = [], defaultdict(list)
        for op in mine:
            by_step[op.step].append(op)
        for here in by_step.values():
            arrived = max(op.start_us for op in here)  # the exchange starts when the last device arrives
            transfers += [max(0.0, op.end_us - arrived) for op in here]
        first, devices = mine[0], len({op.device for op in mine})
        per_step = max(1, round(len(mine) / (devices * max(steps, 1))))
        rows.append(CollectiveTiming(name, first.kind, first.bytes, axes.get(name, ()), first.layer, per_step,
                                     statistics.median(op.duration_us for op in mine), statistics.median(transfers)))
    return tuple(sorted(rows, key=lambda c: -c.duration_us * c.occurrences))


@dataclasses.dataclass(frozen=True)
class _OpTable:
    """What one program's HLO says of its ops: collective kinds, bytes and axes, and layers."""

    kinds: dict[str, str]
    sizes: dict[str, int]
    axes: dict[str, tuple[str, ...]]
    layers: dict[str, str | None]

    @classmethod
    def read(cls, hlo_text: str, mesh: Any, layers: Iterable[str]) -> _OpTable:
        ops = collective_ops(hlo_text, mesh)
        return cls({op.name: op.kind for op in ops}, {op.name: op.bytes for op in ops},
                   {op.name: op.axes for op in ops}, op_layers(hlo_text, layers))


def read_timeline(trace: str | Path, *, hlo_text: str | Sequence[str] | None = None, mesh: Any = None,
                  layers: Iterable[str] = (),
                  module: str | None = None, first_step: int = 0) -> Timeline:
    """Read a profiler trace into a :class:`Timeline` (see the module docstring).

    Args:
        trace: a ``perfetto_trace.json.gz`` file, or a folder holding one (the newest is read).
        hlo_text: the profiled program's optimised HLO (``compiled.as_text()``): classifies ops by opcode, gives
            collectives their bytes and mesh axes and ops their model layer. A list gives one per profiled step
            (a logging step runs another compiled variant, with other op names).
        mesh: the mesh the program runs on (names the axes a collective spans).
        layers: the model's submodule paths (``blocks/3/mlp``), to name each op's layer.
        module: the HLO module to read (default: the one with the most op events, i.e. the training step).
        first_step: the training step of the first profiled execution.

    Raises:
        TraceFormatError: the file is missing, unreadable, or holds no per-device op events.

    Example:
        >>> timeline = read_timeline("runs/mlp-dp/profile")
        >>> timeline.steps[0].slowest_device in range(8)
        True
    """
    path = find_trace_file(trace) if Path(trace).is_dir() else Path(trace)
    module, raw = _device_events(trace_events(path), module)
    raw = _merged(raw)
    texts = [hlo_text] if isinstance(hlo_text, str) else list(hlo_text or [])
    tables = {text: _OpTable.read(text, mesh, layers) for text in set(texts)}
    origin: dict[str, float] = {}
    for r in raw:
        origin[r.run] = min(origin.get(r.run, r.start), r.start)
    runs = sorted(origin, key=origin.__getitem__)
    index = {run: i for i, run in enumerate(runs)}
    ops, axes, empty = [], {}, _OpTable({}, {}, {}, {})
    for r in raw:
        step = index[r.run]
        table = tables[texts[min(step, len(texts) - 1)]] if texts else empty
        kind = table.kinds.get(r.name) or _kind_from_name(r.name)
        ops.append(TimedOp(r.device, step, r.name, kind, round(r.start - origin[r.run], 3),
                           round(r.end - r.start, 3), table.layers.get(r.name), table.sizes.get(r.name)))
        if r.name in table.axes:
            axes[r.name] = table.axes[r.name]
    ops.sort(key=lambda op: (op.step, op.device, op.start_us))
    devices = tuple(sorted({op.device for op in ops}))
    by_step: dict[int, list[TimedOp]] = defaultdict(list)
    for op in ops:
        by_step[op.step].append(op)
    steps = tuple(_step_timing(i, by_step[i], devices) for i in range(len(runs)))
    timings = _collective_timings(ops, axes, len(runs))
    return Timeline(module, devices, tuple(ops), steps, timings, str(path), first_step)


def _kind_from_name(name: str) -> str:
    """A collective's kind read from its op name (``all-reduce.8``, ``all_gather.207``), else compute."""
    found = _COLLECTIVE_NAME.match(name)
    return found[1].replace("_", "-") if found else COMPUTE


__all__ = ["COMPUTE", "CollectiveTiming", "PERFETTO_FILE", "StepTiming", "TimedOp", "Timeline", "TraceFormatError",
           "find_trace_file", "op_layers", "read_timeline", "trace_events"]
