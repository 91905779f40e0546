"""The layout engine equals JAX's own NamedSharding maths, on random meshes, specs and shapes."""

import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

import workbench as wb

AXIS_NAMES = ("data", "model", "expert")


def _factorisations(n, parts):
    """Every ordered way to write n as a product of `parts` factors >= 1."""
    if parts == 1:
        return [(n,)]
    return [(f,) + rest for f in range(1, n + 1) if n % f == 0 for rest in _factorisations(n // f, parts - 1)]


@st.composite
def mesh_spec_shape(draw, max_devices=8, concrete=True):
    devices = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= max_devices])) if concrete else draw(
        st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 64, 256, 1024])
    )
    n_axes = draw(st.integers(1, 3))
    sizes = draw(st.sampled_from(_factorisations(devices, n_axes)))
    names = AXIS_NAMES[:n_axes]
    ndim = draw(st.integers(0, 4))
    unused = list(names)
    entries, shape = [], []
    for _ in range(ndim):
        choice = draw(st.integers(0, 2))
        axes = []
        if choice and unused:
            count = draw(st.integers(1, min(choice, len(unused))))
            axes = draw(st.permutations(unused))[:count]
            for axis in axes:
                unused.remove(axis)
        parts = math.prod(sizes[names.index(a)] for a in axes)
        shape.append(parts * draw(st.integers(1, 3)))
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    # A spec may be shorter than the array: trailing dimensions are then unsharded.
    keep = draw(st.integers(0, ndim))
    if any(e is not None for e in entries[keep:]):
        keep = ndim
    spec = PartitionSpec(*entries[:keep])
    order = draw(st.permutations(range(devices)))
    return wb.MeshShape(names, sizes), spec, tuple(shape), order


def _jax_index(index, shape):
    """JAX's tuple of slices as [start, stop) pairs."""
    return tuple((s.start or 0, size if s.stop is None else s.stop) for s, size in zip(index, shape, strict=True))


@settings(max_examples=150, deadline=None)
@given(mesh_spec_shape())
def test_layout_equals_devices_indices_map(case):
    mesh_shape, spec, shape, order = case
    devices = [jax.devices()[i] for i in order]
    mesh = wb.build_mesh(mesh_shape, devices=devices)
    layout = wb.layout_array(shape, mesh, spec)
    sharding = NamedSharding(mesh, spec)

    expected = {d.id: _jax_index(idx, shape) for d, idx in sharding.devices_indices_map(shape).items()}
    assert {d.device_id: d.index for d in layout.devices} == expected
    assert layout.shard_shape == tuple(sharding.shard_shape(shape))
    copies = {}
    for index in expected.values():
        copies[index] = copies.get(index, 0) + 1
    assert set(copies.values()) == {layout.replication}
    assert layout.is_fully_replicated == sharding.is_fully_replicated
    assert layout.bytes_per_device == math.prod(layout.shard_shape) * 4
    # Every device's mesh coordinates are its position in the device grid.
    for device in layout.devices:
        position = tuple(device.coords[n] for n in mesh_shape.names)
        assert mesh.devices[position].id == device.device_id
    # One device asked alone (no list of every device built) gives JAX's slice too, by position and by id.
    alone = wb.layout_array(shape, mesh, spec)
    assert {alone.device_slice(p).device_id: alone.device_slice(p).index for p in range(mesh_shape.size)} == expected
    assert {i: alone.slice_of_device(i).index for i in expected} == expected


@settings(max_examples=150, deadline=None)
@given(mesh_spec_shape(concrete=False))
def test_abstract_layout_tiles_the_array_exactly(case):
    """On abstract meshes (up to 1,024 devices) every element is held by exactly `replication` devices."""
    mesh_shape, spec, shape, _ = case
    layout = wb.layout_array(shape, mesh_shape, spec, dtype="bfloat16")
    abstract = wb.layout.abstract_mesh(mesh_shape)
    assert layout.shard_shape == tuple(NamedSharding(abstract, spec).shard_shape(shape))
    holders = layout.holders()
    assert all(len(ids) == layout.replication for ids in holders.values())
    assert len(holders) * layout.replication == mesh_shape.size
    # Distinct blocks are disjoint and their sizes add up to the whole array.
    assert len(holders) * math.prod(layout.shard_shape) == math.prod(shape)
    for index in holders:
        assert all(0 <= start < stop <= size or size == 0 for (start, stop), size in zip(index, shape, strict=True))
    assert layout.bytes_per_device == math.prod(layout.shard_shape) * 2
    assert layout.device_ids == tuple(range(mesh_shape.size))


@settings(max_examples=150, deadline=None)
@given(mesh_spec_shape(concrete=False), st.sampled_from(["float32", "bfloat16", "int8", "int4"]))
def test_per_leaf_figures_equal_the_per_device_computation(case, dtype):
    """Shard shape, bytes and replication are worked out once per leaf (no per-device list); each equals what
    the devices' own slices say, and each device's slice computed alone equals the all-devices computation."""
    mesh_shape, spec, shape, _ = case
    tree = wb.layout_tree({"w": jax.ShapeDtypeStruct(shape, dtype)}, wb.layout.abstract_mesh(mesh_shape), {"w": spec})
    leaf = tree.leaf("w").layout
    every = wb.layout_array(shape, mesh_shape, spec, dtype=dtype).devices  # vectorised over all devices
    bits = np.dtype(jax.numpy.dtype(dtype)).itemsize * 8 if dtype != "int4" else 4
    for position, device in enumerate(every):
        alone = leaf.device_slice(position)
        assert alone == device == leaf.slice_of_device(device.device_id)
        block = tuple(stop - start for start, stop in alone.index)
        assert block == leaf.shard_shape
        assert -(-math.prod(block) * bits // 8) == leaf.bytes_per_device
    copies = {}
    for device in every:
        copies[device.index] = copies.get(device.index, 0) + 1
    assert set(copies.values()) == {leaf.replication}
    assert leaf.device_ids == tuple(d.device_id for d in every) == tuple(range(mesh_shape.size))
    assert tree.per_device_bytes == {d.device_id: leaf.bytes_per_device for d in every}


def test_real_arrays_are_described_as_placed():
    mesh = wb.build_mesh("data=4,model=2")
    x = jax.device_put(np.zeros((8, 6), np.float32), NamedSharding(mesh, PartitionSpec("data", "model")))
    layout = wb.layout_array(x, None)
    for shard in x.addressable_shards:
        mine = layout.slice_of_device(shard.device.id)
        assert mine.index == _jax_index(shard.index, x.shape)
        assert tuple(shard.data.shape) == layout.shard_shape


def test_large_abstract_mesh_known_answer():
    layout = wb.layout_array((4096, 1024), "data=64,model=16", "data, model", dtype="bfloat16")
    assert layout.shard_shape == (64, 64)
    assert layout.bytes_per_device == 64 * 64 * 2
    assert layout.replication == 1
    last = layout.device_slice(1023)
    assert last.coords == {"data": 63, "model": 15}
    assert last.index == ((4032, 4096), (960, 1024))
    replicated = wb.layout_array((10,), "data=32,model=32", "")
    assert replicated.replication == 1024 and replicated.shard_shape == (10,)
