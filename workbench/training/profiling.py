"""Profile a running training loop: JAX's profiler around N steady-state steps, and what is live on the devices.

:meth:`Trainer.profile <workbench.training.trainer.Trainer.profile>` hands the loop a :class:`ProfileRequest`;
at the next step boundary after the run's compiled steps (never the compiling one) the loop opens a
:class:`Capture`: ``jax.profiler.start_trace(<run>/profile/step-<S>/, create_perfetto_trace=True)``, then N
steps as usual (metrics are logged as always), each sampled just before dispatch for the bytes alive on every
device by role (:func:`live_bytes_by_device`: the state, the batch, copies of either, other), then the trace is
stopped once the last step has run. The capture writes, beside JAX's ``plugins/profile/<time>/`` files:

* ``capture.json``: run, first step, steps, the program's HLO module and which profiled steps were logging
  steps (a different compiled variant), the compiler's memory analysis of the step, the live samples;
* ``step.hlo.txt`` and ``logging_step.hlo.txt``: the optimised HLO of the two variants (op names, bytes, layers).

Reading it into a timeline and a memory comparison is :func:`workbench.analysis.profile_report.read_profile`'s
work, drawing it :mod:`workbench.views.profile_figures`' (the layers above). One profiler session runs per
process (JAX's rule): a second request, here or in another trainer, is refused with a message.

Example:
    >>> name = trainer.start(steps=1000); capture = trainer.profile(steps=5)
    >>> capture.folder
    PosixPath('runs/mlp-dp-.../profile/step-...')
    >>> trainer.stop(); summary = trainer.wait(); trainer.status
    'stopped'
"""

from __future__ import annotations

import dataclasses
import gc
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..errors import WorkbenchError

PROFILE_FOLDER = "profile"
CAPTURE_FILE = "capture.json"
HLO_FILES = {False: "step.hlo.txt", True: "logging_step.hlo.txt"}
MAX_PROFILE_STEPS = 100  # a trace of more steps is slow to write and to draw; a few steady steps tell the story
_SESSION = threading.Lock()  # JAX runs one profiler session per process


class ProfileError(WorkbenchError):
    """A profile that cannot be taken: nothing runs, one is being taken, bad steps, or the capture failed."""


