"""What every child process the workbench starts has in common: a CPU-only JAX environment with a given
number of simulated devices, the same ``workbench`` package as the parent, an end when the parent goes,
and a kill of its whole process group that is safe from any thread.

Used by the compile-verification child (:mod:`workbench.analysis.verification`) and the workers of a
multi-process run (:mod:`workbench.training.process_group`).

Example:
    >>> child_environment(4)["WORKBENCH_CPU_DEVICES"]
    '4'
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from .devices import THREADS_ENV_VAR, workbench_threads_setting

REAP_TIMEOUT_S = 10.0  # how long a killed or finished child may take to be reaped


def package_root() -> str:
    """The folder that holds this ``workbench`` package, so a child imports the same code."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_environment(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a child: CPU only, ``devices`` simulated CPU devices (set the workbench's
    way, so no other device setting competes), this ``workbench`` first on the path, plus ``extra``.

    Example:
        >>> child_environment(2, WORKBENCH_COMPILATION_CACHE="off")["JAX_PLATFORMS"]
        'cpu'
    """
    env = dict(os.environ)
    env.update({
        "JAX_PLATFORMS": "cpu",  # a TPU is reached through a topology, never a TPU backend; libtpu stays quiet
        "WORKBENCH_CPU_DEVICES": str(devices),
        "PYTHONPATH": os.pathsep.join(p for p in [package_root(), env.get("PYTHONPATH", "")] if p),
        "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        **extra,
    })
    env.pop("JAX_NUM_CPU_DEVICES", None)
    ours = workbench_threads_setting()
    # Sized for this process's devices: the child sizes its own.
    if ours is not None and env.get(THREADS_ENV_VAR) == ours:
        env.pop(THREADS_ENV_VAR)
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", "")).strip()
    return env


def exit_when_parent_goes() -> None:
    """Block until stdin closes (the parent closed it, or died), then end this process at once.

    A child runs it in a daemon thread, with stdin a pipe from its parent: no child outlives its parent.
    """
    sys.stdin.read()
    os._exit(3)


def stop_process_group(process: subprocess.Popen) -> None:
    """Kill the child's process group (it runs in its own session) and reap it; safe to call twice, from any
    thread. Its pipes are left to their reader: closing a pipe another thread reads can deadlock."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    try:
        process.wait(timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a zombie the kernel has not let go of yet: nothing more to do
        pass


__all__ = ["REAP_TIMEOUT_S", "child_environment", "exit_when_parent_goes", "package_root", "stop_process_group"]
