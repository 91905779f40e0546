"""Scanned layers: ``n`` copies of one layer, parameters stacked on a leading axis, run in one ``lax.scan``.

Production language-model trainers scan their blocks (MaxText's ``scan_layers``, Flax's ``nnx.scan``)
because a compiler then sees one layer's program instead of ``n`` unrolled copies: measured here, the TPU
compiler's time for the README's 24-layer 1.3B step fell with it (see docs/design/production-steps.md),
and XLA:CPU's too. The values computed are the same as a Python loop over ``n`` separate layers.

A :class:`LayerStack` holds the stacked layer as ``layer`` (paths ``blocks/layer/attn/q/kernel``, shape
``(n, ...)``). Per-layer ``fsdp`` (:mod:`.modes.param_gathering`) runs the same loop with each
iteration's slice gathered, so a device still holds one layer's parameters at a time.

Example:
    >>> import jax.numpy as jnp
    >>> stack = LayerStack(lambda rngs: nnx.Linear(4, 4, rngs=rngs), 3, rngs=nnx.Rngs(0))
    >>> stack.layer.kernel.shape, stack(jnp.ones((2, 4))).shape
    ((3, 4, 4), (2, 4))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import jax
from flax import nnx
from jax import lax

from .remat import prepare_state
from .shapes_apart import apart, restored, shapes_of

LAYER_AXIS = 0  # the stacking axis of every leaf in a LayerStack


class LayerStack(nnx.Module):
    """``length`` layers made by ``make_layer(rngs)``, each with its own initial values, stacked and scanned.

    Calling it runs ``x = layer_i(x)`` for ``i = 0 .. length - 1``; each layer takes and returns one array
    of the same shape and dtype (a residual stream).
    """

    def __init__(self, make_layer: Callable[[nnx.Rngs], nnx.Module], length: int, *, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=length)
        @nnx.vmap(in_axes=(0,), out_axes=LAYER_AXIS)
        def stacked(rngs: nnx.Rngs) -> nnx.Module:
            return make_layer(rngs)

        self.length = length
        self.layer = stacked(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        graphdef, state = nnx.split(self.layer)
        # What a step does to each iteration's slice before the layer runs, where it sets one on this traced copy
        # (modes/layout_pins.py holds its parameters to their layout): plain data, not a Variable.
        prepare = getattr(self, "prepare_slice", None)
        # The slice is restored inside the layer's remat boundary: only a layer under remat (its `remat` attribute, as
        # per-layer fsdp reads it) has one; any other gets its slice prepared here.
        if prepare is None or getattr(self.layer, "remat", "none") == "none":
            prepare = prepare or (lambda layer_state: layer_state)
            return scan_layers(lambda layer_state, carry: nnx.merge(graphdef, prepare(layer_state))(carry), state, x)
        # A prepared slice is a new value: a layer under remat keeps it for its backward pass, and the loop stacks
        # those copies from zeros that XLA merges across leaves of one shape (shapes_apart.py: why that splits
        # dp-tp's residual stream on libtpu). So the loop hands each leaf over in a shape of its own, and the
        # layer's remat boundary restores and prepares it (remat.prepare_state): what the layer keeps is then the
        # loop's own slice, which JAX does not copy, and the gradients' stacks have shapes of their own.
        slice_shapes = [shape[LAYER_AXIS + 1:] for shape in shapes_of(state)]

        def apply_layer(layer_state: Any, carry: jax.Array) -> jax.Array:
            layer = nnx.merge(graphdef, layer_state)
            prepare_state(layer, lambda handed: prepare(restored(handed, slice_shapes)))
            return layer(carry)

        return scan_layers(apply_layer, apart(state), x)


def scan_layers(apply_layer: Callable[[Any, jax.Array], jax.Array], stacked: Any, x: jax.Array) -> jax.Array:
    """``x`` through ``apply_layer(slice_i, x)`` for each slice ``i`` of ``stacked`` along its leading axis.

    Example:
        >>> import jax.numpy as jnp
        >>> scan_layers(lambda w, x: x * w, jnp.array([2.0, 3.0]), jnp.ones(2))
        Array([6., 6.], dtype=float32)
    """
    def body(carry, layer_slice):
        return apply_layer(layer_slice, carry), None

    return lax.scan(body, x, stacked)[0]


def is_layer_stack(module: Any) -> TypeGuard[LayerStack]:
    """Whether ``module`` is a :class:`LayerStack` (the fsdp gathering and the planner count its layers)."""
    return isinstance(module, LayerStack)


__all__ = ["LAYER_AXIS", "LayerStack", "is_layer_stack", "scan_layers"]
