"""Data parallelism: the batch split over one mesh axis, the model state replicated (or sharded), and
gradients averaged across devices.

Placement (:func:`create_data_parallel_sharding`, :func:`shard_batch`, :func:`shard_model_state`,
:func:`replicate_params`) works on any pytree: NumPy and JAX leaves alike are put on the mesh, and
leaves that are not arrays pass through untouched. Which spec each state leaf gets is decided by
:func:`~workbench.layout.tree_layout.layout_tree`, which also records why; this module only places.

:func:`reduce_gradients` is the collective for code inside ``jax.shard_map`` or ``jax.pmap``. It refuses
the N× trap: inside ``shard_map(..., check_vma=True)``, ``jax.grad`` with respect to replicated
parameters already returns the *sum* over devices, and a following ``pmean`` leaves N times the mean.
:func:`mean_of_gradient_trees` is the same average computed on the host from per-shard gradients.

The simplest data parallelism needs none of the collectives: ``jit`` a step whose batch is sharded
(:func:`shard_batch`) and whose parameters are replicated, and the compiler inserts the all-reduce.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import GradientSyncError, MeshError, SpecError, WorkbenchError
from ..layout.mesh import DATA_AXIS, build_mesh, parse_mesh
from ..layout.paths import is_array_like, leaves_with_paths, path_to_str
from ..layout.specs import entry_axes, spec_entries, validate_spec
from ..layout.tree_layout import TreeLayout, layout_tree

REDUCTIONS = ("mean", "sum")


# --- placement ---------------------------------------------------------------------------------


def _leaf_name(path: str) -> str:
    """A leaf's path for messages; a tree that is a single array has the empty path."""
    return repr(path) if path else "'<root>' (the tree is one array)"


def _concrete_mesh(mesh: Any) -> Mesh:
    """A ``jax.sharding.Mesh``: meshes pass through, descriptions (``"data=8"``) are built."""
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, jax.sharding.AbstractMesh):
        raise MeshError(
            f"mesh {parse_mesh(mesh)} is abstract (no devices) and cannot hold arrays: "
            f"build a concrete one with build_mesh('{parse_mesh(mesh)}'), or plan with layout_tree"
        )
    return build_mesh(mesh)


def create_data_parallel_sharding(mesh: Any, data_axis: str = DATA_AXIS) -> NamedSharding:
    """The sharding of a batch: leading dimension split over ``data_axis``, the rest whole.

    Args:
        mesh: a concrete ``jax.sharding.Mesh``, or mesh text such as ``"data=8"`` (built with
            :func:`~workbench.layout.mesh.build_mesh`, Explicit axes, over all local devices).
        data_axis: the mesh axis the batch is split over.

    Returns:
        ``NamedSharding(mesh, PartitionSpec(data_axis))``.

    Raises:
        MeshError: the mesh has no axis ``data_axis`` (the message lists its axes), or it is abstract.

    Example:
        >>> create_data_parallel_sharding(build_mesh("data=8")).spec
        P('data',)
    """
    concrete = _concrete_mesh(mesh)
    parse_mesh(concrete).axis_size(data_axis)  # MeshError naming the mesh's axes
    return NamedSharding(concrete, PartitionSpec(data_axis))


def _spec_for_rank(spec: PartitionSpec, rank: int) -> PartitionSpec:
    """The batch spec fitted to one leaf: cut to its rank, padded with None (0-D: replicated)."""
    entries = list(spec_entries(spec))[:rank]
    return PartitionSpec(*entries, *([None] * (rank - len(entries))))


