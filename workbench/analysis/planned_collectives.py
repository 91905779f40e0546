"""The collectives a planned step runs: a mode's declared ones, sized from the layout and priced with the ring model.

Example:
    >>> from flax import nnx
    >>> from workbench.analysis.cost_model import hardware
    >>> from workbench.layout.tree_layout import layout_tree
    >>> from workbench.training.models import abstract_model
    >>> from workbench.training.modes import mode_class
    >>> layout = layout_tree(nnx.state(abstract_model("mlp"), nnx.Param), "data=8", "replicate")
    >>> planned, synced = step_collectives(mode_class("dp"), layout.mesh, layout, hardware("cpu"), None, 0, [])
    >>> [(c.kind, c.axes, c.group_size) for c in planned], synced == layout.bytes_per_device
    ([('all-reduce', ('data',), 8)], True)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..layout.mesh import DATA_AXIS, MeshShape
from ..layout.specs import entry_axes, spec_entries
from ..layout.tree_layout import TreeLayout
from ..training.modes.base import DATA_SHARDED_PLACEMENTS
from ..training.modes.fsdp_whole_tree import WholeTreeShardedDataParallel
from .collectives import CountedCollective
from .cost_model import Hardware, collective_time, group_spans_hosts


@dataclasses.dataclass(frozen=True)
class PlannedCollective(CountedCollective):
    """One kind of collective a step runs, in theory.

    Attributes:
        kind: ``all-reduce``, ``all-gather`` or ``reduce-scatter``.
        what: what it moves, in words.
        bytes: ``V`` of the ring formula: the full array on each device, for one occurrence.
        axes: the mesh axes of the group.
        group_size: devices in each group.
        count: occurrences per step.
        time_each_s: ring-model seconds for one occurrence.
    """

    kind: str
    what: str
    bytes: int
    axes: tuple[str, ...]
    group_size: int
    count: int
    time_each_s: float

    @property
    def time_s(self) -> float:
        """Seconds per step for all ``count`` occurrences."""
        return self.count * self.time_each_s

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "what": self.what, "bytes": self.bytes, "axes": list(self.axes),
            "group_size": self.group_size, "count": self.count, "time_each_s": self.time_each_s, "time_s": self.time_s,
        }


def step_collectives(
    mode_cls, mesh: MeshShape, params_layout: TreeLayout, hw: Hardware,
    block_activation: int | None, activation_all_reduces: int, notes: list[str], custom: bool = False,
    gathered_bytes_per_float: int = 4, microbatches: int = 1, not_regathered_bytes: int = 0,
    gradient_bytes_per_float: int = 4,
) -> tuple[list[PlannedCollective], int]:
    """The mode's declared collectives (:attr:`ParallelMode.collectives`), sized from the layout and
    priced with the ring model, and the per-device gradient bytes synchronised over 'data'.

    Sizes by what each carries: the gradients of leaves not split over the axis (their per-device bytes); leaves
    split over the axis, gathered or reduce-scattered whole; a transformer block's activations,
    ``activation_all_reduces`` times a microbatch (:func:`~.plan_estimates.activation_all_reduces`). XLA combines
    small collectives, so each kind is priced as one bucketed collective. ``gathered_bytes_per_float``: the bytes a
    gathered float32 parameter takes on the wire (2 where a bf16 step gathers bf16: XLA:GPU casts before gathering,
    and a per-layer gathering mode casts its shards first off XLA:CPU). ``microbatches``: a step's microbatches
    (gradient accumulation): what runs inside each microbatch's forward and backward pass runs that many times
    (:func:`_per_microbatch`); ``block_activation`` is one microbatch's. ``not_regathered_bytes``: the per-device
    bytes, split over 'data', of the layers a per-layer gathering mode does not gather again for the backward pass
    (:func:`~.plan_estimates.not_regathered_bytes`). ``gradient_bytes_per_float``: the bytes a float32 parameter's
    gradient takes in a gradient all-reduce (2 where the compiler sums bf16 gradients).
    """
    collectives: list[PlannedCollective] = []
    synced = 0
    for need in _needs(mode_cls, custom):
        group = mesh.axis_size(need.axis) if need.axis in mesh.names else 1
        split = [leaf for leaf in params_layout.leaves if _split_over(leaf, need.axis)]
        split_bytes = sum(leaf.layout.bytes_per_device for leaf in split)
        count = 1
        if need.carries == "sharded-parameters":
            nbytes = split_bytes * group * gathered_bytes_per_float // 4
        elif need.carries == "regathered-parameters":
            nbytes = (split_bytes - not_regathered_bytes) * group * gathered_bytes_per_float // 4
        elif need.carries == "sharded-gradients":
            nbytes = split_bytes * group
        elif need.carries in ("gradients", "whole-gradients"):
            nbytes = (params_layout.bytes_per_device - split_bytes) * gradient_bytes_per_float // 4
        else:  # activations
            nbytes, count = block_activation or 0, activation_all_reduces
        if _per_microbatch(mode_cls, need.carries):
            count *= microbatches
        if need.axis == DATA_AXIS and need.carries not in ("sharded-parameters", "regathered-parameters"):
            synced += nbytes
        if nbytes > 0 and group > 1 and count > 0:
            what = need.what.split(":")[0]
            spans_hosts = group_spans_hosts(mesh, (need.axis,), hw.devices_per_host)
            time_each = collective_time(need.kind, nbytes, group, hw, spans_hosts=spans_hosts)
            collectives.append(PlannedCollective(need.kind, what, int(nbytes), (need.axis,), group, count, time_each))
    whole = [leaf for leaf in params_layout.leaves if not _split_over(leaf, DATA_AXIS)]
    if mode_cls.state_placement in DATA_SHARDED_PLACEMENTS and whole and not custom:
        notes.append(f"{len(whole)} parameter(s) have no dimension divisible by data={mesh.axis_size(DATA_AXIS)} "
                     "and stay whole on every device (their gradients are all-reduced)")
    return collectives, synced


def _per_microbatch(mode_cls, carries: str) -> bool:
    """Whether a collective runs in every microbatch of an accumulated step, not once per step: tp's activation
    all-reduces (inside each block), and a per-layer gathering mode's gathers and reduce-scatters (each layer is
    gathered where it is used, and its gradients scattered back at once, so a device only ever accumulates its own
    share: measured in tests/test_comm_ledger.py). A gradient all-reduce, and a whole-tree mode's gather, runs once."""
    if carries == "activations":
        return True
    return mode_cls.parameter_gathering == "per-layer" and carries in (
        "sharded-parameters", "regathered-parameters", "sharded-gradients")


def _split_over(leaf, axis: str) -> bool:
    return any(axis in entry_axes(entry) for entry in spec_entries(leaf.layout.spec))


def _needs(mode_cls, custom: bool) -> list:
    """The collectives to price: the mode's declaration; with your own rule table, the data-axis ones
    follow the table (leaves split over 'data' are gathered and reduce-scattered, the rest all-reduced),
    and activations are not estimated (the table's split is unknown to the model)."""
    needs = list(mode_cls.collectives)
    if custom:
        needs = [n for n in needs if n.carries != "activations" and n.axis != DATA_AXIS]
        if mode_cls.batch_axis == DATA_AXIS and not mode_cls.one_device:
            needs += list(WholeTreeShardedDataParallel.collectives)
    return needs


__all__ = ["PlannedCollective", "step_collectives"]
