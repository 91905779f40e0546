"""Shared helpers for the benchmarks: medians of repeats, warm-up excluded, the machine's label, records.

A record is one line of ``make bench``: ``{"name", "value", "unit", "target", "ok", "note"}``. ``target``
says which way it is held: ``"<= 1.05"``, ``">= 3"``, ``"1.00 ± 0.01"``, or None for a figure that is
reported, not held to anything (then ``ok`` is true).
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
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
