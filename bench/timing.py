"""Shared timing helpers for the benchmarks: medians of repeats, warm-up excluded, machine label."""

from __future__ import annotations

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


def machine() -> str:
    """A short label for absolute figures: CPU count, architecture and Python."""
    return f"{os.cpu_count()} CPU {platform.machine()}, Python {platform.python_version()}"


def record(name: str, value: float, unit: str, target: float | None, higher_is_better: bool = False, note: str = "") -> dict:
    """One benchmark result in the suite's JSON format."""
    ok = True if target is None else (value >= target if higher_is_better else value <= target)
    return {"name": name, "value": value, "unit": unit, "target": target, "ok": ok, "note": note}
