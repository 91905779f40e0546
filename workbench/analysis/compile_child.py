"""The child process of a verification: compiles one training step for a target and reports it.

Run as ``python -m workbench.analysis.compile_child`` by :mod:`workbench.analysis.verification`, which
sets the simulated device count in the environment first (JAX fixes it when it starts). It reads one
JSON request line on stdin, writes JSON lines on its own channel (the original stdout): ``{"progress":
text}`` as it goes, then ``{"result": CompiledStep.to_json()}`` or ``{"error": {"type", "message"}}``.
Everything else anything prints (libtpu's or the CUDA plugin's start-up noise, warnings) goes to stderr,
which the parent keeps out of sight. It exits at once when its stdin closes: the parent went away.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import mesh_utils, topologies

from ..child_processes import exit_when_parent_goes
from ..errors import WorkbenchError
from ..formatting import format_bytes
from ..training.config import TrainConfig
from ..training.profiling import memory_figures
from ..training.step import build_abstract_step
from .compile_target import mesh_mismatch, parse_target
from .compiled_step import CompiledStep, read_compiled_step
from .exported_step import ExportedStep, compile_exported, exported_mesh
from .gpu_memory_budget import LIFTED, reached_budget
from .gpu_target import gpu_chip, gpu_topology
from .tpu_buffers import compile_reading_buffers


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory: ``VmHWM`` on Linux (``ru_maxrss`` may include the parent's)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss if sys.platform == "darwin" else maxrss * 1024


def _topology_devices(target, mesh) -> list:
    """The TPU topology's devices, in an order that follows the chips' physical layout for this mesh."""
    try:
        devices = list(topologies.get_topology_desc(platform="tpu", topology_name=target.topology).devices)
    except Exception as error:  # noqa: BLE001 - libtpu raises a runtime error with its reason
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WorkbenchError(f"libtpu does not accept TPU topology {target.topology!r}: {reason}; use a shape "
                             "its generation offers, e.g. tpu:v5e:4x4, tpu:v5p:8x8x8, tpu:v4:4x4x4") from None
    if len(devices) != mesh.size:
        raise mesh_mismatch(mesh, target, len(devices))
    try:  # as jax.make_mesh does on real chips: neighbouring mesh positions on neighbouring chips
        return list(mesh_utils.create_device_mesh(mesh.sizes, devices, allow_split_physical_axes=True).flat)
    except Exception:  # noqa: BLE001 - a shape the helper cannot map: plain order compiles the same program
        return devices


def _gpu_devices(target, mesh) -> list:
    """``target``'s compile-only GPUs, host by host: consecutive mesh positions of the innermost axis share a host."""
    chip, count = target.generation, target.chips
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=gpu_chip(chip).target_config(),
                                                topology=gpu_topology(chip, count))
    except Exception as error:  # noqa: BLE001 - the plugin raises a runtime error with its reason
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WorkbenchError(f"XLA:GPU does not accept {target}: {reason}") from None
    devices = sorted(topology.devices, key=lambda device: device.id)
    if len(devices) != mesh.size:
        raise mesh_mismatch(mesh, target, len(devices))
    return devices


def compile_request(request: dict[str, Any], say: Callable[..., None]) -> dict[str, Any]:
    """Build the step ``request`` describes (or read the one the parent exported: your own model), compile it and
    return ``CompiledStep.to_json()``."""
    config = TrainConfig.from_json(request["config"])
    target = parse_target(request["target"])
    start = time.perf_counter()
    devices = None
    if target.kind == "tpu":
        say(progress=f"starting libtpu for topology {target.topology}")
        devices = _topology_devices(target, config.mesh_shape)
    elif target.kind == "gpu":
        say(progress=f"starting XLA:GPU for {target.chips:,} {target.generation} GPUs (no GPU needed)")
        devices = _gpu_devices(target, config.mesh_shape)
    if request.get("exported"):  # your own model's step, traced by the parent: nothing to rebuild here
        exported = ExportedStep.from_json(request["exported"])
        built = time.perf_counter()
        say(progress=f"compiling your model's exported step for {config.mesh_shape.size:,} {target} devices")
        on = devices or jax.devices()[: config.mesh_shape.size]
        compile_step = lambda options=None: compile_exported(exported, on, options)[0]  # noqa: E731
        mesh, layers = exported_mesh(exported, on), exported.layers
    else:
        say(progress="tracing the model and laying out the step (nothing is allocated)")
        step = build_abstract_step(config, seq_len=request.get("seq_len"), devices=devices)
        built = time.perf_counter()
        say(progress=f"compiling the step for {step.mode.mesh.size:,} {target} devices")
        compile_step, mesh, layers = step.compile, step.mode.mesh, step.layers
    buffers = None
    if target.kind == "tpu":  # its temporaries read off its buffer assignment (tpu_buffers: why)
        compiled, buffers = compile_reading_buffers(compile_step)
    else:
        compiled = compile_step()
    compiled_at = time.perf_counter()
    say(progress="reading the compiled program's memory, FLOPs and collectives")
    report = read_compiled_step(compiled, mesh, layers, target=str(target), compile_seconds=compiled_at - built,
                                build_seconds=built - start, peak_rss_bytes=peak_rss_bytes())
    if buffers is not None:  # the HBM block libtpu reserves, not its memory analysis's estimate (tpu_buffers)
        report = dataclasses.replace(report, temp_bytes=buffers.hbm_block_bytes,
                                     reported_temp_bytes=report.temp_bytes, hbm_block_bytes=buffers.hbm_block_bytes,
                                     on_chip_bytes=buffers.on_chip_bytes)
    if target.kind == "gpu":
        report = _as_written(report, compile_step, say)
    return report.to_json()


def _as_written(report: CompiledStep, compile_step: Callable[..., Any], say: Callable[..., None]) -> CompiledStep:
    """``report`` with the temporaries of the step as written, where XLA:GPU's came out at its memory budget (it may
    have computed values again to fit, :mod:`.gpu_memory_budget`): compiled once more with the budget lifted."""
    budget = report.xla_gpu_budget
    if budget is None or not reached_budget(report.temp_bytes, budget):
        return report
    say(progress=f"the step reached XLA:GPU's memory budget ({format_bytes(budget)}): compiling it again with the "
                 "budget lifted, to see the step as written")
    written = memory_figures(compile_step(LIFTED))
    return dataclasses.replace(report, as_written_temp_bytes=written["temp_bytes"] if written else None)


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes where the parent keeps it out of sight

    def say(**message: Any) -> None:
        channel.write(json.dumps(message) + "\n")

    request = json.loads(sys.stdin.readline())
    threading.Thread(target=exit_when_parent_goes, daemon=True).start()
    try:
        say(result=compile_request(request, say))
    except BaseException as error:  # noqa: BLE001 - everything is reported; the parent decides what it means
        kind = type(error).__name__
        message = str(error) if isinstance(error, WorkbenchError) else f"{str(error).strip()[-4000:]}"
        say(error={"type": kind, "message": message, "workbench": isinstance(error, WorkbenchError)})
    channel.flush()
    sys.stderr.flush()
    os._exit(0)  # JAX's and libtpu's teardown adds nothing the parent needs


if __name__ == "__main__":
    main()