def _check_leading_dim(path: str, shape: tuple[int, ...], spec: PartitionSpec,
                       mesh: Mesh | jax.sharding.AbstractMesh) -> None:
    """SpecError naming the leaf when its leading dimension does not split evenly over the data axes."""
    axes = entry_axes(spec_entries(spec)[0]) if shape and spec_entries(spec) else ()
    if not axes:
        return
    sizes = parse_mesh(mesh).axes
    parts = math.prod(sizes[a] for a in axes)
    size = shape[0]
    if size % parts == 0:
        return
    what = f"mesh axis {axes[0]!r} ({parts})" if len(axes) == 1 else f"mesh axes {axes} (product {parts})"
    up, down = -(-size // parts) * parts, size // parts * parts
    fix = f"pad the batch to {up} rows" + (f" or drop it to {down}" if down else "")
    raise SpecError(
        f"batch leaf {_leaf_name(path)} has leading dimension {size}, which {what} does not divide: "
        f"{fix} (a multiple of {parts})"
    )


def shard_batch(batch: Any, sharding: NamedSharding | Mesh | str, *, data_axis: str = DATA_AXIS) -> Any:
    """Put every array leaf of a batch on the mesh with its leading dimension over the data axis.

    NumPy arrays and JAX arrays are placed alike. Each leaf gets the sharding's spec cut (or padded
    with None) to its rank, so labels of shape ``(B,)`` and images of shape ``(B, H, W, C)`` share one
    sharding; 0-D leaves are replicated. Leaves that are not arrays (strings, Python numbers, objects)
    are returned unchanged, and the container structure is kept.

    Args:
        batch: a pytree (dict, tuple, dataclass, ...) of arrays.
        sharding: a ``NamedSharding`` (e.g. from :func:`create_data_parallel_sharding`), or a mesh (a
            ``Mesh`` or mesh text), split over ``data_axis``.
        data_axis: the axis used when ``sharding`` is a mesh.

    Returns:
        The batch with ``jax.Array`` leaves laid out on the mesh.

    Raises:
        SpecError: a leaf's leading dimension is not divisible by the data-axis size (the message names
            the leaf and says how to pad or drop rows), or another dimension does not fit the spec.

    Example:
        >>> import numpy as np
        >>> mesh = build_mesh("data=8")
        >>> out = shard_batch({"x": np.zeros((32, 4)), "name": "digits"}, mesh)
        >>> out["x"].sharding.spec, out["x"].addressable_shards[0].data.shape, out["name"]
        (P('data', None), (4, 4), 'digits')
    """
    if not isinstance(sharding, NamedSharding):
        if isinstance(sharding, jax.sharding.Sharding):
            raise SpecError(
                f"shard_batch needs a NamedSharding, got {type(sharding).__name__}: "
                "use create_data_parallel_sharding(mesh) or pass the mesh itself"
            )
        sharding = create_data_parallel_sharding(sharding, data_axis)
    mesh = sharding.mesh

    def place(keypath, leaf):
        if not is_array_like(leaf):
            return leaf
        path, shape = path_to_str(keypath), tuple(leaf.shape)
        spec = _spec_for_rank(sharding.spec, len(shape))
        _check_leading_dim(path, shape, spec, mesh)
        try:
            validate_spec(spec, mesh, shape)
        except SpecError as error:
            raise SpecError(f"batch leaf {_leaf_name(path)} (shape {shape}): {error}") from None
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(place, batch)


def shard_model_state(
    state: Any,
    mesh: Any,
    param_sharding: Any = "replicate",
    *,
    data_axis: str = DATA_AXIS,
    return_layout: bool = False,
) -> Any | tuple[Any, TreeLayout]:
    """Place every array leaf of a model or optimizer state on the mesh; nothing is dropped.

    The spec of each leaf is chosen by :func:`~workbench.layout.tree_layout.layout_tree` (which records the
    reason), then the leaf is placed with ``jax.device_put(leaf, NamedSharding(mesh, spec))``. The tree
    type is kept: an ``nnx.State`` stays an ``nnx.State``, so ``nnx.update(model, placed)`` works.
    Scalars (Adam's ``count``, the optimizer's ``step``) are placed replicated. Non-array leaves pass
    through unchanged.

    Args:
        state: a pytree of arrays, e.g. ``nnx.state(model)`` or ``nnx.state(optimizer)``.
        mesh: a concrete ``jax.sharding.Mesh`` or mesh text (built with
            :func:`~workbench.layout.mesh.build_mesh`).
        param_sharding: ``"replicate"`` (plain data parallelism); ``"shard"`` (each leaf's largest
            dimension divisible by ``data_axis`` is split over it, ZeRO style; scalars and leaves with no
            divisible dimension stay replicated and the layout says why); a
            :class:`~workbench.layout.rules.RuleTable` or list of ``(regex, spec)`` pairs; or a dict
            ``{path: spec}``. Anything else ``layout_tree`` accepts works too.
        data_axis: the axis the ``"shard"`` strategy splits over.
        return_layout: also return the :class:`~workbench.layout.tree_layout.TreeLayout` (spec and reason per leaf).

    Returns:
        The placed state, or ``(state, layout)`` with ``return_layout=True``.

    Raises:
        SpecError: a rule or path spec does not fit a leaf (the message names the leaf and the rule).
        MeshError: ``data_axis`` is not an axis of the mesh (``"shard"``).
        WorkbenchError: a leaf is abstract (``ShapeDtypeStruct``), or the strategy is unknown.

    Note:
        On a mesh with Explicit axes, a ``"shard"``-placed model may not run a forward pass as is: JAX
        refuses a matmul whose contracting dimension is sharded on both sides unless given an
        ``out_sharding`` (an MLP hits this). Use Auto axes there, or replicate.

    Example:
        >>> from flax import nnx
        >>> model = nnx.Linear(16, 3, rngs=nnx.Rngs(0))
        >>> state, layout = shard_model_state(nnx.state(model), build_mesh("data=8"), "shard",
        ...                                   return_layout=True)
        >>> layout.leaf("bias").reason
        "replicated: no dimension of (3,) is divisible by 'data' (8)"
        >>> nnx.update(model, state)
    """
    concrete = _concrete_mesh(mesh)
    layout = layout_tree(state, concrete, param_sharding, data_axis=data_axis)
    # layout_tree lists the array leaves in flattening order: walk the same order to pair them up.
    planned = iter(layout.leaves)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    placed = []
    for _keypath, leaf in flat:
        if not is_array_like(leaf):
            placed.append(leaf)
            continue
        leaf_layout = next(planned)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise WorkbenchError(
                f"leaf {leaf_layout.path!r} is abstract ({leaf.dtype}{list(leaf.shape)}, e.g. from "
                "nnx.eval_shape) and holds no values to place: create the real state first, or plan the "
                "abstract one with layout_tree(state, mesh, ...)"
            )
        placed.append(jax.device_put(leaf, NamedSharding(concrete, leaf_layout.layout.spec)))
    placed_state = jax.tree_util.tree_unflatten(treedef, placed)
    return (placed_state, layout) if return_layout else placed_state


def replicate_params(params: Any, mesh: Any) -> Any:
    """Every array leaf on every device of the mesh (``NamedSharding(mesh, P())``).

    Example:
        >>> params = replicate_params({"w": jnp.ones((4, 3))}, build_mesh("data=8"))
        >>> params["w"].sharding.is_fully_replicated
        True
    """
    return shard_model_state(params, mesh, "replicate")


# --- gradient collectives ----------------------------------------------------------------------


def _bound_axis_names() -> tuple[str, ...] | None:
    """Axis names bound where we are being traced (shard_map, pmap, vmap), or None if JAX hides them."""
    try:  # private, but the only list that includes vmap/pmap axes; guarded for other JAX versions
        from jax._src import core

        return tuple(str(name) for name in core.get_axis_env().axis_names())
    except Exception:  # noqa: BLE001 - a private API: any JAX that lacks it only loses the hint
        return None


def _mesh_axis_names() -> tuple[str, ...]:
    """The manual mesh axes of the enclosing shard_map (for error messages)."""
    try:
        return tuple(jax.sharding.get_abstract_mesh().manual_axes)
    except Exception:  # noqa: BLE001 - only for an error message: no mesh, no names
        return ()


def _unbound_axis_error(axis: str) -> GradientSyncError:
    bound = _bound_axis_names() or _mesh_axis_names()
    if bound:
        where = f"the bound axes here are {', '.join(repr(a) for a in bound)}: use one of them"
    else:
        where = (
            "no axis is bound here: call reduce_gradients inside jax.shard_map(...) or jax.pmap(..., "
            "axis_name=...), or jit a step with the batch sharded and the compiler averages for you"
        )
    return GradientSyncError(f"axis_name {axis!r} is not bound: {where}")


def _check_vma_enabled() -> bool | None:
    """Whether shard_map's varying-axes checking is on while tracing; None if this JAX hides it."""
    try:
        from jax._src import config

        return bool(config._check_vma.value)
    except Exception:  # noqa: BLE001 - a private flag: a JAX without it means "cannot say"
        return None


def varying_axes(value: Any) -> frozenset[str] | None:
    """The mesh axes a traced value (or a ``jax.eval_shape`` result) varies over inside ``shard_map``; None if this
    JAX cannot say.

    JAX 0.10 keeps them in ``jax.typeof(x).mat.varying``; older versions in ``.vma`` or
    ``.manual_axis_type.varying``.

    Example:
        >>> seen, mesh = [], build_mesh("data=8")  # what varying_axes says inside shard_map, on a "data" mesh:
        >>> x = jax.device_put(jnp.zeros(8), create_data_parallel_sharding(mesh))
        >>> _ = jax.shard_map(lambda x_shard: seen.append(varying_axes(x_shard)) or x_shard, mesh=mesh,
        ...                   in_specs=PartitionSpec("data"), out_specs=PartitionSpec("data"))(x)
        >>> seen
        [frozenset({'data'})]
    """
    try:
        aval = value if isinstance(value, jax.ShapeDtypeStruct) else jax.typeof(value)
    except Exception:  # noqa: BLE001 - a value JAX cannot type: "cannot say", as documented
        return None
    return type_varying_axes(aval)


def type_varying_axes(aval: Any) -> frozenset[str] | None:
    """:func:`varying_axes` of a type (a jaxpr variable's ``aval``); None if this JAX cannot say."""
    for getter in (
        lambda a: a.mat.varying,
        lambda a: a.vma,
        lambda a: a.manual_axis_type.varying,
    ):
        try:
            axes = getter(aval)
        except AttributeError:
            continue
        if axes is not None:
            return frozenset(axes)
    return None


def _check_not_already_summed(grads: Any, axes: tuple[str, ...]) -> None:
    """GradientSyncError if shard_map's vma checking says JAX already summed a gradient over ``axes``."""
    if not _check_vma_enabled():  # with check_vma=False (and under pmap) nothing is varying: no signal
        return
    for path, leaf in leaves_with_paths(grads):
        varying = varying_axes(leaf)
        if varying is None:
            return
        summed = [axis for axis in axes if axis not in varying]
        if not summed:
            continue
        axis = summed[0]
        try:
            count = f"{lax.axis_size(axis)}"
        except Exception:  # noqa: BLE001 - only for the message: an unknown size reads "N"
            count = "N"
        raise GradientSyncError(
            f"gradient {_leaf_name(path)} does not vary over axis {axis!r}: inside jax.shard_map with "
            f"check_vma=True, jax.grad with respect to replicated (unvarying) parameters already returns "
            f"the SUM over the {count} devices of {axis!r}, so pmean would leave {count} x the mean gradient. "
            f"Fix: lax.pcast(params, {axis!r}, to='varying') before jax.grad, then reduce_gradients; or take "
            f"jax.grad outside shard_map of a body that returns lax.pmean(loss, {axis!r}); or use check_vma=False"
        )


def reduce_gradients(grads: Any, reduction: str = "mean", axis_name: str | Sequence[str] = DATA_AXIS) -> Any:
    """Average (or sum) gradients across devices, element-wise; for use inside shard_map or pmap.

    Every leaf keeps its shape: ``lax.pmean``/``lax.psum`` over ``axis_name``. Inside
    ``jax.shard_map(..., check_vma=True)`` the gradients must vary over the axis (take ``jax.grad``
    with respect to ``lax.pcast(params, axis_name, to="varying")``); gradients of replicated
    parameters are already summed by JAX and are refused instead of being silently wrong by N×.

    Args:
        grads: a pytree of per-device gradients (e.g. from ``jax.grad`` or ``nnx.grad``).
        reduction: ``"mean"`` (the full-batch gradient of a mean loss over equal shards) or ``"sum"``.
        axis_name: the mapped axis to reduce over (or a tuple of axes).

    Returns:
        The reduced gradients, same structure and shapes, identical on every device.

    Raises:
        GradientSyncError: ``reduction`` is unknown; ``axis_name`` is not bound here (outside
            shard_map/pmap, or not an axis of the mesh); or a gradient does not vary over the axis
            (the N× trap), with the three ways to fix it.

    Example:
        >>> from jax.sharding import PartitionSpec as P
        >>> mesh, params = build_mesh("data=8"), {"w": jnp.ones(4)}
        >>> batch = jax.device_put(jnp.arange(32.0).reshape(8, 4), create_data_parallel_sharding(mesh))
        >>> def loss_fn(params, batch_shard):
        ...     return jnp.mean(batch_shard @ params["w"])
        >>> def local_step(params, batch_shard):
        ...     params = lax.pcast(params, "data", to="varying")  # per-device gradients, not pre-summed
        ...     grads = jax.grad(loss_fn)(params, batch_shard)
        ...     return reduce_gradients(grads, "mean", "data")
        >>> step = jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
        >>> grads = step(params, batch)
        >>> grads["w"]  # the full batch's gradient: each column's mean
        Array([14., 15., 16., 17.], dtype=float32)
    """
    if reduction not in REDUCTIONS:
        raise GradientSyncError(
            f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}: use 'mean' for the "
            "gradient of a mean loss, 'sum' for a summed loss"
        )
    axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    bound = _bound_axis_names()
    if bound is not None:
        for axis in axes:
            if axis not in bound:
                # Checked first: inside shard_map JAX fails on an unknown axis with a bare AssertionError.
                raise _unbound_axis_error(axis)
    _check_not_already_summed(grads, axes)
    collective = lax.pmean if reduction == "mean" else lax.psum
    try:
        return jax.tree_util.tree_map(lambda g: collective(g, axes), grads)
    except NameError:  # "unbound axis name", when the bound axes could not be listed beforehand
        raise _unbound_axis_error(axes[0]) from None


