"""Layouts of whole pytrees: a model's parameters and optimizer state, leaf by leaf, with totals.

:func:`layout_tree` takes abstract state (``nnx.eval_shape``/``jax.eval_shape`` output: nothing is
allocated), a mesh, and where each leaf's spec comes from:

* ``"replicate"``: every leaf on every device (plain data parallelism);
* ``"shard"``: each leaf's largest dimension divisible by the data axis is sharded over it (ZeRO/FSDP
  style); scalars and leaves with no divisible dimension stay replicated, and the reason is recorded;
* a :class:`~workbench.layout.rules.RuleTable` or a list of ``(regex, spec)`` pairs (first match wins);
* a :class:`~workbench.layout.sharded_rules.ShardedRuleTable`: its rules, and each leaf sharded over the
  data axis too on a dimension no rule splits (FSDP x tensor parallelism);
* a dict ``{path: spec}``, a function ``(path, leaf) -> spec``, a single ``PartitionSpec`` for all, or a
  pytree of specs shaped like the state;
* None: each leaf's own ``NamedSharding`` if it has one, else replicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import jax
from jax.sharding import PartitionSpec

from ..errors import SpecError, WorkbenchError
from .array_layout import ArrayLayout, PlacedMesh, layout_array, place_mesh
from .mesh import MeshShape
from .paths import is_array_like, leaves_with_paths
from .rules import RuleTable
from .sharded_rules import ShardedRuleTable, shard_beside
from .specs import format_spec, parse_spec

STRATEGIES = ("replicate", "shard")
ON_INVALID = ("raise", "replicate")


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """One leaf of a tree: its path, its layout, and why it got its spec."""

    path: str
    layout: ArrayLayout
    reason: str
    rule: int | None = None
    # Set when the requested spec could not be applied (``on_invalid="replicate"``): why, naming the spec.
    problem: str | None = None

    def row(self) -> dict:
        """A table row of plain values."""
        return {
            "path": self.path,
            "shape": list(self.layout.shape),
            "dtype": self.layout.dtype,
            "spec": format_spec(self.layout.spec),
            "shard_shape": list(self.layout.shard_shape),
            "bytes_per_device": self.layout.bytes_per_device,
            "replication": self.layout.replication,
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """Per-leaf layouts of a pytree on one mesh, with per-device totals.

    ``unused_rules`` lists rule-table entries that matched no leaf (a typo in a pattern, usually).
    """

    mesh: MeshShape
    leaves: tuple[LeafLayout, ...]
    rules: RuleTable | None = None
    unused_rules: tuple[int, ...] = ()

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        """path -> spec, for every leaf."""
        return {leaf.path: leaf.layout.spec for leaf in self.leaves}

    @property
    def bytes_per_device(self) -> int:
        """Bytes every device holds for the whole tree.

        Specs must divide dimensions evenly, so every device of the mesh holds the same amount.
        """
        return sum(leaf.layout.bytes_per_device for leaf in self.leaves)

    @property
    def per_device_bytes(self) -> dict[int, int]:
        """device id -> bytes of the whole tree on it (equal for every device: shards are even)."""
        ids = self.leaves[0].layout.device_ids if self.leaves else tuple(range(self.mesh.size))
        held = self.bytes_per_device  # summed once, not once per device
        return dict.fromkeys(ids, held)

    @property
    def total_bytes(self) -> int:
        """Bytes of the tree held once (what one device holds without any sharding)."""
        return sum(leaf.layout.total_bytes for leaf in self.leaves)

    @property
    def replicated_leaves(self) -> list[LeafLayout]:
        """Leaves held whole by every device."""
        return [leaf for leaf in self.leaves if leaf.layout.is_fully_replicated]

    def group_bytes_per_device(self, depth: int = 1) -> dict[str, int]:
        """Bytes per device summed by the first ``depth`` path components (e.g. params vs opt_state)."""
        out: dict[str, int] = {}
        for leaf in self.leaves:
            group = "/".join(leaf.path.split("/")[:depth])
            out[group] = out.get(group, 0) + leaf.layout.bytes_per_device
        return out

    def leaf(self, path: str) -> LeafLayout:
        """The leaf with this path; KeyError listing a few paths if none."""
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        sample = ", ".join(leaf.path for leaf in self.leaves[:5])
        raise KeyError(f"no leaf {path!r}; paths look like: {sample}")

    def rows(self) -> list[dict]:
        """One plain dict per leaf (path, shape, dtype, spec, shard shape, bytes/device, replication, reason)."""
        return [leaf.row() for leaf in self.leaves]

    def to_json(self) -> dict:
        """Everything as JSON-ready values."""
        return {
            "mesh": self.mesh.axes,
            "leaves": self.rows(),
            "bytes_per_device": self.bytes_per_device,
            "total_bytes": self.total_bytes,
            "unused_rules": [str(self.rules.rules[i]) for i in self.unused_rules] if self.rules else [],
        }


def shard_largest_dim(shape: tuple[int, ...], axis: str, axis_size: int) -> tuple[PartitionSpec, str]:
    """The ``"shard"`` strategy for one leaf: its largest dimension divisible by the axis size.

    Ties go to the earlier dimension. Returns the spec and the reason, which says why a leaf stays
    replicated (scalar, or no divisible dimension).

    Example:
        >>> shard_largest_dim((3, 16), "data", 8)
        (P(None, 'data'), "dimension 1 (16) sharded over 'data'")
    """
    if not shape:
        return PartitionSpec(), "replicated: scalar"
    candidates = [d for d, size in enumerate(shape) if size >= axis_size and size % axis_size == 0]
    if not candidates:
        return PartitionSpec(), f"replicated: no dimension of {shape} is divisible by {axis!r} ({axis_size})"
    dim = max(candidates, key=lambda d: (shape[d], -d))
    entries: list[str | None] = [None] * len(shape)
    entries[dim] = axis
    return PartitionSpec(*entries), f"dimension {dim} ({shape[dim]}) sharded over {axis!r}"


def _spec_pytree(specs: Any) -> list | None:
    """Specs given as a pytree shaped like the state, flattened in JAX's order; None if not one."""
    if isinstance(specs, (PartitionSpec, Mapping, RuleTable, str)) or callable(specs):
        return None
    return jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


