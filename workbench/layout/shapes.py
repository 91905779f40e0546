"""Array shapes and dtypes from text: ``"8,16,32"`` and ``"bfloat16"``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import dtypes

from ..errors import DTypeError, ShapeError


def parse_shape(value: str | Sequence[int] | int) -> tuple[int, ...]:
    """Read a shape: ``"8,16,32"``, ``"(8, 16)"``, ``"8x16"``, ``""`` (0-D), an int, or a sequence.

    Example:
        >>> parse_shape("8, 16,32")
        (8, 16, 32)
        >>> parse_shape("")
        ()
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        parts: list[Any] = [int(value)]
    elif isinstance(value, str):
        text = value.strip().strip("()[]").strip()
        if not text:
            return ()
        # "8,16" is the usual form; "8x16" is accepted when there is no comma.
        parts = [p.strip() for p in (text.split(",") if "," in text else re.split(r"[x×]", text))]
        if parts and parts[-1] == "":  # "8," is a 1-D shape, as in Python
            parts = parts[:-1]
        for part in parts:
            if not re.fullmatch(r"\d+", part):
                raise ShapeError(
                    f"shape {value!r} has {part!r}, not a size: write whole numbers >= 0 separated by "
                    "commas, e.g. '8,16,32' (or '' for a 0-D array)"
                )
    else:  # a sequence; a bool (an int, but not a size) is refused below, as inside one
        parts = [value] if isinstance(value, bool) else list(value)
    shape = []
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (int, np.integer, str)):
            raise ShapeError(f"shape {value!r} has {part!r}, not a whole number: e.g. (8, 16)")
        size = int(part)
        if size < 0:
            raise ShapeError(f"shape {value!r} has a negative size {size}: sizes are >= 0")
        shape.append(size)
    return tuple(shape)


def parse_dtype(value: Any) -> np.dtype:
    """A NumPy/JAX dtype from a name (``"bfloat16"``, ``"float32"``, ``"int8"``) or a dtype.

    Example:
        >>> parse_dtype("bfloat16").name
        'bfloat16'
    """
    try:
        return np.dtype(jnp.dtype(value))
    except (TypeError, ValueError):
        raise DTypeError(
            f"dtype {value!r} is not a JAX dtype: use e.g. float32, bfloat16, float16, int32, int8, bool"
        ) from None


def itemsize_bits(dtype: Any) -> int:
    """Bits per element, exact for sub-byte dtypes such as int4."""
    dtype = parse_dtype(dtype)
    try:
        return int(dtypes.itemsize_bits(dtype))
    except (AttributeError, TypeError):
        return dtype.itemsize * 8
