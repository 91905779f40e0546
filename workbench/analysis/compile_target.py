"""Where a step is compiled to check a plan: simulated CPU devices, a TPU topology through libtpu, or NVIDIA
GPUs through XLA:GPU's deviceless compile (:mod:`.gpu_target`).

:func:`parse_target` reads ``"cpu"``, ``"tpu:v5p:8x8x8"`` or ``"gpu:h100:512"`` into a :class:`CompileTarget`, and
:func:`validate_target` judges it against the planned mesh before any process starts: too many CPU devices,
an unknown TPU generation or GPU, libtpu or the CUDA plugin missing, or a chip count that differs from the
mesh's each raise one :class:`~workbench.errors.WorkbenchError` saying what to do. A target names its hardware preset
(:data:`~workbench.analysis.cost_model.HARDWARE`), so the plan prices what the compiler compiled for.

Example:
    >>> target = parse_target("tpu:v5p:8x8x8")
    >>> target.generation, target.chips, target.hardware
    ('v5p', 512, 'tpu-v5p')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from typing import Any

from ..errors import MeshError, WorkbenchError
from ..layout.mesh import DATA_AXIS, MeshShape
from .gpu_target import GPU_CHIPS, gpu_chip, gpu_compiler_problem, gpu_topology

# XLA:CPU compiled a sharded step for 2048 simulated devices (1.9 s) and failed at 8192 ("Multiprocess
# computations aren't implemented on the CPU backend"): JAX 0.10.2, measured.
CPU_DEVICE_LIMIT = 2048
# TPU generation as libtpu names it -> the cost model's hardware preset.
TPU_GENERATIONS = {"v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e"}
TOPOLOGY_EXAMPLES = ("v5e:4x4 (16 chips)", "v5e:16x16 (256)", "v5p:8x8x8 (512)", "v4:4x4x4 (64)", "v6e:16x16 (256)")
# Slice shapes libtpu 0.0.42 accepts (checked with get_topology_desc), smallest first: what a picker offers.
TOPOLOGY_SHAPES = {
    "v5e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
    "v6e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v4": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"),
}
DEVICES_PER_CHIP = {"v4": 2}  # a v4 chip shows as two devices (its two TensorCores); the others as one
INSTALL_LIBTPU = ("compiling for a TPU topology needs libtpu, which this environment lacks: "
                  "pip install -e '.[tpu]' in the workbench's folder (or pip install 'jax[tpu]'), then try again")
_TOPOLOGY = re.compile(r"^(?P<generation>[a-z0-9]+):(?P<shape>\d+(?:x\d+){1,2})$")
_GPUS = re.compile(r"^(?P<chip>[a-z0-9-]+):(?P<count>\d+)$")


@dataclasses.dataclass(frozen=True)
class CompileTarget:
    """What a verification compiles for.

    Attributes:
        kind: ``"cpu"`` (XLA:CPU on simulated devices), ``"tpu"`` (the TPU compiler, via libtpu) or ``"gpu"``
            (XLA:GPU, deviceless).
        topology: libtpu's topology name, e.g. ``"v5p:8x8x8"``, or ``"<chip>:<count>"`` for GPUs, e.g.
            ``"h100:512"``; None for ``cpu``.
    """

    kind: str
    topology: str | None = None

    @property
    def generation(self) -> str | None:
        return self.topology.split(":")[0] if self.topology else None

    @property
    def chips(self) -> int | None:
        """Chips in the topology (the product of its shape, or the GPU count); None for ``cpu``."""
        return math.prod(int(n) for n in self.topology.split(":")[1].split("x")) if self.topology else None

    @property
    def hardware(self) -> str | None:
        """The cost model's preset for these chips; None for ``cpu`` (the plan keeps its own)."""
        generation = self.generation
        if generation is None:  # cpu: no topology
            return None
        return GPU_CHIPS[generation].hardware if self.kind == "gpu" else TPU_GENERATIONS[generation]

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.topology}"


def topologies_for(devices: int) -> tuple[str, ...]:
    """The TPU targets of :data:`TOPOLOGY_SHAPES` with ``devices`` devices, a mesh of that size can compile for.

    Example:
        >>> topologies_for(16)
        ('tpu:v5e:4x4', 'tpu:v5p:2x2x4', 'tpu:v6e:4x4', 'tpu:v4:2x2x2')
    """
    return tuple(f"tpu:{generation}:{shape}" for generation, shapes in TOPOLOGY_SHAPES.items() for shape in shapes
                 if math.prod(map(int, shape.split("x"))) * DEVICES_PER_CHIP.get(generation, 1) == devices)


def _known_topologies() -> str:
    return (f"write cpu, tpu:<generation>:<shape> with a generation of {', '.join(TPU_GENERATIONS)}, "
            f"e.g. {', '.join('tpu:' + example for example in TOPOLOGY_EXAMPLES)}, or gpu:<chip>:<count> with a "
            f"chip of {', '.join(GPU_CHIPS)}, e.g. gpu:h100:512")


