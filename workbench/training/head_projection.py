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

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

PROJECTED = "head_projection"  # the name its outputs carry for a remat policy to keep (training/remat.py)
_PARAMETERS_REGATHERED: contextvars.ContextVar[bool] = contextvars.ContextVar("parameters_regathered", default=False)


@contextlib.contextmanager
def parameters_regathered() -> Iterator[None]:
    """While a layer is traced whose parameters are gathered for its call and gathered again for its backward
    pass (per-layer fsdp): its head projections keep no reshaped kernel for the backward pass."""
    token = _PARAMETERS_REGATHERED.set(True)
    try:
        yield
    finally:
        _PARAMETERS_REGATHERED.reset(token)


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
        options = {"out_sharding": out_sharding}  # as nnx.Linear passes them
        if self.preferred_element_type is not None:
            options["preferred_element_type"] = self.preferred_element_type
        project = functools.partial(_project, self.n_heads, self.into_heads, self.dot_general, self.precision, options)
        if _PARAMETERS_REGATHERED.get():
            # Checkpointed, saving nothing: the backward pass reads the kernel itself, reshaped again. Kept, the
            # reshaped kernel is a value of its own, which per-layer fsdp cannot tell from an activation and keeps
            # gathered until the backward pass (it drops only the parameters themselves: modes/param_gathering.py).
            # Not elsewhere: in dp-tp's microbatches libtpu split the residual stream over 'model' again.
            project = jax.checkpoint(project, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)
        y = checkpoint_name(project(inputs, kernel), PROJECTED)  # the matmul's output, which remat dots keeps
        if bias is not None:  # reshaped to y's rank, as nnx.Linear does: its gradient is then a sum and a reshape
            per_output = y.shape[-2:] if self.into_heads else y.shape[-1:]
            y = y + bias.reshape((1,) * (y.ndim - len(per_output)) + per_output)
        return y


def _project(n_heads: int, into_heads: bool, dot_general, precision, options: dict, inputs: jax.Array,
             kernel: jax.Array) -> jax.Array:
    d_in, d_out = kernel.shape
    if into_heads:
        kernel = kernel.reshape(d_in, n_heads, d_out // n_heads)
        contracted = (((inputs.ndim - 1,), (0,)), ((), ()))
    else:
        kernel = kernel.reshape(n_heads, d_in // n_heads, d_out)
        contracted = (((inputs.ndim - 2, inputs.ndim - 1), (0, 1)), ((), ()))
    return dot_general(inputs, kernel, contracted, precision=precision, **options)


__all__ = ["PROJECTED", "HeadProjection", "parameters_regathered"]
