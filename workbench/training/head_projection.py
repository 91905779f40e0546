"""Attention's projections into and out of its heads, contracted as ``(d_model, heads, head_dim)`` kernels.

A transformer's q, k, v and output projections are ``nnx.Linear`` layers of ``(d_model, d_model)`` kernels, a
column block per head. Written as a matmul and a reshape, the concatenated heads are a ``(batch, T, d_model)`` value
split over a tensor-parallel axis along its last dimension: the residual stream's shape, but not its layout.
libtpu's sharding propagation took one for the other in a scanned step inside a ``shard_map`` manual over
``data`` (fsdp-tp): the stream was split over ``model`` along ``d_model`` and gathered before every matmul that reads
it, 3.7-5.3x the bytes Megatron's layout sends over ``model`` (docs/design/compile-verification.md, "libtpu's traffic
over `model`"). Contracted with the kernel seen as ``(d_model, heads, head_dim)``, no value of the stream's shape is
ever split: the heads keep their own axis. MaxText and Flax's ``MultiHeadAttention`` write their projections so
(``DenseGeneral`` over ``(heads, head_dim)``).

The parameters are ``nnx.Linear``'s, the same paths, shapes and initial values, so layouts, rule tables and
checkpoints do not change; the products are the same sums.

Example:
    >>> import jax.numpy as jnp
    >>> to_heads = HeadProjection(8, 2, into_heads=True, rngs=nnx.Rngs(0))
    >>> to_heads(jnp.ones((1, 3, 8))).shape
    (1, 3, 2, 4)
    >>> HeadProjection(8, 2, into_heads=False, rngs=nnx.Rngs(0))(jnp.ones((1, 3, 2, 4))).shape
    (1, 3, 8)
"""

from __future__ import annotations

import jax
from flax import nnx


class HeadProjection(nnx.Linear):
    """A ``(d_model, d_model)`` ``nnx.Linear`` whose heads' side is ``(n_heads, d_model // n_heads)``.

    ``into_heads``: ``(..., d_model) -> (..., n_heads, head_dim)`` (q, k, v); otherwise
    ``(..., n_heads, head_dim) -> (..., d_model)`` (the output projection).
    """

    def __init__(self, d_model: int, n_heads: int, *, into_heads: bool, rngs: nnx.Rngs):
        super().__init__(d_model, d_model, rngs=rngs)
        self.n_heads = n_heads
        self.into_heads = into_heads

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        d_in, d_out = kernel.shape
        if self.into_heads:
            heads = (self.n_heads, d_out // self.n_heads)
            kernel = kernel.reshape(d_in, *heads)
            contracted = (((inputs.ndim - 1,), (0,)), ((), ()))
        else:
            kernel = kernel.reshape(self.n_heads, d_in // self.n_heads, d_out)
            contracted = (((inputs.ndim - 2, inputs.ndim - 1), (0, 1)), ((), ()))
        options = {"out_sharding": out_sharding}  # as nnx.Linear passes them
        if self.preferred_element_type is not None:
            options["preferred_element_type"] = self.preferred_element_type
        y = self.dot_general(inputs, kernel, contracted, precision=self.precision, **options)
        if bias is not None:  # reshaped to y's rank, as nnx.Linear does: its gradient is then a sum and a reshape
            per_output = heads if self.into_heads else (d_out,)
            y = y + bias.reshape((1,) * (y.ndim - len(per_output)) + per_output)
        return y


__all__ = ["HeadProjection"]
