"""Device meshes: parse ``"data=4,model=2"``, build a concrete mesh over local devices, or an abstract
mesh of any size for planning.

:class:`MeshShape` is the plain description (axis names and sizes) every other module works from; it
never touches devices. :func:`build_mesh` turns it into a ``jax.sharding.Mesh`` over local devices and
:func:`abstract_mesh` into a ``jax.sharding.AbstractMesh`` (e.g. ``data=64,model=16`` on a laptop).
Axis types are always passed to JAX explicitly: ``jax.make_mesh`` and ``Mesh`` disagree on the default.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType

from ..errors import MeshError
from ..devices import warn_if_devices_missing, more_devices_hint

AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Words the spec parser reads as "not sharded": an axis with one of these names could not be named.
RESERVED_AXIS_NAMES = frozenset({"None", "none", "null", "P", "PartitionSpec"})
AXIS_TYPES = ("explicit", "auto")
# The axis names the parallel modes use: the batch is split over DATA_AXIS, layers over MODEL_AXIS.
DATA_AXIS, MODEL_AXIS = "data", "model"


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """Axis names and sizes of a device mesh, in order (the first axis varies slowest).

    Example:
        >>> parse_mesh("data=4,model=2").size
        8
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self):
        _validate_axes(self.names, self.sizes)

    @property
    def size(self) -> int:
        """Number of devices the mesh spans."""
        return math.prod(self.sizes)

    @property
    def axes(self) -> dict[str, int]:
        """Axis name -> size, in mesh order."""
        return dict(zip(self.names, self.sizes, strict=True))

    def axis_size(self, name: str) -> int:
        """Size of one axis; :class:`MeshError` naming the mesh's axes if it has no such axis."""
        if name not in self.names:
            raise MeshError(
                f"mesh {self} has no axis {name!r}; its axes are {', '.join(self.names)}: "
                f"use one of them or add {name}=N to the mesh"
            )
        return self.sizes[self.names.index(name)]

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))


def _validate_axes(names: Sequence[str], sizes: Sequence[int]) -> None:
    if len(names) != len(sizes):
        raise MeshError(
            f"mesh has {len(sizes)} size(s) {tuple(sizes)} but {len(names)} name(s) {tuple(names)}: "
            "give one name per axis"
        )
    if not names:
        raise MeshError("mesh has no axes: give at least one, e.g. 'data=8'")
    seen = set()
    for name, size in zip(names, sizes, strict=True):
        if not isinstance(name, str) or not AXIS_NAME.match(name):
            raise MeshError(
                f"mesh axis name {name!r} is not a valid name: use letters, digits and '_', "
                "starting with a letter, e.g. 'data'"
            )
        if name in RESERVED_AXIS_NAMES:
            raise MeshError(f"mesh axis name {name!r} is reserved in partition specs: choose another, e.g. 'data'")
        if name in seen:
            raise MeshError(f"mesh axis {name!r} appears twice: give each axis a different name")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, int):
            raise MeshError(f"mesh axis {name!r} has size {size!r}, not a whole number: use e.g. {name}=4")
        if size < 1:
            raise MeshError(f"mesh axis {name!r} has size {size}: sizes must be at least 1")


def _parse_size(name: str, raw: str) -> int:
    raw = raw.strip()
    if not re.fullmatch(r"[+-]?\d+", raw):
        raise MeshError(f"mesh axis {name!r} has size {raw!r}, not a whole number: use e.g. {name}=4")
    return int(raw)


def parse_mesh(value: Any, names: Sequence[str] | None = None) -> MeshShape:
    """Read a mesh description into a :class:`MeshShape`.

    Accepts ``"data=4,model=2"`` (spaces allowed), a dict ``{"data": 4, "model": 2}``, sizes with
    ``names=`` (``parse_mesh((4, 2), names=("data", "model"))``), a :class:`MeshShape`, or a JAX
    ``Mesh``/``AbstractMesh``. Raises :class:`MeshError` naming the bad part and a fix.

    Example:
        >>> parse_mesh("data=4, model=2").axes
        {'data': 4, 'model': 2}
    """
    if isinstance(value, MeshShape):
        return value
    if names is not None:
        if isinstance(value, int):
            value = (value,)
        if isinstance(names, str):
            names = (names,)
        sizes = tuple(value)
        return MeshShape(tuple(names), sizes)
    if hasattr(value, "axis_names") and hasattr(value, "axis_sizes"):  # jax Mesh / AbstractMesh
        return MeshShape(tuple(value.axis_names), tuple(int(s) for s in value.axis_sizes))
    if isinstance(value, Mapping):
        return MeshShape(tuple(value.keys()), tuple(value.values()))
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise MeshError("mesh is empty: give axes as name=size, e.g. 'data=8' or 'data=4,model=2'")
        parsed_names, parsed_sizes = [], []
        for part in text.split(","):
            part = part.strip()
            if not part:
                raise MeshError(f"mesh {value!r} has an empty axis (two commas?): write e.g. 'data=4,model=2'")
            if "=" not in part:
                raise MeshError(
                    f"mesh axis {part!r} in {value!r} has no size: write name=size, e.g. '{part}=4'"
                )
            name, _, size = part.partition("=")
            name = name.strip()
            if not name:
                raise MeshError(f"mesh axis {part!r} in {value!r} has no name: write name=size, e.g. 'data{part}'")
            parsed_names.append(name)
            parsed_sizes.append(_parse_size(name, size))
        return MeshShape(tuple(parsed_names), tuple(parsed_sizes))
    raise MeshError(
        f"cannot read a mesh from {type(value).__name__} {value!r}: give 'data=4,model=2', "
        "a dict, or sizes with names="
    )


