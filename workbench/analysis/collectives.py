"""The collective records: one family, from what a mode declares to what a trace timed, and one kinds table.

A collective is one fact seen at several stages; each stage's record adds what that stage knows:

* declared, ``CollectiveNeed`` (``training/modes/declaration.py``): what it carries, how often; no size yet;
* planned, ``PlannedCollective`` (:mod:`.planning`): bytes from the layout, the ring model's time;
* compiled, one instruction, ``CollectiveOp`` (:mod:`.hlo`): its HLO name, dtype, shapes and metadata;
* compiled, per step by shape, ``Collective`` (:mod:`.ledger`): the communication ledger's rows;
* compiled, per step by model code, ``CompiledCollective`` (:mod:`.compiled_step`): layers, source lines;
* timed, one instruction, ``CollectiveTiming`` (:mod:`.timeline`): durations, transfer, bandwidth.

Every record after the declaration is a :class:`CollectiveRecord` (``kind``, checked against
:data:`COLLECTIVE_KINDS`, ``bytes`` per device per occurrence, the whole array's size, and ``axes``); the
counted ones are :class:`CountedCollective` (``group_size``, ``count`` per step, ``total_bytes``). The two
compiled per-step records group the same instructions two ways and keep their own JSON forms (the ledger's
and ``plan --verify``'s). More: docs/design/communication-ledger.md.

Example:
    >>> COLLECTIVE_KINDS[:3]
    ('all-reduce', 'all-gather', 'reduce-scatter')
"""

from __future__ import annotations

from collections.abc import Iterable

# Every collective the workbench reads, declares or prices, in the order its tables list them.
COLLECTIVE_KINDS: tuple[str, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


class CollectiveRecord:
    """What every collective record after a mode's declaration says (mixed into frozen dataclasses, which
    declare the fields in their own order).

    Attributes:
        kind: one of :data:`COLLECTIVE_KINDS`.
        bytes: per device, per occurrence: the whole array's size; None where unknown (a trace read
            without its program's HLO).
        axes: the mesh axes each group of devices spans; ``()`` for a group of one or unknown.
    """

    kind: str
    bytes: int | None
    axes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise ValueError(f"collective kind {self.kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")


class CountedCollective(CollectiveRecord):
    """A collective record with its group and how often it runs per step.

    Attributes:
        group_size: devices per group (for a collective-permute, the devices that send).
        count: occurrences per step (loop iterations included).
    """

    bytes: int
    group_size: int
    count: int

    @property
    def total_bytes(self) -> int:
        """``bytes * count``: this record's share of a step, per device."""
        return self.bytes * self.count


def bytes_by_kind(collectives: Iterable[CountedCollective]) -> dict[str, int]:
    """Kind -> bytes per device per step (``sum(total_bytes)``), for the kinds present, in
    :data:`COLLECTIVE_KINDS` order.

    Example:
        >>> from workbench.analysis.ledger import Collective
        >>> bytes_by_kind([Collective("reduce-scatter", 8, ("data",), 1, "float32", ((2,),)),
        ...                Collective("all-reduce", 4, (), 3, "float32", ((1,),))])
        {'all-reduce': 12, 'reduce-scatter': 8}
    """
    totals: dict[str, int] = {}
    for collective in collectives:
        totals[collective.kind] = totals.get(collective.kind, 0) + collective.total_bytes
    return {kind: totals[kind] for kind in COLLECTIVE_KINDS if kind in totals}


def bytes_by_kind_and_axes(collectives: Iterable[CountedCollective]) -> dict[tuple[str, tuple[str, ...]], int]:
    """(kind, mesh axes) -> bytes per device per step: :func:`bytes_by_kind`, each kind apart by the axes it spans.

    Example:
        >>> from workbench.analysis.ledger import Collective
        >>> bytes_by_kind_and_axes([Collective("all-gather", 8, ("data",), 1, "float32", ((2,),)),
        ...                         Collective("all-gather", 4, ("model",), 3, "float32", ((1,),))])
        {('all-gather', ('data',)): 8, ('all-gather', ('model',)): 12}
    """
    totals: dict[tuple[str, tuple[str, ...]], int] = {}
    for collective in collectives:
        key = (collective.kind, tuple(collective.axes))
        totals[key] = totals.get(key, 0) + collective.total_bytes
    return totals


__all__ = ["COLLECTIVE_KINDS", "CollectiveRecord", "CountedCollective", "bytes_by_kind", "bytes_by_kind_and_axes"]
