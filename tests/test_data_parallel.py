"""Data parallelism on 8 simulated CPU devices: real placements, real collectives, single-device references.

Every gradient test compares against ``jax.grad`` of the full-batch loss on one device. The N× trap is
measured, not assumed: a plain ``lax.pmean`` after ``jax.grad`` of replicated params inside shard_map
really gives 8× here, and ``reduce_gradients`` refuses it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.training.data_parallel import (
    create_data_parallel_sharding,
    mean_of_gradient_trees,
    reduce_gradients,
    replicate_params,
    shard_batch,
    shard_model_state,
    varying_axes,
)
from workbench.errors import GradientSyncError, MeshError, SpecError, WorkbenchError
from workbench.layout.mesh import abstract_mesh, build_mesh
from workbench.layout.paths import leaves_with_paths
from workbench.layout.rules import RuleTable

DEVICES = 8
BATCH = 32
AXIS_TYPES = ("explicit", "auto")
# float32 sums taken in a different order (per-shard then across devices) differ in the last bits.
RTOL, ATOL = 1e-6, 1e-7


@pytest.fixture(scope="module", params=AXIS_TYPES)
def mesh(request):
    return build_mesh(f"data={DEVICES}", axis_types=request.param)


@pytest.fixture(scope="module")
def auto_mesh():
    return build_mesh(f"data={DEVICES}", axis_types="auto")


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(4, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def make_model() -> MLP:
    return MLP(nnx.Rngs(0))


def make_batch(rows: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(rows, 4)).astype(np.float32), rng.normal(size=(rows, 3)).astype(np.float32)


def forward(model, x):
    return model(x)


# --- single-device reference ----------------------------------------------------------------------

GRAPHDEF, PARAMS = nnx.split(make_model(), nnx.Param)


def mse(params, x, y):
    """Mean loss over the rows it is given: the mean of equal-sized shard means is the full mean."""
    return jnp.mean((nnx.merge(GRAPHDEF, params)(x) - y) ** 2)


X, Y = make_batch()
REFERENCE_GRADS = jax.grad(mse)(PARAMS, X, Y)


def assert_trees_close(actual, expected, scale: float = 1.0):
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for (path, a), (_, e) in zip(leaves_with_paths(actual), leaves_with_paths(expected), strict=True):
        assert np.shape(a) == np.shape(e), path
        np.testing.assert_allclose(np.asarray(a), scale * np.asarray(e), rtol=RTOL, atol=ATOL * scale, err_msg=path)


def ratio_to_reference(grads) -> float:
    """The one factor by which ``grads`` differ from the reference (checked to be the same everywhere)."""
    a, e = np.asarray(grads["l1"]["kernel"][...]), np.asarray(REFERENCE_GRADS["l1"]["kernel"][...])
    ratio = float(np.median(a / e))
    np.testing.assert_allclose(a, ratio * e, rtol=1e-5, atol=1e-6)
    return ratio


def data_parallel_grads(mesh, body, *, check_vma=True):
    """Run ``body(params, x, y)`` per device with the batch split over 'data' and params replicated.

    Inputs are placed exactly as in_specs say, which an Explicit mesh requires (it will not reshard).
    """
    step = jax.shard_map(
        body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(), check_vma=check_vma
    )
    batch = shard_batch((X, Y), mesh)
    return jax.jit(step)(replicate_params(PARAMS, mesh), *batch)


def local_grads_of_cast_params(params, x, y):
    """The fix: params cast to varying, so jax.grad gives this device's own gradient."""
    return jax.grad(mse)(lax.pcast(params, "data", to="varying"), x, y)


# --- create_data_parallel_sharding ---------------------------------------------------------------


