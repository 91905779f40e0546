"""A language model's output head, and the cross-entropy through it computed a chunk of tokens at a time.

At a large vocabulary the logits dominate a step's memory: 2,048 tokens x 32,000 words are 262 MB in
float32, and the softmax and its gradient as many again. :meth:`OutputHead.cross_entropy_sums` runs the
head's matmul, the log-softmax and the loss over the sequence in chunks (``lax.scan`` over a
``jax.checkpoint``-ed chunk), so one chunk's logits exist at a time, forward and backward: the backward
pass recomputes each chunk's logits from the hidden states, as MaxText's vocabulary tiling and Liger's
fused linear cross-entropy do. The head's kernel is read once for all chunks (under ``fsdp``: gathered
once), and its gradient is summed over the chunks.

Example:
    >>> head = OutputHead(4, 10, rngs=nnx.Rngs(0))
    >>> sums = head.cross_entropy_sums(jnp.ones((2, 6, 4)), jnp.zeros((2, 6), jnp.int32), jnp.ones((2, 6)), 4)
    >>> sorted(sums)
    ['correct', 'loss']
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

# The logits of one sequence the loss computes at once, by default: chunks of LOGITS_PER_CHUNK // vocab
# tokens (32 of 32,000 words; a whole 128-token sequence below a vocabulary of 8,192, so small models
# compute the loss in one piece, exactly as the plain cross-entropy does).
LOGITS_PER_CHUNK = 2**20


def default_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of a sequence for the loss at vocabulary ``vocab``: about ``LOGITS_PER_CHUNK`` logits.

    Example:
        >>> default_chunk_tokens(32000), default_chunk_tokens(256)
        (32, 4096)
    """
    return max(1, LOGITS_PER_CHUNK // vocab)


class OutputHead(nnx.Linear):
    """``x @ kernel`` from ``d_model`` to ``vocab`` (no bias): an ``nnx.Linear`` that can also compute the
    cross-entropy chunk by chunk (:meth:`cross_entropy_sums`).

    Its parameter is ``kernel``, initialised as ``nnx.Linear``'s, so models and checkpoints are unchanged.
    """

    # Methods besides __call__ that compute with the parameters: fsdp gathers them for each call of
    # these, once, as it does for __call__ (workbench.training.modes.param_gathering).
    PARAM_METHODS: ClassVar[tuple[str, ...]] = ("cross_entropy_sums",)

    def __init__(self, d_model: int, vocab: int, *, rngs: nnx.Rngs):
        super().__init__(d_model, vocab, use_bias=False, rngs=rngs)

    def cross_entropy_sums(self, hidden: jax.Array, labels: jax.Array, weights: jax.Array,
                           chunk_tokens: int) -> dict[str, jax.Array]:
        """Weighted sums over tokens of the cross-entropy and of correct predictions, ``chunk_tokens``
        positions of every sequence at a time.

        ``hidden`` is (B, T, d_model), ``labels`` and ``weights`` (B, T). Tokens of weight 0 count for
        nothing, whatever they hold (dropped with ``where``, as :func:`~workbench.training.models.masked_mean`
        does). Chunks run along the sequence, so a batch split over devices stays split in every chunk.
        """
        batch, length, _ = hidden.shape
        chunks = -(-length // chunk_tokens)
        pad = chunks * chunk_tokens - length  # padded positions get weight 0
        weights = weights.astype(jnp.float32)
        hidden, labels, weights = (jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
                                   for a in (hidden, labels, weights))

        # The kernel's gradient is summed over the chunks in the kernel's own dtype (bfloat16 under bf16
        # compute), as JAX sums a parameter's gradient over any loop; summing in float32 measured 262 MB
        # more at the 1.3B model's peak (an f32 copy of the head's gradient).
        graphdef, params = nnx.split(self)

        @jax.checkpoint  # keeps only the chunk's index: its logits are recomputed in the backward pass
        def chunk_sums(params, hidden, labels, weights, index):
            def chunk(a):  # positions index * chunk_tokens ... of every sequence, sliced in place
                return lax.dynamic_slice_in_dim(a, index * chunk_tokens, chunk_tokens, axis=1)

            logits = nnx.merge(graphdef, params)(chunk(hidden)).astype(jnp.float32)
            labels, weights = chunk(labels), chunk(weights)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            correct = jnp.argmax(logits, axis=-1) == labels
            kept = weights > 0
            return (jnp.where(kept, losses * weights, 0.0).sum(), jnp.where(kept, correct * weights, 0.0).sum())

        # lax.map, not a scan carrying the totals: a carry would have to start per-device under shard_map.
        losses, correct = lax.map(lambda index: chunk_sums(params, hidden, labels, weights, index),
                                  jnp.arange(chunks))
        loss, correct = losses.sum(), correct.sum()
        return {"loss": loss, "correct": correct}


__all__ = ["LOGITS_PER_CHUNK", "OutputHead", "default_chunk_tokens"]
