"""Shared helpers for the benchmarks: medians of repeats, warm-up excluded, the machine's label, records,
and a plan's time and peak memory in a fresh process.

A record is one line of ``make bench``: ``{"name", "value", "unit", "target", "ok", "note"}``. ``target``
says which way it is held: ``"<= 1.05"``, ``">= 3"``, ``"1.00 ± 0.01"``, or None for a figure that is
reported, not held to anything (then ``ok`` is true).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def median_seconds(function: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``function()`` over ``repeats`` runs after ``warmup`` untimed runs."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.lru_cache(maxsize=1)
def machine() -> str:
    """A label for absolute figures: CPU model and count, JAX backend and version, Python."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    devices = jax.devices()
    return (
        f"{cpu}, {os.cpu_count()} cores; JAX {jax.__version__} on {len(devices)} {devices[0].platform} "
        f"device(s); Python {platform.python_version()}"
    )


def record(name: str, value: float, unit: str, target: tuple | None = None, note: str = "") -> dict:
    """One benchmark result. ``target``: ``("<=", 1.05)``, ``(">=", 3)``, ``("±", 1.0, 0.01)`` or None.

    Example:
        >>> record("dp step / hand-written jit", 1.02, "x", ("<=", 1.05))["target"]
        '<= 1.05'
    """
    if target is None:
        text, ok = None, True
    elif target[0] == "<=":
        text, ok = f"<= {target[1]:g}", value <= target[1]
    elif target[0] == ">=":
        text, ok = f">= {target[1]:g}", value >= target[1]
    elif target[0] == "±":
        text, ok = f"{target[1]:.2f} ± {target[2]:g}", abs(value - target[1]) <= target[2]
    else:
        raise ValueError(f"unknown target {target!r}: use ('<=', x), ('>=', x) or ('±', centre, tolerance)")
    return {"name": name, "value": float(value), "unit": unit, "target": text, "ok": bool(ok), "note": note}


# The peak is read from /proc/self/status (VmHWM), not ru_maxrss: Linux carries ru_maxrss over fork and
# exec, so a child started by a large parent (a benchmark, after planning) reports the parent's peak.
_PLAN_CHILD = """
import json, resource, sys, time

def peak_kib():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except OSError:  # not Linux: ru_maxrss (KiB on Linux, bytes on macOS) may include the parent's peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)

import workbench
after_import = peak_kib()
seconds = None
case = json.loads(sys.argv[1])
if case is not None:
    from workbench.analysis.planning import plan_training
    model, options, mesh, mode = case
    start = time.perf_counter()
    plan_training(model, options, mesh, mode)
    seconds = time.perf_counter() - start
print(json.dumps({"after_import_kib": after_import, "peak_kib": peak_kib(), "seconds": seconds}))
"""


def plan_in_fresh_process(case: tuple[str, dict, str, str] | None, timeout: float = 600) -> dict:
    """``plan_training(*case)`` for ``case = (model, options, mesh, mode)`` in a new interpreter, or with
    ``case=None`` only ``import workbench``: ``{"after_import_kib", "peak_kib", "seconds"}`` (peaks in KiB).

    No compilation cache: the figure is a first plan ever, not one helped by an earlier process. A child
    that runs past ``timeout`` seconds is killed (``subprocess.run`` kills and reaps it, then raises).

    Example:
        >>> plan_in_fresh_process(None)["seconds"] is None  # doctest: +SKIP
        True
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "WORKBENCH_COMPILATION_CACHE": "off"}
    done = subprocess.run([sys.executable, "-c", _PLAN_CHILD, json.dumps(case)], capture_output=True, text=True,
                          env=env, check=True, timeout=timeout)
    return json.loads(done.stdout.strip().splitlines()[-1])
