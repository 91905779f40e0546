"""The models the workbench trains, behind one registry: ``linear``, ``mlp``, ``cnn`` and ``transformer``.

Each model class declares, as data:

* its preset: the keyword defaults of its constructor (option names, types and values in one place);
* ``loss``: ``(model, batch) -> (loss, aux)``; a batch is ``{"x", "y"}`` plus an optional ``"mask"``
  so that the padding of a final batch never changes the loss;
* ``tensor_parallel_rules(axis)``: ``(regex, spec)`` pairs over its parameter paths, ready for
  :func:`~workbench.layout.tree_layout.layout_tree` (empty when the model has nothing to split);
* its traits, read by the planner: ``SEQUENCE_OPTION`` (reads sequences up to that option's length),
  ``BLOCKS_OPTION`` (identical blocks, counted by that option), ``TRANSFORMER_ESTIMATES``.

Adding a model means writing its class and adding it to ``_REGISTRY``.

Example:
    >>> model = build_model("mlp", hidden=32)
    >>> model(jnp.zeros((2, 64))).shape
    (2, 10)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ..errors import ShapeError, WorkbenchError
from .causal_attention import causally_masked, weighted_values
from .head_projection import HeadProjection
from .layer_stack import LayerStack
from .lm_head import OutputHead, default_tile
from .remat import REMAT_POLICIES as ALL_REMAT_POLICIES
from .remat import rematerialized, validate_remat
from .schedule_ties import weight_gradients_first
from .token_embedding import TokenEmbedding

FEED_FORWARD_MULTIPLIER = 4  # the transformer's d_ff when none is given: 4 * d_model
LossOutput = tuple[jax.Array, dict[str, jax.Array]]


# --- losses --------------------------------------------------------------------------------------


def masked_mean(values: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """The mean of ``values`` over the entries ``mask`` keeps, and the total weight behind it.

    ``mask`` covers the leading dimensions of ``values`` (per example, or per token for a (B, T) mask).
    Padding is dropped with ``where``, not multiplied by zero, so NaN or inf computed from padded rows
    cannot leak in, and whatever padded rows hold, the result is the same bits; an all-padding batch
    gives 0, not NaN. Against the unpadded batch (another shape, so another compiled program) it agrees
    to float32 rounding: XLA picks a summation order per length. A plain ``sum`` is kept on purpose: it
    is one local reduce plus one all-reduce under data parallelism, where a fixed-order (tree) sum was
    measured to add collective-permutes (Auto mesh axes) or fail to trace (Explicit axes).

    Example:
        >>> masked_mean(jnp.array([1.0, 3.0, 100.0]), jnp.array([1, 1, 0]))[0]
        Array(2., dtype=float32)
    """
    values = values.astype(jnp.float32)
    if mask is None:
        weight = jnp.ones_like(values)
    else:
        mask = jnp.asarray(mask, jnp.float32)
        weight = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)), values.shape)
    total_weight = weight.sum()
    total = jnp.where(weight > 0, values * weight, 0.0).sum()
    safe_weight = jnp.where(total_weight > 0, total_weight, 1.0)  # keeps the gradient finite, too
    return jnp.where(total_weight > 0, total / safe_weight, 0.0), total_weight


def mean_squared_error_loss(model: nnx.Module, batch: Mapping[str, Any]) -> LossOutput:
    """Regression: squared error averaged over outputs, then over unmasked examples (``y`` may be (B,))."""
    predictions = model(batch["x"])
    targets = jnp.asarray(batch["y"]).reshape(predictions.shape)
    loss, weight = masked_mean(jnp.mean((predictions - targets) ** 2, axis=-1), batch.get("mask"))
    return loss, {"weight": weight}


def cross_entropy_loss(model: nnx.Module, batch: Mapping[str, Any]) -> LossOutput:
    """Softmax cross-entropy against integer labels, with accuracy, for classifiers and language models.

    Classifiers: logits (B, classes), labels (B,). Language models: logits (B, T, vocab) and ``y`` holds
    the next token of every position (B, T), so this is next-token cross-entropy averaged over tokens;
    the mask may then be per example (B,) or per token (B, T).
    """
    logits = model(batch["x"]).astype(jnp.float32)
    labels = jnp.asarray(batch["y"])
    per_item = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    loss, weight = masked_mean(per_item, batch.get("mask"))
    accuracy, _ = masked_mean(jnp.argmax(logits, axis=-1) == labels, batch.get("mask"))
    return loss, {"accuracy": accuracy, "weight": weight}


def token_weights(mask: jax.Array | None, shape: tuple[int, ...]) -> jax.Array:
    """Per-token float32 weights of shape ``shape`` (B, T) from a mask per example (B,) or per token (B, T).

    Example:
        >>> token_weights(jnp.array([1, 0]), (2, 3)).tolist()
        [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """
    if mask is None:
        return jnp.ones(shape, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    return jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim)), shape)


def language_model_loss(model: nnx.Module, batch: Mapping[str, Any]) -> LossOutput:
    """Next-token cross-entropy of a :class:`TransformerLM`, with accuracy, as :func:`cross_entropy_loss`
    computes them; but where the vocabulary is larger than the model's ``loss_tile`` words, the logits are
    computed a tile of the vocabulary at a time and never exist whole
    (:meth:`~.lm_head.OutputHead.cross_entropy_sums`).

    Example:
        >>> model = build_model("transformer", vocab=16, d_model=8, n_heads=2, n_layers=1, loss_tile=4)
        >>> batch = {"x": jnp.zeros((2, 8), jnp.int32), "y": jnp.ones((2, 8), jnp.int32)}
        >>> tiled, plain = language_model_loss(model, batch)[0], cross_entropy_loss(model, batch)[0]
        >>> bool(jnp.allclose(tiled, plain))
        True
    """
    tokens = jnp.asarray(batch["x"])
    tile = getattr(model, "loss_tile", None)  # a model of your own with this loss: computed in one piece
    lm = typing.cast("TransformerLM", model)  # a model with a loss_tile has the transformer's head and vocab
    if tile is None or tile >= lm.vocab:
        return cross_entropy_loss(model, batch)  # one tile: the plain loss, the same bits as before tiling
    labels = jnp.asarray(batch["y"])
    weights = token_weights(batch.get("mask"), labels.shape)
    sums = lm.head.cross_entropy_sums(lm.hidden_states(tokens), labels, weights, tile)
    total_weight = weights.sum()
    safe_weight = jnp.where(total_weight > 0, total_weight, 1.0)  # keeps the gradient finite, as masked_mean

    def mean(total):
        return jnp.where(total_weight > 0, total / safe_weight, 0.0)

    return mean(sums["loss"]), {"accuracy": mean(sums["correct"]), "weight": total_weight}


# --- models --------------------------------------------------------------------------------------


def column_row_rules(column: str, row: str, axis: str, kernel_rank: int = 2,
                     stacked: bool = False) -> list[tuple[str, str]]:
    """Megatron's pair: ``column`` split over its outputs (kernel and bias), ``row`` over its inputs.

    The pair needs one all-reduce, after ``row``, whose bias is added after it and so stays whole.
    Patterns match from a path boundary, so they also lay out optimizer moments (``opt_state/.../mu/...``).
    ``stacked`` layers (a :class:`~.layer_stack.LayerStack`) have a leading layer axis, never split.

    Example:
        >>> column_row_rules("up", "down", "model")[0]
        ('(^|/)up/kernel$', 'None, model')
    """
    stack = ["None"] if stacked else []
    leading = stack + ["None"] * (kernel_rank - 2)
    return [
        (rf"(^|/){column}/kernel$", ", ".join(leading + ["None", axis])),
        (rf"(^|/){column}/bias$", ", ".join(stack + [axis])),
        (rf"(^|/){row}/kernel$", ", ".join(leading + [axis, "None"])),
    ]


class RegisteredModel(nnx.Module):
    """What every registered model declares besides its layers (see the module docstring)."""

    NAME: ClassVar[str]
    DATA_KIND: ClassVar[str]  # the Dataset kind it trains on: regression, classification or language
    loss: ClassVar[Any]  # staticmethod (model, batch) -> (loss, aux)
    # Traits the planner and the step-memory simulation read, so that a new model declares them instead of
    # being named there (defaults: a model of examples, not sequences, with no repeated blocks).
    SEQUENCE_OPTION: ClassVar[str | None] = None  # the option bounding its sequences' length; None: no sequences
    BLOCKS_OPTION: ClassVar[str | None] = None  # the option counting its identical blocks (each adds the same memory)
    # The planner counts its FLOPs, kept activations and tensor-parallel all-reduces with the transformer's formulas
    # (reading d_model, n_heads, n_layers, vocab, loss_tile and flops_per_token); otherwise 6 FLOPs per parameter.
    TRANSFORMER_ESTIMATES: ClassVar[bool] = False
    # The remat policies it applies (:mod:`.remat`); a model that applies more than "none" takes them as the
    # constructor's keyword ``remat``, which is a training setting (``TrainConfig.remat``), not a model option.
    REMAT_POLICIES: ClassVar[tuple[str, ...]] = ("none",)

    @classmethod
    def options_for_data(cls, dataset: Any) -> dict[str, Any]:
        """The options that must agree with ``dataset`` (input width, classes, vocabulary, ...)."""
        return {}

    @classmethod
    def tensor_parallel_rules(cls, axis: str = "model",
                              options: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
        """``(regex, spec text)`` pairs for tensor parallelism over ``axis`` of the model built with
        ``options`` (default its preset); empty: nothing to split."""
        return []

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Fills derived defaults and checks options against each other (types are checked before)."""
        return options

    @classmethod
    def example_shapes(cls, options: dict[str, Any], seq_len: int | None = None) -> tuple[tuple, tuple]:
        """One example's ``x`` and ``y`` shapes as its data set's batches hold them (resolved ``options``)."""
        raise NotImplementedError


class LinearRegression(RegisteredModel):
    """``y = x W + b``. A single layer has no partner to pair a split with: no tensor-parallel rules."""

    NAME = "linear"
    DATA_KIND = "regression"
    loss = staticmethod(mean_squared_error_loss)

    @classmethod
    def options_for_data(cls, dataset: Any) -> dict[str, Any]:
        return {"in_features": math.prod(dataset.input_shape), "out_features": math.prod(dataset.target_shape) or 1}

    @classmethod
    def example_shapes(cls, options: dict[str, Any], seq_len: int | None = None) -> tuple[tuple, tuple]:
        return (options["in_features"],), (options["out_features"],)

    def __init__(self, *, in_features: int = 16, out_features: int = 1, use_bias: bool = True, rngs: nnx.Rngs):
        self.linear = nnx.Linear(in_features, out_features, use_bias=use_bias, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x)


class MLPClassifier(RegisteredModel):
    """Two ReLU hidden layers and a linear output; the preset fits the flattened 8x8 digits."""

    NAME = "mlp"
    DATA_KIND = "classification"
    loss = staticmethod(cross_entropy_loss)

    @classmethod
    def options_for_data(cls, dataset: Any) -> dict[str, Any]:
        return {"in_features": math.prod(dataset.input_shape), "num_classes": dataset.num_classes}

    @classmethod
    def example_shapes(cls, options: dict[str, Any], seq_len: int | None = None) -> tuple[tuple, tuple]:
        return (options["in_features"],), ()

    def __init__(self, *, in_features: int = 64, hidden: int = 128, num_classes: int = 10, rngs: nnx.Rngs):
        self.hidden1 = nnx.Linear(in_features, hidden, rngs=rngs)
        self.hidden2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.output = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], -1)
        return self.output(nnx.relu(self.hidden2(nnx.relu(self.hidden1(x)))))

    @classmethod
    def tensor_parallel_rules(cls, axis: str = "model",
                              options: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
        # The hidden layers are the pair; the output layer is small (10 classes) and stays whole.
        return column_row_rules("hidden1", "hidden2", axis)


class CNNClassifier(RegisteredModel):
    """Two (3x3 conv, ReLU, 2x2 max-pool) blocks and a dense head, for square images (8x8x1 digits).

    Takes (B, H*W*C), (B, H, W) or (B, H, W, C) input: the digits data set ships flattened rows.
    """

    NAME = "cnn"
    DATA_KIND = "classification"
    loss = staticmethod(cross_entropy_loss)

    @classmethod
    def options_for_data(cls, dataset: Any) -> dict[str, Any]:
        shape = dataset.input_shape
        channels = shape[-1] if len(shape) == 3 else 1
        side = math.isqrt(math.prod(shape) // channels)
        if side * side * channels != math.prod(shape):
            raise WorkbenchError(
                f"model 'cnn' needs square images; data {dataset.name!r} has inputs of shape {shape}: use mlp"
            )
        return {"image_size": side, "in_channels": channels, "num_classes": dataset.num_classes}

    @classmethod
    def example_shapes(cls, options: dict[str, Any], seq_len: int | None = None) -> tuple[tuple, tuple]:
        return (options["image_size"] ** 2 * options["in_channels"],), ()  # flattened rows, as digits ships

    def __init__(self, *, image_size: int = 8, in_channels: int = 1, conv1_channels: int = 16,
                 conv2_channels: int = 32, num_classes: int = 10, rngs: nnx.Rngs):
        self.image_size, self.in_channels = image_size, in_channels
        self.conv1 = nnx.Conv(in_channels, conv1_channels, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(conv1_channels, conv2_channels, kernel_size=(3, 3), rngs=rngs)
        pooled = image_size // 4  # after two 2x2 pools
        self.head = nnx.Linear(pooled * pooled * conv2_channels, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], self.image_size, self.image_size, self.in_channels)
        for conv in (self.conv1, self.conv2):
            x = nnx.max_pool(nnx.relu(conv(x)), window_shape=(2, 2), strides=(2, 2))
        return self.head(x.reshape(x.shape[0], -1))

    @classmethod
    def tensor_parallel_rules(cls, axis: str = "model",
                              options: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
        # Conv kernels are (h, w, in, out): conv1 splits its output channels, conv2 its input channels.
        return column_row_rules("conv1", "conv2", axis, kernel_rank=4)

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        if options["image_size"] < 4:
            size = options["image_size"]
            raise WorkbenchError(f"model 'cnn' image_size={size} is too small: two 2x2 pools need 4 or more")
        return options


def sinusoidal_positions(length: int, d_model: int) -> jax.Array:
    """Position embeddings (length, d_model) from "Attention Is All You Need": computed, never trained.

    Example:
        >>> sinusoidal_positions(3, 4)[0]
        Array([0., 0., 1., 1.], dtype=float32)
    """
    # NumPy, not jnp: a constant, so tracing a step compiles no little XLA programs for it (which cost
    # a fresh process's first plan about 0.1 s each with the compilation cache off)
    frequencies = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float32) / d_model).astype(np.float32)
    angles = np.arange(length, dtype=np.float32)[:, None] * frequencies
    return jnp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)[:, :d_model])


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention in which position t sees positions <= t.

    q, k, v and out are separate (d_model, d_model) kernels. Column block h of q/k/v is head h, so a
    column split of q/k/v over a mesh axis gives each device whole heads (n_heads must divide by it). They are
    contracted as (d_model, heads, head_dim) kernels (:mod:`.head_projection`: why), so the heads never stand
    concatenated in a value of the residual stream's shape.
    """

    def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs):
        self.n_heads = n_heads
        self.q = HeadProjection(d_model, n_heads, into_heads=True, rngs=rngs)
        self.k = HeadProjection(d_model, n_heads, into_heads=True, rngs=rngs)
        self.v = HeadProjection(d_model, n_heads, into_heads=True, rngs=rngs)
        self.out = HeadProjection(d_model, n_heads, into_heads=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        q, k, v = self.q(x), self.k(x), self.v(x)  # (batch, T, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        # Masked and weighted with hand-written backward passes that hold fewer (batch, heads, T, T) buffers
        # (causal_attention): the same values and gradients.
        weights = jax.nn.softmax(causally_masked(scores), axis=-1)
        return self.out(weighted_values(weights, v))


class FeedForward(nnx.Module):
    """``down(gelu(up(x)))``: the position-wise MLP of a transformer block."""

    def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(d_model, d_ff, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # Its input's gradient goes down once its weights' exist: XLA:GPU left those to after the attention's
        # backward pass, keeping the (batch, T, d_ff) gradients they read (schedule_ties.weight_gradients_first).
        return weight_gradients_first(FeedForward.forward)(self, x)

    def forward(self, x: jax.Array) -> jax.Array:
        """The feed-forward's output, without the order its backward pass is tied to."""
        return self.down(nnx.gelu(self.up(x)))


