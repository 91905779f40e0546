"""Byte sizes written by people (``16GiB``, ``80GB``, ``512MiB``) read as a number of bytes.

Example:
    >>> parse_byte_size("1.5 KiB")
    1536
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import WorkbenchError

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]i?b|b)?\s*", re.IGNORECASE)
_UNITS = {
    "b": 1,
    **{f"{prefix}b": 1000**power for power, prefix in enumerate("kmgtp", 1)},
    **{f"{prefix}ib": 1024**power for power, prefix in enumerate("kmgtp", 1)},
}


def parse_byte_size(value: Any, what: str = "device memory") -> int:
    """Bytes from ``16GiB``, ``80GB``, ``512MiB``, ``1.5 TiB`` or a plain number of bytes.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` powers of 1024; letters may be any case.
    Raises :class:`~workbench.errors.WorkbenchError` naming the value otherwise.

    Example:
        >>> parse_byte_size("16GiB"), parse_byte_size("80GB"), parse_byte_size(512)
        (17179869184, 80000000000, 512)
    """
    fix = "write e.g. 16GiB, 80GB or 512MiB"
    if isinstance(value, bool):
        raise WorkbenchError(f"{what} {value!r} is not a size: {fix}")
    if isinstance(value, (int, float)):
        number, multiplier = value, 1
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise WorkbenchError(f"{what} {value!r} is not a size: {fix}")
        number, multiplier = float(match.group(1)), _UNITS[(match.group(2) or "b").lower()]
    size = round(number * multiplier) if math.isfinite(number) else 0
    if size < 1:
        raise WorkbenchError(f"{what} {value!r} must be at least one byte: {fix}")
    return int(size)


__all__ = ["parse_byte_size"]
