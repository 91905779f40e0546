"""Ties that make XLA compute a value only once others exist: how a backward pass keeps its recomputation (and
per-layer fsdp its re-gathers) in the backward pass, where the compiler would otherwise move it forward.

Per-layer fsdp (:mod:`.modes.param_gathering`) and the remat policies (:mod:`.remat`) both recompute work in
the backward pass. XLA schedules an operation whose operands are ready as early as it likes, and XLA:CPU
removes the optimisation barriers ``jax.checkpoint`` relies on before it schedules, so recomputed values
were computed in the forward pass and kept (measured: the same temporaries with and without remat).

Example:
    >>> import jax.numpy as jnp
    >>> computed_after({"w": jnp.ones(2)}, jnp.array([3.0]))["w"]
    Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.numpy as jnp
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


__all__ = ["computed_after", "done_marker"]
