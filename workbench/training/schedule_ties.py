"""Ties that make XLA compute a value only once others exist: how a backward pass keeps its recomputation (and
per-layer fsdp its re-gathers) in the backward pass, where the compiler would otherwise move it forward.

Per-layer fsdp (:mod:`.modes.param_gathering`) and the remat policies (:mod:`.remat`) both recompute work in
the backward pass, and both hand a layer's input gradient down only once the layer's own gradients exist
(remat through :func:`handed_down_after`). XLA schedules an operation whose operands are ready as early as it
likes, and XLA:CPU removes the optimisation barriers ``jax.checkpoint`` relies on before it schedules, so
recomputed values were computed in the forward pass and kept (measured: the same temporaries with and without
remat). A transformer block's feed-forward, recomputed or not, hands its input gradient down after its weight
gradients too (:func:`weight_gradients_first`): XLA:GPU's scheduler otherwise left them to after the attention's
backward pass.

Example:
    >>> import jax.numpy as jnp
    >>> computed_after({"w": jnp.ones(2)}, jnp.array([3.0]))["w"]
    Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from .data_parallel import varying_axes


def computed_after(values: Any, *deps: Any) -> Any:
    """``values`` unchanged, but computed from ``deps`` too, so XLA cannot compute them earlier.

    Why a zero added rather than ``lax.optimization_barrier``: XLA:CPU removes optimisation barriers
    before it schedules (its ``cse_barrier_expander``), and then merged the backward pass's re-gathers
    into the forward pass's. ``nan_to_num(x) * 0`` is 0 for every x and XLA does not fold a float
    multiplication by zero (it is not 0 for NaN), so the dependency stays. A leaf that is the same on
    every device is left alone: a zero from per-device values would make it per-device.

    Example:
        >>> computed_after(jnp.arange(3.0), jnp.ones(2)).tolist()
        [0.0, 1.0, 2.0]
    """
    zero = done_marker(deps)
    if zero is None:
        return values
    zero_varies = varying_axes(zero) or frozenset()

    def tie(leaf):
        if not jnp.issubdtype(leaf.dtype, jnp.inexact) or not zero_varies <= (varying_axes(leaf) or frozenset()):
            return leaf
        return leaf + zero.astype(leaf.dtype)

    return jax.tree.map(tie, values)


def done_marker(values: Any) -> jax.Array | None:
    """A float32 zero computed from every float leaf of ``values`` (None if there is none): a scalar that
    exists only once they all do, cheap to keep for :func:`computed_after`.

    Example:
        >>> done_marker({"w": jnp.ones(2)})
        Array(0., dtype=float32)
    """
    floats = [leaf for leaf in jax.tree.leaves(values) if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size]
    if not floats:
        return None
    total = sum(jnp.nan_to_num(lax.stop_gradient(leaf[(0,) * leaf.ndim]).astype(jnp.float32)) for leaf in floats)
    return cast(jax.Array, total * 0.0)  # a sum of arrays (there is at least one) is an array, not sum()'s 0


def handed_down_after(values: Any, deps: Any) -> tuple[Any, Any]:
    """``(values, deps)`` unchanged, but ``values`` available only once ``deps`` are computed, where the compiler
    schedules with that order: a layer's input gradient ``values`` handed down once its own gradients ``deps`` exist.
    Use both results: XLA drops the part of a barrier whose result is unused (and with it, the order).

    An optimisation barrier, not :func:`computed_after`'s zero: XLA:GPU keeps barriers until it schedules, JAX
    0.10's XLA:CPU removes them before (its ``cse_barrier_expander``), where the order is not needed. XLA:GPU's
    scheduler computed every transformer block's weight gradients at the end of a jit step under remat ``block``,
    next to their all-reduce, each keeping its operands until then (the 1.3B's dp-tp step on 512 H100s: 11.2 GiB,
    tied 5.8). Per-layer fsdp ties its hand-down with a zero instead (``param_gathering._layer_call``: there a
    barrier cost JAX 0.12's XLA:CPU 14% more temporaries).

    Example:
        >>> handed_down_after(jnp.ones(2), jnp.zeros(3))[0].tolist()
        [1.0, 1.0]
    """
    deps, values = lax.optimization_barrier((deps, values))
    return values, deps


def weight_gradients_first(fn: Callable) -> Callable:
    """``fn(module, *args)`` whose backward pass hands the inputs' gradients down only once the module's weight
    gradients exist (:func:`handed_down_after`); nothing is recomputed, the values are ``fn``'s.

    Why: XLA:GPU's scheduler put a transformer block's feed-forward weight gradients after the attention's backward
    pass, keeping the (batch, T, d_ff) gradients they read alive beside the attention's (batch, heads, T, T)
    buffers. Tied, the 1.3B fsdp step on 512 H100s under remat ``block`` compiled to 5.4 GiB where it took 6.0
    (compiled without a GPU; the other modes' rows held or fell a little).

    Example:
        >>> layer = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> bool(jnp.allclose(weight_gradients_first(nnx.Linear.__call__)(layer, jnp.ones(2)), layer(jnp.ones(2))))
        True
    """
    def call(module: Any, *args: Any) -> Any:
        graphdef, state = nnx.split(module)

        def pure(state: Any, *args: Any) -> Any:
            return fn(nnx.merge(graphdef, state), *args)

        @jax.custom_vjp
        def run(state: Any, *args: Any) -> Any:
            return pure(state, *args)

        def forward(state: Any, *args: Any) -> tuple[Any, Any]:
            return jax.vjp(pure, state, *args)  # the output, and a pullback holding what it saves

        def backward(pullback: Any, cotangent: Any) -> Any:
            state_grad, *arg_grads = pullback(cotangent)
            # A kernel's gradient waits as its matmul computes it, [out, in] (JAX transposes that to [in, out]), so
            # the transposes on either side of the barrier cancel: per-layer fsdp reduce-scatters it in that order,
            # and a barrier between the matmul and its transpose had XLA:CPU fold the transpose into the matmul.
            leaves, treedef = jax.tree.flatten(state_grad)
            as_computed = [leaf.T if leaf.ndim == 2 else leaf for leaf in leaves]
            arg_grads, as_computed = handed_down_after(tuple(arg_grads), as_computed)
            state_grad = treedef.unflatten([leaf.T if leaf.ndim == 2 else leaf for leaf in as_computed])
            return (state_grad, *arg_grads)

        run.defvjp(forward, backward)
        return run(state, *args)

    return call


__all__ = ["computed_after", "done_marker", "handed_down_after", "weight_gradients_first"]
