"""The layout linter: what in a tree's layout will hurt on a real mesh, and how to fix it.

:func:`lint_layout` reads a :class:`~workbench.layout.tree_layout.TreeLayout` (nothing is recomputed or
allocated) and returns :class:`LayoutWarning` records, worst first:

=======================  =====================================================================
``indivisible``          a leaf's spec splits a dimension its mesh axes do not divide; JAX would
                         refuse to place it (lay out with ``on_invalid="replicate"`` to see them all)
``large-replicated``     a large leaf every device holds whole; the fix names a spec that shards
                         it, or the padding that would make one of its dimensions divisible
``state-not-split``      an optimizer moment held whole while its parameter is split (a pattern
                         anchored at the start of the path misses the moments' paths)
``unused-rule``          a rule-table entry that matched no leaf (a typo in a pattern, usually)
=======================  =====================================================================

Replication is what data parallelism is, so ``large-replicated`` fires only above ``min_bytes`` per
leaf (default 1 MiB): a laptop-sized model is quiet, a 1B-parameter embedding on 512 devices is not.

Example:
    >>> import jax, jax.numpy as jnp
    >>> state = {"embed": jax.ShapeDtypeStruct((32000, 2048), jnp.float32)}
    >>> from workbench.layout.tree_layout import layout_tree
    >>> [w.kind for w in lint_layout(layout_tree(state, "data=512", "replicate"))]
    ['large-replicated']
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.sharding import PartitionSpec

from .specs import format_spec
from .tree_layout import LeafLayout, TreeLayout, shard_largest_dim
from ..formatting import format_bytes

DEFAULT_MIN_BYTES = 1 << 20  # 1 MiB: below this a replicated leaf costs too little to be worth a warning
SEVERITIES = ("error", "warning")


@dataclasses.dataclass(frozen=True)
class LayoutWarning:
    """One lint finding: its kind, the leaf (or rule) it is about, what is wrong and the fix.

    ``bytes_per_device`` is what the leaf costs each device as laid out (0 for rule findings); the
    report sorts by severity, then by it.
    """

    kind: str
    severity: str
    path: str | None
    message: str
    fix: str
    bytes_per_device: int = 0

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}; {self.fix}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _best_split(leaf: LeafLayout) -> tuple[str, int] | None:
    """The single-axis spec that saves the most bytes for a replicated leaf, as (spec text, bytes)."""
    best = None
    for axis, size in leaf.layout.mesh.axes.items():
        if size < 2:
            continue
        spec, _ = shard_largest_dim(leaf.layout.shape, axis, size)
        if spec == PartitionSpec():  # no dimension divides by this axis
            continue
        per_device = leaf.layout.bytes_per_device // size
        if best is None or per_device < best[1]:
            best = (format_spec(spec, "code"), per_device)
    return best


def _padding_fix(leaf: LeafLayout) -> str:
    """No dimension divides by any axis: the padding that would make the largest one divisible."""
    shape = leaf.layout.shape
    axis, size = max(leaf.layout.mesh.axes.items(), key=lambda item: item[1])
    dim = max(range(len(shape)), key=lambda d: shape[d])
    padded = -(-shape[dim] // size) * size
    return (f"no dimension of {shape} divides by any mesh axis: pad dimension {dim} ({shape[dim]}) to "
            f"{padded} to shard it over {axis!r} ({size})")


def _large_replicated(leaf: LeafLayout, devices: int) -> LayoutWarning:
    held = leaf.layout.bytes_per_device
    split = _best_split(leaf)
    if split is not None:
        spec, per_device = split
        fix = f"shard it, e.g. {spec}: {format_bytes(per_device)} per device instead of {format_bytes(held)}"
    else:
        fix = _padding_fix(leaf)
    return LayoutWarning(
        "large-replicated", "warning", leaf.path,
        f"{leaf.path} {leaf.layout.shape} ({format_bytes(held)}) is held whole by all {devices:,} devices",
        fix, held,
    )


def _indivisible(leaf: LeafLayout, problem: str) -> LayoutWarning:
    return LayoutWarning(
        "indivisible", "error", leaf.path,
        f"{leaf.path} {leaf.layout.shape} cannot be placed as asked (counted as replicated here)",
        problem, leaf.layout.bytes_per_device,
    )


def _moment_warnings(params: TreeLayout, state: TreeLayout, min_bytes: int) -> list[LayoutWarning]:
    """Optimizer-state leaves held whole although the parameter they belong to is split.

    A moment's path ends with its parameter's path (``.../mu/embed/embedding``), so a pattern anchored at
    the start (``^embed``) places the parameter and silently misses its moments.
    """
    split = {leaf.path: leaf for leaf in params.leaves if not leaf.layout.is_fully_replicated}
    found = []
    for leaf in state.leaves:
        if not leaf.layout.is_fully_replicated or leaf.layout.bytes_per_device < min_bytes:
            continue
        owner = next((split[p] for p in split if leaf.path.endswith("/" + p)), None)
        if owner is not None and owner.layout.shape == leaf.layout.shape:
            found.append(LayoutWarning(
                "state-not-split", "warning", leaf.path,
                f"optimizer state {leaf.path} ({format_bytes(leaf.layout.bytes_per_device)}) is held whole by all "
                f"{state.mesh.size:,} devices, but its parameter {owner.path} is split "
                f"{format_spec(owner.layout.spec, 'code')}",
                "let the rule match the end of the path (e.g. '(^|/)embed/embedding$' instead of '^embed'), so "
                "the moments follow their parameter", leaf.layout.bytes_per_device,
            ))
    return found


def lint_layout(layout: TreeLayout, *, min_bytes: int = DEFAULT_MIN_BYTES,
                optimizer_state: TreeLayout | None = None) -> list[LayoutWarning]:
    """Everything in ``layout`` worth fixing before a production run, errors first, costliest first.

    Args:
        layout: a tree's layout (:func:`~workbench.layout.tree_layout.layout_tree`; use
            ``on_invalid="replicate"`` so every indivisible leaf is reported, not just the first).
        min_bytes: the smallest replicated leaf (bytes per device) worth a ``large-replicated`` warning.
        optimizer_state: the optimizer state's layout under the same rules, when ``layout`` is the
            parameters': its moments are checked against their parameters (``state-not-split``), its
            indivisible leaves are reported too, and a rule that matched only optimizer state (e.g. a
            catch-all ``.*`` for step counters) is not "unused".

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from workbench.layout.tree_layout import layout_tree
        >>> state = {"w": jax.ShapeDtypeStruct((1000, 4096), jnp.float32)}
        >>> table = layout_tree(state, "data=16", [("w", "data, None")], on_invalid="replicate")
        >>> print(lint_layout(table)[0].kind)
        indivisible
    """
    devices = layout.mesh.size
    warnings = []
    for leaf in layout.leaves:
        if leaf.problem is not None:
            warnings.append(_indivisible(leaf, leaf.problem))
        elif devices > 1 and leaf.layout.is_fully_replicated and leaf.layout.bytes_per_device >= min_bytes:
            warnings.append(_large_replicated(leaf, devices))
    if optimizer_state is not None:
        warnings += _moment_warnings(layout, optimizer_state, min_bytes)
        reported = [leaf.path for leaf in layout.leaves if leaf.problem is not None]
        # A moment of a reported parameter is reported once, with its parameter.
        warnings += [_indivisible(leaf, leaf.problem) for leaf in optimizer_state.leaves
                     if leaf.problem is not None and not any(leaf.path.endswith("/" + p) for p in reported)]
    unused = set(layout.unused_rules)
    if optimizer_state is not None and optimizer_state.rules is not None:
        unused &= set(optimizer_state.unused_rules)
    if layout.rules is not None:
        for index in sorted(unused):
            rule = layout.rules.rules[index]
            warnings.append(LayoutWarning(
                "unused-rule", "warning", None, f"rule {index} ({rule}) matched no leaf",
                "check the pattern against the paths (they look like "
                f"{layout.leaves[0].path if layout.leaves else 'layer/kernel'!r}) or remove it",
            ))
    return sorted(warnings, key=lambda w: (SEVERITIES.index(w.severity), -w.bytes_per_device))


def lint_text(warnings: list[LayoutWarning], *, limit: int = 8) -> str:
    """The warnings as lines, at most ``limit`` (then how many more, and what they cost)."""
    if not warnings:
        return "no layout warnings"
    lines = [f"  - {w}" for w in warnings[:limit]]
    rest = warnings[limit:]
    if rest:
        lines.append(f"  - ... and {len(rest)} more ({format_bytes(sum(w.bytes_per_device for w in rest))} "
                     "per device between them)")
    return "\n".join(lines)


__all__ = ["DEFAULT_MIN_BYTES", "LayoutWarning", "lint_layout", "lint_text"]