def test_data_parallel_sharding_splits_the_leading_dimension(mesh):
    sharding = create_data_parallel_sharding(mesh)
    assert isinstance(sharding, NamedSharding)
    assert sharding.mesh is mesh
    assert sharding.spec == P("data")
    assert sharding.shard_shape((BATCH, 5)) == (BATCH // DEVICES, 5)


def test_data_parallel_sharding_builds_mesh_text():
    sharding = create_data_parallel_sharding("data=4,model=2")
    assert dict(sharding.mesh.shape) == {"data": 4, "model": 2}
    assert sharding.spec == P("data")


def test_data_parallel_sharding_unknown_axis_names_the_mesh_axes(mesh):
    with pytest.raises(MeshError, match=r"no axis 'batch'.*its axes are data"):
        create_data_parallel_sharding(mesh, "batch")


def test_data_parallel_sharding_refuses_an_abstract_mesh():
    with pytest.raises(MeshError, match=r"abstract .*build_mesh"):
        create_data_parallel_sharding(abstract_mesh("data=8"))


# --- shard_batch -----------------------------------------------------------------------------------


def test_shard_batch_places_numpy_and_jax_leaves_on_all_devices(mesh):
    images = np.arange(BATCH * 2 * 2, dtype=np.float32).reshape(BATCH, 2, 2)
    batch = {"x": X, "y": jnp.asarray(Y), "images": images, "labels": jnp.arange(BATCH), "scale": np.float32(2)}
    placed = shard_batch(batch, create_data_parallel_sharding(mesh))

    expected_specs = {"x": P("data", None), "y": P("data", None), "images": P("data", None, None),
                      "labels": P("data"), "scale": P()}
    for name, spec in expected_specs.items():
        leaf = placed[name]
        assert isinstance(leaf, jax.Array), name
        assert leaf.sharding.spec == spec, name
        assert leaf.sharding.mesh is mesh
        shards = leaf.addressable_shards
        assert {shard.device for shard in shards} == set(jax.devices())
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(batch[name]))
        for shard in shards:
            if spec == P():
                assert shard.data.shape == ()
                continue
            assert shard.data.shape == (BATCH // DEVICES, *np.shape(batch[name])[1:])
            # Each device holds its own contiguous block of rows.
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(batch[name])[shard.index])


def test_shard_batch_passes_non_array_leaves_through(mesh):
    marker = object()
    batch = {"x": X, "name": "digits", "missing": None, "epoch": 3, "rate": 0.5, "thing": marker}
    placed = shard_batch(batch, mesh)
    assert placed["x"].sharding.spec == P("data", None)
    assert placed["name"] == "digits" and placed["missing"] is None
    assert placed["epoch"] == 3 and placed["rate"] == 0.5 and placed["thing"] is marker


def test_shard_batch_accepts_a_mesh_and_keeps_the_container(mesh):
    placed = shard_batch((X, [Y]), mesh)
    assert isinstance(placed, tuple) and isinstance(placed[1], list)
    assert placed[0].sharding.spec == P("data", None)
    assert placed[1][0].sharding.spec == P("data", None)


def test_shard_batch_indivisible_leading_dim_names_the_leaf(mesh):
    with pytest.raises(SpecError) as error:
        shard_batch({"x": np.zeros((30, 4)), "y": np.zeros((32,))}, mesh)
    message = str(error.value)
    assert "'x'" in message and "30" in message and "'data' (8)" in message
    assert "pad the batch to 32" in message and "drop it to 24" in message


def test_shard_batch_smaller_than_the_axis_suggests_padding_only(mesh):
    with pytest.raises(SpecError, match=r"leading dimension 5,.*pad the batch to 8 rows \(a multiple of 8\)") as error:
        shard_batch({"x": np.zeros((5,))}, mesh)
    assert "drop" not in str(error.value)


@settings(max_examples=25, deadline=None)
@given(rows_per_device=st.integers(1, 3), trailing=st.lists(st.integers(1, 3), max_size=2))
def test_shard_batch_matches_jax_device_indices(rows_per_device, trailing):
    mesh = build_mesh(f"data={DEVICES}")
    shape = (rows_per_device * DEVICES, *trailing)
    leaf = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    placed = shard_batch(leaf, mesh)
    expected = placed.sharding.devices_indices_map(shape)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), leaf[expected[shard.device]])


# --- shard_model_state ---------------------------------------------------------------------------