def validate_profile_steps(steps: Any) -> int:
    """``steps`` as an int in 1..:data:`MAX_PROFILE_STEPS`, else a :class:`ProfileError` naming it."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_PROFILE_STEPS:
        raise ProfileError(f"profile steps={steps!r} must be a whole number from 1 to {MAX_PROFILE_STEPS}: a few "
                           "steady steps (5) show the pattern")
    return int(steps)


@dataclasses.dataclass(frozen=True)
class ProfileCapture:
    """What a profile left on disk: ``folder`` (``<run>/profile/step-<S>/``), the training steps
    ``first_step`` .. ``first_step + steps - 1``, and ``error`` when the capture itself failed (the run went on)."""

    run: str
    folder: Path
    first_step: int
    steps: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "folder": str(self.folder), "first_step": self.first_step, "steps": self.steps,
                "error": self.error}


class ProfileRequest:
    """A profile asked for and not yet taken: :meth:`result` waits for its :class:`ProfileCapture`."""

    def __init__(self, steps: int):
        self.steps = steps
        self._done = threading.Event()
        self._capture: ProfileCapture | None = None
        self._error: str | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def error(self) -> str | None:
        """Why no capture was taken (None: taken, or not yet done)."""
        return self._error

    def finish(self, capture: ProfileCapture | None = None, error: str | None = None) -> None:
        self._capture, self._error = capture, error
        self._done.set()

    def result(self, timeout: float | None = None) -> ProfileCapture:
        """The capture, once taken (waits at most ``timeout`` seconds).

        Raises:
            ProfileError: the wait timed out, the run ended first, or the capture failed.
        """
        if not self._done.wait(timeout):
            raise ProfileError(f"the profile of {self.steps} steps was not taken within {timeout} s: the steps are "
                               "slow or the run is paused; wait longer (profile(..., timeout=...))")
        if self._error is not None:
            raise ProfileError(self._error)
        if self._capture is None:  # finish() gives a capture or an error
            raise ProfileError("the profile finished without a capture")
        return self._capture


def _buffers(array: jax.Array) -> Iterable[tuple[Any, int, int]]:
    """(device, buffer address, bytes) of each shard of ``array`` this process holds (replicas included)."""
    for shard in array.addressable_shards:
        yield shard.device, shard.data.unsafe_buffer_pointer(), shard.data.nbytes


def _shape_key(array: Any) -> tuple:
    return (tuple(array.shape), str(array.dtype))  # any layout: a copy on one device is still a copy


def live_bytes_by_device(devices: Iterable[Any], known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The bytes of every live ``jax.Array`` on each of ``devices``, by role, as a JSON record.

    Args:
        devices: the devices to count (others' arrays are ignored).
        known: e.g. ``{"state": tree, "batch": tree}``: arrays that are these trees' leaves take that role, arrays
            shaped like one of their leaves (in any layout) take ``"<role> copy"``, the rest ``"other"``.

    Returns ``{"by_device": {id: {role: bytes}}, "in_use": {id: bytes} | None, "peak_in_use": ..., "limit": ...}``;
    the last three from ``Device.memory_stats()`` where the backend keeps allocator statistics (GPU, TPU; not
    XLA:CPU): bytes in use, the peak in use and the most the allocator may hand out (``bytes_limit``).

    Example:
        >>> from workbench.layout.mesh import build_mesh
        >>> from workbench.training.data_parallel import replicate_params
        >>> state = replicate_params({"w": np.ones((256, 1024), np.float32)}, build_mesh("data=8"))  # 1 MiB each
        >>> sample = live_bytes_by_device(jax.devices(), {"state": state})
        >>> sample["by_device"][0]["state"]
        1048576
    """
    devices = list(devices)
    ids = {device.id for device in devices}
    role_of: dict[int, str] = {}
    copy_of: dict[tuple, str] = {}
    for role, tree in (known or {}).items():
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, jax.Array):
                role_of[id(leaf)] = role
                if leaf.ndim:  # a scalar of the state's shape is far likelier a metric than a copy
                    copy_of.setdefault(_shape_key(leaf), f"{role} copy")
    by_device: dict[int, dict[str, int]] = {device.id: defaultdict(int) for device in devices}
    # One buffer can be several live arrays: reading a replicated array's value (np.asarray) or its shards
    # makes a one-device array per shard over the same buffer. Each buffer is counted once, under the role of
    # the first array seen with it, the known ones first.
    arrays = sorted(jax.live_arrays(), key=lambda array: id(array) not in role_of)
    seen: set[tuple[int, int]] = set()
    for array in arrays:
        role = role_of.get(id(array)) or copy_of.get(_shape_key(array), "other")
        try:
            buffers = list(_buffers(array))
        except Exception:  # noqa: BLE001 - deleted by another thread meanwhile: not live any more
            continue
        for device, address, nbytes in buffers:
            if device.id in ids and (device.id, address) not in seen:
                seen.add((device.id, address))
                by_device[device.id][role] += nbytes
    stats = {device.id: device.memory_stats() for device in devices}
    allocator = all(stats.values())
    return {
        "by_device": {d: dict(roles) for d, roles in by_device.items()},
        "in_use": {d: int(s.get("bytes_in_use", 0)) for d, s in stats.items()} if allocator else None,
        "peak_in_use": {d: int(s.get("peak_bytes_in_use", 0)) for d, s in stats.items()} if allocator else None,
        "limit": {d: int(s["bytes_limit"]) for d, s in stats.items() if s.get("bytes_limit")} if allocator else None,
    }


