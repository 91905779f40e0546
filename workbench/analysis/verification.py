"""Compile the real training step for a planned mesh, in a child process, and read the compiler's figures.

The device count of JAX's CPU backend is fixed when JAX starts, so the step is compiled in a child
process (:mod:`.compile_child`) started with as many simulated CPU devices as the mesh has (up to
:data:`~.compile_target.CPU_DEVICE_LIMIT`), or against a TPU topology through libtpu. Nothing is
allocated: the child builds the step with :func:`~workbench.training.step.build_abstract_step` and
compiles it with ``mode.compile_step``. What comes back is a :class:`~.compiled_step.CompiledStep`.

Use :func:`verify_step` to wait for it, or :func:`start_verification` to run it in the background:
the returned :class:`VerificationJob` has ``progress``, ``done``, ``cancel()`` and ``result()`` (what a
notebook button needs). Every wait has a time limit, and the child is killed and reaped on every way
out: success, error, time-out, ``cancel()``, Ctrl-C, or the job being garbage collected. Why and what was
measured: docs/design/compile-verification.md.

Example:
    >>> config = TrainConfig(model="transformer", mode="fsdp", mesh="data=64,model=8", batch=1024,
    ...                      model_options={"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000})
    >>> job = start_verification(config, "cpu", on_progress=print)  # doctest: +SKIP
    >>> job.done, job.progress[-1]  # doctest: +SKIP
    (False, 'compiling the step for 512 cpu devices')
    >>> job.result(timeout=600).peak_bytes  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import errors
from ..child_processes import REAP_TIMEOUT_S, child_environment, stop_process_group
from ..errors import StepDoesNotFit, VerificationError, WorkbenchError
from ..training.config import TrainConfig, resolve_config
from ..training.models import MODELS
from ..training.step import validate_compiles_ahead
from .compile_target import CompileTarget, validate_target, parse_target
from .compiled_step import CompiledStep
from .exported_step import ExportedStep, OwnModel, OwnModelError, export_step
from .cost_model import hardware as lookup_hardware
from .gpu_target import DEVICELESS_XLA_FLAGS, gpu_compiler_dir
from .layout_search import remat_choices
from .verdict_record import refusal

# libtpu checks a step's memory against the chip's while it compiles, and refuses a step that does not fit: "Ran out
# of memory on HBM, the total memory required for HLO temporaries (36.58G) exceeds available HBM (15.75G)" (JAX 0.10's
# and 0.12's libtpu, the 1.3B dp-tp step without remat on v5e:16x16). That is the target's answer, not a failure here.
_TARGET_MEMORY_REFUSAL = re.compile(r"Ran out of memory on (\w+)\b.*?\(([\d.]+ ?[KMGT]?i?B?)\) exceeds available \w+ "
                                    r"\(([\d.]+ ?[KMGT]?i?B?)\)", re.S)
DEFAULT_TIMEOUT_S = 900.0  # the 1.3B model on 512 devices compiles in well under a minute on 2 cores
STDERR_TAIL_LINES = 3  # of the child's stderr, shown with an error (libtpu's noise is never shown otherwise)
ProgressFn = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class VerifySettings:
    """How to verify a plan: the ``target`` (``"cpu"``, ``"tpu:v5p:8x8x8"``), a ``timeout`` in seconds for
    the whole compile, and ``on_progress(text)``, called from a background thread as it goes."""

    target: CompileTarget | str = "cpu"
    timeout: float = DEFAULT_TIMEOUT_S
    on_progress: ProgressFn | None = None

    def __post_init__(self):
        object.__setattr__(self, "target", parse_target(self.target))
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise WorkbenchError(f"verify timeout={self.timeout!r} must be a number of seconds > 0: use e.g. 600")


def verify_settings(verify: Any) -> VerifySettings:
    """``verify`` as :class:`VerifySettings`: a target text or :class:`~.compile_target.CompileTarget` gets
    the defaults; settings are returned as they are."""
    return verify if isinstance(verify, VerifySettings) else VerifySettings(verify)


def planned_hardware(hardware: Any, settings: VerifySettings | None) -> Any:
    """The hardware a plan prices: as given; by default the TPU topology's preset, else ``tpu-v5p``.

    Raises WorkbenchError when a TPU target and an explicitly given preset name disagree.
    """
    target = parse_target(settings.target) if settings is not None else None  # VerifySettings parsed it: as is
    topology_preset = target.hardware if target is not None else None
    if hardware is None:
        return topology_preset or "tpu-v5p"
    if topology_preset and lookup_hardware(hardware).name != topology_preset:
        raise WorkbenchError(
            f"hardware {lookup_hardware(hardware).name!r} contradicts --verify {target}, which compiles for "
            f"{topology_preset}: drop --hardware (the topology's preset is used) or give --hardware {topology_preset}"
        )
    return hardware


def _child_environment(resolved: Any, target: CompileTarget) -> dict[str, str]:
    """The child's environment (for a :class:`~workbench.training.config.ResolvedConfig`): CPU only, the mesh's
    device count, no compilation cache."""
    devices = 1 if target.kind in ("tpu", "gpu") or resolved.mode_class.one_device else resolved.mesh_shape.size
    # Compile for real: a cached program would report a stale compile time (and op metadata, which the cache key
    # leaves out), and a 512-device program is not worth keeping. libtpu locks /tmp/libtpu_lockfile for one
    # process at a time; compiling for a topology uses no chip.
    env = child_environment(devices, WORKBENCH_COMPILATION_CACHE="off", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    if target.kind == "gpu":  # XLA:GPU cannot time kernels without the GPU (JAX starts with these flags)
        env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} {DEVICELESS_XLA_FLAGS}".strip()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(gpu_compiler_dir())]))
    return env


def _close(*streams: Any) -> None:
    for stream in streams:
        try:
            if stream is not None:
                stream.close()
        except (OSError, ValueError):
            pass


class VerificationJob:
    """A step being compiled in a child process. Start one with :func:`start_verification`.

    ``progress`` lists the messages so far (``on_progress`` gets each as it arrives, from a background
    thread), ``done`` says whether it has finished (either way), ``cancel()`` kills the child at once,
    and ``result(timeout)`` waits for the :class:`~.compiled_step.CompiledStep` or raises the
    WorkbenchError that stopped it (:class:`~workbench.errors.VerificationError` for a failed, killed,
    timed-out or cancelled compile). ``elapsed`` is the seconds since it started.
    """

    def __init__(self, config: Any, target: CompileTarget, seq_len: int | None, timeout: float,
                 on_progress: ProgressFn | None, exported: ExportedStep | None = None):
        resolved = resolve_config(config)
        config = resolved.config
        self.config, self.target, self.timeout = config, target, float(timeout)
        self._on_progress = on_progress
        self._progress: list[str] = []
        self._outcome: CompiledStep | None = None
        self._error: Exception | None = None
        self._why_stopped: str | None = None  # "cancelled" or "timeout", set before the child is killed
        self._done = threading.Event()
        self._started = time.monotonic()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the child's stderr, read when it ends; closed there
        request = {"config": config.to_json(), "target": str(target), "seq_len": seq_len,
                   "exported": None if exported is None else exported.to_json()}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "workbench.analysis.compile_child"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, env=_child_environment(resolved, target),
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop the child ourselves
        )
        self._finalizer = weakref.finalize(self, stop_process_group, self._process)  # also runs at interpreter exit
        try:
            if self._process.stdin is not None:  # always: Popen was given stdin=PIPE
                self._process.stdin.write((json.dumps(request) + "\n").encode())
                self._process.stdin.flush()
        except OSError:
            pass  # the child died at once: the reader reports why
        self._timer = threading.Timer(self.timeout, self._stop_because, args=("timeout",))
        self._timer.daemon = True
        self._timer.start()
        self._reader = threading.Thread(target=self._read, name="workbench-verify", daemon=True)
        self._reader.start()

    # --- what a caller sees ------------------------------------------------------------------------------

    @property
    def progress(self) -> list[str]:
        return list(self._progress)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def cancel(self) -> None:
        """Stop the compile now: the child is killed and reaped; ``result()`` then raises VerificationError."""
        self._stop_because("cancelled")
        self._done.wait(REAP_TIMEOUT_S)

    def result(self, timeout: float | None = None) -> CompiledStep:
        """Wait (at most ``timeout`` seconds; by default until the job's own time limit) for the compiled step.

        Ctrl-C while waiting cancels the job. Raises WorkbenchError if it failed, or if ``timeout`` passed
        first (the job then keeps running: call ``result()`` again or ``cancel()``).
        """
        limit = self.timeout - self.elapsed + 2 * REAP_TIMEOUT_S if timeout is None else timeout
        try:
            finished = self._done.wait(max(limit, 0.0))
        except KeyboardInterrupt:
            self.cancel()
            raise
        if not finished:
            if timeout is None:  # past the job's own limit and still not done: stop it rather than wait on
                self._stop_because("timeout")
                self._done.wait(REAP_TIMEOUT_S)
            else:
                raise WorkbenchError(f"the compile for {self.target} is still running after {timeout:g} s: call "
                                     "result() again to keep waiting, or cancel()")
        if self._error is not None:
            raise self._error
        if self._outcome is None:
            raise VerificationError(f"the compile for {self.target} stopped without a result")
        return self._outcome

    # --- the background side -----------------------------------------------------------------------------

    def _stop_because(self, why: str) -> None:
        if self._why_stopped is None and not self._done.is_set():
            self._why_stopped = why
        stop_process_group(self._process)

    def _say(self, text: str) -> None:
        self._progress.append(text)
        if self._on_progress is not None:
            try:
                self._on_progress(text)
            except Exception:  # noqa: BLE001 - a broken progress display must not stop the compile
                pass

    def _read(self) -> None:
        try:
            for line in self._process.stdout or ():  # always a pipe: Popen was given stdout=PIPE
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not ours
                if "progress" in message:
                    self._say(str(message["progress"]))
                elif "result" in message:
                    self._outcome = CompiledStep.from_json(message["result"])
                elif "error" in message:
                    self._error = self._child_error(message["error"])
        except (OSError, ValueError):
            pass  # the pipe closed under us: the child was killed
        finally:
            stop_process_group(self._process)
            _close(self._process.stdin, self._process.stdout)
            self._timer.cancel()
            if self._outcome is None and self._error is None:
                self._error = self._death()
            self._stderr.close()
            self._finalizer.detach()
            self._done.set()

    def _what(self) -> str:
        model = self.config.model
        model = f"your {model.removeprefix('custom:')}" if model.startswith("custom:") else model
        return f"the {self.config.mode} step of {model} on {self.config.mesh} for {self.target}"

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        tail = " | ".join(line[:160] for line in lines[-STDERR_TAIL_LINES:])
        return f" (its last output: {tail})" if tail else ""

    def _child_error(self, error: dict[str, Any]) -> Exception:
        kind, message = error.get("type", "Exception"), str(error.get("message", "")).strip()
        if error.get("workbench"):
            cls = getattr(errors, kind, WorkbenchError)
            wanted = isinstance(cls, type) and issubclass(cls, WorkbenchError)
            return cls(message) if wanted else WorkbenchError(message)
        first = next((line.strip() for line in message.splitlines() if line.strip()), kind)
        refused = _TARGET_MEMORY_REFUSAL.search(message)
        if refused:
            space, needed, available = refused.groups()
            heavier = _heavier_remat(self.config)
            return StepDoesNotFit(
                f"{self._what()} does not fit: the compiler reports {needed} of temporaries, more than the "
                f"{available} of {space} a chip has (the target's memory, not this machine's): plan it with "
                f"{heavier}a smaller batch per device or more devices, and verify that")
        if kind == "MemoryError" or re.search(r"RESOURCE_EXHAUSTED|out of memory|Cannot allocate", message, re.I):
            return VerificationError(f"compiling {self._what()} ran out of memory ({first[:200]}): verify a smaller "
                                     "model or mesh, or on a machine with more memory")
        return VerificationError(f"compiling {self._what()} failed: {kind}: {first[:300]}")

    def _death(self) -> Exception:
        if self._why_stopped == "cancelled":
            return VerificationError(f"cancelled: the compile of {self._what()} was stopped")
        if self._why_stopped == "timeout":
            return VerificationError(
                f"compiling {self._what()} took longer than {self.timeout:g} s and was stopped: give a longer "
                "timeout (VerifySettings(timeout=...)) or verify a smaller mesh")
        code = self._process.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            likely = ", most likely out of memory" if -code == signal.SIGKILL else ""
            return VerificationError(f"the process compiling {self._what()} was killed ({name}{likely}): verify a "
                                     f"smaller model or mesh{self._stderr_tail()}")
        return VerificationError(f"the process compiling {self._what()} died (exit status {code}) without a "
                                 f"result{self._stderr_tail()}")


def _heavier_remat(config: Any) -> str:
    """The remat policies of ``config``'s model that recompute more (keep less) than its own, as advice ("remat dots
    or block, "); empty where there are none (the mlp has no policy but none, nor has your own module)."""
    policies = remat_choices(config.model) if config.model in MODELS else ("none",)
    heavier = policies[policies.index(config.remat) + 1:] if config.remat in policies else ()
    return f"remat {' or '.join(heavier)}, " if heavier else ""


def start_verification(config: Any, target: Any = "cpu", *, seq_len: int | None = None,
                       timeout: float = DEFAULT_TIMEOUT_S, on_progress: ProgressFn | None = None) -> VerificationJob:
    """Start compiling ``config``'s step (a :class:`~workbench.TrainConfig` of a registered model) for
    ``target`` in a child process; returns at once with a :class:`VerificationJob`.

    Bad input (an unknown target, too many CPU devices, libtpu missing, a topology whose chip count is
    not the mesh's, a mode that is not one jit program, a bad config) raises WorkbenchError here, before
    any process starts.

    Example:
        >>> config = TrainConfig(model="mlp", mode="dp", mesh="data=16", batch=64)
        >>> job = start_verification(config, "cpu")  # returns at once: the compile runs in a child process
        >>> job.cancel(); job.done  # the child is killed and reaped
        True
    """
    settings = VerifySettings(target, timeout, on_progress)
    resolved = _verifiable(config, settings.target)
    return VerificationJob(resolved, parse_target(settings.target), seq_len, settings.timeout, settings.on_progress)


def validate_verifiable(config: Any, target: Any = "cpu") -> Any:
    """``config`` checked for compiling its step for ``target``, or the WorkbenchError that
    :func:`start_verification` would raise: what nothing runs (:func:`~workbench.training_verdict`: a batch
    that does not split, a mode the mesh cannot carry), a mode that is not one jit program, a target the
    mesh does not fit. Nothing is started.

    Example:
        >>> validate_verifiable(TrainConfig(mode="simulated", mesh="data=8"), "cpu")
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: mode 'simulated' (...) is not one jit program over a mesh, so its step ...
    """
    return _verifiable(config, target).config


def _verifiable(config: Any, target: Any) -> Any:
    """:func:`validate_verifiable`, returning the :class:`~workbench.training.config.ResolvedConfig` it checked."""
    resolved = resolve_config(config)
    refused = refusal(resolved)  # the verdict's error level: a batch that does not split fails here, not in the child
    if refused is not None:
        raise WorkbenchError(refused.message)
    validate_compiles_ahead(resolved.mode_class)
    validate_target(parse_target(target), resolved.mesh_shape)
    return resolved


def verify_step(config: Any, target: Any = "cpu", *, seq_len: int | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                on_progress: ProgressFn | None = None) -> CompiledStep:
    """Compile ``config``'s step for ``target`` in a child process and wait for the compiler's figures.

    Example:
        >>> config = TrainConfig(model="mlp", mode="fsdp", mesh="data=16", batch=64)
        >>> step = verify_step(config, "cpu", timeout=300)
        >>> step.devices, step.alias_bytes <= step.argument_bytes
        (16, True)
    """
    return _finished(start_verification(config, target, seq_len=seq_len, timeout=timeout, on_progress=on_progress))


def _finished(job: VerificationJob) -> CompiledStep:
    """The job's result, waited for; whatever happens while waiting, no child is left running."""
    try:
        return job.result()
    finally:
        if not job.done:
            job.cancel()


def plan_config(plan: Any) -> Any:
    """The :class:`~workbench.TrainConfig` whose step a :class:`~workbench.analysis.TrainingPlan` of a registered
    model describes (what a fresh process rebuilds the step from).

    Raises WorkbenchError for your own module: no config rebuilds it. Verify it with
    :func:`start_plan_verification`'s ``own`` (or :func:`~workbench.plan_training`'s ``verify`` with ``loss`` and
    ``example_batch``), which traces the step in this process; a plan made with your own ``rules`` compiles your
    table that way too.
    """
    if plan.model not in MODELS:
        raise WorkbenchError(
            f"no config rebuilds your {plan.model} in another process: verify it with plan_training(..., verify=..., "
            "loss=..., example_batch=...) or start_plan_verification(plan, target, OwnModel(module, loss, "
            "example_batch)), which trace its step here; a budget test, compiled in a fresh process, needs a "
            "registered model"
        )
    return TrainConfig(model=plan.model, model_options=dict(plan.model_options), mode=plan.mode, mesh=str(plan.mesh),
                       batch=plan.global_batch, optimizer=plan.optimizer, precision=plan.precision, accum=plan.accum,
                       remat=plan.remat)


def start_plan_verification(plan: Any, verify: Any = "cpu", own: OwnModel | None = None) -> VerificationJob:
    """:func:`start_verification` of the step ``plan`` describes (``verify``: a target or VerifySettings).

    ``own``: the plan's own module (or registered model) with its loss, example batch and rule table, as an
    :class:`~.exported_step.OwnModel`: the child cannot rebuild it, so the step is traced and exported here for
    the target's platform (seconds) and only compiled there (:mod:`.exported_step`).

    Example:
        >>> plan = plan_training("mlp", {}, "data=16", "dp")
        >>> job = start_plan_verification(plan, "cpu")  # returns at once: the compile runs in a child process
        >>> verified = plan.with_compiled(job.result(timeout=300))
        >>> verified.compiled.devices, verified.comparison.row("arguments").ratio
        (16, 1.0)
        >>> own = OwnModel(lambda: TwoLayer(nnx.Rngs(0)), my_loss, batch, rules)  # doctest: +SKIP
        >>> plan = plan_training(own.model, None, "data=4,model=4", "dp-tp", rules=rules, loss=my_loss,
        ...                      example_batch=batch)  # doctest: +SKIP
        >>> start_plan_verification(plan, "tpu:v5e:4x4", own).result().peak_bytes  # doctest: +SKIP
    """
    settings = verify_settings(verify)
    if own is None:
        return start_verification(plan_config(plan), settings.target, seq_len=plan.seq_len, timeout=settings.timeout,
                                  on_progress=settings.on_progress)
    if own.name != plan.model:
        raise OwnModelError(f"the plan is for {plan.model}, but the model to verify is {own.name}: pass the module "
                            "the plan was made for")
    target = parse_target(settings.target)
    config = own.step_config(plan.mode, plan.mesh, plan.global_batch, plan.precision, plan.optimizer, plan.accum,
                             dict(plan.model_options), plan.remat)
    resolved = _verifiable(config, target)
    if settings.on_progress is not None:
        settings.on_progress(f"tracing and exporting the step of {own.described} for {target.kind} (in this "
                             "process)")
    exported = export_step(resolved, own, target, seq_len=plan.seq_len)
    return VerificationJob(resolved, target, plan.seq_len, settings.timeout, settings.on_progress, exported)


def verify_plan(plan: Any, verify: Any = "cpu", own: OwnModel | None = None) -> CompiledStep:
    """Compile the step ``plan`` describes for ``verify`` (a target or VerifySettings) and wait for it (``own``:
    as :func:`start_plan_verification` takes it)."""
    return _finished(start_plan_verification(plan, verify, own))


__all__ = [
    "DEFAULT_TIMEOUT_S", "VerificationJob", "VerifySettings", "plan_config", "planned_hardware",
    "start_plan_verification", "start_verification", "verify_plan", "verify_settings", "verify_step",
]
