"""The arithmetic every parallel mode shares: one training step written once, as small pure pieces.

A step is: gradients of the loss on a (micro)batch, combined over microbatches and devices, then one
optimizer update. Modes differ only in *where* the combining happens (a Python loop, the compiler, an
explicit ``pmean``) and in how the state is laid out, so this module gives them the pieces:

:class:`TrainState` (parameters, optimizer state, the model's other state), :func:`weighted_sums` (the loss and
gradient times the batch's weight: sums of these add up exactly over any split of a batch, padded or not),
:func:`weighted_sums_of` (the same for any ``params -> (loss, aux)``, as ``fsdp``'s layers need),
:func:`accumulate` (over ``k`` microbatches with ``lax.scan``), :func:`means` and :func:`finish_step`.

Mixed precision (``"bf16"``): the float32 master parameters and float inputs are cast to bfloat16 for
the forward and backward pass; gradients arrive in float32 (the cast's transpose) and the update is
applied to the float32 master copy.

Example:
    >>> from workbench.training import build_model, load_dataset, model_class
    >>> tx, graphdef, state = optax.sgd(0.1), *init_state(build_model("mlp"), optax.sgd(0.1))
    >>> batch = next(load_dataset("digits").batches(64, seed=0))
    >>> sums = weighted_sums(graphdef, model_class("mlp").loss, "fp32", state.params, state.other, batch)
    >>> sorted(finish_step(tx, state, means(sums))[1])
    ['loss']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ...errors import WorkbenchError
from ...layout.paths import leaves_with_paths
from ..data_parallel import varying_axes
from ..layer_scopes import name_layers
from ..shapes_apart import apart, apart_shapes, restored

PRECISIONS = ("fp32", "bf16")
LossFn = Callable[[nnx.Module, Mapping[str, Any]], tuple[jax.Array, dict[str, jax.Array]]]


class TrainState(NamedTuple):
    """Everything a step reads and writes, as one pytree (paths ``params/...``, ``opt_state/...``).

    ``other`` is the model's state that is not an ``nnx.Param`` (e.g. batch statistics); it is carried
    unchanged, so a model that updates such state in its forward pass keeps its initial values.
    """

    params: Any
    opt_state: Any
    other: Any


def init_state(model: nnx.Module, optimizer: optax.GradientTransformation) -> tuple[Any, TrainState]:
    """Split ``model`` into its graph definition and a fresh :class:`TrainState`.

    Example:
        >>> from workbench.training.models import build_model
        >>> graphdef, state = init_state(build_model("linear"), optax.sgd(0.1))
        >>> type(state).__name__, sorted(state._fields)
        ('TrainState', ['opt_state', 'other', 'params'])
    """
    graphdef, params, other = nnx.split(model, nnx.Param, ...)
    return graphdef, TrainState(params, optimizer.init(params), other)


def cast_floats(tree: Any, dtype) -> Any:
    """Every floating-point leaf of ``tree`` cast to ``dtype`` (integer leaves, e.g. tokens, untouched)."""

    def cast(leaf):
        return leaf.astype(dtype) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating) else leaf

    return jax.tree.map(cast, tree)


def _batch_weight(batch: Mapping[str, Any]) -> jax.Array:
    """What a batch counts for when the loss does not say: its mask's sum, else its number of rows."""
    if "mask" in batch:
        return jnp.sum(jnp.asarray(batch["mask"], jnp.float32))
    return jnp.float32(jax.tree.leaves(batch)[0].shape[0])


def model_loss(graphdef: Any, loss: LossFn, precision: str, params: Any, other: Any, batch: Any):
    """``(loss, aux)`` of the model rebuilt from ``params``, computed at ``precision``."""
    if precision == "bf16":
        params, batch = cast_floats(params, jnp.bfloat16), cast_floats(batch, jnp.bfloat16)
    model = name_layers(nnx.merge(graphdef, params, other))  # op names carry layer paths: metadata only
    value, aux = loss(model, batch)
    return value.astype(jnp.float32), aux


def as_per_device(tree: Any, axis: str) -> Any:
    """Inside ``shard_map``: every leaf marked as varying over ``axis`` (leaves already varying are kept).

    Why: with ``check_vma=True``, ``jax.grad`` with respect to an unvarying (replicated) input returns
    the gradient already summed over ``axis``. Marked per-device first, each device gets its own local
    gradient, to be reduced once and explicitly (see ``dp_shard_map.py``).
    """
    return jax.tree.map(
        lambda x: x if axis in (varying_axes(x) or ()) else jax.lax.pcast(x, axis, to="varying"), tree
    )


def _loss_weight(aux: Mapping[str, Any], batch: Any) -> jax.Array:
    """What the loss counts: ``aux["weight"]`` when the loss reports it, else the batch's own weight."""
    return jnp.asarray(aux["weight"], jnp.float32) if "weight" in aux else _batch_weight(batch)


