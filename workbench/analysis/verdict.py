"""Will this run train here? One verdict for a whole :class:`~workbench.TrainConfig`, that every surface shows.

:func:`workbench.mesh_fit` judges a mode against a mesh's axes. A run also needs its batch to split, this
machine to have the devices, and this machine's memory to hold the data and state. :func:`training_verdict`
asks all of it, in the order a person fixes things, and says the first thing wrong with the fixes:

=========  ==========================================================================================
``ok``      ✓ it trains here
``warning`` ⚠ it trains, but devices along axes the mode does not use repeat the same work
``plan``    plan and verify only: layouts, plans and Verify work, training needs more devices (or memory)
            than this machine has
``error``   ✗ nothing runs it: the trainer, Check and Verify refuse it, in these words
=========  ==========================================================================================

The Model & mode, Inspect, Train and Verify tabs and the CLI all show this one verdict, so a ✓ is never
followed by a refusal.

Example:
    >>> training_verdict(TrainConfig(mesh="data=512", batch=256)).level
    'error'
    >>> [fix.label for fix in training_verdict(TrainConfig(mesh="data=512", batch=256)).fixes]
    ['use batch 512']
    >>> training_verdict(TrainConfig(mesh="data=4096", batch=4096)).level
    'plan'
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax

from ..devices import local_devices_text
from ..errors import WorkbenchError
from ..formatting import format_bytes
from ..layout.mesh import MeshShape, parse_mesh
from ..training.config import ResolvedConfig, TrainConfig, resolve_config
from ..training.host_memory import (HOST_BATCH_COPIES, USABLE_FRACTION, available_host_memory, batch_bytes,
                                    devices_share_host_memory, largest_batch_within)
from ..training.data import load_dataset
from ..training.models import MODELS, abstract_batch, model_config_for_data
from ..training.modes import MeshFix, mesh_fit
from ..training.modes.declaration import reshaped_mesh
from .planning import plan_training
from .verdict_record import LEVELS, TrainingVerdict, batch_fixes, refusal


def training_verdict(config: TrainConfig | ResolvedConfig, *, devices: int | None = None,
                     available_memory: int | None = None) -> TrainingVerdict:
    """The verdict on training ``config`` (checked here: an unchecked config is fine) on this machine.

    ``devices`` and ``available_memory`` replace this machine's device count and available memory (for
    tests and for judging another machine). The memory estimate (registered models only) is the planned
    step's peak on every device that shares this host's memory, plus the host's copies of the batch.

    Example:
        >>> verdict = training_verdict(TrainConfig(mode="tp", mesh="data=8"))
        >>> verdict.level, verdict.fixes[0].label
        ('error', 'use mode dp')
    """
    try:
        resolved = resolve_config(config)  # once: everything below takes the parsed mesh and the mode's class
    except WorkbenchError as error:
        return TrainingVerdict("error", str(error))
    declared, mesh = resolved.mode_class, resolved.mesh_shape
    fit = mesh_fit(declared, mesh)  # judged once, here: the refusal and the notes below share it
    refused = refusal(resolved, fit)
    if refused is not None:
        return refused
    notes = (fit.message,) if fit.level == "warning" else ()
    devices = len(jax.devices()) if devices is None else devices
    if not declared.one_device and mesh.size > devices:
        smaller = _trainable_mesh_here(declared, mesh, devices)
        message = (f"plan and verify only: mesh {mesh} has {mesh.size:,} devices and this machine has "
                   f"{local_devices_text(devices)}; training needs {mesh.size:,}. Plan it and verify it with the "
                   f"compiler here, or train on mesh {smaller}")
        return TrainingVerdict("plan", message, (MeshFix(f"use mesh {smaller}", mesh=str(smaller)),), notes)
    try:
        memory = _memory_refusal(resolved, available_memory)
    except WorkbenchError as error:  # data the model or its options contradict: the trainer refuses, not the compiler
        return TrainingVerdict("plan", f"plan and verify only: {error}", (), notes)
    if memory is not None:
        return dataclasses.replace(memory, notes=notes)
    return TrainingVerdict(fit.level, fit.message, fit.fixes)


def mesh_within(mesh: MeshShape, devices: int) -> MeshShape:
    """``mesh`` with its outer axes shrunk until it spans at most ``devices`` (inner axes kept where they fit).

    Example:
        >>> small, large = MeshShape(("data", "model"), (64, 8)), MeshShape(("data",), (4096,))
        >>> str(mesh_within(small, 8)), str(mesh_within(large, 8))
        ('data=1,model=8', 'data=8')
    """
    sizes = list(mesh.sizes)
    for axis in range(len(sizes)):
        others = math.prod(sizes) // sizes[axis]
        sizes[axis] = max(1, min(sizes[axis], devices // others)) if others <= devices else 1
    return MeshShape(mesh.names, tuple(sizes))


def _trainable_mesh_here(declared: type, mesh: MeshShape, devices: int) -> MeshShape:
    """A mesh of at most ``devices`` for mode ``declared`` (its class): ``mesh`` shrunk (its inner axes kept),
    unless that leaves devices repeating the work; then the mode's own arrangement of the devices."""
    shrunk = mesh_within(mesh, devices)
    if mesh_fit(declared, shrunk).level == "ok":
        return shrunk
    return parse_mesh(reshaped_mesh(declared.axes, devices, declared.mesh_example))