class DecoderBlock(nnx.Module):
    """Pre-LayerNorm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``, its activations kept as the remat
    policy ``remat`` says (:mod:`.remat`)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, norm_epsilon: float, *, remat: str = "none",
                 rngs: nnx.Rngs):
        # Inside the block's own call, so that per-layer fsdp, which wraps that call, gathers the parameters
        # once and the policy sees them as inputs (remat outside would gather them again to recompute).
        self.remat = remat
        self.ln1 = nnx.LayerNorm(d_model, epsilon=norm_epsilon, rngs=rngs)
        self.attn = CausalSelfAttention(d_model, n_heads, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=norm_epsilon, rngs=rngs)
        self.mlp = FeedForward(d_model, d_ff, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return rematerialized(DecoderBlock.residual_stream, self.remat)(self, x)

    def residual_stream(self, x: jax.Array) -> jax.Array:
        """The block's computation, without remat: the residual stream after attention and feed-forward."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@functools.partial(nnx.jit, static_argnums=(0, 1, 2, 3), static_argnames=("remat",))
def new_decoder_block(d_model: int, n_heads: int, d_ff: int, norm_epsilon: float, rngs: nnx.Rngs,
                      remat: str = "none") -> DecoderBlock:
    """A freshly initialised block, traced on its own (the same values as building it eagerly).

    Why: in one whole-model trace (``nnx.eval_shape``) every rng call makes flax inspect a tracer at a
    cost proportional to everything traced so far, so a 20-layer 1B model took over a second to describe.
    One trace per block keeps abstract builds linear in depth; concrete builds compile a block once.
    """
    return DecoderBlock(d_model, n_heads, d_ff, norm_epsilon, remat=remat, rngs=rngs)


