"""A profile read back: the timeline of the profiled steps and the memory per device three ways.

:func:`read_profile` reads what :meth:`Trainer.profile <workbench.training.trainer.Trainer.profile>` captured
into ``<run>/profile/step-<S>/`` (:mod:`workbench.training.profiling`): JAX's Perfetto trace becomes a
:class:`~.timeline.Timeline` (ops per device per step, compute against collectives, each collective's bandwidth
from its ledger bytes); the live samples, the compiled step's memory analysis and the layout engine's
prediction (:func:`~.step_memory.planned_step_memory` of the run's config) become a
:class:`~.memory_comparison.MemoryComparison`. Both are written beside the capture (``timeline.json``,
``memory.json``) so a later reader skips the parsing. A trace that cannot be parsed (JAX changes the format)
leaves ``timeline`` None and ``timeline_error`` saying why; the raw files stay for xprof or Perfetto.

Example:
    >>> report = read_profile("runs/mlp-dp")  # the run's latest profile
    >>> report.run, report.first_step, report.steps, report.timeline_error
    ('mlp-dp', 2, 3, None)
    >>> print(report.how_to_open())
    the full trace: runs/mlp-dp/profile/step-000002/.../perfetto_trace.json.gz: drag it into the Perfetto UI ...
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..training.config import TrainConfig
from ..training.profiling import ProfileCapture, ProfileError, profile_folders, read_capture
from ..training.step import build_abstract_step
from .memory_comparison import MemoryComparison, compare_memory
from .step_memory import NotSimulated, planned_step_memory
from .timeline import Timeline, TraceFormatError, find_trace_file, op_layers, read_timeline

TIMELINE_FILE = "timeline.json"
MEMORY_FILE = "memory.json"
PERFETTO_UI = "https://ui.perfetto.dev"


@dataclasses.dataclass(frozen=True)
class ProfileReport:
    """One profile, read: see the module docstring. ``perfetto_file`` is JAX's trace for the details."""

    run: str
    folder: Path
    first_step: int
    steps: int
    timeline: Timeline | None
    timeline_error: str | None
    memory: MemoryComparison
    perfetto_file: Path | None
    capture_error: str | None = None
    notes: tuple[str, ...] = ()

    def how_to_open(self) -> str:
        """Where the full trace is, and how to look at it."""
        if self.perfetto_file is None:
            return f"the raw profile is in {self.folder}: open it with xprof (pip install xprof; xprof {self.folder})"
        return (f"the full trace: {self.perfetto_file}: drag it into the Perfetto UI ({PERFETTO_UI}), or run "
                f"xprof {self.folder} if xprof is installed (pip install xprof)")


def _predicted(config: dict[str, Any], backend: str) -> tuple[Any, str | None]:
    """The layout engine's step memory for the run's config, as ``backend``'s compiler holds it (None and why
    where it has none)."""
    if str(config.get("model", "")).startswith("custom:"):
        return None, ("your own model: its prediction needs the model and an example batch (plan_training(model=..., "
                      "example_batch=...))")
    try:
        return planned_step_memory(TrainConfig.from_json(config), compiler=backend), None
    except (NotSimulated, WorkbenchError) as exc:
        return None, str(exc)


def _run_config(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder.parent.parent / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _layers(config: dict[str, Any]) -> tuple[str, ...]:
    """The model's submodule paths, from the run's config (none for your own model: ops keep their names)."""
    if not config or str(config.get("model", "")).startswith("custom:"):
        return ()
    try:
        step = build_abstract_step(TrainConfig.from_json(config))
        return tuple(step.layers)
    except WorkbenchError:
        return ()


def read_profile(source: ProfileCapture | str | Path, *, reparse: bool = False) -> ProfileReport:
    """Read a profile: a :class:`~workbench.training.profiling.ProfileCapture`, a profile folder, or a run folder
    (its latest profile). The parsed timeline and memory are kept beside it and reused unless ``reparse``.

    Raises:
        ProfileError: no profile there.

    Example:
        >>> report = read_profile("runs/mlp-dp")
        >>> len(report.timeline.steps), 0 < report.timeline.steps[0].collective_share < 1
        (3, True)
    """
    folder = Path(source.folder if isinstance(source, ProfileCapture) else source)
    if not (folder / "capture.json").exists():
        found = profile_folders(folder)
        if not found:
            raise ProfileError(f"no profile in {folder}: profile a run (Trainer.profile(steps=5) while it trains, or "
                               "workbench train --profile 5)")
        folder = found[-1]
    capture = read_capture(folder)
    config = _run_config(folder)
    layers = _layers(config)
    timeline, timeline_error, perfetto = _timeline(folder, capture, config, layers, reparse)
    memory = _memory(folder, capture, config, reparse)
    notes = tuple(note for note in (_stale_names(capture["programs"].values(), layers),) if note)
    return ProfileReport(capture["run"], folder, capture["first_step"], capture["steps"], timeline, timeline_error,
                         memory, perfetto, capture.get("error"), notes)


def _stale_names(programs: Any, layers: tuple[str, ...]) -> str | None:
    """Why no op names a layer although the model has layers: the step came from JAX's compilation cache, compiled
    by a version of the code that named its ops otherwise (the cache's key leaves op metadata out)."""
    texts = [text for text in programs if text]
    if not layers or not texts or any(any(op_layers(text, layers).values()) for text in texts):
        return None
    return ("the compiled step names no layer of the model (its op names came from JAX's compilation cache, compiled "
            "by another version of the code): run workbench cache --clear, then profile again to see layers")


def _timeline(folder: Path, capture: dict[str, Any], config: dict[str, Any], layers: tuple[str, ...], reparse: bool):
    saved = folder / TIMELINE_FILE
    try:
        perfetto = find_trace_file(folder)
    except TraceFormatError as exc:
        return None, str(exc), None
    if saved.exists() and not reparse:
        return Timeline.from_json(json.loads(saved.read_text())), None, perfetto
    programs = capture["programs"]
    # One text per profiled step (a logging step runs the diagnostics variant); none for a mode of several programs.
    texts = ([programs.get(logging) or programs.get(not logging) for logging in capture["logging_steps"]]
             if programs else [])
    try:
        timeline = read_timeline(perfetto, hlo_text=texts or None, mesh=config.get("mesh"), layers=layers,
                                 module=capture.get("module"), first_step=capture["first_step"])
    except TraceFormatError as exc:
        return None, str(exc), perfetto
    saved.write_text(json.dumps(timeline.to_json()))
    return timeline, None, perfetto


def _memory(folder: Path, capture: dict[str, Any], config: dict[str, Any], reparse: bool) -> MemoryComparison:
    saved = folder / MEMORY_FILE
    if saved.exists() and not reparse:
        return MemoryComparison.from_json(json.loads(saved.read_text()))
    backend = capture.get("backend", "cpu")  # captures before the backend was recorded ran on CPU devices
    predicted, why = _predicted(config, backend) if config else (None, "the run's config.json is missing")
    compiled = capture.get("compiled_memory")
    memory = compare_memory(predicted, compiled, capture["live_samples"], predicted_note=why,
                            compiled_note=None if compiled else "the mode runs several programs: no one compiled step")
    saved.write_text(json.dumps(memory.to_json()))
    return memory


__all__ = ["MEMORY_FILE", "PERFETTO_UI", "ProfileReport", "TIMELINE_FILE", "read_profile"]
