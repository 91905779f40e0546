"""A bound on how many dispatched programs may be unfinished at once.

JAX dispatch is asynchronous: a jitted step returns before it has run, so a loop can queue many steps
ahead of the devices, and the trainer reads metrics only every ``log_every`` steps to keep it that way.
But XLA's CPU runtime runs the simulated devices' collectives on a shared thread pool, and with too many
executions queued its rendezvous deadlocks: measured on 2 cores with JAX 0.10.2, 60 chained ``dp`` steps
of the digits mlp on 8 simulated devices ran, 100 hung for 40 s and then aborted the whole process
("Termination timeout for all reduce ... Expected 8 threads to join the rendezvous"); 200 independent
evaluation calls did the same. A user who sets ``log_every=500`` must not lose the kernel.

:class:`InFlight` keeps the last :data:`MAX_IN_FLIGHT` programs' outputs and, when one more is added,
waits for the oldest to finish. That wait is backpressure, not a synchronisation with the newest step:
nothing is copied to the host, the step waited for was dispatched 16 steps earlier (normally finished
long before), and 16 steps stay queued, so the devices never wait for the host because of it.

Example:
    >>> queue = InFlight()
    >>> for step in range(100):  # doctest: +SKIP
    ...     state, metrics = mode.step(state, batch)
    ...     queue.add(metrics["loss"])
"""

from __future__ import annotations

import collections
from typing import Any

import jax

MAX_IN_FLIGHT = 16  # well under the ~60-100 where XLA:CPU's collectives deadlocked on 2 cores


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