def _axis_types(axis_types: str | Sequence[str], count: int):
    if isinstance(axis_types, str):
        axis_types = (axis_types,) * count
    axis_types = tuple(axis_types)
    if len(axis_types) != count:
        raise MeshError(f"{len(axis_types)} axis type(s) {axis_types} for a mesh of {count} axes: give one per axis")
    result = []
    for kind in axis_types:
        if isinstance(kind, AxisType):
            result.append(kind)
            continue
        key = str(kind).strip().lower()
        if key not in AXIS_TYPES:
            raise MeshError(f"axis type {kind!r} is not one of {', '.join(AXIS_TYPES)}: use 'explicit' or 'auto'")
        result.append(AxisType.Explicit if key == "explicit" else AxisType.Auto)
    return tuple(result)


def build_mesh(mesh: Any, *, axis_types: str | Sequence[str] = "explicit", devices: Sequence[Any] | None = None):
    """A concrete ``jax.sharding.Mesh`` over local devices.

    ``devices`` defaults to every device JAX sees, and the mesh must use all of them; pass a list (e.g.
    ``jax.devices()[:2]``) to build a smaller mesh. ``axis_types`` is ``"explicit"`` or ``"auto"`` (or
    one per axis). Raises :class:`MeshError` when the sizes do not multiply to the device count.

    Example:
        >>> dict(build_mesh("data=4,model=2").shape)
        {'data': 4, 'model': 2}
    """
    shape = parse_mesh(mesh)
    types = _axis_types(axis_types, len(shape.names))
    if devices is None:
        warn_if_devices_missing()
        devices = jax.devices()
        if shape.size != len(devices):
            raise MeshError(
                f"mesh {shape} needs {shape.size} devices but JAX has {len(devices)} "
                f"({devices[0].platform}): choose sizes that multiply to {len(devices)}, pass "
                f"devices=jax.devices()[:{shape.size}] for a smaller mesh, plan on abstract_mesh('{shape}'), "
                f"{more_devices_hint(shape.size)}"
            )
    devices = list(devices)
    validate_device_list(shape, devices)
    grid = np.array(devices, dtype=object).reshape(shape.sizes)
    return jax.sharding.Mesh(grid, shape.names, axis_types=types)


def validate_device_list(shape: MeshShape, devices: Sequence[Any]) -> None:
    """MeshError unless ``devices`` are exactly the ``shape.size`` devices a mesh of ``shape`` is laid over.

    Example:
        >>> validate_device_list(parse_mesh("data=8"), ["a device"] * 4)
        Traceback (most recent call last):
        ...
        workbench.errors.MeshError: mesh data=8 needs 8 devices but 4 were given: pass exactly 8 devices
    """
    if shape.size != len(devices):
        raise MeshError(
            f"mesh {shape} needs {shape.size} devices but {len(devices)} were given: "
            f"pass exactly {shape.size} devices"
        )


def abstract_mesh(mesh: Any, *, axis_types: str | Sequence[str] = "explicit"):
    """A ``jax.sharding.AbstractMesh`` of any size, for planning layouts without devices.

    Example:
        >>> abstract_mesh("data=64,model=16").axis_sizes
        (64, 16)
    """
    shape = parse_mesh(mesh)
    return AbstractMesh(shape.sizes, shape.names, axis_types=_axis_types(axis_types, len(shape.names)))


def is_concrete(mesh: Any) -> bool:
    """True for a mesh with real devices (``jax.sharding.Mesh``), False for descriptions and abstract meshes."""
    return isinstance(mesh, jax.sharding.Mesh)
