"""What a run reports as it goes: :class:`TrainEvent` records, emitted by the in-process
:class:`~workbench.training.trainer.Trainer` and rebuilt from a run's files by
:class:`~workbench.training.run_follower.RunFollower`. Standard library only: no JAX.

Example:
    >>> TrainEvent("metrics", 10, {"loss": 0.5}, "mlp-dp").to_json()
    {'kind': 'metrics', 'step': 10, 'run': 'mlp-dp', 'loss': 0.5}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

@dataclasses.dataclass(frozen=True)
class TrainEvent:
    """One thing that happened in a run: ``kind``, the step, and its data.

    ``kind`` is ``start``, ``compiled``, ``metrics``, ``eval``, ``sync``, ``checkpoint`` (a save has started; it
    reaches the disk in the background), ``profile``, ``paused``, ``resumed``, ``silent`` (only from a followed
    run: no new line and no summary for a while, see run_follower) or ``end``.
    """

    kind: str
    step: int
    data: dict
    run: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "run": self.run, **self.data}


def deliver(event: TrainEvent, subscribers: list[Callable[[TrainEvent], None]], errors: list[str]) -> None:
    """Call every subscriber with ``event``; one that raises is dropped and its error kept in ``errors``
    (a broken plot must not break training or following).

    Example:
        >>> def broken(event): raise ValueError("no plot")
        >>> seen, subscribers, errors = [], [broken], []
        >>> subscribers.append(seen.append)
        >>> deliver(TrainEvent("end", 3, {}, "r"), subscribers, errors)
        >>> len(seen), len(subscribers), errors
        (1, 1, ["broken: ValueError('no plot')"])
    """
    for callback in list(subscribers):
        try:
            callback(event)
        except Exception as error:  # noqa: BLE001 - a subscriber must not end the run
            errors.append(f"{getattr(callback, '__name__', callback)!s}: {error!r}")
            subscribers.remove(callback)
