"""Rule tables whose leaves are sharded over the data axis too: the layout of FSDP x tensor parallelism.

A :class:`ShardedRuleTable` places each leaf by its rule, as a :class:`~.rules.RuleTable` does (the
``model`` splits of a model's tensor-parallel pairs), then shards it over ``data`` as the ``"shard"``
strategy does (:func:`~.tree_layout.shard_largest_dim`), on the largest dimension divisible by the data
axis that no rule splits (:func:`shard_beside`). A leaf with no such dimension stays whole over ``data``.

Why mesh axes of size 1 are dropped from a rule's spec: they split nothing, and dropping them makes the
layout on ``data=N,model=1`` exactly the ``"shard"`` strategy's (``fsdp``'s), dimension for dimension.

Example:
    >>> from jax.sharding import PartitionSpec
    >>> shard_beside(PartitionSpec(None, "model"), (64, 32), {"data": 4, "model": 2})
    (P('data', 'model'), "dimension 0 (64) sharded over 'data'")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from jax.sharding import PartitionSpec

from .rules import RuleTable
from .specs import entry_axes, spec_entries


class ShardedRuleTable(RuleTable):
    """A :class:`~.rules.RuleTable` whose leaves are also sharded over ``data_axis`` (see the module docstring).

    Example:
        >>> ShardedRuleTable([(r"kernel$", "None, model")]).data_axis
        'data'
    """

    def __init__(self, rules: Iterable[tuple[str, object]] | RuleTable, data_axis: str = "data"):
        super().__init__(rules)
        self.data_axis = data_axis

    def __repr__(self) -> str:
        return f"Sharded{super().__repr__()}"


def shard_beside(spec: PartitionSpec, shape: tuple[int, ...], mesh_axes: Mapping[str, int],
                 data_axis: str = "data") -> tuple[PartitionSpec, str]:
    """``spec`` (its size-1 axes dropped) with ``data_axis`` added on the largest dimension of ``shape``
    divisible by the axis size that ``spec`` leaves unsplit, and why; ``spec`` alone if there is none.

    Example:
        >>> shard_beside(PartitionSpec("model"), (32,), {"data": 4, "model": 2})
        (P('model',), "replicated over 'data': no dimension of (32,) left unsplit is divisible by 'data' (4)")
    """
    entries = [tuple(a for a in entry_axes(e) if mesh_axes.get(a, 1) > 1) for e in spec_entries(spec)]
    entries += [()] * (len(shape) - len(entries))
    size = mesh_axes.get(data_axis, 1)
    # As the "shard" strategy chooses (shard_largest_dim), among the dimensions no rule splits.
    candidates = [d for d, axes in enumerate(entries) if not axes and shape[d] >= size and shape[d] % size == 0]
    if candidates:
        dim = max(candidates, key=lambda d: (shape[d], -d))
        entries[dim] = (data_axis,)
        reason = f"dimension {dim} ({shape[dim]}) sharded over {data_axis!r}"
    else:
        reason = (f"replicated over {data_axis!r}: no dimension of {tuple(shape)} left unsplit is divisible by "
                  f"{data_axis!r} ({size})")
    if not any(entries):
        return PartitionSpec(), reason  # whole, written as the "shard" strategy writes it
    return PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else axes for axes in entries)), reason
