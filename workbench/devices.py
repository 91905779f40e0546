"""Simulated CPU devices: configure them before JAX starts, and say so clearly when it is too late.

JAX fixes its device count when its backend starts (the first JAX operation). Workshops and tests run
on laptops with one CPU, so importing :mod:`workbench` asks JAX for ``N`` simulated CPU devices
(default 8, ``WORKBENCH_CPU_DEVICES`` overrides). If JAX already started with fewer, we warn once with
the count and the way to get more, instead of failing later with an obscure mesh error.

It also gives XLA's CPU runtime more threads than devices (``PJRT_NPROC``): with exactly one thread per
simulated device, a device that runs ahead into the next step's collective holds a thread another device
needs to finish this step's, and the process aborts in the rendezvous (docs/design/in-flight-steps.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import warnings

import jax  # importing JAX does not start its backend: the device count can still be set below

DEFAULT_CPU_DEVICES = 8
ENV_VAR = "WORKBENCH_CPU_DEVICES"
THREADS_ENV_VAR = "PJRT_NPROC"  # read by XLA's CPU client when it starts: the size of its two thread pools
# The PJRT_NPROC a workbench process set: a child that inherits both (a pytest-xdist worker, a spawned
# multiprocessing child) knows the size was a parent's choice for its devices, not the user's, and sizes its own.
THREADS_SET_BY_ENV_VAR = "WORKBENCH_SET_PJRT_NPROC"
THREADS_PER_DEVICE = 4  # two steps' collectives in flight, two at once per step, with room to spare
MAX_THREADS = 256  # XLA's own cap on its compute pool; beyond 64 devices the pools keep one thread per device


class DeviceCountWarning(UserWarning):
    """JAX started before the workbench could configure its simulated devices."""


@dataclasses.dataclass(frozen=True)
class DeviceSetup:
    """What :func:`configure_cpu_devices` asked for and what happened."""

    requested: int | None
    configured: bool
    reason: str
    threads: int | None = None  # the PJRT_NPROC the workbench set, or None when it left the pools alone


_setup: DeviceSetup | None = None
_warned = False


def _requested_count() -> int | None:
    """The simulated CPU device count to ask for, or None when the user chose another way."""
    raw = os.environ.get(ENV_VAR)
    if raw is not None:
        # A typo in the environment must not make `import workbench` fail: say so and use the default.
        count = int(raw) if raw.strip().isdigit() else 0
        if count >= 1:
            return count
        warnings.warn(
            f"{ENV_VAR}={raw!r} is not a device count of at least 1: using {DEFAULT_CPU_DEVICES}. "
            f"Set it to a whole number such as {ENV_VAR}=8.",
            DeviceCountWarning,
            stacklevel=4,
        )
        return DEFAULT_CPU_DEVICES
    # The user configured JAX directly: respect it.
    if os.environ.get("JAX_NUM_CPU_DEVICES") or re.search(
        r"xla_force_host_platform_device_count", os.environ.get("XLA_FLAGS", "")
    ):
        return None
    return DEFAULT_CPU_DEVICES


def _accelerator_requested() -> bool:
    """True when the user pointed JAX at a platform list without the CPU (e.g. JAX_PLATFORMS=cuda)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    return bool(platforms) and "cpu" not in platforms.split(",")


# Compilers installed to compile for accelerators this machine need not have: libtpu (the ``tpu`` extra) and
# XLA:GPU's CUDA plugin (kept out of this environment by ``make gpu-compile``, but a user may install it here).
COMPILER_PLUGINS = ("libtpu", "jax_cuda12_plugin")


def _compilers_without_accelerators() -> bool:
    """libtpu or the CUDA plugin is installed (to compile for TPU topologies or GPUs) on a machine with no TPU
    chip and no GPU, and JAX was left to pick its platforms: it would start them anyway, and they print a
    screenful of warnings (hostnames, accelerator types, a CUDA that fails) before JAX falls back to the CPU."""
    if os.environ.get("JAX_PLATFORMS", "").strip():
        return False
    try:
        if not any(importlib.util.find_spec(plugin) is not None for plugin in COMPILER_PLUGINS):
            return False
        from jax._src import hardware_utils  # what JAX itself asks before starting libtpu's cloud set-up

        return (hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0
                and not hardware_utils.has_visible_nvidia_gpu() and not hardware_utils.num_available_amd_gpus(1))
    except Exception:  # noqa: BLE001 - another JAX layout: leave JAX's own choice alone
        return False


def configure_cpu_devices() -> DeviceSetup:
    """Ask JAX for simulated CPU devices, if JAX has not started yet. Called by ``import workbench``.

    Returns what was done. Safe to call again: it changes nothing after the first call.

    Example:
        >>> import workbench
        >>> workbench.devices.device_setup().requested
        8
    """
    global _setup
    if _setup is not None:
        return _setup
    requested = _requested_count()
    if _compilers_without_accelerators():
        try:
            jax.config.update("jax_platforms", "cpu")  # the CPU is all there is: don't start libtpu or CUDA
        except RuntimeError:
            pass
    if _accelerator_requested():
        _setup = DeviceSetup(None, False, "JAX_PLATFORMS names an accelerator: left alone")
    elif requested is None:
        _setup = DeviceSetup(None, False, "JAX_NUM_CPU_DEVICES or XLA_FLAGS set by the user: left alone")
    else:
        try:
            jax.config.update("jax_num_cpu_devices", requested)
            _setup = DeviceSetup(requested, True, f"asked JAX for {requested} CPU devices",
                                 _give_collectives_threads(requested))
        except RuntimeError:
            # The backend already started (JAX was used before workbench was imported).
            _setup = DeviceSetup(requested, False, "JAX had already started")
            warn_if_devices_missing()  # the backend is up, so counting devices costs nothing now
    return _setup