def parse_target(value: Any) -> CompileTarget:
    """A :class:`CompileTarget` from ``"cpu"``, ``"tpu:<generation>:<shape>"`` or ``"gpu:<chip>:<count>"`` (a
    target is returned as is).

    Raises :class:`~workbench.errors.WorkbenchError` listing the known names for anything else.

    Example:
        >>> parse_target("cpu"), str(parse_target("tpu:v5e:4x4"))
        (CompileTarget(kind='cpu', topology=None), 'tpu:v5e:4x4')
    """
    if isinstance(value, CompileTarget):
        return value
    text = str(value).strip().lower()
    if text == "cpu":
        return CompileTarget("cpu")
    if text.startswith("tpu:"):
        match = _TOPOLOGY.match(text[len("tpu:"):])
        if match and match["generation"] in TPU_GENERATIONS:
            return CompileTarget("tpu", text[len("tpu:"):])
        if match:
            raise WorkbenchError(f"unknown TPU generation {match['generation']!r} in {value!r}: {_known_topologies()}")
    if text.startswith("gpu:"):
        match = _GPUS.match(text[len("gpu:"):])
        if match:
            gpu_chip(match["chip"])
            gpu_topology(match["chip"], int(match["count"]))  # a count that is not whole hosts: which ones are
            return CompileTarget("gpu", f"{match['chip']}:{int(match['count'])}")
    raise WorkbenchError(f"unknown compile target {value!r}: {_known_topologies()}")


def libtpu_installed() -> bool:
    """Whether the ``libtpu`` wheel (the TPU compiler) can be imported here."""
    try:
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


def fitting_mesh(mesh: MeshShape, devices: int) -> MeshShape | None:
    """``mesh`` re-sized to ``devices``: its other axes kept where they divide, ``data`` taking the rest.

    Example:
        >>> str(fitting_mesh(MeshShape(("data", "model"), (64, 8)), 16))
        'data=2,model=8'
    """
    sizes = dict(zip(mesh.names, mesh.sizes, strict=True))
    grow = DATA_AXIS if DATA_AXIS in sizes else mesh.names[0]
    remaining = devices
    for name in reversed(mesh.names):
        if name == grow:
            continue
        sizes[name] = math.gcd(sizes[name], remaining)
        remaining //= sizes[name]
    sizes[grow] = remaining
    return MeshShape(mesh.names, tuple(sizes[name] for name in mesh.names))


def mesh_mismatch(mesh: MeshShape, target: CompileTarget, devices: int) -> MeshError:
    """The error for a mesh whose device count differs from the topology's, naming a mesh that fits."""
    fit = fitting_mesh(mesh, devices)
    if target.kind == "gpu":
        return MeshError(f"mesh {mesh} has {mesh.size:,} devices but {target} has {devices:,} GPUs: plan on --mesh "
                         f"{fit}, or verify on gpu:{target.generation}:{mesh.size}")
    return MeshError(
        f"mesh {mesh} has {mesh.size:,} devices but TPU topology {target.topology} has {devices:,}: "
        f"plan on --mesh {fit}, or pick a topology with {mesh.size:,} chips"
    )


def validate_target(target: CompileTarget, mesh: MeshShape) -> None:
    """Raise a WorkbenchError now, before any child process, when ``target`` cannot compile for ``mesh``.

    The CPU compiler takes up to :data:`CPU_DEVICE_LIMIT` devices; a TPU topology's chip count must equal
    the mesh's (v5e, v5p and v6e have one device per chip; v4's devices are counted where libtpu reports
    them), and it needs libtpu.

    Example:
        >>> validate_target(parse_target("cpu"), MeshShape(("data",), (4096,)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: ...at most 2,048 simulated devices...
    """
    if target.kind == "cpu":
        if mesh.size > CPU_DEVICE_LIMIT:
            raise WorkbenchError(
                f"mesh {mesh} has {mesh.size:,} devices; XLA:CPU compiles for at most {CPU_DEVICE_LIMIT:,} simulated "
                f"devices (it fails at 8,192): verify on --mesh {fitting_mesh(mesh, CPU_DEVICE_LIMIT)}, or against a "
                "TPU topology of as many chips with libtpu (e.g. --verify tpu:v5p:16x16x16 has 4,096)"
            )
        return
    chips = target.chips  # a TPU or GPU target has a topology, so a chip count
    if target.generation != "v4" and chips is not None and chips != mesh.size:
        raise mesh_mismatch(mesh, target, chips)
    if target.kind == "gpu":
        problem = gpu_compiler_problem()
        if problem is not None:
            raise WorkbenchError(problem)
        return
    if not libtpu_installed():
        raise WorkbenchError(INSTALL_LIBTPU)


__all__ = [
    "CPU_DEVICE_LIMIT", "INSTALL_LIBTPU", "TOPOLOGY_SHAPES", "TPU_GENERATIONS", "CompileTarget", "validate_target",
    "fitting_mesh", "libtpu_installed", "mesh_mismatch", "parse_target", "topologies_for",
]
