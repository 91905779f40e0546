"""A bound on how many dispatched programs may be unfinished at once.

:class:`InFlight` keeps the outputs of the last :data:`MAX_IN_FLIGHT` dispatched programs and waits for
the oldest when one more is added: backpressure that keeps Stop and Pause prompt and the queued batches few,
without making the devices wait. It was first added against XLA's CPU collectives aborting under a long
queue of steps; that cause is fixed where the devices are set up. Why: docs/design/in-flight-steps.md.

Example:
    >>> import jax.numpy as jnp
    >>> queue, step, loss = InFlight(), jax.jit(lambda x: x * 0.5), jnp.ones(())
    >>> for _ in range(100):  # a training loop: state, metrics = mode.step(state, batch)
    ...     loss = step(loss)
    ...     queue.add(loss)  # queue.add(metrics["loss"])
    >>> len(queue) <= MAX_IN_FLIGHT
    True
"""

from __future__ import annotations

import collections
from typing import Any

import jax

MAX_IN_FLIGHT = 16  # Stop and Pause act within 16 steps; the collectives' thread pools are sized in workbench.devices


class InFlight:
    """The outputs of the programs dispatched last; :meth:`add` waits for the oldest beyond ``limit``."""

    def __init__(self, limit: int = MAX_IN_FLIGHT):
        self.limit = limit
        self._outputs: collections.deque = collections.deque()

    def add(self, output: Any) -> None:
        """Note one more dispatched program's output (any pytree of arrays); wait for the oldest if full."""
        self._outputs.append(output)
        if len(self._outputs) > self.limit:
            jax.block_until_ready(self._outputs.popleft())

    def clear(self) -> None:
        """Forget every output (after something waited for all of them, e.g. a metrics read)."""
        self._outputs.clear()

    def __len__(self) -> int:
        return len(self._outputs)