def _give_collectives_threads(devices: int) -> int | None:
    """Size XLA's CPU thread pools for ``devices`` simulated devices (unless the user chose a size); the size
    set, or None.

    XLA makes each pool ``max(cores, devices)`` threads. On a laptop that is one thread per device, and
    a collective blocks its thread until every device arrives: a device already in the next step's
    all-reduce holds a thread that a slower device needs for this step's, and after 40 s XLA aborts the
    whole process. Measured (2 cores, 8 devices, chained dp steps): 300 queued steps aborted 3 runs of 3
    with 8 threads; 3,000 ran with 16, 32 or 64. Idle threads cost nothing but their reserved stacks.
    """
    inherited = os.environ.get(THREADS_ENV_VAR)
    if inherited is not None and inherited != os.environ.get(THREADS_SET_BY_ENV_VAR):
        return None  # the user's size
    threads = min(max(THREADS_PER_DEVICE * devices, os.cpu_count() or 1), MAX_THREADS)
    os.environ[THREADS_ENV_VAR] = str(threads)  # read by the C++ client when JAX's backend starts, not before
    os.environ[THREADS_SET_BY_ENV_VAR] = str(threads)
    return threads


def workbench_threads_setting() -> str | None:
    """The ``PJRT_NPROC`` value the workbench set in this process (so a child with another device count can
    size its own), or None when the user set it or it was not set.

    Example:
        >>> workbench_threads_setting() == os.environ["PJRT_NPROC"]  # e.g. '32' for 8 devices
        True
    """
    setup = _setup
    return str(setup.threads) if setup is not None and setup.threads is not None else None


def warn_if_devices_missing() -> None:
    """Warn once if JAX has fewer CPU devices than the workbench asked for, saying how to get more."""
    global _warned
    setup = _setup or configure_cpu_devices()
    if _warned or setup.configured or setup.requested is None:
        return
    have = len(jax.devices("cpu"))
    if have < setup.requested:
        _warned = True
        warnings.warn(
            f"JAX started before workbench was imported and has {have} CPU device(s), not "
            f"{setup.requested}. Meshes are limited to {have} device(s) (abstract meshes of any size "
            f"still work). To get {setup.requested}: restart the kernel and import workbench before "
            f"using JAX, or set {ENV_VAR}={setup.requested} in the environment before starting Python.",
            DeviceCountWarning,
            stacklevel=3,
        )


def device_setup() -> DeviceSetup:
    """What the workbench did about simulated devices at import time."""
    return configure_cpu_devices()


def local_devices_text(count: int | None = None) -> str:
    """What JAX computes on here, in words: ``"8 simulated CPU devices"``, ``"1 GPU (NVIDIA H200)"``.

    ``count`` replaces the number of devices (to describe a machine like this one with another count).

    Example:
        >>> local_devices_text()
        '8 simulated CPU devices'
    """
    devices = jax.devices()
    count = len(devices) if count is None else count
    platform = devices[0].platform
    if platform == "cpu":
        return f"{count} simulated CPU device{'s' * (count != 1)}"
    kinds = sorted({getattr(device, "device_kind", platform) for device in devices})
    return f"{count} {platform.upper()}{'s' * (count != 1)} ({', '.join(kinds)})"


def every_device_mesh() -> str:
    """The mesh a run uses by default: every device JAX has here, over ``data`` (``data=8`` on the simulated
    CPU devices, ``data=1`` on a machine with one GPU). Starts JAX's backend.

    Example:
        >>> every_device_mesh()
        'data=8'
    """
    return f"data={len(jax.devices())}"


def more_devices_hint(size: int) -> str:
    """How to get a mesh of ``size`` devices this machine lacks, as the end of a sentence: more simulated CPU
    devices where JAX runs on the CPU; on a GPU or TPU machine (where simulated devices need JAX_PLATFORMS=cpu),
    planning and verifying without the devices, or simulating on the CPU.

    Example:
        >>> more_devices_hint(16)
        'or set WORKBENCH_CPU_DEVICES=16 before importing workbench (restart the kernel)'
    """
    if jax.default_backend() == "cpu":
        return f"or set WORKBENCH_CPU_DEVICES={size} before importing workbench (restart the kernel)"
    return (f"plan and verify it without the devices (workbench plan --verify gpu:h100:{size}, or tpu:...), or "
            f"simulate {size} CPU devices: JAX_PLATFORMS=cpu WORKBENCH_CPU_DEVICES={size} before importing workbench "
            "(restart the kernel)")


def describe_devices() -> dict:
    """A plain record of what JAX sees: backend, device count, and each device's id and kind.

    Example:
        >>> describe_devices()["count"]
        8
    """
    warn_if_devices_missing()
    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "count": len(devices),
        "jax_version": jax.__version__,
        "setup": device_setup().reason,
        "summary": local_devices_text(),
        "devices": [
            {"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", d.platform)}
            for d in devices
        ],
    }
