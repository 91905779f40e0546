"""Whether this machine can hold a run's data and state, estimated before anything is allocated.

On simulated CPU devices every device's buffers live in the host's memory, so a batch of a billion examples
fails deep inside NumPy ("Unable to allocate 238 GiB") after seconds of work. The trainer refuses a batch whose host
copies do not fit (:func:`validate_batch_fits_host`); the verdict (:mod:`workbench.analysis.verdict`) adds the
step's own memory on every simulated device, so whatever the trainer refuses, the verdict never calls ✓.

Example:
    >>> available_host_memory() > 0
    True
    >>> batch_bytes({"x": jax.ShapeDtypeStruct((10, 64), "float32")})
    2560
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from ..errors import WorkbenchError
from ..formatting import format_bytes

# Of the memory available now, how much a run may plan to use: the kernel, the browser and JAX's own
# buffers need the rest, and the figure moves while we look.
USABLE_FRACTION = 0.8
# Host copies of one global batch alive at once: the batch being read, and the one placed on the devices.
HOST_BATCH_COPIES = 2


def available_host_memory() -> int:
    """Bytes the operating system can give this process now (Linux ``MemAvailable``), else its physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def batch_bytes(batch: Any) -> int:
    """Bytes of a batch given as arrays or ``ShapeDtypeStruct`` leaves."""
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(batch))


def devices_share_host_memory() -> bool:
    """Whether JAX's devices keep their buffers in this host's memory (the CPU backend: simulated devices)."""
    return jax.default_backend() == "cpu"


def largest_batch_within(budget: int, fixed: float, per_example: float, unit: int) -> int:
    """The largest multiple of ``unit`` examples whose ``fixed + per_example * batch`` bytes fit ``budget``
    (0 when not even ``unit`` fits).

    Example:
        >>> largest_batch_within(1000, 100, 10.0, 8)
        88
    """
    if per_example <= 0:
        return 0
    return max(0, int((budget - fixed) // per_example) // unit * unit)


def validate_batch_fits_host(batch: int, example_bytes: int, unit: int, available: int | None = None) -> None:
    """WorkbenchError, with the largest batch (a multiple of ``unit``) that fits, when this host cannot hold
    :data:`HOST_BATCH_COPIES` global batches of ``batch`` examples of ``example_bytes`` each.

    Example:
        >>> validate_batch_fits_host(10**9, 260, 8, available=16 * 2**30)
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: a global batch of 1,000,000,000 needs about 484.3 GiB ... at most 26,430,560
    """
    available = available_host_memory() if available is None else available
    per_example = HOST_BATCH_COPIES * example_bytes
    need = per_example * batch
    if need > USABLE_FRACTION * available:
        fits = largest_batch_within(int(USABLE_FRACTION * available), 0, per_example, unit)
        raise WorkbenchError(f"a global batch of {batch:,} needs about {format_bytes(need)} of this machine's memory "
                             f"for its data, and {format_bytes(available)} is available: use a batch of at most "
                             f"{fits:,}")


__all__ = ["HOST_BATCH_COPIES", "USABLE_FRACTION", "available_host_memory", "batch_bytes", "validate_batch_fits_host",
           "devices_share_host_memory", "largest_batch_within"]
