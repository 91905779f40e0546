"""Compiling for NVIDIA GPUs without one: XLA:GPU's deviceless compile, for ``--verify gpu:<chip>:<count>``.

XLA:GPU compiles for a GPU it is only told about: the CUDA plugin (``jax-cuda12-plugin``, kept apart in
:func:`gpu_compiler_dir` by ``make gpu-compile``) takes a target description (a ``GpuTargetConfigProto`` in
text form, one per chip in :data:`GPU_CHIPS`, shipped in ``gpu_targets/``) and a topology of hosts, and gives
compile-only devices in a process that runs on the CPU. ptxas (``nvidia-cuda-nvcc-cu12``) turns the kernels into
GPU code; no driver, no cuDNN. On a real H200 this compile gave the real compile's peak to the byte (JAX_NOTES).

Example:
    >>> chip = GPU_CHIPS["h100"]
    >>> chip.description, gpu_topology("h100", 512)
    ('NVIDIA H100 80GB HBM3', '1x64x8')
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import pathlib
import re
import sys

from ..errors import WorkbenchError

TARGET_CONFIGS = pathlib.Path(__file__).parent / "gpu_targets"
GPU_COMPILER_ENV = "WORKBENCH_GPU_COMPILER"  # a folder holding the CUDA plugin and ptxas (see gpu_compiler_dir)
# A compile without the GPU cannot time kernels: autotuning off picks XLA's default kernels, whose buffers
# are the same (the memory and collectives the workbench reads do not depend on the choice).
DEVICELESS_XLA_FLAGS = "--xla_gpu_autotune_level=0"


@dataclasses.dataclass(frozen=True)
class GpuChip:
    """An NVIDIA GPU the workbench compiles for.

    Attributes:
        name: the name in ``gpu:<name>:<count>``.
        description: the device name XLA reports.
        hardware: the cost model's preset (:data:`~workbench.analysis.cost_model.HARDWARE`).
        gpus_per_host: GPUs in one host's NVLink domain (an HGX/DGX board: 8).
    """

    name: str
    description: str
    hardware: str
    gpus_per_host: int = 8

    @property
    def config_path(self) -> pathlib.Path:
        return TARGET_CONFIGS / f"{self.name}.txtpb"

    def target_config(self) -> str:
        """The chip's ``GpuTargetConfigProto`` text, as XLA reads it."""
        return self.config_path.read_text()

    @functools.cached_property  # read once: plans ask for it per candidate layout
    def memory_bytes(self) -> int:
        """The GPU's memory as its target description gives it (``device_memory_size``): what XLA:GPU budgets from
        (:mod:`.gpu_memory_budget`)."""
        found = re.search(r"device_memory_size:\s*(\d+)", self.target_config())
        if found is None:
            raise WorkbenchError(f"{self.config_path} gives no device_memory_size: restore it from the workbench")
        return int(found.group(1))


GPU_CHIPS: dict[str, GpuChip] = {chip.name: chip for chip in (
    GpuChip("a100-80gb", "NVIDIA A100-SXM4-80GB", "a100-80gb"),
    GpuChip("h100", "NVIDIA H100 80GB HBM3", "h100-nvlink"),
    GpuChip("h100-pcie", "NVIDIA H100 PCIe", "h100-pcie"),
    GpuChip("h200", "NVIDIA H200 141GB HBM3e", "h200"),
    GpuChip("b200", "NVIDIA B200", "b200"),
)}


def gpu_chip(name: str) -> GpuChip:
    """The chip called ``name``; WorkbenchError listing the known ones otherwise."""
    if name not in GPU_CHIPS:
        raise WorkbenchError(f"unknown GPU {name!r}: choose one of {', '.join(GPU_CHIPS)} (e.g. gpu:h100:512)")
    return GPU_CHIPS[name]


def chip_for_hardware(hardware: str) -> GpuChip | None:
    """The chip whose cost-model preset is ``hardware`` (None: not a GPU the workbench compiles for).

    Example:
        >>> chip_for_hardware("h100-nvlink").name, chip_for_hardware("tpu-v5p")
        ('h100', None)
    """
    return next((chip for chip in GPU_CHIPS.values() if chip.hardware == hardware), None)