def _memory_refusal(resolved: ResolvedConfig, available: int | None) -> TrainingVerdict | None:
    """``plan`` when this machine's memory cannot hold the run (registered models: yours is not sized here)."""
    config, declared, mesh = resolved.config, resolved.mode_class, resolved.mesh_shape
    if config.model not in MODELS:
        return None
    data = (config.data, tuple(sorted(config.data_options.items())))  # the seed changes values, not sizes
    fixed, per_example = _memory_need(config.model, tuple(sorted(config.model_options.items())), data, declared,
                                      mesh, config.batch, config.accum, config.precision, config.optimizer)
    need = fixed + per_example * config.batch
    available = available_host_memory() if available is None else available
    if need <= USABLE_FRACTION * available:
        return None
    unit = declared.batch_parts(mesh) * config.accum
    fits = largest_batch_within(int(USABLE_FRACTION * available), fixed, per_example, unit)
    fix = (f"use a batch of at most {fits:,}", (MeshFix(f"use batch {fits}", batch=fits),)) if fits else (
        "no batch fits: use a smaller model or more memory", ())
    message = (f"plan and verify only: a batch of {config.batch:,} needs about {format_bytes(int(need))} of this "
               f"machine's memory for its data and the step, and {format_bytes(available)} is available; "
               f"{fix[0]}")
    return TrainingVerdict("plan", message, fix[1])


@functools.lru_cache(maxsize=64)
def _memory_need(model: str, options: tuple, data: tuple, declared: type, mesh: MeshShape, batch: int, accum: int,
                 precision: str, optimizer: str) -> tuple[float, float]:
    """(bytes that do not grow with the batch, bytes per example) this machine holds to train the config.

    Devices that keep their buffers in host memory (simulated CPU devices) add the planned step's peak, once
    per device the mode computes on; the state part of it does not grow with the batch, the rest does. The
    host holds :data:`HOST_BATCH_COPIES` copies of each global batch besides. ``data`` is (name, options);
    the model is sized from it as the trainer sizes it, so a model the data contradicts raises here.
    """
    name, data_options = data
    dataset = load_dataset(name, **dict(data_options))
    examples = abstract_batch(model_config_for_data(model, dataset, **dict(options)), 1)
    per_example = float(HOST_BATCH_COPIES * batch_bytes(examples))
    if not devices_share_host_memory():
        return 0.0, per_example
    plan = plan_training(model, dict(options), mesh, declared, optimizer=optimizer, global_batch=max(batch // accum, 1),
                         precision=precision, hardware="cpu")
    used = 1 if declared.one_device else mesh.size
    state = plan.total_bytes
    growing = max(plan.peak_bytes - state, 0) * accum / batch  # the microbatch's activations, per example of the batch
    return float(state * used), per_example + growing * used


__all__ = ["LEVELS", "TrainingVerdict", "batch_fixes", "mesh_within", "training_verdict"]