def _tree_mismatch(reference: Any, other: Any, index: int) -> str | None:
    """What differs between gradient tree 0 and tree ``index`` (structure, then shapes), or None."""
    ref_leaves, other_leaves = leaves_with_paths(reference), leaves_with_paths(other)
    ref_paths, other_paths = [p for p, _ in ref_leaves], [p for p, _ in other_leaves]
    if ref_paths != other_paths:
        missing = [p for p in ref_paths if p not in other_paths]
        extra = [p for p in other_paths if p not in ref_paths]
        parts = ([f"missing {missing[:3]}"] if missing else []) + ([f"extra {extra[:3]}"] if extra else [])
        return f"gradient tree {index} has different leaves from tree 0 ({'; '.join(parts) or 'another order'})"
    if jax.tree_util.tree_structure(reference) != jax.tree_util.tree_structure(other):
        return f"gradient tree {index} has the same leaf paths as tree 0 but different container types"
    for (path, a), (_, b) in zip(ref_leaves, other_leaves, strict=True):
        if jnp.shape(a) != jnp.shape(b):
            return (
                f"leaf {_leaf_name(path)} has shape {jnp.shape(a)} in tree 0 but {jnp.shape(b)} in tree "
                f"{index}: each tree must hold full-shape gradients (one per data shard), not pieces of one"
            )
    return None


def mean_of_gradient_trees(trees: Sequence[Any]) -> Any:
    """The element-wise average of per-shard gradient trees: what ``pmean`` computes, on the host.

    For a mean loss and equal-sized shards this equals the gradient of the whole batch.

    Args:
        trees: one gradient pytree per data shard, all with the same structure and leaf shapes.

    Returns:
        One tree of the same structure and shapes.

    Raises:
        GradientSyncError: no trees, or trees whose structure or shapes differ (the message names the
            tree and the leaf).

    Example:
        >>> mean_of_gradient_trees([{"w": jnp.ones(2)}, {"w": jnp.zeros(2)}])["w"]
        Array([0.5, 0.5], dtype=float32)
    """
    trees = list(trees)
    if not trees:
        raise GradientSyncError("no gradient trees to average: pass a list with one gradient tree per data shard")
    for index, tree in enumerate(trees[1:], start=1):
        mismatch = _tree_mismatch(trees[0], tree, index)
        if mismatch:
            raise GradientSyncError(mismatch)
    return jax.tree_util.tree_map(lambda *leaves: jnp.mean(jnp.stack(leaves), axis=0), *trees)
