"""A language model's output head, and the cross-entropy through it computed a slice of the vocabulary at a time.

At a large vocabulary the logits dominate a step's memory: 2,048 tokens x 32,000 words are 262 MB in
float32, and the softmax and its gradient as many again. :meth:`OutputHead.cross_entropy_sums` computes
the head's matmul, the log-sum-exp and the loss over tiles of the vocabulary (``lax.map`` over a
``jax.checkpoint``-ed tile), so one tile's logits exist at a time, forward and backward: each tile gives
every token its log-sum-exp, its label's logit if the label is in the tile, and its best word; the backward
pass recomputes a tile's logits from the hidden states. Tiling the vocabulary rather than the tokens
(MaxText's vocabulary tiling) also keeps the head's gradient in one piece: each tile adds to its own
columns of it, where a chunk of tokens makes a whole head-sized product per chunk to add up (measured
on the README's 1.3B fsdp step: compiled temporaries 0.248 of the whole parameter tree, against 0.271
with token chunks). The head's kernel is read once for all tiles (under ``fsdp``: gathered once).

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
import numpy as np
from flax import nnx
from jax import lax

# Words per tile of the vocabulary the loss computes at once, by default about this many: with the 2,048
# tokens a device holds in the README's 1.3B plan, 4 MB of float32 logits a tile; a vocabulary this small
# or smaller is computed in one piece, exactly as the plain cross-entropy does.
DEFAULT_TILE = 512


def default_tile(vocab: int) -> int:
    """Words per tile of the loss at vocabulary ``vocab``: about :data:`DEFAULT_TILE`, a divisor of ``vocab``
    where one lies within a factor of two (a padded last tile costs a padded copy of the head and of its
    gradient), the whole vocabulary when it is that small.

    Example:
        >>> default_tile(32000), default_tile(50257), default_tile(256)
        (500, 512, 256)
    """
    if vocab <= DEFAULT_TILE:
        return vocab
    return next((t for t in range(DEFAULT_TILE, DEFAULT_TILE // 2, -1) if vocab % t == 0), DEFAULT_TILE)


class OutputHead(nnx.Linear):
    """``x @ kernel`` from ``d_model`` to ``vocab`` (no bias): an ``nnx.Linear`` that can also compute the
    cross-entropy a tile of the vocabulary at a time (:meth:`cross_entropy_sums`).

    Its parameter is ``kernel``, initialised as ``nnx.Linear``'s, so models and checkpoints are unchanged.
    """

    # Methods besides __call__ that compute with the parameters: fsdp gathers them for each call of
    # these, once, as it does for __call__ (workbench.training.modes.param_gathering).
    PARAM_METHODS: ClassVar[tuple[str, ...]] = ("cross_entropy_sums",)

    def __init__(self, d_model: int, vocab: int, *, rngs: nnx.Rngs):
        super().__init__(d_model, vocab, use_bias=False, rngs=rngs)

    def cross_entropy_sums(self, hidden: jax.Array, labels: jax.Array, weights: jax.Array,
                           tile: int) -> dict[str, jax.Array]:
        """Weighted sums over tokens of the cross-entropy and of correct predictions, ``tile`` words of the
        vocabulary at a time.

        ``hidden`` is (B, T, d_model), ``labels`` and ``weights`` (B, T). Tokens of weight 0 count for
        nothing, whatever they hold (dropped with ``where``, as :func:`~workbench.training.models.masked_mean`
        does). A vocabulary that ``tile`` does not divide gets padded words whose logits are -inf.
        """
        kernel = self.kernel[...]
        vocab = kernel.shape[-1]
        tiles = -(-vocab // tile)
        if tiles * tile != vocab:
            kernel = jnp.pad(kernel, [(0, 0), (0, tiles * tile - vocab)])

        @jax.checkpoint  # keeps nothing of the tile: its logits are recomputed in the backward pass
        def tile_stats(first):
            kernel_tile = lax.dynamic_slice_in_dim(kernel, first, tile, axis=1)
            logits = (hidden @ kernel_tile).astype(jnp.float32)  # (B, T, tile), as nnx.Linear computes them
            words = first + jnp.arange(tile)
            logits = jnp.where(words < vocab, logits, -jnp.inf)  # padded words
            mine = (labels >= first) & (labels < first + tile)
            label_logit = jnp.take_along_axis(logits, jnp.clip(labels - first, 0, tile - 1)[..., None], -1)[..., 0]
            best = jnp.argmax(logits, axis=-1)
            return (jax.nn.logsumexp(logits, axis=-1), jnp.where(mine, label_logit, 0.0),
                    lax.stop_gradient(jnp.max(logits, axis=-1)), first + best)

        # lax.map, not a scan carrying running sums: a carry would have to start per-device under shard_map.
        lse, label_logit, best_value, best_word = lax.map(tile_stats, np.arange(tiles) * tile)
        losses = jax.nn.logsumexp(lse, axis=0) - label_logit.sum(axis=0)
        # the first tile holding the largest logit, then its first such word: jnp.argmax's choice over the whole
        predicted = jnp.take_along_axis(best_word, jnp.argmax(best_value, axis=0)[None], 0)[0]
        weights = weights.astype(jnp.float32)
        kept = weights > 0
        return {"loss": jnp.where(kept, losses * weights, 0.0).sum(),
                "correct": jnp.where(kept, (predicted == labels) * weights, 0.0).sum()}


__all__ = ["DEFAULT_TILE", "OutputHead", "default_tile"]