RULES = RuleTable([(r"l1/kernel$", "None, data"), (r"l2/kernel$", "data, None"), (r".*", "")])


def check_state_placed(original, placed, layout, mesh):
    """Every leaf still there, same values, placed as the layout says."""
    assert type(placed) is type(original)
    before, after = leaves_with_paths(original), leaves_with_paths(placed)
    assert [p for p, _ in after] == [p for p, _ in before]
    assert set(layout.specs) == {p for p, _ in before}
    for (path, old), (_, new) in zip(before, after, strict=True):
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old), err_msg=path)
        assert new.dtype == old.dtype, path
        assert new.sharding == NamedSharding(mesh, layout.specs[path]), path
        assert {shard.device for shard in new.addressable_shards} == set(jax.devices()), path


@pytest.mark.parametrize("strategy", ["replicate", "shard", RULES], ids=["replicate", "shard", "rules"])
def test_shard_model_state_places_a_real_nnx_model(mesh, strategy):
    model = make_model()
    expected = forward(model, X)
    state = nnx.state(model)
    placed, layout = shard_model_state(state, mesh, strategy, return_layout=True)
    check_state_placed(state, placed, layout, mesh)

    if strategy == "shard":
        assert layout.specs["l1/kernel"] == P(None, "data")
        assert layout.specs["l2/kernel"] == P("data", None)
        assert layout.leaf("l2/bias").reason == "replicated: no dimension of (3,) is divisible by 'data' (8)"
        assert placed["l2"]["bias"][...].sharding.is_fully_replicated
    if strategy is RULES:
        assert layout.leaf("l1/kernel").rule == 0 and layout.leaf("l1/bias").rule == 2

    nnx.update(model, placed)
    assert model.l1.kernel[...].sharding.spec == layout.specs["l1/kernel"]
    # An Explicit mesh refuses matmuls whose contracting dimension is sharded on both sides (JAX asks
    # for out_sharding), so a sharded model runs its forward pass on Auto axes only.
    explicit = mesh.axis_types[0] == jax.sharding.AxisType.Explicit
    if strategy == "replicate" or not explicit:
        np.testing.assert_allclose(np.asarray(nnx.jit(forward)(model, X)), np.asarray(expected), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("strategy", ["replicate", "shard"])
def test_shard_model_state_keeps_every_adam_leaf(mesh, strategy):
    model = make_model()
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    state = nnx.state(optimizer)
    placed, layout = shard_model_state(state, mesh, strategy, return_layout=True)
    check_state_placed(state, placed, layout, mesh)

    paths = set(layout.specs)
    assert {"step", "opt_state/0/count"} <= paths
    assert {f"opt_state/0/{moment}/l1/kernel" for moment in ("mu", "nu")} <= paths
    for scalar in ("step", "opt_state/0/count"):
        assert layout.leaf(scalar).layout.is_fully_replicated
        if strategy == "shard":
            assert layout.leaf(scalar).reason == "replicated: scalar"
    if strategy == "shard":  # the moments follow their parameters
        assert layout.specs["opt_state/0/mu/l1/kernel"] == P(None, "data")

    nnx.update(optimizer, placed)
    assert optimizer.opt_state[0].mu["l1"]["kernel"][...].sharding.spec == layout.specs["opt_state/0/mu/l1/kernel"]
    assert int(optimizer.step[...]) == 0


def test_jit_with_sharded_batch_and_replicated_state_matches_one_device(auto_mesh):
    """The compiler's data parallelism: one Adam step equals the single-device step."""

    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    def run(place: bool):
        model = make_model()
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        batch = (X, Y)
        if place:
            nnx.update(model, shard_model_state(nnx.state(model), auto_mesh))
            nnx.update(optimizer, shard_model_state(nnx.state(optimizer), auto_mesh))
            batch = shard_batch(batch, auto_mesh)
        loss = nnx.jit(train_step)(model, optimizer, *batch)
        return float(loss), nnx.state(model), int(optimizer.step[...])

    loss, state, step = run(place=True)
    reference_loss, reference_state, _ = run(place=False)
    assert step == 1
    np.testing.assert_allclose(loss, reference_loss, rtol=RTOL)
    assert_trees_close(state, reference_state)


def test_shard_model_state_accepts_a_path_dict_and_reports_misfits(mesh):
    state = nnx.state(make_model())
    placed, layout = shard_model_state(state, mesh, {"l1/bias": "data"}, return_layout=True)
    assert placed["l1"]["bias"][...].sharding.spec == P("data")
    assert layout.leaf("l2/kernel").reason == "replicated: path not in the spec dict"
    with pytest.raises(SpecError, match=r"leaf 'l2/bias' .*not divisible"):
        shard_model_state(state, mesh, {"l2/bias": "data"})


def test_shard_model_state_without_layout_returns_the_state_only(mesh):
    placed = shard_model_state({"w": np.ones((8, 2), np.float32), "tag": "mlp"}, mesh, "shard")
    assert placed["w"].sharding.spec == P("data", None) and placed["tag"] == "mlp"


def test_shard_model_state_refuses_abstract_leaves(mesh):
    abstract = nnx.state(nnx.eval_shape(make_model))
    with pytest.raises(WorkbenchError, match=r"leaf 'l1/bias' is abstract .*layout_tree"):
        shard_model_state(abstract, mesh)


def test_replicate_params_puts_every_leaf_everywhere(mesh):
    params = replicate_params({"w": np.ones((4, 3), np.float32), "b": jnp.zeros(3), "step": jnp.int32(7)}, mesh)
    for name, leaf in params.items():
        assert leaf.sharding == NamedSharding(mesh, P()), name
        assert len(leaf.addressable_shards) == DEVICES
        assert all(shard.data.shape == leaf.shape for shard in leaf.addressable_shards)
    assert int(params["step"]) == 7


# --- reduce_gradients inside shard_map ----------------------------------------------------------


def test_the_n_times_trap_is_real(mesh):
    """What reduce_gradients guards against: grad of replicated params is already summed over devices."""
    plain_pmean = data_parallel_grads(mesh, lambda p, x, y: lax.pmean(jax.grad(mse)(p, x, y), "data"))
    plain_psum = data_parallel_grads(mesh, lambda p, x, y: lax.psum(jax.grad(mse)(p, x, y), "data"))
    assert ratio_to_reference(plain_pmean) == pytest.approx(DEVICES, rel=1e-6)
    assert ratio_to_reference(plain_psum) == pytest.approx(DEVICES**2, rel=1e-6)


def test_reduce_gradients_refuses_the_n_times_trap(mesh):
    with pytest.raises(GradientSyncError) as error:
        data_parallel_grads(mesh, lambda p, x, y: reduce_gradients(jax.grad(mse)(p, x, y)))
    message = str(error.value)
    assert "'data'" in message and "already returns the SUM" in message and "8 x the mean" in message
    assert "lax.pcast" in message and "check_vma=False" in message


@pytest.mark.parametrize("reduction, scale", [("mean", 1.0), ("sum", float(DEVICES))])
def test_reduce_gradients_of_cast_params_match_the_full_batch_gradient(mesh, reduction, scale):
    def body(params, x, y):
        grads = local_grads_of_cast_params(params, x, y)
        assert varying_axes(grads["l1"]["kernel"][...]) == {"data"}
        reduced = reduce_gradients(grads, reduction, "data")
        assert jax.tree_util.tree_map(jnp.shape, reduced) == jax.tree_util.tree_map(jnp.shape, grads)
        return reduced

    grads = data_parallel_grads(mesh, body)
    assert_trees_close(grads, REFERENCE_GRADS, scale=scale)


def test_reduce_gradients_with_check_vma_off_is_exact(mesh):
    grads = data_parallel_grads(mesh, lambda p, x, y: reduce_gradients(jax.grad(mse)(p, x, y)), check_vma=False)
    assert ratio_to_reference(grads) == pytest.approx(1.0, rel=1e-6)
    assert_trees_close(grads, REFERENCE_GRADS)


def test_grad_outside_shard_map_of_pmean_loss_is_exact(mesh):
    """The other fix: differentiate a shard_map whose body returns the averaged loss."""
    loss = jax.shard_map(
        lambda p, x, y: lax.pmean(mse(p, x, y), "data"),
        mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(),
    )
    with jax.set_mesh(mesh):  # an Explicit mesh needs it to place the cotangents
        grads = jax.jit(jax.grad(loss))(replicate_params(PARAMS, mesh), *shard_batch((X, Y), mesh))
    assert ratio_to_reference(grads) == pytest.approx(1.0, rel=1e-6)


def test_reduce_gradients_under_pmap_matches_the_reference():
    def body(params, x, y):
        return reduce_gradients(jax.grad(mse)(params, x, y), "mean", "data")

    per_device = jax.pmap(body, axis_name="data", in_axes=(None, 0, 0))(
        PARAMS, X.reshape(DEVICES, -1, 4), Y.reshape(DEVICES, -1, 3)
    )
    for device in range(DEVICES):
        assert_trees_close(jax.tree_util.tree_map(lambda g, device=device: g[device], per_device), REFERENCE_GRADS)


def test_reduce_gradients_rejects_an_unknown_reduction(mesh):
    with pytest.raises(GradientSyncError, match=r"reduction 'max' is not one of mean, sum"):
        data_parallel_grads(mesh, lambda p, x, y: reduce_gradients(local_grads_of_cast_params(p, x, y), "max"))
    assert issubclass(GradientSyncError, ValueError)


def test_reduce_gradients_names_an_unbound_axis_and_the_bound_ones(mesh):
    # Bare JAX fails here with an empty AssertionError.
    with pytest.raises(GradientSyncError, match=r"axis_name 'batch' is not bound: the bound axes here are 'data'"):
        data_parallel_grads(
            mesh, lambda p, x, y: reduce_gradients(local_grads_of_cast_params(p, x, y), "mean", "batch")
        )


def test_reduce_gradients_outside_any_map_says_where_to_call_it():
    with pytest.raises(GradientSyncError, match=r"'data' is not bound: no axis is bound here.*shard_map"):
        reduce_gradients(REFERENCE_GRADS)
    with pytest.raises(GradientSyncError, match=r"'data' is not bound"):
        jax.jit(reduce_gradients)(REFERENCE_GRADS)


# --- mean_of_gradient_trees ------------------------------------------------------------------------


def per_shard_grads() -> list:
    rows = BATCH // DEVICES
    return [jax.grad(mse)(PARAMS, X[i * rows:(i + 1) * rows], Y[i * rows:(i + 1) * rows]) for i in range(DEVICES)]


def test_mean_of_gradient_trees_is_the_full_batch_gradient_and_pmeans_result(mesh):
    mean = mean_of_gradient_trees(per_shard_grads())
    assert type(mean) is type(REFERENCE_GRADS)
    assert_trees_close(mean, REFERENCE_GRADS)
    pmean_result = data_parallel_grads(mesh, lambda p, x, y: reduce_gradients(local_grads_of_cast_params(p, x, y)))
    assert_trees_close(mean, pmean_result)


def test_mean_of_gradient_trees_rejects_empty_and_mismatched_trees():
    grads = per_shard_grads()[:2]
    with pytest.raises(GradientSyncError, match=r"no gradient trees"):
        mean_of_gradient_trees([])
    with pytest.raises(GradientSyncError, match=r"tree 1 has different leaves .*missing \['l2/bias'\]"):
        mean_of_gradient_trees([{"l1": {"kernel": 1.0}, "l2": {"bias": 1.0}}, {"l1": {"kernel": 1.0}}])
    sliced = jax.tree_util.tree_map(lambda g: g[:1], grads[1])
    with pytest.raises(GradientSyncError, match=r"leaf 'l1/bias' has shape \(16,\) in tree 0 but \(1,\) in tree 1"):
        mean_of_gradient_trees([grads[0], sliced])
