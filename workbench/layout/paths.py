"""Readable paths for pytree leaves: ``l1/kernel``, ``opt_state/0/mu/l1/kernel``.

Rule tables match regexes against these strings, and every table shows them, so they must be the same
everywhere: NNX's trailing ``.value`` (a Variable's payload) is dropped.
"""

from __future__ import annotations

from typing import Any

import jax


def key_to_str(key: Any) -> str:
    """One path element as text."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_to_str(keypath: tuple) -> str:
    """A JAX key path as ``a/b/0/c``.

    Example:
        >>> path_to_str((jax.tree_util.DictKey("l1"), jax.tree_util.DictKey("kernel")))
        'l1/kernel'
    """
    parts = [key_to_str(k) for k in keypath]
    if len(keypath) > 1 and isinstance(keypath[-1], jax.tree_util.GetAttrKey) and parts[-1] == "value":
        parts = parts[:-1]
    return "/".join(parts)


def is_array_like(leaf: Any) -> bool:
    """Arrays, NumPy arrays and ``ShapeDtypeStruct``s: things with a shape and a dtype."""
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def leaves_with_paths(tree: Any, is_leaf=None) -> list[tuple[str, Any]]:
    """Every leaf with its path string, in JAX's flattening order.

    Example:
        >>> leaves_with_paths({"w": 1, "b": [2, 3]})
        [('b/0', 2), ('b/1', 3), ('w', 1)]
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [(path_to_str(path), leaf) for path, leaf in flat]
