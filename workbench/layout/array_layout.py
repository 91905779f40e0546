"""The layout engine: which device holds which slice of an array, how many bytes, how many copies.

:func:`layout_array` answers for one array (or just a shape and dtype) on a mesh, concrete or abstract,
without allocating anything. The answer is an :class:`ArrayLayout`, a plain record every view (text,
JSON, plotly, widgets) draws from. It equals JAX's own ``NamedSharding.devices_indices_map`` on
concrete meshes (the property tests prove it) and works the same on meshes of any size.

The maths: a device at mesh coordinates ``c`` holds, on dimension ``d`` sharded over axes
``(a1, ..., ak)``, block number ``mixed_radix(c[a1], ..., c[ak])`` of ``prod(size(ai))`` equal blocks
(``a1`` major). Unsharded dimensions are held whole. Devices that differ only on axes the spec does not
use hold the same slice: that count is the replication factor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import numpy as np
from jax.sharding import PartitionSpec

from .mesh import MeshShape, is_concrete, parse_mesh
from .shapes import itemsize_bits, parse_dtype, parse_shape
from .specs import entry_axes, format_spec, spec_entries, spec_to_json, validate_spec

Interval = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class DeviceSlice:
    """One device's part of an array: ``index`` holds ``[start, stop)`` per dimension."""

    position: int  # row-major position in the mesh
    device_id: int  # the JAX device id on a concrete mesh; the position on an abstract one
    coords: dict[str, int]
    index: tuple[Interval, ...]

    def to_json(self) -> dict:
        return {"id": self.device_id, "coords": dict(self.coords), "index": [list(i) for i in self.index]}


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayLayout:
    """Where an array lives on a mesh. Build it with :func:`layout_array`.

    Attributes:
        shape, dtype: the global array.
        mesh: the mesh's axis names and sizes.
        spec: the validated partition spec.
        shard_shape: the shape every device holds.
        bytes_per_device: bytes of one shard.
        replication: how many devices hold each shard (1 = fully sharded).
        device_ids: JAX device id per mesh position (row-major); positions on abstract meshes.
        concrete: whether the mesh had real devices.
    """

    shape: tuple[int, ...]
    dtype: str
    mesh: MeshShape
    spec: PartitionSpec
    shard_shape: tuple[int, ...]
    bytes_per_device: int
    replication: int
    device_ids: tuple[int, ...]
    concrete: bool

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole (global) array, held once."""
        return _nbytes(self.shape, self.dtype)

    @property
    def stored_bytes(self) -> int:
        """Bytes stored over all devices, counting every copy."""
        return self.bytes_per_device * self.num_devices

    @property
    def shards_per_dim(self) -> tuple[int, ...]:
        """How many blocks each dimension is cut into."""
        return tuple(size // shard if shard else 1 for size, shard in zip(self.shape, self.shard_shape, strict=True))

    @property
    def is_fully_replicated(self) -> bool:
        return self.replication == self.num_devices

    def _starts_at(self, coords: np.ndarray) -> np.ndarray:
        """(n, ndim) start index of the block held at each row of ``coords`` ((n, axes) mesh coordinates)."""
        starts = np.zeros((len(coords), len(self.shape)), dtype=np.int64)
        for dim, entry in enumerate(spec_entries(self.spec)):
            block = np.zeros(len(coords), dtype=np.int64)
            for axis in entry_axes(entry):  # mixed radix, first axis major
                k = self.mesh.names.index(axis)
                block = block * self.mesh.sizes[k] + coords[:, k]
            starts[:, dim] = block * self.shard_shape[dim]
        return starts

    @functools.cached_property
    def _starts(self) -> np.ndarray:
        """(devices, ndim) start index of every device's block: vectorised for meshes of any size."""
        return self._starts_at(_mesh_coords(self.mesh))

    def device_slice(self, position: int) -> DeviceSlice:
        """The slice held by the device at a mesh position (row-major).

        One device's slice is computed for it alone (unless every device's is known already), so asking
        it of every leaf of a model on 16,384 devices stays cheap.
        """
        coords = np.unravel_index(position, self.mesh.sizes)
        known = self.__dict__.get("_starts")
        starts = known[position] if known is not None else self._starts_at(np.array([coords], dtype=np.int64))[0]
        return DeviceSlice(
            position=position,
            device_id=self.device_ids[position],
            coords={n: int(c) for n, c in zip(self.mesh.names, coords, strict=True)},
            index=tuple((int(s), int(s) + n) for s, n in zip(starts, self.shard_shape, strict=True)),
        )

    @functools.cached_property
    def devices(self) -> tuple[DeviceSlice, ...]:
        """Every device's slice, in mesh order (built on first use, for this leaf only)."""
        _ = self._starts  # every device at once, vectorised, before the per-device records
        return tuple(self.device_slice(p) for p in range(self.num_devices))

    def slice_of_device(self, device_id: int) -> DeviceSlice:
        """The slice held by the device with this id."""
        try:
            return self.device_slice(self._position_of(device_id))
        except KeyError:
            raise KeyError(f"device {device_id} is not in mesh {self.mesh}") from None

    def _position_of(self, device_id: int) -> int:
        """Where a device id sits in the mesh: a lookup on real meshes, the id itself on abstract ones."""
        if self.concrete:
            return _positions_by_id(self.device_ids)[device_id]
        if isinstance(device_id, (int, np.integer)) and 0 <= device_id < self.num_devices:
            return int(device_id)
        raise KeyError(device_id)

    def holders(self) -> dict[tuple[Interval, ...], list[int]]:
        """Each distinct block -> the device ids holding it (in mesh order)."""
        out: dict[tuple[Interval, ...], list[int]] = {}
        for device in self.devices:
            out.setdefault(device.index, []).append(device.device_id)
        return out

    def summary(self) -> dict:
        """Everything but the per-device list, as JSON-ready values."""
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "mesh": self.mesh.axes,
            "spec": spec_to_json(self.spec),
            "shard_shape": list(self.shard_shape),
            "bytes_per_device": self.bytes_per_device,
            "replication": self.replication,
        }

    def to_json(self) -> dict:
        """The layout as one JSON object (the CLI's ``inspect --json`` format).

        Example:
            >>> layout_array((8, 4), "data=2", "data").to_json()["devices"][1]["index"]
            [[4, 8], [0, 4]]
        """
        return {**self.summary(), "devices": [d.to_json() for d in self.devices]}

    def __repr__(self) -> str:
        return (
            f"ArrayLayout({self.dtype}{list(self.shape)} on {self.mesh} as {format_spec(self.spec, 'code')}: "
            f"shard {list(self.shard_shape)}, {self.bytes_per_device} B/device, replication {self.replication})"
        )


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    return -(-math.prod(shape) * _itemsize_bits(dtype) // 8)


# Dtypes are read once each: parsing one costs more than the rest of a leaf's layout.
_itemsize_bits = functools.lru_cache(maxsize=64)(itemsize_bits)


def _dtype_name(dtype: Any) -> str:
    return _cached_dtype_name(dtype) if isinstance(dtype, Hashable) else parse_dtype(dtype).name


@functools.lru_cache(maxsize=64)
def _cached_dtype_name(dtype: Any) -> str:
    return parse_dtype(dtype).name


@functools.lru_cache(maxsize=64)
def _mesh_coords(mesh: MeshShape) -> np.ndarray:
    """(devices, axes) coordinates of every mesh position, row-major."""
    if mesh.size == 0:
        return np.zeros((0, len(mesh.sizes)), dtype=np.int64)
    grids = np.indices(mesh.sizes).reshape(len(mesh.sizes), -1)
    return grids.T.astype(np.int64)


def _shape_and_dtype(array: Any, dtype: Any) -> tuple[tuple[int, ...], str]:
    if hasattr(array, "shape") and hasattr(array, "dtype"):
        shape = tuple(int(s) for s in array.shape)
        chosen = array.dtype if dtype is None else dtype
    else:
        shape = parse_shape(array)
        chosen = "float32" if dtype is None else dtype
    return shape, _dtype_name(chosen)


class PlacedMesh(NamedTuple):
    """A mesh read once for many layouts: its shape, the device id at each position, whether it is real."""

    shape: MeshShape
    device_ids: tuple[int, ...]
    concrete: bool


def place_mesh(mesh: Any) -> PlacedMesh:
    """Read a mesh once (text, ``MeshShape``, abstract or concrete mesh) to lay out many arrays on it.

    Every layout on one mesh shares the same ``device_ids`` tuple: a model's thousands of leaves on
    16,384 devices hold one list of ids between them, not one each.

    Example:
        >>> place_mesh("data=4,model=2").device_ids
        (0, 1, 2, 3, 4, 5, 6, 7)
    """
    if isinstance(mesh, PlacedMesh):
        return mesh
    shape = parse_mesh(mesh)
    if is_concrete(mesh):
        return PlacedMesh(shape, _concrete_device_ids(mesh), True)
    return PlacedMesh(shape, _positions(shape.size), False)


@functools.lru_cache(maxsize=16)
def _concrete_device_ids(mesh: Any) -> tuple[int, ...]:
    return tuple(int(d.id) for d in mesh.devices.flat)


@functools.lru_cache(maxsize=16)
def _positions(size: int) -> tuple[int, ...]:
    return tuple(range(size))


@functools.lru_cache(maxsize=16)
def _positions_by_id(device_ids: tuple[int, ...]) -> dict[int, int]:
    return {device_id: position for position, device_id in enumerate(device_ids)}


def layout_array(array: Any, mesh: Any, spec: Any = None, *, dtype: Any = None) -> ArrayLayout:
    """The layout of an array on a mesh under a partition spec. Allocates nothing.

    Args:
        array: a shape (``(8, 16)`` or ``"8,16"``), a ``jax.ShapeDtypeStruct`` (e.g. from
            ``jax.eval_shape``), or an array. With ``spec=None``, a ``jax.Array`` with a
            ``NamedSharding`` is described as it is placed.
        mesh: a concrete ``jax.sharding.Mesh`` (device ids are JAX's), an ``AbstractMesh``, a
            :class:`~workbench.layout.mesh.MeshShape` or text such as ``"data=64,model=16"`` (any size),
            or a :class:`PlacedMesh` (a mesh read once by :func:`place_mesh`, for many arrays).
        spec: a ``PartitionSpec`` or spec text (``"data, None"``); None means replicated.
        dtype: overrides the array's dtype (default float32 for bare shapes).

    Raises :class:`~workbench.errors.SpecError` when the spec does not fit the mesh or shape.

    Example:
        >>> layout = layout_array((8, 16, 32), "data=2,model=4", "data, None, model")
        >>> layout.shard_shape, layout.bytes_per_device, layout.replication
        ((4, 16, 8), 2048, 1)
    """
    if spec is None and hasattr(array, "sharding") and hasattr(array.sharding, "spec"):
        spec = array.sharding.spec
        if mesh is None:
            mesh = array.sharding.mesh
    shape, dtype_name = _shape_and_dtype(array, dtype)
    # Shard shape, bytes and replication hold for the leaf as a whole (every device holds an equal block);
    # the per-device slices wait until a view asks for them.
    placed = place_mesh(mesh)
    mesh_shape = placed.shape
    parsed = validate_spec(spec, mesh_shape, shape)  # the text itself, so a message can quote how it was written
    shard_shape = list(shape)
    used_devices = 1
    for dim, entry in enumerate(spec_entries(parsed)):
        parts = math.prod(mesh_shape.axis_size(a) for a in entry_axes(entry))
        shard_shape[dim] = shape[dim] // parts
        used_devices *= parts
    return ArrayLayout(
        shape=shape,
        dtype=dtype_name,
        mesh=mesh_shape,
        spec=parsed,
        shard_shape=tuple(shard_shape),
        bytes_per_device=_nbytes(shard_shape, dtype_name),
        replication=mesh_shape.size // used_devices,
        device_ids=placed.device_ids,
        concrete=placed.concrete,
    )