def memory_figures(compiled: Any) -> dict[str, int] | None:
    """The compiler's memory estimate per device of a ``jax.stages.Compiled`` (its ``memory_analysis()``),
    or None if it gives none.

    Example:
        >>> import jax.numpy as jnp
        >>> figures = memory_figures(jax.jit(lambda x: x @ x.T).lower(jnp.ones((64, 32))).compile())
        >>> figures["argument_bytes"], figures["output_bytes"]  # 64x32 and 64x64 float32
        (8192, 16384)
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    fields = {
        "argument_bytes": "argument_size_in_bytes", "output_bytes": "output_size_in_bytes",
        "alias_bytes": "alias_size_in_bytes", "temp_bytes": "temp_size_in_bytes",
        "generated_code_bytes": "generated_code_size_in_bytes",
    }
    return {key: int(getattr(stats, attr, 0) or 0) for key, attr in fields.items()}


def _options() -> Any:
    """Device and host events only: the Python tracer would record every Python call of the training thread
    (measured: it made stopping a 5-step trace take 1-2.7 s instead of 0.2 s), which the timeline never reads."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    return options


def _module_name(hlo_text: str) -> str | None:
    first = hlo_text.split("\n", 1)[0]
    return first.split()[1].rstrip(",") if first.startswith("HloModule ") and len(first.split()) > 1 else None


class Capture:
    """One profile being taken by the training loop (see the module docstring); made by :meth:`begin`."""

    def __init__(self, request: ProfileRequest, run: str, run_path: Path, first_step: int):
        self.request, self.run = request, run
        self.first_step = first_step
        self.folder = Path(run_path) / PROFILE_FOLDER / f"step-{first_step:06d}"
        self.logging_steps: list[bool] = []
        self.samples: list[dict[str, Any]] = []
        self.programs: dict[bool, Any] = {}  # the shapes of each variant profiled, then its HLO text
        self.compiled_memory: dict[str, int] | None = None
        self.began = time.perf_counter()

    @classmethod
    def begin(cls, request: ProfileRequest, run: str, run_path: Path, first_step: int) -> Capture | None:
        """Start JAX's profiler for ``request`` (None, with the request failed, if it cannot start)."""
        if not _SESSION.acquire(blocking=False):
            request.finish(error="another profile is being taken in this process (JAX runs one at a time): wait "
                                 "for it to finish, then profile again")
            return None
        capture = cls(request, run, run_path, first_step)
        # Arrays in reference cycles (Flax's graph flattening makes some) stay live until Python's cyclic
        # collector runs: collected now, the live figures are what the run holds, not when gc last ran.
        gc.collect()
        try:
            capture.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(capture.folder), create_perfetto_trace=True, profiler_options=_options())
        except Exception as exc:  # noqa: BLE001 - e.g. a session the user started with jax.profiler
            _SESSION.release()
            request.finish(error=f"JAX's profiler could not start ({type(exc).__name__}: {exc}): stop any trace "
                                 "started with jax.profiler (jax.profiler.stop_trace()), then profile again")
            return None
        return capture

    @property
    def taken(self) -> int:
        return len(self.logging_steps)

    @property
    def complete(self) -> bool:
        return self.taken >= self.request.steps

    def before_step(self, mode: Any, state: Any, batch: Any, logging: bool) -> None:
        """Sample what is live (the step's arguments all are) and note the step's variant."""
        self.logging_steps.append(logging)
        self.samples.append(live_bytes_by_device(_devices(mode), {"state": state, "batch": batch}))
        if logging not in self.programs:  # its shapes, to read its HLO once the trace is stopped
            self.programs[logging] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                                  (state, batch))

    def _read_programs(self, mode: Any) -> None:
        """The HLO of each step variant profiled (jit's cache has them; reading one lowers the step again, whose
        Python work would fill the trace, so this runs after it)."""
        for logging, (state, batch) in list(self.programs.items()):
            try:
                compiled = (mode.compile_step(state, batch, diagnostics=True) if logging
                            else mode.compile_step(state, batch))
            except WorkbenchError:  # a mode of several programs (simulated) has no one step to read
                del self.programs[logging]
                continue
            self.programs[logging] = compiled.as_text()
            if not logging or self.compiled_memory is None:
                self.compiled_memory = memory_figures(compiled)

    def end(self, mode: Any, last_output: Any, error: str | None = None) -> ProfileCapture:
        """Wait for the profiled steps to run, stop the profiler and write the capture's files. Never raises:
        what went wrong is the capture's ``error`` (the run goes on)."""
        try:
            jax.block_until_ready(last_output)
        except Exception as exc:  # noqa: BLE001 - a failed step: its error ends the run, the trace still closes
            error = error or f"the profiled steps failed ({type(exc).__name__}: {exc})"
        try:
            jax.profiler.stop_trace()
        except Exception as exc:  # noqa: BLE001
            error = error or f"JAX's profiler could not write the trace ({type(exc).__name__}: {exc})"
        finally:
            _SESSION.release()
        try:
            self._read_programs(mode)
        except Exception as exc:  # noqa: BLE001 - the timeline is then read without the HLO (op names only)
            self.programs = {}
            error = error or f"the step's HLO could not be read ({type(exc).__name__}: {exc})"
        record = {
            "run": self.run, "first_step": self.first_step, "steps": self.taken, "requested_steps": self.request.steps,
            "logging_steps": self.logging_steps,
            "module": _module_name(self.programs.get(False) or self.programs.get(True) or ""),
            "compiled_memory": self.compiled_memory, "live_samples": self.samples,
            "backend": jax.default_backend(),  # whose compiler built the step: the prediction follows its rules
            "capture_s": round(time.perf_counter() - self.began, 3), "error": error,
        }
        try:
            for logging, text in self.programs.items():
                (self.folder / HLO_FILES[logging]).write_text(text)
            (self.folder / CAPTURE_FILE).write_text(json.dumps(record, indent=1))
        except OSError as exc:
            error = error or f"the profile could not be written to {self.folder} ({exc})"
        capture = ProfileCapture(self.run, self.folder, self.first_step, self.taken, error)
        self.request.finish(capture, error)
        return capture


