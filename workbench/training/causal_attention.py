"""The two steps of causal attention whose gradients the compiler would otherwise hold too long: masking the scores,
and weighting the values by the probabilities. Each is the plain computation with a hand-written backward pass that
keeps less of the (batch, heads, T, T) work alive, measured on XLA:GPU compiled for 512 H100s (without a GPU).

- :func:`causally_masked` keeps no residual for its backward pass, and makes no constant of the scores' shape.
  Through ``jnp.where`` the forward pass broadcast its fill (the lowest value) to the scores' shape, and the backward
  pass read the mask broadcast so and a zero of that shape; in a scanned layer stack each is the same in every
  layer, so JAX's scan computed them once, before the loop, and they stayed for the whole loop (on the 1.3B
  transformer under fsdp, whose heads are not split: 1 GiB for the fill, 1.5 GiB for the backward's, a device).
- :func:`weighted_values` computes the values' gradient ``P^T dO`` before it hands on the probabilities' gradient
  ``dO V^T``. Left to itself, XLA:GPU's scheduler computed it after the queries' and keys' gradients, so the
  probabilities ``P`` stayed live beside the scores, ``dP`` and ``dS`` (four (batch, heads, T, T) buffers where three
  do). Under remat ``block`` the 1.3B fsdp step's compiled peak fell from 6.9 to 6.0 GiB a device.

Example:
    >>> scores = jnp.zeros((1, 1, 2, 2))
    >>> causally_masked(scores)[0, 0, 0].tolist() == [0.0, float(jnp.finfo(jnp.float32).min)]
    True
    >>> weighted_values(jnp.ones((1, 1, 2, 2)) / 2, jnp.ones((1, 2, 1, 3))).shape
    (1, 2, 1, 3)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .schedule_ties import handed_down_after


def _causal_mask(length: int) -> np.ndarray:
    """Position q may see positions k <= q: a NumPy constant, so tracing compiles nothing for it."""
    return np.tril(np.ones((length, length), dtype=bool))


@jax.custom_vjp
def causally_masked(scores: jax.Array) -> jax.Array:
    """``scores`` (..., T, T) with every key after its query set to the dtype's lowest value, so that a softmax gives
    it no weight. The gradient passes where the mask keeps the score, computed in the backward pass from the mask
    constant (no (..., T, T) residual).

    Example:
        >>> jax.grad(lambda s: causally_masked(s).sum())(jnp.zeros((2, 2))).tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    # The fill is computed from the scores (the lowest value for every finite score; a NaN stays NaN, which only a
    # step that has already diverged holds), not broadcast from a constant: a broadcast constant is the same in
    # every layer, and JAX's scan computed it once, before the loop.
    return jnp.where(_causal_mask(scores.shape[-1]), scores, jnp.minimum(scores, jnp.finfo(scores.dtype).min))


def _masked_forward(scores: jax.Array) -> tuple[jax.Array, None]:
    return causally_masked(scores), None


def _masked_backward(_: None, grad: jax.Array) -> tuple[jax.Array]:
    return (jnp.where(_causal_mask(grad.shape[-1]), grad, jnp.zeros((), grad.dtype)),)


causally_masked.defvjp(_masked_forward, _masked_backward)


@jax.custom_vjp
def weighted_values(weights: jax.Array, values: jax.Array) -> jax.Array:
    """Attention's output ``einsum("bhqk,bkhd->bqhd", weights, values)``, whose backward pass computes the values'
    gradient before it hands on the weights' (see the module docstring).

    Example:
        >>> weights, values = jnp.ones((1, 1, 2, 2)) / 2, jnp.arange(6.0).reshape(1, 2, 1, 3)
        >>> weighted_values(weights, values)[0, 0, 0].tolist()
        [1.5, 2.5, 3.5]
    """
    return jnp.einsum("bhqk,bkhd->bqhd", weights, values)


def _weighted_forward(weights: jax.Array, values: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return weighted_values(weights, values), (weights, values)


def _weighted_backward(saved: tuple[jax.Array, jax.Array], grad: jax.Array) -> tuple[jax.Array, jax.Array]:
    weights, values = saved
    values_grad = jnp.einsum("bhqk,bqhd->bkhd", weights, grad)
    weights_grad = jnp.einsum("bqhd,bkhd->bhqk", grad, values)
    # Both results are used, so XLA keeps the barrier, and with it the order: the probabilities' last full reader
    # (the values' gradient) runs before their gradient goes on to the softmax's backward pass.
    weights_grad, values_grad = handed_down_after(weights_grad, values_grad)
    return weights_grad, values_grad


weighted_values.defvjp(_weighted_forward, _weighted_backward)


__all__ = ["causally_masked", "weighted_values"]