def _scalar_metrics(aux: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The aux values that are metrics (float scalars), excluding the weight itself."""
    return {k: jnp.asarray(v, jnp.float32) for k, v in aux.items() if k != "weight" and jnp.ndim(v) == 0}


def mean_loss_and_grads(
    graphdef: Any, loss: LossFn, precision: str, params: Any, other: Any, batch: Any, *, with_grads: bool = True
) -> dict[str, Any]:
    """``{"grads": g, "metrics": {"loss": l, ...}, "weight": w}``: the loss's own means on one batch.

    ``w`` is ``aux["weight"]`` when the loss reports one (the workbench's losses do), else the mask's
    sum, else the number of rows. A loss that ignores masking must then be a mean over the batch.
    ``with_grads=False`` leaves the gradients out (``"grads": None``), for evaluation.
    """

    def objective(p):
        return model_loss(graphdef, loss, precision, p, other, batch)

    if with_grads:
        (value, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
    else:
        (value, aux), grads = objective(params), None
    weight = _loss_weight(aux, batch)
    return {"grads": grads, "metrics": {"loss": value, **_scalar_metrics(aux)}, "weight": weight}


def weighted_sums_of(objective: Callable[[Any], tuple[jax.Array, Any]], params: Any, batch: Any) -> dict[str, Any]:
    """:func:`weighted_sums` of ``objective(params) -> (loss, aux)``, differentiating ``weight * loss``.

    The same sums, but the weight is applied before differentiating, so collectives in ``objective``'s
    transpose (a gathered parameter's reduce-scatter) already sum the devices' *weighted* gradients.
    """

    def weighted(p):
        value, aux = objective(p)
        weight = jax.lax.stop_gradient(_loss_weight(aux, batch))
        return value * weight, (value, aux, weight)

    (_, (value, aux, weight)), grads = jax.value_and_grad(weighted, has_aux=True)(params)
    metrics = {"loss": value, **_scalar_metrics(aux)}
    return {"grads": grads, "metrics": jax.tree.map(lambda m: m * weight, metrics), "weight": weight}


def weighted_sums(
    graphdef: Any, loss: LossFn, precision: str, params: Any, other: Any, batch: Any, *, with_grads: bool = True
) -> dict[str, Any]:
    """:func:`mean_loss_and_grads` multiplied by the weight: ``{"grads": w*g, "metrics": w*m, "weight": w}``.

    Sums of these over any split of a batch, divided by the summed weight (:func:`means`), give the
    whole batch's mean loss and gradient exactly.
    """
    result = mean_loss_and_grads(graphdef, loss, precision, params, other, batch, with_grads=with_grads)
    weight = result["weight"]
    sums = {"metrics": jax.tree.map(lambda m: m * weight, result["metrics"]), "weight": weight}
    if with_grads:
        sums["grads"] = jax.tree.map(lambda g: g * weight.astype(g.dtype), result["grads"])
    return sums


def add_sums(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Element-wise ``a + b`` of two :func:`weighted_sums` results."""
    return jax.tree.map(jnp.add, a, b)


def microbatches(batch: Any, k: int) -> Any:
    """The batch as ``k`` microbatches along a new leading axis: leaf ``(B, ...)`` -> ``(k, B/k, ...)``.

    Microbatch ``j`` holds rows ``j, j+k, j+2k, ...``: reshaping to ``(B/k, k, ...)`` keeps every row on
    the device that holds it (the data split is over the leading ``B/k`` rows), so under data
    parallelism each microbatch is itself spread over all devices and nothing moves.
    """
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1), batch)


def accumulate(sums_of: Callable[[Any], dict[str, Any]], batch: Any, k: int) -> dict[str, Any]:
    """``sums_of`` summed over ``k`` microbatches of ``batch`` (``lax.scan``); ``k=1`` calls it once.

    Example:
        >>> from workbench.training.data import load_dataset
        >>> from workbench.training.models import build_model, model_class
        >>> g, state = init_state(build_model("mlp"), optax.sgd(0.1))
        >>> p, o, loss = state.params, state.other, model_class("mlp").loss
        >>> batch = next(load_dataset("digits").batches(64, seed=0))
        >>> sums = accumulate(lambda b: weighted_sums(g, loss, "fp32", p, o, b), batch, 4)
        >>> float(sums["weight"])  # every row of the 4 microbatches
        64.0
    """
    if k == 1:
        return sums_of(batch)
    split = microbatches(batch, k)
    # One loop over all k microbatches from zero sums, not the first microbatch then a loop over the rest: XLA drops
    # a loop that runs once, and then schedules accum=2's two microbatches side by side, both sets of activations
    # live (measured on XLA:CPU, a 4-layer transformer: 173 MB of temporaries against 177 MB without accumulation;
    # 92 MB from zeros). Adding to zero is exact, so the sums are the same.
    # The sums carried in shapes of their own (shapes_apart.py): accumulators of one shape start from one zero, and
    # libtpu then gave a tensor-parallel kernel's and the output head's gradients one layout.
    start, shapes = _zero_sums(sums_of, split)
    total, _ = jax.lax.scan(lambda total, micro: (add_sums(total, apart(sums_of(micro))), None), start, split)
    return restored(total, shapes)


def _zero_sums(sums_of: Callable[[Any], dict[str, Any]], split: Any) -> tuple[dict[str, Any], list[tuple[int, ...]]]:
    """Zeros of one microbatch's sums in shapes of their own (:func:`~..shapes_apart.apart_shapes`), each varying over
    the mesh axes its sum varies over inside ``shard_map`` (a loop's carry keeps its type: a per-device gradient
    varies, one shard_map already summed does not); and the sums' own shapes."""
    leaves, structure = jax.tree.flatten(jax.eval_shape(sums_of, jax.tree.map(lambda x: x[0], split)))
    shapes = [leaf.shape for leaf in leaves]

    def zeros(leaf: jax.ShapeDtypeStruct, shape: tuple[int, ...]) -> jax.Array:
        value = jnp.zeros(shape, leaf.dtype)
        axes = tuple(sorted(varying_axes(leaf) or ()))
        return jax.lax.pcast(value, axes, to="varying") if axes else value

    return jax.tree.unflatten(structure, list(map(zeros, leaves, apart_shapes(shapes)))), shapes


def means(sums: dict[str, Any]) -> dict[str, Any]:
    """The sums divided by the total weight, in :func:`mean_loss_and_grads`'s form.

    An all-padding batch (weight 0) gives zero gradients and metrics rather than NaN.
    """
    weight = sums["weight"]
    safe = jnp.where(weight > 0, weight, 1.0)
    metrics = {k: jnp.where(weight > 0, v / safe, 0.0) for k, v in sums["metrics"].items()}
    grads = sums.get("grads")
    if grads is not None:
        grads = jax.tree.map(lambda g: g / safe.astype(g.dtype), grads)
    return {"grads": grads, "metrics": metrics, "weight": weight}


def finish_step(
    optimizer: optax.GradientTransformation,
    state: TrainState,
    result: dict[str, Any],
    diagnostics: bool = False,
    faults: tuple[str, ...] = (),
):
    """One optimizer update from mean gradients (:func:`means` or :func:`mean_loss_and_grads`).

    Returns ``(new_state, metrics)``, left on the device. Every metric costs every step (on a sharded
    state, a reduction plus a collective), so an ordinary step reports only ``loss``; with
    ``diagnostics`` (the trainer asks at logging steps) it adds ``grad_norm`` (global L2), ``weight``
    (examples or tokens counted) and ``grad_sq_norms``, each leaf's squared norm, from which the global
    norm is computed and a non-finite one names the leaf whose gradient blew up (:func:`first_non_finite`).
    Accuracy and the loss's other metrics are left to evaluation.

    ``faults`` may hold the teaching fault ``"optimizer-reset"``: the optimizer state is rebuilt from
    scratch before the update, as a step that calls ``tx.init`` every time does (see :mod:`.faults`).
    """
    grads = result["grads"]
    opt_state = optimizer.init(state.params) if "optimizer-reset" in faults else state.opt_state
    updates, opt_state = optimizer.update(grads, opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": result["metrics"]["loss"]}
    if diagnostics:
        leaves = jax.tree.leaves(grads)
        sq_norms = jnp.stack([jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves]) if leaves else jnp.zeros(0)
        metrics.update(grad_norm=jnp.sqrt(jnp.sum(sq_norms)), grad_sq_norms=sq_norms, weight=result["weight"])
    return TrainState(params, opt_state, state.other), metrics


def first_non_finite(params: Any, grads_finite, params_finite=()) -> str | None:
    """Which leaf went non-finite, in words, from per-leaf flags; None if all are finite.

    ``grads_finite`` come from a step's ``grad_sq_norms`` (a squared norm is non-finite when the
    gradient holds NaN/inf, or is so large its square overflows); ``params_finite`` from the state.
    A gradient is named before a parameter: a NaN gradient makes the parameter NaN in the same step.

    Example:
        >>> first_non_finite({"w": 0, "b": 0}, [True, False], [True, False])
        "gradient of 'w'"
    """
    paths = [path for path, _ in leaves_with_paths(params)] if params is not None else []
    for what, flags in (("gradient", grads_finite), ("parameter", params_finite)):
        for index, ok in enumerate(list(flags)):
            if not bool(ok):
                name = paths[index] if index < len(paths) else f"#{index}"
                return f"{what} of {name!r}"
    return None


def validate_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a WorkbenchError saying which are."""
    if precision not in PRECISIONS:
        raise WorkbenchError(
            f"precision {precision!r} is not one of {', '.join(PRECISIONS)}: use 'fp32', or 'bf16' for "
            "bfloat16 compute with float32 master weights"
        )
    return precision