def gpu_topology(chip: str, count: int) -> str:
    """XLA's ``"<slices>x<hosts>x<gpus per host>"`` for ``count`` GPUs of ``chip``: one host of up to
    ``gpus_per_host`` GPUs, or whole hosts.

    Example:
        >>> gpu_topology("h200", 4), gpu_topology("b200", 4096)
        ('1x1x4', '1x512x8')
        >>> gpu_topology("h100", 12)
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: gpu:h100:12 is not a whole number of 8-GPU hosts: use gpu:h100:8 or ...
    """
    per_host = gpu_chip(chip).gpus_per_host
    if count < 1:
        raise WorkbenchError(f"gpu:{chip}:{count} has no GPUs: use a count from 1, e.g. gpu:{chip}:8")
    if count <= per_host:
        return f"1x1x{count}"
    if count % per_host:
        lower, upper = count // per_host * per_host, -(-count // per_host) * per_host
        raise WorkbenchError(f"gpu:{chip}:{count} is not a whole number of {per_host}-GPU hosts: "
                             f"use gpu:{chip}:{lower} "
                             f"or gpu:{chip}:{upper} (or 1 to {per_host} GPUs on one host)")
    return f"1x{count // per_host}x{per_host}"


def gpu_targets_for(devices: int) -> tuple[str, ...]:
    """The ``gpu:<chip>:<count>`` targets a mesh of ``devices`` compiles for (none when ``devices`` is not one
    host's worth or whole hosts).

    Example:
        >>> gpu_targets_for(16)
        ('gpu:a100-80gb:16', 'gpu:h100:16', 'gpu:h100-pcie:16', 'gpu:h200:16', 'gpu:b200:16')
        >>> gpu_targets_for(12)
        ()
    """
    return tuple(f"gpu:{chip.name}:{devices}" for chip in GPU_CHIPS.values()
                 if devices <= chip.gpus_per_host or devices % chip.gpus_per_host == 0)


def gpu_compiler_dir() -> pathlib.Path:
    """Where the CUDA plugin and ptxas are kept: ``$WORKBENCH_GPU_COMPILER``, else ``gpu-compile/`` in this Python's
    environment (``make gpu-compile`` fills it). Only a GPU compile's child process has it on its path: installed
    beside JAX, the plugin loads into every JAX process and prints CUDA's start-up noise (no driver found) there."""
    chosen = os.environ.get(GPU_COMPILER_ENV, "").strip()
    return pathlib.Path(chosen).expanduser() if chosen else pathlib.Path(sys.prefix) / "gpu-compile"


def _version(distribution: str, where: pathlib.Path | None = None) -> str | None:
    """The installed version of ``distribution``: in folder ``where``, else in this environment."""
    if where is not None:
        found = [d.version for d in importlib.metadata.distributions(path=[str(where)])
                 if (d.metadata["Name"] or "").lower().replace("_", "-") == distribution]
        return found[0] if found else None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_command(jaxlib: str | None = None) -> str:
    """The command that puts the CUDA plugin matched to ``jaxlib`` (default: the installed one) and ptxas in
    :func:`gpu_compiler_dir`."""
    jaxlib = jaxlib or _version("jaxlib")
    return (f"pip install --no-deps --target {gpu_compiler_dir()} 'jax-cuda12-plugin=={jaxlib}' "
            f"'jax-cuda12-pjrt=={jaxlib}' nvidia-cuda-nvcc-cu12")


def gpu_compiler_problem() -> str | None:
    """None when XLA:GPU can compile here without a GPU; else one line with the exact command that fixes it.

    Read afresh each time (a few package records): ``make gpu-compile`` run while a kernel is open counts at once.
    """
    where = gpu_compiler_dir()
    jaxlib = _version("jaxlib")
    install = f"run make gpu-compile in the workbench's folder (it runs: {install_command(jaxlib)})"
    plugin = _version("jax-cuda12-plugin", where)
    if plugin is None:
        return f"compiling for GPUs needs XLA:GPU's CUDA plugin, which {where} lacks: {install}"
    if plugin != jaxlib or _version("jax-cuda12-pjrt", where) != jaxlib:
        return f"the CUDA plugin in {where} is {plugin} and jaxlib {jaxlib}: they must match; {install}"
    if _version("nvidia-cuda-nvcc-cu12", where) is None:
        return f"compiling for GPUs needs ptxas (the nvidia-cuda-nvcc-cu12 wheel), which {where} lacks: {install}"
    return None


__all__ = ["DEVICELESS_XLA_FLAGS", "GPU_CHIPS", "GPU_COMPILER_ENV", "GpuChip", "chip_for_hardware", "gpu_chip",
           "gpu_compiler_dir", "gpu_compiler_problem", "gpu_targets_for", "gpu_topology", "install_command"]