def embedding_sharding(tokens: jax.Array) -> NamedSharding | None:
    """Where looked-up embeddings go: the tokens' Explicit sharding, plus a whole feature dimension.

    Why: under Explicit mesh axes JAX refuses to guess a gather's output sharding, so data-parallel
    training of the LM would fail to trace. With Auto axes or no mesh, None lets JAX choose.

    Example:
        >>> embedding_sharding(jnp.zeros((2, 8), jnp.int32)) is None
        True
    """
    sharding = jax.typeof(tokens).sharding
    if all(entry is None for entry in sharding.spec):
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec, None))


class TransformerLM(RegisteredModel):
    """A small decoder-only language model: tokens (B, T) int -> next-token logits (B, T, vocab).

    Token embedding plus sinusoidal positions, ``n_layers`` pre-LayerNorm blocks, a final LayerNorm and
    an untied output head without bias. The preset is a byte-level model (vocab 256). ``remat``: what each
    block keeps for the backward pass (:mod:`.remat`); a training setting, so not one of the options.

    ``loss_tile``: the loss computes the logits of this many words of the vocabulary at a time
    (:func:`language_model_loss`); by default 512 (:func:`~.lm_head.default_tile`), so a vocabulary of
    512 words or fewer is computed in one piece.
    """

    NAME = "transformer"
    DATA_KIND = "language"
    loss = staticmethod(language_model_loss)
    SEQUENCE_OPTION = "max_len"
    BLOCKS_OPTION = "n_layers"
    TRANSFORMER_ESTIMATES = True
    REMAT_POLICIES = ALL_REMAT_POLICIES

    @classmethod
    def options_for_data(cls, dataset: Any) -> dict[str, Any]:
        return {"vocab": dataset.vocab_size, "max_len": dataset.input_shape[0]}

    @classmethod
    def example_shapes(cls, options: dict[str, Any], seq_len: int | None = None) -> tuple[tuple, tuple]:
        length = options["max_len"] if seq_len is None else seq_len
        return (length,), (length,)  # tokens, and the next token of each position

    def __init__(self, *, vocab: int = 256, d_model: int = 128, n_heads: int = 4, n_layers: int = 2,
                 d_ff: int | None = None, max_len: int = 128, norm_epsilon: float = 1e-5,
                 loss_tile: int | None = None, scan_layers: bool = False, remat: str = "none", rngs: nnx.Rngs):
        resolved = self.resolve_options(dict(vocab=vocab, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                             loss_tile=loss_tile))
        d_ff = typing.cast(int, resolved["d_ff"])  # resolved: derived from d_model when not given
        self.loss_tile = resolved["loss_tile"]  # words per tile of the loss
        self.vocab, self.d_model, self.n_layers, self.d_ff, self.max_len = vocab, d_model, n_layers, d_ff, max_len
        self.n_heads = n_heads
        self.embed = TokenEmbedding(vocab, d_model, rngs=rngs)
        if scan_layers:  # one block's program, looped: how production LMs compile (see training/layer_stack.py)
            self.blocks = LayerStack(lambda rngs: DecoderBlock(d_model, n_heads, d_ff, norm_epsilon, remat=remat,
                                                               rngs=rngs), n_layers, rngs=rngs)
        else:
            self.blocks = nnx.List([new_decoder_block(d_model, n_heads, d_ff, norm_epsilon, rngs, remat=remat)
                                    for _ in range(n_layers)])
        self.final_norm = nnx.LayerNorm(d_model, epsilon=norm_epsilon, rngs=rngs)
        self.head = OutputHead(d_model, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.head(self.hidden_states(tokens))

    def hidden_states(self, tokens: jax.Array) -> jax.Array:
        """(B, T) tokens -> (B, T, d_model): everything but the output head (the final norm included)."""
        length = tokens.shape[-1]
        if length > self.max_len:
            raise ShapeError(
                f"sequence length {length} exceeds max_len={self.max_len}: crop it or build with max_len={length}"
            )
        x = self.embed(tokens, out_sharding=embedding_sharding(tokens))
        x = x + sinusoidal_positions(length, self.d_model).astype(x.dtype)  # bf16 stays bf16
        if isinstance(self.blocks, LayerStack):
            x = self.blocks(x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.final_norm(x)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Forward FLOPs per token at context length ``seq_len`` (default ``max_len``).

        ``2 * (n_layers * (4 d^2 + 2 d d_ff) + d vocab) + 4 n_layers seq_len d``: two FLOPs per
        multiply-add of every matmul weight (q, k, v, out, up, down, head), plus the attention scores
        ``q k^T`` and the weighted sum of values, ``2 seq_len d`` each per token and layer. The full
        T x T score matrix is counted, as in PaLM's ``6N + 12 L H Q T`` (training: three forwards);
        a causal kernel that skips masked blocks does about half the attention term. Embedding lookups,
        biases, norms and softmax are left out: XLA's count of the preset is 2% higher, and the gap
        shrinks as d_model grows.

        Example:
            >>> build_model("transformer", n_layers=1, vocab=8, d_model=4, n_heads=1).flops_per_token(2)
            480
        """
        seq_len = self.max_len if seq_len is None else seq_len
        d = self.d_model
        matmul_weights = self.n_layers * (4 * d * d + 2 * d * self.d_ff) + d * self.vocab
        return 2 * matmul_weights + 4 * self.n_layers * seq_len * d

    @classmethod
    def tensor_parallel_rules(cls, axis: str = "model",
                              options: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
        stacked = bool((options or {}).get("scan_layers"))  # the blocks' leading layer axis stays whole
        blocks = "blocks/layer" if stacked else r"blocks/\d+"
        attention, mlp = f"{blocks}/attn", f"{blocks}/mlp"
        return column_row_rules(rf"{attention}/(q|k|v)", rf"{attention}/out", axis, stacked=stacked) + column_row_rules(
            rf"{mlp}/up", rf"{mlp}/down", axis, stacked=stacked
        )

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        if options["d_model"] % options["n_heads"]:
            raise WorkbenchError(
                f"model 'transformer' d_model={options['d_model']} is not divisible by n_heads={options['n_heads']}: "
                "pick n_heads dividing d_model (head size = d_model / n_heads)"
            )
        return {**options, "d_ff": options["d_ff"] or FEED_FORWARD_MULTIPLIER * options["d_model"],
                "loss_tile": options["loss_tile"] or default_tile(options["vocab"])}


_REGISTRY: dict[str, type[RegisteredModel]] = {
    cls.NAME: cls for cls in (LinearRegression, MLPClassifier, CNNClassifier, TransformerLM)
}
MODELS: tuple[str, ...] = tuple(_REGISTRY)


# --- options and construction --------------------------------------------------------------------

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false"}
_BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


# Constructor keywords that are not model options: the initialisation's rngs, and remat (a training setting).
_NOT_OPTIONS = ("self", "rngs", "remat")


def model_class(name: str) -> type[RegisteredModel]:
    """The registered class of model ``name``; WorkbenchError listing :data:`MODELS` if there is none."""
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return _REGISTRY[name]


def model_options(name: str) -> dict[str, tuple[type, Any]]:
    """Option name -> (type, preset value), read from the model's constructor signature.

    Example:
        >>> model_options("mlp")["hidden"]
        (<class 'int'>, 128)
    """
    init = model_class(name).__init__
    hints = typing.get_type_hints(init)
    options = {}
    for key, parameter in inspect.signature(init).parameters.items():
        if key not in _NOT_OPTIONS:
            # `int | None` means "an int, derived when not given" (the transformer's d_ff).
            kind = next(t for t in typing.get_args(hints[key]) or (hints[key],) if t is not type(None))
            options[key] = (kind, parameter.default)
    return options


def _checked_value(name: str, key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind``: ints are fine where numbers are wanted; bools are not numbers here."""
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if is_number and (kind is float or isinstance(value, numbers.Integral)) and kind is not bool:
        if not value > 0:  # pyright: ignore[reportOperatorIssue]  (typeshed's numbers.Real declares no ">")
            raise WorkbenchError(f"model {name!r} option {key}={value!r} must be positive")
        return kind(value)
    raise WorkbenchError(f"model {name!r} option {key}={value!r} must be {_TYPE_WORDS[kind]}")


def _unknown_option(name: str, key: str, valid: Mapping[str, Any]) -> WorkbenchError:
    return WorkbenchError(f"model {name!r} has no option {key!r}: valid options are {', '.join(valid)}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model's name and its complete, checked options (derived ones filled in)."""

    name: str
    options: dict[str, Any]

    def build(self, rngs: nnx.Rngs | None = None, seed: int = 0, remat: str = "none") -> RegisteredModel:
        """The model, initialised from ``rngs`` (default ``nnx.Rngs(seed)``), its blocks keeping their
        activations as remat policy ``remat`` says (:mod:`.remat`; RematError if the model cannot apply it)."""
        registered = model_class(self.name)
        validate_remat(remat, self.name, registered.REMAT_POLICIES)
        cls = typing.cast("Callable[..., RegisteredModel]", registered)  # built from its own options
        applied = {} if remat == "none" else {"remat": remat}  # models without blocks take no remat keyword
        return cls(**self.options, **applied, rngs=rngs if rngs is not None else nnx.Rngs(seed))

    def to_text(self) -> str:
        """The options as ``key=value,...`` text, which :func:`parse_model_options` reads back."""
        return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.options.items())


def model_config(name: str, **overrides: Any) -> ModelConfig:
    """The preset of model ``name`` with ``overrides`` applied, type-checked and resolved.

    Example:
        >>> model_config("transformer", d_model=256).options["d_ff"]
        1024
    """
    valid = model_options(name)
    for key in overrides:
        if key not in valid:
            raise _unknown_option(name, key, valid)
    options = {
        key: _checked_value(name, key, overrides[key], kind) if key in overrides else default
        for key, (kind, default) in valid.items()
    }
    return ModelConfig(name, model_class(name).resolve_options(options))


def parse_model_options(text: str, name: str) -> dict[str, Any]:
    """Typed overrides from ``key=value,...`` text for model ``name`` (ints, floats, bools; never eval).

    Raises WorkbenchError naming the key for unknown keys (listing the valid ones), values of the wrong
    type, duplicates, and values the model rejects when built.

    Example:
        >>> parse_model_options("d_model=2048, n_layers=24", "transformer")
        {'d_model': 2048, 'n_layers': 24}
    """
    valid = model_options(name)
    parsed: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, separator, value = (part.strip() for part in item.partition("="))
        if not (separator and key and value):
            raise WorkbenchError(f"model option {item!r} is not key=value: write e.g. '{next(iter(valid))}=...'")
        if key not in valid:
            raise _unknown_option(name, key, valid)
        if key in parsed:
            raise WorkbenchError(f"model option {key!r} is given twice in {text!r}: keep one")
        kind = valid[key][0]
        try:
            parsed[key] = _BOOLEANS[value.lower()] if kind is bool else kind(value)
        except (KeyError, ValueError):
            raise WorkbenchError(f"model {name!r} option {key}={value!r} must be {_TYPE_WORDS[kind]}") from None
    model_config(name, **parsed)  # the checks building does: positive sizes, heads dividing d_model, ...
    return parsed


def build_model(name: str, rngs: nnx.Rngs | None = None, seed: int = 0, *, remat: str = "none",
                **overrides: Any) -> RegisteredModel:
    """Model ``name`` with its preset and ``overrides``, initialised from ``rngs`` or ``seed``, its blocks
    under remat policy ``remat`` (:mod:`.remat`).

    Example:
        >>> build_model("cnn")(jnp.zeros((2, 64))).shape
        (2, 10)
        >>> build_model("transformer", remat="dots").blocks[0].remat
        'dots'
    """
    return model_config(name, **overrides).build(rngs, seed, remat)


def abstract_model(name: str, seed: int = 0, **overrides: Any) -> RegisteredModel:
    """Model ``name`` with ``jax.ShapeDtypeStruct`` parameters (``nnx.eval_shape``): nothing is allocated.

    Example:
        >>> param_count(abstract_model("transformer", d_model=2048, n_heads=16, n_layers=20, vocab=32000))
        1138241536
    """
    config = model_config(name, **overrides)
    return nnx.eval_shape(lambda: config.build(seed=seed))


# What a batch of each kind of data holds: (x dtype, y dtype); every batch also has a float32 "mask".
_BATCH_DTYPES = {"regression": ("float32", "float32"), "classification": ("float32", "int32"),
                 "language": ("int32", "int32")}


def abstract_batch(config: ModelConfig, examples: int, seq_len: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
    """A batch of ``examples`` for model ``config`` as shapes (``x``, ``y``, ``mask``), without any data:
    what its data set's batches hold, for compiling a step ahead of time.

    Example:
        >>> {k: v.shape for k, v in abstract_batch(model_config("transformer"), 8, seq_len=64).items()}
        {'x': (8, 64), 'y': (8, 64), 'mask': (8,)}
    """
    cls = model_class(config.name)
    x_shape, y_shape = cls.example_shapes(config.options, seq_len)
    x_dtype, y_dtype = _BATCH_DTYPES[cls.DATA_KIND]
    return {"x": jax.ShapeDtypeStruct((examples, *x_shape), x_dtype),
            "y": jax.ShapeDtypeStruct((examples, *y_shape), y_dtype),
            "mask": jax.ShapeDtypeStruct((examples,), "float32")}


def param_count(model: nnx.Module) -> int:
    """Number of trainable parameters (``nnx.Param`` entries) of a real or abstract model.

    Example:
        >>> param_count(build_model("linear", in_features=3))
        4
    """
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


def loss_fn(model: RegisteredModel, batch: Mapping[str, Any]) -> LossOutput:
    """The loss of a registered model on ``batch``: ``(loss, aux)`` from its class's ``loss``.

    Example:
        >>> model = build_model("linear", in_features=2)
        >>> float(loss_fn(model, {"x": jnp.zeros((4, 2)), "y": jnp.zeros(4)})[0])
        0.0
    """
    return type(model).loss(model, batch)


def model_config_for_data(name: str, dataset: Any, **overrides: Any) -> ModelConfig:
    """Model ``name`` fitted to ``dataset``: sizes the data decides (input width, classes, vocabulary,
    sequence length) are taken from it; ``overrides`` may set them only to the same values.

    Raises WorkbenchError when the model does not train on this kind of data (naming the models that
    do), or when an override contradicts the data.

    Example:
        >>> from workbench.training.data import load_dataset
        >>> model_config_for_data("mlp", load_dataset("digits"), hidden=64).options["in_features"]
        64
    """
    cls = model_class(name)
    if dataset.kind != cls.DATA_KIND:
        fitting = [n for n, c in _REGISTRY.items() if c.DATA_KIND == dataset.kind]
        raise WorkbenchError(
            f"model {name!r} trains on {cls.DATA_KIND} data, but data {dataset.name!r} is {dataset.kind}: "
            f"use --model {' or '.join(fitting)}, or other data"
        )
    fitted = cls.options_for_data(dataset)
    for key, value in fitted.items():
        # A sequence length above the data's is fine: the model then reads shorter sequences than it could.
        if key in overrides and overrides[key] != value and not (key == cls.SEQUENCE_OPTION and overrides[key] > value):
            raise WorkbenchError(
                f"model option {key}={overrides[key]!r} does not fit data {dataset.name!r}, which needs "
                f"{key}={value}: drop the option (it is set from the data)"
            )
    return model_config(name, **{**fitted, **overrides})


def tensor_parallel_rules(name: str, axis: str = "model",
                          options: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """The tensor-parallel ``(regex, spec text)`` table of model ``name`` over mesh axis ``axis``, for the
    model built with ``options`` (``scan_layers`` stacks the transformer's blocks on a leading axis).

    Example:
        >>> tensor_parallel_rules("mlp")[0]
        ('(^|/)hidden1/kernel$', 'None, model')
        >>> tensor_parallel_rules("transformer", options={"scan_layers": True})[0]
        ('(^|/)blocks/layer/attn/(q|k|v)/kernel$', 'None, None, model')
    """
    return model_class(name).tensor_parallel_rules(axis, options)


def has_tensor_parallel_layers(name: str) -> bool:
    """Whether model ``name`` has layers tensor parallelism can split (``linear`` has none)."""
    return bool(tensor_parallel_rules(name))
