"""A token embedding whose gradient buffer is made only once the backward pass reaches it.

The gradient of a lookup is a scatter-add of the embeddings' gradients into a zero table as large as the
embedding (262 MB for 32,000 x 2,048 in float32). JAX writes that zero table as a broadcast with no
inputs, which a scheduler may place anywhere: XLA:CPU made it at the start of the backward pass, so it
sat beside the output head's gradient at the step's peak. :class:`TokenEmbedding` computes the zero
table from the incoming gradient, so it exists only from the moment it is filled.

Example:
    >>> embed = TokenEmbedding(10, 4, rngs=nnx.Rngs(0))
    >>> embed(jnp.array([[1, 2]])).shape
    (1, 2, 4)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


def _lookup(table: jax.Array, tokens: jax.Array) -> jax.Array:
    """``jnp.take(table, tokens, axis=0)``, whose gradient's zero table waits for the gradient."""

    @jax.custom_vjp
    def lookup(table, tokens):
        return jnp.take(table, tokens, axis=0)

    def forward(table, tokens):
        return lookup(table, tokens), tokens

    def backward(tokens, cotangent):
        # A zero computed from the cotangent (XLA does not fold x * 0 for floats: NaN * 0 is NaN).
        zero = jnp.nan_to_num(lax.stop_gradient(cotangent[(0,) * cotangent.ndim])) * 0
        zeros = jnp.zeros(table.shape, cotangent.dtype) + zero
        return zeros.at[tokens].add(cotangent, mode="drop"), None

    lookup.defvjp(forward, backward)
    return lookup(table, tokens)


class TokenEmbedding(nnx.Embed):
    """``nnx.Embed`` (same parameter, ``embedding``, and initialisation) with :func:`_lookup`'s gradient.

    Without a ``dtype`` it looks up in the table's dtype at the call, as ``nnx.Linear`` computes in its
    inputs' and parameters' dtype: ``nnx.Embed`` fixes the dtype to the parameter's at construction
    (float32), so a model cast to bfloat16 for mixed precision looked up float32 embeddings and every
    layer above computed in float32 (twice the activation memory, found 2026-11-27).
    """

    def __init__(self, num_embeddings: int, features: int, *, dtype=None, **kwargs):
        super().__init__(num_embeddings, features, dtype=dtype, **kwargs)
        self.dtype = dtype  # None: the table's own dtype when called

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        if out_sharding is not None or self.num_embeddings == 1 or not jnp.issubdtype(inputs.dtype, jnp.integer):
            return super().__call__(inputs, out_sharding=out_sharding)  # Explicit mesh axes: flax's own lookup
        (table,) = self.promote_dtype((self.embedding[...],), dtype=self.dtype, inexact=False)
        return _lookup(table, inputs)


__all__ = ["TokenEmbedding"]
