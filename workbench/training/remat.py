"""Rematerialisation (activation checkpointing): which of a block's values the forward pass keeps for the
backward pass, and which the backward pass computes again.

A policy trades memory for FLOPs, per transformer block (``TrainConfig.remat``, ``--remat``):

* ``none``: every value the backward pass reads is kept (the most memory, no recomputation);
* ``block``: only each block's input is kept; the backward pass runs the block's forward again
  (``jax.checkpoint_policies.nothing_saveable``): the least memory, one more forward pass of the blocks;
* ``dots``: the outputs of the block's matmuls against its weights are kept (q, k, v, the attention's output
  projection, the feed-forward's up projection); the norms, the attention scores and softmax and the GELU are
  computed again (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``: the attention's two einsums
  have batch dimensions, so they are recomputed, and their (B, H, T, T) scores are never kept).

A model declares the policies it applies (``RegisteredModel.REMAT_POLICIES``); only the transformer has
repeated blocks to apply them to, so ``mlp``, ``cnn`` and ``linear`` take ``none`` only. Every mode applies
the policy, per-layer ``fsdp`` and ``fsdp-tp`` too: they keep what the policy keeps except the gathered
parameters, which they gather again for the backward pass, and under ``block`` recompute each block from its
input themselves (:mod:`.modes.param_gathering`).

Example:
    >>> validate_remat("block", "transformer", ("none", "block", "dots"))
    'block'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from ..errors import WorkbenchError
from .head_projection import PROJECTED
from .schedule_ties import computed_after, handed_down_after

REMAT_POLICIES = ("none", "block", "dots")
# What each policy keeps, in the words the CLI's help and the widgets show.
REMAT_MEANINGS = {
    "none": "keep every activation (no recomputation)",
    "block": "keep each block's input, recompute the block in the backward pass",
    "dots": "keep the blocks' matmul outputs, recompute the rest",
}
_JAX_POLICIES = {
    "block": jax.checkpoint_policies.nothing_saveable,
    # Inside per-layer fsdp's layers the attention's projections are checkpoints of their own (head_projection.py),
    # whose outputs the dots policy would not see as a matmul's: kept by their name.
    "dots": jax.checkpoint_policies.save_from_both_policies(jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                                                            jax.checkpoint_policies.save_only_these_names(PROJECTED)),
}


class RematError(WorkbenchError):
    """A remat policy that is unknown, or that the model cannot apply."""


def validate_remat(remat: Any, model: str | None, supported: tuple[str, ...]) -> str:
    """``remat`` if it is a policy that model ``model`` (None: your own model) applies (``supported``), else a
    :class:`RematError` naming it and the choices.

    Example:
        >>> validate_remat("blocks", "transformer", REMAT_POLICIES)
        Traceback (most recent call last):
        ...
        workbench.training.remat.RematError: unknown remat policy 'blocks': choose one of none, block, dots
        >>> validate_remat("block", "mlp", ("none",))
        Traceback (most recent call last):
        ...
        workbench.training.remat.RematError: model 'mlp' cannot apply remat 'block' (it has no repeated blocks): ...
    """
    if remat not in REMAT_POLICIES:
        raise RematError(f"unknown remat policy {remat!r}: choose one of {', '.join(REMAT_POLICIES)}")
    if remat not in supported and model is None:
        raise RematError(f"remat {remat!r} applies to the registered transformer's blocks, not your own model: choose "
                         "none, and wrap your model's blocks in nnx.remat yourself")
    if remat not in supported:
        raise RematError(f"model {model!r} cannot apply remat {remat!r} (it has no repeated blocks): choose one of "
                         f"{', '.join(supported)}, or model 'transformer', which applies {', '.join(REMAT_POLICIES)}")
    return remat


def rematerialized(fn: Callable, remat: str) -> Callable:
    """``fn(module, *args)`` with its activations kept as policy ``remat`` says (``none``: ``fn`` itself).

    ``jax.checkpoint`` alone does not recompute on XLA:CPU: it removes the optimisation barriers that keep the
    recomputation apart before it schedules, then schedules the recomputed values in the forward pass, where
    they live as long as kept ones (measured: the same temporaries under every policy). So the backward pass
    here recomputes only once the output's gradient exists (:func:`~.schedule_ties.computed_after`, the
    tie per-layer fsdp uses for its re-gathers), which XLA:CPU and XLA:GPU honour (measured: the README's 0.8B
    on one H200, compiled deviceless, holds 84.7 GiB without remat and 18.4 GiB with ``block``).

    Example:
        >>> import jax.numpy as jnp
        >>> layer = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> bool(jnp.allclose(rematerialized(nnx.Linear.__call__, "block")(layer, jnp.ones(2)), layer(jnp.ones(2))))
        True
    """
    if remat == "none":
        return fn
    policy = _JAX_POLICIES[remat]

    def call(module: nnx.Module, *args: Any) -> Any:
        graphdef, state = nnx.split(module)
        prepare = getattr(module, _PREPARE_STATE, None) or (lambda state: state)

        def pure(state: Any, *args: Any) -> Any:
            return fn(nnx.merge(graphdef, prepare(state)), *args)

        # prevent_cse off: the tie below keeps the recomputation from merging with the forward pass.
        checkpointed = jax.checkpoint(pure, policy=policy, prevent_cse=False)

        @jax.custom_vjp
        def run(state: Any, *args: Any) -> Any:
            return pure(state, *args)

        def forward(state: Any, *args: Any) -> tuple[Any, Any]:
            return jax.vjp(checkpointed, state, *args)  # the output, and a pullback holding what the policy saves

        def backward(pullback: Any, cotangent: Any) -> Any:
            # Tied to the cotangent only: a block's output gradient exists once the forward pass above it has
            # ended. No marker of the forward's output is kept, so where the forward is itself recomputed and
            # only the pullback is used, XLA drops that forward. The weights are tied too: untied, XLA:CPU
            # moved work on them forward and kept more (measured: 4% more with block).
            state_grad, *arg_grads = _tied(pullback, cotangent, vectors=remat != "dots")(cotangent)
            # The input's gradient goes down once the weights' exist: else XLA:GPU computed every block's weight
            # gradients at the end of the backward pass, next to their all-reduce, keeping each one's operands
            # (the 1.3B transformer's dp-tp step on 512 H100s under block: 11.2 GiB, tied 5.8).
            arg_grads, state_grad = handed_down_after(tuple(arg_grads), state_grad)
            return (state_grad, *arg_grads)

        run.defvjp(forward, backward)
        return run(state, *args)

    return call


_PREPARE_STATE = "prepare_state"


def prepare_state(module: nnx.Module, prepare: Callable[[Any], Any]) -> None:
    """Have ``module``'s remat boundary (:func:`rematerialized`; a block under remat) apply ``prepare`` to its state
    (an ``nnx.State``) first: what a step does to a block's parameters as the block starts, done inside, so that what
    the block keeps for its backward pass is the state as it came, and its recomputation is prepared again.

    Why inside: a prepared value is a new one. Kept, a scanned stack's loop stacks copies of it from zeros that XLA
    merges by shape (``shapes_apart.py``); and the tie that orders the recomputation (:func:`_tied`) makes new values
    again, whose layout the compiler chooses afresh: held to their layout outside only, libtpu split dp-tp's layer
    norms' scales over 'model' and its residual stream with them (4.4-6.9x the bytes planned over it). Set on a traced
    copy of the module only (plain data, not a Variable). Used by :class:`~.layer_stack.LayerStack` (each slice
    restored to its shapes) and :mod:`.modes.layout_pins` (parameters held to their layout).

    Example:
        >>> block = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> prepare_state(block, lambda state: state)
    """
    object.__setattr__(module, _PREPARE_STATE, prepare)


def _tied(pullback: Any, cotangent: Any, vectors: bool) -> Any:
    """``pullback`` with its saved values tied to ``cotangent`` (:func:`~.schedule_ties.computed_after`); with
    ``vectors`` False, all but its vectors (a layer norm's scale, a bias).

    Why not the vectors under ``dots``: a tied value is a new one, whose layout the compiler chooses afresh. In
    fsdp-tp's step under ``dots`` libtpu split the tied layer-norm scales and biases over ``model``, and the residual
    stream with them, which it then gathered before every matmul reading it (the README's 1.3B on v5e:16x16: 5.3x the
    bytes planned over ``model``; untied, the plan's). Under ``block`` the tie holds XLA:CPU's memory down: untied, the
    2-block transformer's dp step held 3% more (26.2 against 25.4 MB a device, JAX 0.10). Where a step holds the
    parameters to their layout (dp-tp's microbatches) it does so inside the boundary (:func:`prepare_state`), so the
    tied values are held again: before, libtpu split dp-tp's unrolled blocks under ``block`` (6.9x the bytes planned
    over ``model``; 1.1x since).
    """
    if vectors:
        return computed_after(pullback, cotangent)
    leaves, structure = jax.tree.flatten(pullback)
    # A vector has one axis longer than 1 (a scanned slice may carry trailing axes of length 1: layer_stack.py).
    tied_at = [i for i, leaf in enumerate(leaves) if sum(size > 1 for size in getattr(leaf, "shape", ())) > 1]
    tied = computed_after([leaves[i] for i in tied_at], cotangent)
    for i, leaf in zip(tied_at, tied, strict=True):
        leaves[i] = leaf
    return jax.tree.unflatten(structure, leaves)


__all__ = ["REMAT_MEANINGS", "REMAT_POLICIES", "RematError", "prepare_state", "rematerialized", "validate_remat"]