def layout_tree(tree: Any, mesh: Any, specs: Any = None, *, data_axis: str = "data",
                on_invalid: str = "raise") -> TreeLayout:
    """The layout of every array leaf of a pytree (non-array leaves are skipped). Allocates nothing.

    Args:
        tree: a pytree of arrays or ``ShapeDtypeStruct`` (e.g. ``nnx.state(nnx.eval_shape(...))``).
        mesh: any mesh :func:`~workbench.layout.array_layout.layout_array` accepts (abstract ones of any size).
        specs: where each leaf's spec comes from (see the module docstring).
        data_axis: the axis the ``"shard"`` strategy uses.
        on_invalid: ``"raise"`` (default) stops at the first leaf whose spec does not fit; ``"replicate"``
            lays such leaves out replicated and records why in ``LeafLayout.problem``, so a linter
            (:func:`~workbench.layout.lint.lint_layout`) can report every problem of a table at once.

    Raises :class:`~workbench.errors.SpecError` naming the leaf (and the rule) whose spec does not fit.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> state = {"w": jax.ShapeDtypeStruct((16, 3), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
        >>> table = layout_tree(state, "data=8", "shard")
        >>> table.leaf("w").layout.spec, table.leaf("step").reason
        (P('data', None), 'replicated: scalar')
    """
    if on_invalid not in ON_INVALID:
        raise WorkbenchError(f"on_invalid={on_invalid!r} is not one of {', '.join(ON_INVALID)}")
    placed = place_mesh(mesh)  # read once: every leaf's layout shares its shape and device ids
    mesh_shape = placed.shape
    all_pairs = leaves_with_paths(tree)
    source = _spec_source(specs, mesh_shape, data_axis, len(all_pairs))
    leaves = []
    used_rules: set[int] = set()
    for position, (path, leaf) in enumerate(all_pairs):
        if not is_array_like(leaf):
            continue
        spec, reason, rule = source.choose(position, path, leaf)
        if rule is not None:
            used_rules.add(rule)
        leaves.append(_lay_out_leaf(path, leaf, placed, spec, reason, rule, source.rules, on_invalid))
    rules = source.rules
    unused = tuple(i for i in range(len(rules)) if i not in used_rules) if rules is not None else ()
    return TreeLayout(mesh_shape, tuple(leaves), rules, unused)


