"""Parameters held to their layout over the mesh axes a partially manual ``shard_map`` leaves to the compiler.

Inside a ``shard_map`` manual over ``data`` only, JAX leaves every value's sharding over the other axes (``model``)
open, for the compiler's sharding propagation (Shardy) to choose. A parameter read there, and its gradient, can then
take a layout other than its own, and the step follows it. It happens: XLA merges the zeros that a loop's gradient
accumulators and a scan's stacks start from, one value for all of one shape, before propagating, so those of one
shape share a layout. With ``dp-tp``'s microbatches, which accumulate in such a ``shard_map`` so that the gradients
are summed over ``data`` once, a column-parallel bias's gradient (split over ``model``) gave the layer norms'
gradients its split, and libtpu split the residual stream over ``model`` along ``d_model`` from there, gathering it
before every matmul: 4.8-5.8x the bytes Megatron's layout sends over ``model`` (2 blocks on v5e:2x2, 4 microbatches).

:func:`pinning_loss` holds each parameter and its gradient to its layout (``with_sharding_constraint`` both ways),
the slices a :class:`~..layer_stack.LayerStack` scans, inside its loop, where their gradients are stacked, and a
block under remat's parameters again inside its remat boundary (:func:`~..remat.prepare_state`: why). The loops'
buffers themselves take shapes of their own (:mod:`..shapes_apart`).
``fsdp-tp`` needs none of it: its layers gather their parameters in a ``shard_map`` nested over ``model``, whose
layout is manual (:mod:`.param_gathering`).

Example (inside the microbatches' ``shard_map``, the parameters' specs over ``model``):
    >>> loss = pinning_loss(model_class("transformer").loss, layout)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import PartitionSpec

from ..layer_stack import LAYER_AXIS, is_layer_stack
from ..remat import prepare_state
from .core import LossFn


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def pin_layout(tree: Any, specs: Any) -> Any:
    """``tree`` unchanged, each leaf and its gradient constrained to its spec in ``specs`` (same structure).

    Inside a ``shard_map``, the specs name only the axes it leaves to the compiler
    (:func:`~workbench.layout.specs.without_axes`).
    """
    leaves, structure = jax.tree.flatten(tree)
    spec_leaves = jax.tree.leaves(specs, is_leaf=_is_spec)
    return jax.tree.unflatten(structure, [_pinned(leaf, spec) for leaf, spec in zip(leaves, spec_leaves, strict=True)])


def _pinned(leaf: jax.Array, spec: PartitionSpec) -> jax.Array:
    """``leaf`` held to ``spec``, and so is its gradient (a ``custom_vjp`` identity)."""

    @jax.custom_vjp
    def hold(x):
        return jax.lax.with_sharding_constraint(x, spec)

    def backward(_, gradient):
        return (jax.lax.with_sharding_constraint(gradient, spec),)

    hold.defvjp(lambda x: (hold(x), None), backward)
    return hold(leaf)


def pinning_loss(loss: LossFn, specs: Any) -> LossFn:
    """``loss`` run on the model with its parameters (``nnx.Param``, structured as ``specs``) held to their layout.

    A :class:`~..layer_stack.LayerStack`'s layers are also held one slice at a time, inside its loop: held only whole,
    before it, the gradients its loop stacks would still share their zeros' layout. A block under remat holds them
    again inside its boundary, where its recomputation starts from tied copies (:func:`~..remat.prepare_state`).
    """

    def pinned(model: nnx.Module, batch: Any) -> Any:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        model = nnx.merge(graphdef, pin_layout(params, specs), rest)
        stacks: list[tuple] = []
        for path, node in nnx.iter_graph(model):
            if is_layer_stack(node):
                stacks.append(path)
                _hold_slices(node, _at(specs, (*path, "layer")))
            elif getattr(node, "remat", "none") != "none" and not any(path[:len(s)] == s for s in stacks):
                prepare_state(node, _holding(_at(specs, path)))  # a block under remat, again inside (remat.py: why)
        return loss(model, batch)

    return pinned


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _hold_slices(stack: nnx.Module, specs: Any) -> None:
    """``stack``'s loop holds each iteration's slice of its parameters to ``specs`` less the stacking axis."""
    slices = jax.tree.map(lambda s: PartitionSpec(*(tuple(s)[:LAYER_AXIS] + tuple(s)[LAYER_AXIS + 1:])), specs,
                          is_leaf=_is_spec)
    object.__setattr__(stack, "prepare_slice", _holding(slices))  # plain data on this traced copy (LayerStack.__call__)


def _holding(specs: Any) -> Any:
    """A module's state (an ``nnx.State``) -> the same, its parameters held to ``specs``."""

    def hold(state: Any) -> Any:
        params, rest = nnx.split_state(state, nnx.Param, ...)
        return nnx.merge_state(pin_layout(params, specs), rest)

    return hold


__all__ = ["pin_layout", "pinning_loss"]
