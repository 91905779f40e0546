"""Layer names in compiled programs: each ``nnx.Module`` call runs in a ``jax.named_scope`` of its path.

NNX, unlike Linen, names nothing, so a compiled step's ops all read ``jit(_step_fn)/jvp()/dot_general``
and the collective one layer causes cannot be told from another's. :func:`name_layers` makes every
submodule call open a named scope, so op names (HLO ``op_name`` metadata, profiles) carry the layer path,
e.g. ``jit(_step_fn)/transpose(jvp(blocks/3))/mlp/down/dot_general``, and :func:`layer_of` reads it
back. Names change metadata only: the computation and its compiled code are the same.

Example:
    >>> from workbench.training.models import build_model
    >>> graphdef, params = nnx.split(build_model("mlp"))
    >>> model = name_layers(nnx.merge(graphdef, params))
    >>> layer_of("jit(f)/jvp(blocks/3)/mlp/down/dot_general", {"blocks/3", "blocks/3/mlp/down"})
    'blocks/3/mlp/down'
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import jax
from flax import nnx

_NAME_ATTRIBUTE = "_workbench_layer_name"
_NAMED_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def _named_class(cls: type) -> type:
    """``cls`` with a ``__call__`` that opens the instance's named scope (one subclass per class, cached)."""
    if cls not in _NAMED_CLASSES:
        original = cls.__call__

        def __call__(self, *args, **kwargs):
            name = self.__dict__.get(_NAME_ATTRIBUTE)
            if not name:
                return original(self, *args, **kwargs)
            with jax.named_scope(name):
                return original(self, *args, **kwargs)

        _NAMED_CLASSES[cls] = type(cls.__name__, (cls,), {
            "__call__": __call__, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        })
    return _NAMED_CLASSES[cls]


def module_paths(model: nnx.Module) -> dict[str, Any]:
    """``"blocks/3/mlp/down"`` -> submodule, for every submodule of ``model`` (the root itself excluded)."""
    return {"/".join(map(str, path)): node for path, node in nnx.iter_graph(model)
            if isinstance(node, nnx.Module) and path}


def _defines_call(cls: type) -> bool:
    """Whether instances are called: containers such as ``nnx.List`` define no ``__call__`` of their own."""
    return any("__call__" in vars(base) for base in cls.__mro__[:-1])


def name_layers(model: nnx.Module) -> nnx.Module:
    """``model`` with each submodule's calls in a named scope of its path; returns ``model``.

    A scope holds the path below the nearest enclosing *called* module (containers like ``nnx.List`` are
    never called), so nested calls spell the whole path: ``blocks/3``, then ``mlp``, then ``down``.
    Meant for the fresh module a step builds with ``nnx.merge`` while tracing: its submodules' classes
    are swapped for cached subclasses whose ``__call__`` opens the scope.
    """
    modules = [(tuple(path), node) for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)]
    called = {path for path, node in modules if not path or _defines_call(type(node))}
    for path, node in modules:
        if not path or path not in called or type(node) in _NAMED_CLASSES.values():  # root, container, or named
            continue
        parent = max((len(p) for p in called if len(p) < len(path) and path[: len(p)] == p), default=0)
        object.__setattr__(node, _NAME_ATTRIBUTE, "/".join(map(str, path[parent:])))  # plain data, not a Variable
        try:
            node.__class__ = _named_class(type(node))
        except Exception:  # noqa: BLE001 - a class that cannot be subclassed or swapped: left unnamed, still correct
            pass
    return model


def _scope_names(op_name: str) -> list[str]:
    """The scope names in an op name, in order, transformations unwrapped: JAX prints the first scope under
    a transformation inside it, ``transpose(jvp(blocks/3))/mlp/down/dot_general``."""
    names, depth, current = [], 0, ""
    for ch in op_name + "/":
        if ch == "/" and depth == 0:
            inner = current[current.rfind("(") + 1 :].rstrip(")") if "(" in current else current
            names += [name for name in inner.split("/") if name]
            current = ""
            continue
        depth += (ch == "(") - (ch == ")")
        current += ch
    return names


def layer_of(op_name: str, layers: Iterable[str]) -> str | None:
    """The deepest path of ``layers`` spelled out in an op name (None if none: the loss, the optimizer).

    Example:
        >>> layer_of("jit(f)/transpose(jvp(blocks/0))/attn/bhqk,bkhd->bqhd/dot_general",
        ...          ["blocks/0", "blocks/0/attn"])
        'blocks/0/attn'
    """
    known = set(layers)
    names = _scope_names(op_name)
    found = ["/".join(names[start:end]) for end in range(len(names) + 1) for start in range(end)]
    return max((path for path in found if path in known), key=len, default=None)


__all__ = ["layer_of", "module_paths", "name_layers"]