@dataclasses.dataclass(frozen=True)
class _SpecSource:
    """Where each leaf's spec comes from, decided once for the whole tree (see the module docstring)."""

    specs: Any
    strategy: str | None = None  # "replicate" or "shard"
    rules: RuleTable | None = None
    flat_specs: list | None = None  # a spec tree, flattened in the state's order
    data_axis: str = "data"
    axis_size: int = 0  # of data_axis, for "shard"
    mesh_axes: Mapping[str, int] | None = None  # axis -> size, for a ShardedRuleTable

    def choose(self, position: int, path: str, leaf: Any) -> tuple[PartitionSpec, str, int | None]:
        """The spec of one leaf, why it got it, and the number of the rule that gave it (if one did)."""
        specs = self.specs
        if specs is None:
            own = getattr(getattr(leaf, "sharding", None), "spec", None)
            if own is None:
                return PartitionSpec(), "replicated: no spec given", None
            return own or PartitionSpec(), "its own sharding", None
        if self.strategy == "replicate":
            return PartitionSpec(), "replicated", None
        if self.strategy == "shard":
            return (*shard_largest_dim(tuple(leaf.shape), self.data_axis, self.axis_size), None)
        if self.rules is not None:
            rule = self.rules.match(path)
            if isinstance(self.rules, ShardedRuleTable):
                spec = PartitionSpec() if rule is None else self.rules.rules[rule].spec
                spec, sharded = shard_beside(spec, tuple(leaf.shape), self.mesh_axes or {}, self.rules.data_axis)
                given = "no rule matched" if rule is None else f"rule {rule}: {self.rules.rules[rule].pattern}"
                return spec, f"{given}; {sharded}", rule
            if rule is None:
                return PartitionSpec(), "replicated: no rule matched", None
            return self.rules.rules[rule].spec, f"rule {rule}: {self.rules.rules[rule].pattern}", rule
        if isinstance(specs, PartitionSpec):
            return specs, "the spec given for all leaves", None
        if isinstance(specs, Mapping):
            if path in specs:
                return parse_spec(specs[path]), "given by path", None
            return PartitionSpec(), "replicated: path not in the spec dict", None
        if callable(specs):  # returns a spec in any form parse_spec reads
            return parse_spec(cast(Any, specs(path, leaf))), "chosen by the spec function", None
        if self.flat_specs is None:  # _spec_source flattened every other kind of specs
            raise WorkbenchError(f"cannot read specs {specs!r}: give a spec tree, a rule table or a strategy name")
        return parse_spec(self.flat_specs[position]), "from the spec tree", None


def _spec_source(specs: Any, mesh: MeshShape, data_axis: str, leaf_count: int) -> _SpecSource:
    """Read ``specs`` once: a strategy name, a rule table (or its pairs), a spec tree, or the rest as given."""
    if isinstance(specs, (list, tuple)) and specs and all(
        isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str) for item in specs
    ):
        specs = RuleTable(specs)
    strategy = specs if isinstance(specs, str) else None
    if strategy is not None and strategy not in STRATEGIES:
        raise WorkbenchError(
            f"specs {specs!r} is not a strategy: use 'replicate', 'shard', a RuleTable, a dict of path -> spec, "
            "or a PartitionSpec"
        )
    axis_size = mesh.axis_size(data_axis) if strategy == "shard" else 0
    rules = specs if isinstance(specs, RuleTable) else None
    # A spec tree is matched to the state by position, so the same array at two paths (tied weights)
    # still gets each path's own spec.
    flat_specs = _spec_pytree(specs) if specs is not None else None
    if flat_specs is not None and len(flat_specs) != leaf_count:
        raise WorkbenchError(
            f"the spec tree has {len(flat_specs)} leaves but the state has {leaf_count}: "
            "give a spec for every leaf, or use a rule table"
        )
    return _SpecSource(specs, strategy, rules, flat_specs, data_axis, axis_size, mesh.axes)


def _lay_out_leaf(
    path: str, leaf: Any, mesh: PlacedMesh, spec: PartitionSpec, reason: str, rule: int | None, rules: RuleTable | None,
    on_invalid: str,
) -> LeafLayout:
    """One leaf's layout; a spec that does not fit raises, or (``on_invalid="replicate"``) is recorded."""
    try:
        return LeafLayout(path, layout_array(leaf, mesh, spec), reason, rule)
    except SpecError as error:
        where = f", rule {rule} ({rules.rules[rule].pattern!r})" if rule is not None and rules is not None else ""
        if on_invalid == "raise":
            raise SpecError(f"leaf {path!r} (shape {tuple(leaf.shape)}{where}): {error}") from None
        layout = layout_array(leaf, mesh, PartitionSpec())
        return LeafLayout(path, layout, f"replicated: its spec {format_spec(spec)} does not fit", rule,
                          f"{error}{where}")