def _devices(mode: Any) -> list[Any]:
    mesh = getattr(mode, "mesh", None)
    if mesh is not None:
        return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    return list(getattr(mode, "devices", None) or [getattr(mode, "device", jax.devices()[0])])


def read_capture(folder: str | Path) -> dict[str, Any]:
    """The ``capture.json`` record of a profile folder (``<run>/profile/step-<S>/``), with the HLO texts under
    ``"programs"`` (``{False: ordinary step, True: logging step}``).

    Raises:
        ProfileError: the folder holds no capture.
    """
    folder = Path(folder)
    try:
        record = json.loads((folder / CAPTURE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{folder} holds no readable {CAPTURE_FILE} ({type(exc).__name__}): profile a run "
                           "(Trainer.profile or workbench train --profile N) to make one") from None
    record["programs"] = {logging: (folder / name).read_text() for logging, name in HLO_FILES.items()
                          if (folder / name).exists()}
    return record


def profile_folders(run_path: str | Path) -> list[Path]:
    """The run's profile folders, oldest first."""
    root = Path(run_path) / PROFILE_FOLDER
    return sorted(p for p in root.glob("step-*") if (p / CAPTURE_FILE).exists()) if root.is_dir() else []


__all__ = ["CAPTURE_FILE", "Capture", "MAX_PROFILE_STEPS", "PROFILE_FOLDER", "ProfileCapture", "ProfileError",
           "ProfileRequest", "validate_profile_steps", "live_bytes_by_device", "memory_figures", "profile_folders",
           "read_capture"]
