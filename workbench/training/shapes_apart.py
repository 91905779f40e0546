"""Loop buffers in shapes of their own, so that the compiler cannot give two of them one layout.

XLA merges identical values before it propagates shardings, and a loop's buffers that start from zeros start from
identical values where their shapes are equal: a scan's stacks of what it saves and of its gradients, a gradient
accumulation's sums. Merged, they share one layout. Where one of them is split over a mesh axis the compiler manages
(a bias split over 'model') and another is whole (a layer norm's scale of the same length), Shardy settled the
conflict by splitting, and libtpu then split the residual stream over 'model' and gathered it before every matmul
(dp-tp's microbatches: 4.3-6.9x the bytes planned over 'model'; docs/design/compile-verification.md, "Loop buffers
in shapes of their own").

:func:`apart` gives each leaf after the first of its shape trailing axes of length 1 until its shape is its own, which
moves no data: XLA lowers the reshapes to bitcasts. :func:`restored` turns them back.

Example:
    >>> import jax.numpy as jnp
    >>> tree = {"bias": jnp.zeros(4), "scale": jnp.ones(4)}
    >>> [leaf.shape for leaf in jax.tree.leaves(apart(tree))]
    [(4,), (4, 1)]
    >>> restored(apart(tree), [(4,), (4,)])["scale"].shape
    (4,)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax


def apart(tree: Any) -> Any:
    """``tree`` with no two leaves of one shape: its leaves reshaped to :func:`apart_shapes` of theirs."""
    leaves, structure = jax.tree.flatten(tree)
    own = apart_shapes([leaf.shape for leaf in leaves])
    return jax.tree.unflatten(structure, [leaf.reshape(shape) for leaf, shape in zip(leaves, own, strict=True)])


def apart_shapes(shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``shapes`` with no two equal: the first of each shape as it is, each later one with the fewest trailing axes of
    length 1 that make it a shape no other has.

    Zeros a loop starts from are made in these shapes, not reshaped to them: XLA turns a reshape of a zero broadcast
    into a broadcast of the new shape after merging the broadcasts.

    Example:
        >>> apart_shapes([(4,), (4,), (4, 1), ()])
        [(4,), (4, 1, 1), (4, 1), ()]
    """
    taken = {tuple(shape) for shape in shapes}
    kept: set[tuple[int, ...]] = set()
    own = []
    for shape in map(tuple, shapes):
        if shape not in kept:
            kept.add(shape)
            own.append(shape)
            continue
        while shape in taken:
            shape += (1,)
        taken.add(shape)
        own.append(shape)
    return own


def restored(tree: Any, shapes: Sequence[tuple[int, ...]]) -> Any:
    """``tree``'s leaves reshaped to ``shapes`` (one per leaf, in ``jax.tree`` order): :func:`apart` undone, on the
    tree it made or on a loop's slice of it."""
    leaves, structure = jax.tree.flatten(tree)
    return jax.tree.unflatten(structure, [leaf.reshape(shape) for leaf, shape in zip(leaves, shapes, strict=True)])


def shapes_of(tree: Any) -> list[tuple[int, ...]]:
    """The shapes of ``tree``'s leaves, in ``jax.tree`` order (what :func:`restored` takes)."""
    return [leaf.shape for leaf in jax.tree.leaves(tree)]


__all__ = ["apart", "apart_shapes", "restored", "shapes_of"]
