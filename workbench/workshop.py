"""Exercises of the workshop notebooks, each with a check the student runs on their own answer.

A check measures the truth with the engine (layouts, the compiled step's ledger, the reference check,
a real ``shard_map`` on the simulated devices) and compares the student's answer with it. It never
raises on a wrong or missing answer: it returns an :class:`ExerciseResult` whose message says what is
wrong and points at the idea to revisit, and which shows as one line in a notebook.

================================  ==========================================================================
:func:`check_bytes_per_device`      predict bytes per device of the MLP's kernels under dp and fsdp
:func:`check_all_reduce_bytes`      predict what the compiler's all-reduce carries per dp step
:func:`check_grad_scale`            predict the gradient scale of the ``psum`` fault on N devices
:func:`check_gradient_sync`         fix a shard_map step whose gradients come out N times too large
:func:`check_fits_chip`             predict whether a planned layout fits its chip, before the compiler answers
:func:`check_process_rows`          predict which rows of the global batch process 1 of 2 loads
:func:`check_restored_shard_shape`  predict a leaf's shard shape once an fsdp checkpoint is restored under dp-tp
:func:`check_dominant_collective`   read which collective kind dominates a profiled fsdp step, and its bytes
:func:`check_beat_the_recommender`  pick a layout for a 1.3B model on 64 H100s at least as fast as recommend's
================================  ==========================================================================

Example:
    >>> check_bytes_per_device(...).status
    'unanswered'
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .analysis.collectives import COLLECTIVE_KINDS
from .analysis.model_layout import model_layout
from .analysis.planning import plan_training
from .analysis.recommender import recommend
from .analysis.reference_check import run_check
from .analysis.step_ledger import ledger_for_config
from .analysis.step_time import StepTime, step_time
from .errors import MeshError, RunError, WorkbenchError
from .formatting import align_columns, format_bytes, format_seconds
from .layout.mesh import build_mesh
from .layout.specs import format_spec
from .training.config import TrainConfig
from .training.modes import mesh_fit
from .training.modes.base import training_mesh
from .training.process_share import batch_share
from .training.runs import load_run

WORKSHOP_DEVICES = 8  # the notebook's simulated devices; the checks use fewer if the machine has fewer
# Marks every browser font has: emoji (a green tick, a red cross, a pencil) render as empty boxes where no
# emoji font is installed (Debian's chromium).
_MARKS = {"passed": "✓ correct", "failed": "✗ not yet", "unanswered": "○ not answered yet"}


@dataclasses.dataclass(frozen=True)
class ExerciseResult:
    """A check's verdict: ``status`` is ``passed``, ``failed`` or ``unanswered``; ``message`` says why."""

    exercise: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return f"{_MARKS[self.status]} ({self.exercise}): {self.message}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_markdown_(self) -> str:
        return f"**{_MARKS[self.status]}** ({self.exercise}): {self.message}"


def _unanswered(exercise: str, answer: Any) -> ExerciseResult | None:
    if answer is None or answer is Ellipsis:
        return ExerciseResult(exercise, "unanswered", "replace the ... with your answer and run the cell again")
    return None


def _unanswered_dict(exercise: str, answer: Any, keys: Any, what: str) -> ExerciseResult | None:
    """The result for an answer that is not yet a dict with exactly ``keys``, each given (``what`` each holds)."""
    if (result := _unanswered(exercise, answer)) is not None:
        return result
    if not isinstance(answer, dict) or set(answer) != set(keys):
        return ExerciseResult(exercise, "failed", f"give a dict with exactly the keys {', '.join(keys)}")
    if any(value is Ellipsis or value is None for value in answer.values()):
        return ExerciseResult(exercise, "unanswered", f"replace every ... with {what} and run the cell again")
    return None


def _whole_number(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return int(value) if float(value).is_integer() else None


def _devices() -> int:
    count = min(WORKSHOP_DEVICES, jax.device_count())
    if count < 2:
        raise RuntimeError("the workshop needs at least 2 devices: import workbench before jax, in a fresh kernel")
    return count


# --- 1. bytes per device --------------------------------------------------------------------------

BYTES_KEYS = ("kernel_dp", "kernel_fsdp", "bias_fsdp")


def bytes_per_device_truth(devices: int = WORKSHOP_DEVICES) -> dict[str, int]:
    """Bytes per device of the digits MLP's ``hidden1/kernel`` (64x128) under dp and fsdp, and of
    ``output/bias`` (10 values) under fsdp, on ``data=devices``; from the layout engine.

    Example:
        >>> bytes_per_device_truth(8)
        {'kernel_dp': 32768, 'kernel_fsdp': 4096, 'bias_fsdp': 40}
    """
    mesh = f"data={devices}"
    dp, fsdp = model_layout("mlp", mesh, "dp").params, model_layout("mlp", mesh, "fsdp").params
    return {
        "kernel_dp": dp.leaf("hidden1/kernel").layout.bytes_per_device,
        "kernel_fsdp": fsdp.leaf("hidden1/kernel").layout.bytes_per_device,
        "bias_fsdp": fsdp.leaf("output/bias").layout.bytes_per_device,
    }


def check_bytes_per_device(answer: Any) -> ExerciseResult:
    """Check ``{"kernel_dp": ..., "kernel_fsdp": ..., "bias_fsdp": ...}`` (bytes) on ``data=8``.

    Example:
        >>> check_bytes_per_device({"kernel_dp": 32768, "kernel_fsdp": 4096, "bias_fsdp": 40}).passed
        True
    """
    name = "bytes-per-device"
    if (result := _unanswered_dict(name, answer, BYTES_KEYS, "a number of bytes")) is not None:
        return result
    truth = bytes_per_device_truth(WORKSHOP_DEVICES)
    hints = {
        "kernel_dp": "data parallelism keeps a whole copy on every device: 64 x 128 float32 values",
        "kernel_fsdp": f"fsdp splits the largest dimension divisible by {WORKSHOP_DEVICES} over 'data'",
        "bias_fsdp": f"10 does not divide by {WORKSHOP_DEVICES}: such a leaf cannot be split evenly",
    }
    wrong = [f"{key}: you said {answer[key]!r}; {hints[key]}"
             for key in BYTES_KEYS if _whole_number(answer[key]) != truth[key]]
    if wrong:
        return ExerciseResult(name, "failed", "; ".join(wrong))
    return ExerciseResult(name, "passed", f"{truth['kernel_dp']:,} B whole, {truth['kernel_fsdp']:,} B as one of "
                          f"{WORKSHOP_DEVICES} shards, and the bias stays whole ({truth['bias_fsdp']} B) "
                          "on every device")


# --- 2. the all-reduce the compiler inserts -------------------------------------------------------


def all_reduce_truth(devices: int = WORKSHOP_DEVICES) -> tuple[int, int]:
    """(gradient bytes of the digits MLP, all-reduce bytes of its compiled dp step on ``data=devices``)."""
    gradients = model_layout("mlp", f"data={devices}", "dp").params.bytes_per_device
    ledger = ledger_for_config(TrainConfig(model="mlp", mesh=f"data={devices}", mode="dp", batch=8 * devices))
    return gradients, ledger.bytes_by_kind().get("all-reduce", 0)


def check_all_reduce_bytes(answer: Any) -> ExerciseResult:
    """Check a prediction of the bytes the dp step's all-reduce carries per step (within 1%).

    Compiles the step once (a few seconds) and reads the collectives from its HLO.
    """
    name = "all-reduce-bytes"
    if (result := _unanswered(name, answer)) is not None:
        return result
    value = _whole_number(answer)
    if value is None or value <= 0:
        return ExerciseResult(name, "failed", f"give a whole number of bytes, not {answer!r}")
    devices = _devices()
    gradients, compiled = all_reduce_truth(devices)
    if abs(value - gradients) <= 0.01 * gradients or value == compiled:
        extra = compiled - gradients
        return ExerciseResult(name, "passed", f"the compiled step all-reduces {compiled:,} B: every float32 gradient "
                              f"({gradients:,} B) once, plus {extra} B of loss and example count")
    ratio = value / gradients
    if math.isclose(ratio, devices, rel_tol=0.02):
        hint = "that is one gradient per device added up: an all-reduce carries one copy's worth per device"
    elif math.isclose(ratio, 1 / devices, rel_tol=0.02):
        hint = "that is one device's share of a split array, but in dp every device holds every gradient whole"
    elif math.isclose(ratio, 0.5, rel_tol=0.02) or math.isclose(ratio, 2, rel_tol=0.02):
        hint = "check the dtype: the gradients are float32, 4 bytes each"
    else:
        hint = "count the MLP's parameters (weights and biases of 64 -> 128 -> 128 -> 10), 4 bytes each"
    return ExerciseResult(name, "failed", f"you said {value:,} B ({ratio:.3g}x the answer); {hint}")


# --- 3. the scale of a summed gradient ------------------------------------------------------------


def check_grad_scale(answer: Any) -> ExerciseResult:
    """Check a prediction of the reference check's ``grad_scale`` for ``dp-shard-map`` with the
    ``psum`` fault on ``data=8`` (measured: about 2 s)."""
    name = "grad-scale"
    if (result := _unanswered(name, answer)) is not None:
        return result
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        return ExerciseResult(name, "failed", f"give a number, not {answer!r}")
    devices = _devices()
    report = run_check("dp-shard-map", model="mlp", mesh=f"data={devices}", faults=["psum"], ledger=False)
    measured = report.grad_scale
    if math.isclose(float(answer), measured, rel_tol=0.02):
        return ExerciseResult(name, "passed", f"measured {measured:.4f}: psum adds the {devices} shard means, "
                              f"so the applied gradient is {devices} times the mean")
    hint = ("the loss on each shard is a mean over that shard; psum adds one such mean per device"
            if float(answer) < measured else "a sum of N means is N means, not N squared")
    return ExerciseResult(name, "failed", f"you said {answer}; {hint}")


# --- 4. fix the step ------------------------------------------------------------------------------


def regression_loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    """Mean squared error of a linear model: the loss the fix-the-step exercise differentiates."""
    prediction = batch["x"] @ params["w"] + params["b"]
    return jnp.mean((prediction - batch["y"]) ** 2)


def regression_problem(examples: int = 64, features: int = 4) -> tuple[dict, dict]:
    """Fixed parameters and a batch for the exercise (the same every time)."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(features,)), jnp.float32), "b": jnp.float32(0.5)}
    x = rng.normal(size=(examples, features)).astype(np.float32)
    batch = {"x": jnp.asarray(x), "y": jnp.asarray(x @ np.arange(1, features + 1) + 0.1 * rng.normal(size=examples),
                                                   jnp.float32)}
    return params, batch


def check_gradient_sync(local_gradients: Callable[[dict, dict], Any]) -> ExerciseResult:
    """Run ``local_gradients(params, shard)`` inside ``jax.shard_map`` over ``data`` (``check_vma=True``,
    parameters replicated, the batch split) and compare what it returns with ``jax.grad`` of
    :func:`regression_loss` on the whole batch, on one device.

    Example:
        >>> def local_gradients(params, shard):
        ...     params = jax.lax.pcast(params, "data", to="varying")
        ...     return jax.lax.pmean(jax.grad(regression_loss)(params, shard), "data")
        >>> check_gradient_sync(local_gradients).passed
        True
    """
    name = "fix-the-step"
    if (result := _unanswered(name, local_gradients)) is not None:
        return result
    if not callable(local_gradients):
        return ExerciseResult(name, "failed",
                              f"give a function local_gradients(params, shard), not {local_gradients!r}")
    devices = _devices()
    mesh = build_mesh(f"data={devices}")
    params, batch = regression_problem()
    reference = jax.grad(regression_loss)(params, batch)
    # Placed as a training step would be (the mesh's axes are Explicit): params on every device, the batch split.
    placed_params = jax.device_put(params, NamedSharding(mesh, P()))
    placed_batch = jax.device_put(batch, NamedSharding(mesh, P("data")))
    step = jax.shard_map(local_gradients, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=True)
    try:
        grads = jax.jit(step)(placed_params, placed_batch)
    except Exception as error:  # noqa: BLE001 - the student's code: any failure is feedback, not a crash
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        hint = ""
        if "out_specs" in str(error) or "vary" in str(error):
            hint = ("; the result still varies over 'data': reduce it across devices (lax.pmean) so every "
                    "device returns the same gradient")
        return ExerciseResult(name, "failed", f"your step raised {type(error).__name__}: {first_line[:300]}{hint}")
    if jax.tree.structure(grads) != jax.tree.structure(reference):
        return ExerciseResult(name, "failed",
                              "return the gradients with the same structure as params: {'w': ..., 'b': ...}")
    got = np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(grads)])
    want = np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(reference)])
    if np.allclose(got, want, rtol=1e-5, atol=1e-6):
        return ExerciseResult(name, "passed", f"on {devices} devices your step returns the whole batch's gradient "
                              "(the mean of the devices' local gradients), to float32 precision")
    scale = float(np.linalg.norm(got) / np.linalg.norm(want))
    if math.isclose(scale, devices, rel_tol=1e-3):
        hint = (f"{devices}x too large: the gradients were summed, not averaged. Under check_vma=True the params "
                "come in replicated, and jax.grad of replicated params already sums over devices (the transpose of "
                "the implicit cast to per-device is a psum), so pmean of it is still the sum. Declare the params "
                "per-device first: params = jax.lax.pcast(params, 'data', to='varying'), then pmean")
    elif math.isclose(scale, 1 / devices, rel_tol=1e-3):
        hint = f"{devices}x too small: the mean was taken twice (divide once)"
    else:
        hint = (f"the gradient's norm is {scale:.3g}x the reference's: each device must differentiate the loss "
                "on its own shard, and the devices' gradients must be averaged")
    return ExerciseResult(name, "failed", hint)


# --- 5. does it fit the chip? (notebook 03) ----------------------------------------------------------------


def _compiled_for(plan: Any, compiled: Any) -> Any:
    """The compiler's record of ``plan``'s step: ``compiled`` waited for if it is a job, else the plan's own."""
    record = plan.compiled if compiled is None else compiled
    if record is None:
        raise WorkbenchError("nothing to judge by: pass the compile of this plan's step (job = "
                             "wb.start_plan_verification(plan)) or a verified plan (plan_training(..., verify='cpu'))")
    if hasattr(record, "result"):  # a VerificationJob: the answer was given while it compiled
        record = record.result()
    if record.mesh != str(plan.mesh):
        raise WorkbenchError(f"the compiled step is for mesh {record.mesh} but the plan is for {plan.mesh}: "
                             "verify this plan's own step (wb.start_plan_verification(plan))")
    return record


def check_fits_chip(answer: Any, plan: Any, compiled: Any = None, *, name: str = "fits-the-chip") -> ExerciseResult:
    """Check a prediction of whether ``plan``'s step fits its chip: ``True`` if the compiler's peak per device
    is at most ``plan.device_memory``, else ``False``. The compiler is the judge, not the plan's own figure
    (XLA:CPU's, libtpu's or XLA:GPU's, whichever compiled it). ``name`` names the exercise.

    ``compiled`` is the compiler's record of the same step: a :class:`~workbench.analysis.VerificationJob` (waited
    for, so the learner answers while it compiles), a :class:`~workbench.analysis.CompiledStep`, or None when
    ``plan`` is verified (``plan.compiled``). A failed compile raises its WorkbenchError.

    Example (``plan``: ``plan_training("mlp", {}, "data=8", "dp", hardware="cpu", verify="cpu")``, verified):
        >>> check_fits_chip(True, plan).passed
        True
        >>> check_fits_chip(False, plan).message
        "it fits: the compiler's peak is ... per device, ...; the plan said ..."
    """
    if (result := _unanswered(name, answer)) is not None:
        return result
    if not isinstance(answer, (bool, np.bool_)):
        return ExerciseResult(name, "failed", f"give True (it fits) or False (it does not), not {answer!r}")
    step = _compiled_for(plan, compiled)
    peak, memory, chip = step.peak_bytes, plan.device_memory, plan.hardware.name
    fits = peak <= memory
    said = (f"the compiler's peak is {format_bytes(peak)} per device, {peak / memory:.0%} of the "
            f"{format_bytes(memory)} of a {chip} chip; the plan said {format_bytes(plan.peak_bytes)}")
    if bool(answer) == fits:
        return ExerciseResult(name, "passed", f"it {'fits' if fits else 'does not fit'}: {said}")
    parts = (f"arguments (the state and the batch) are {format_bytes(step.argument_bytes)} and its temporaries "
             f"(gradients, activations of {plan.examples_per_device:,} examples per device, what the mode gathers) "
             f"{format_bytes(step.temp_bytes)}")
    if fits:
        hint = (f"it fits: {said}. Spread over {plan.data_parallel_size:,} data-parallel devices, its {parts}: "
                "count what one device holds, not the whole model")
    else:
        hint = (f"it does not fit: {said}. Its {parts}: the plan's transients are rough, so a plan near or under "
                "the limit is not a promise until the compiler agrees")
    return ExerciseResult(name, "failed", hint)


# --- 6. which rows each process loads (notebook 02, part 8) --------------------------------------------------

# The exercise: the rows of each global batch of 64 that process 1 of 2 loads, for each mesh (and its mode).
PROCESS_ROWS_MESHES = {"data=8": "dp", "data=4,model=2": "dp-tp", "model=2,data=4": "dp-tp"}
PROCESS_ROWS_BATCH, PROCESS_ROWS_PROCESSES, PROCESS_ROWS_ASKED = 64, 2, 1


@dataclasses.dataclass(frozen=True)
class ProcessRows:
    """What one process of a run across processes holds: its devices, and the rows of each global batch it loads.

    Attributes:
        devices: the positions in ``jax.devices()`` of its devices (jax.distributed lists process 0's devices
            first, then process 1's, and so on, an equal block each; the modes build their mesh in that order).
        batch_positions: those devices' positions along the mode's batch axis (empty: the batch is not split).
        share: the rows it loads, as :func:`~workbench.training.process_share.batch_share` computes them.
    """

    devices: tuple[int, ...]
    batch_positions: tuple[int, ...]
    share: Any  # a ProcessShare

    @property
    def rows(self) -> range:
        return range(self.share.rows.start, self.share.rows.stop)


@dataclasses.dataclass(frozen=True)
class _DeviceOfProcess:
    """A mesh device as a run across processes would see it: its id and the process that holds it."""

    id: int
    process_index: int


def _mesh_across_processes(mesh: Any, processes: int) -> Any:
    """``mesh`` (over this process's devices) with each device marked with the process that would hold it when
    ``processes`` processes train on it: the k-th of ``jax.devices()`` belongs to process k // (size / processes)."""
    order = {device.id: index for index, device in enumerate(jax.devices())}
    per_process = mesh.devices.size // processes
    marked = np.empty(mesh.devices.shape, dtype=object)
    for index, device in np.ndenumerate(mesh.devices):
        marked[index] = _DeviceOfProcess(device.id, order[device.id] // per_process)
    return types.SimpleNamespace(axis_names=mesh.axis_names, shape=mesh.shape, devices=marked)


def process_rows(mesh: str = "data=8", processes: int = 2, batch: int = 64,
                 mode: str = "dp") -> tuple[ProcessRows, ...]:
    """Each process's devices and rows of a global batch of ``batch`` when ``processes`` processes train ``mode``
    on ``mesh``: the engine's :func:`~workbench.training.process_share.batch_share` over the mesh the mode
    builds, its devices given to processes as ``jax.distributed`` does. Runs in one process, no workers.

    Raises:
        WorkbenchError: ``processes`` does not divide the mesh or the batch, or the mode does not train on it.

    Example:
        >>> [share.rows for share in process_rows("data=8", 2, 64)]
        [range(0, 32), range(32, 64)]
    """
    resolved = TrainConfig(mode=mode, mesh=mesh, batch=batch, processes=processes).resolved()
    config, shape = resolved.config, resolved.mesh_shape
    fit = mesh_fit(resolved.mode_class, shape)
    if not fit.ok:
        raise MeshError(fit.message)
    axis = resolved.mode_class.batch_axis
    parts = shape.axis_size(axis) if axis else 1
    if batch % parts:
        raise WorkbenchError(f"global batch {batch} does not split into the {parts} parts of axis {axis!r} of mesh "
                             f"{config.mesh}: use a multiple of {parts}")
    layout = _mesh_across_processes(training_mesh(shape), processes)
    out = []
    for process in range(processes):
        held = [(layout_index, device) for layout_index, device in np.ndenumerate(layout.devices)
                if device.process_index == process]
        where = tuple(layout.axis_names).index(axis) if axis else None
        share = batch_share(layout, axis, batch, process)  # in this one process it counts 1 process: say how many
        out.append(ProcessRows(
            devices=tuple(sorted(device.id for _, device in held)),
            batch_positions=() if where is None else tuple(sorted({index[where] for index, _ in held})),
            share=dataclasses.replace(share, process_count=processes),
        ))
    return tuple(out)


def _span(values: Any) -> str:
    """``4-7`` for consecutive values, else ``0, 2, 5`` (``1, 3, 5, ..., 63 (32 in all)`` when long); ``-`` for none."""
    values = sorted(values)
    if not values:
        return "-"
    if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    if len(values) > 6:
        return f"{', '.join(map(str, values[:3]))}, ..., {values[-1]} ({len(values)} in all)"
    return ", ".join(map(str, values))


def process_rows_table(shares: Any) -> str:
    """:func:`process_rows` as a text table: each process's devices, batch positions and rows.

    Example:
        >>> print(process_rows_table(process_rows("data=8", 2, 64)))
        process  devices  batch positions  rows   examples
        -------  -------  ---------------  -----  --------
        0        0-3      0-3              0-31         32
        1        4-7      4-7              32-63        32
    """
    rows = [[str(s.share.process_index), _span(s.devices), _span(s.batch_positions),
             f"{s.rows.start}-{s.rows.stop - 1}", str(len(s.rows))] for s in shares]
    return "\n".join(align_columns(["process", "devices", "batch positions", "rows", "examples"], rows, right=[4]))


def _as_rows(value: Any) -> tuple[int, ...] | None:
    """A set of rows (``range``, ``slice``, or integers) as sorted row numbers; None if it is none of those."""
    if isinstance(value, slice):
        if value.step not in (None, 1) or value.stop is None:
            return None
        value = range(value.start or 0, value.stop)
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        return None
    rows = [_whole_number(row) for row in value]
    whole = [row for row in rows if row is not None]
    return tuple(sorted(whole)) if len(whole) == len(rows) else None


def _rows_hint(mesh: str, said: tuple[int, ...], asked: ProcessRows, others: tuple[ProcessRows, ...]) -> str:
    """Why ``said`` is not the rows of process ``asked``, pointing at the idea to revisit."""
    truth = tuple(asked.rows)
    devices = len(asked.devices)
    parts = len(set().union(*(s.batch_positions for s in others))) or 1
    per_part = PROCESS_ROWS_BATCH // parts
    if len(said) == 2 < len(truth):
        return "give every row, as range(first, last + 1), not only the first and the last"
    if any(said == tuple(other.rows) for other in others if other is not asked) and said != truth:
        return ("those are another process's rows: jax.devices() lists process 0's devices first, so process "
                f"{PROCESS_ROWS_ASKED} holds devices {_span(asked.devices)}")
    if len(said) == len(truth) and set(said) != set(truth) and said != tuple(range(said[0], said[-1] + 1)):
        return "the batch is split over the devices in blocks of consecutive rows, not interleaved"
    if len(said) == per_part and per_part < len(truth):
        return (f"that is one batch part ({per_part} rows, one position along 'data'); process {PROCESS_ROWS_ASKED} "
                f"holds {devices} devices, at positions {_span(asked.batch_positions)} along 'data'")
    whole = " (all of 'data': this process loads the whole batch)" if len(truth) == PROCESS_ROWS_BATCH else ""
    return (f"process {PROCESS_ROWS_ASKED} holds devices {_span(asked.devices)}; on {mesh} they sit at positions "
            f"{_span(asked.batch_positions)} along 'data'{whole}, and each position holds {per_part} of the "
            f"{PROCESS_ROWS_BATCH} rows")


def check_process_rows(answer: Any) -> ExerciseResult:
    """Check ``{mesh: rows}``: the rows of each global batch of 64 that process 1 of 2 loads, for each mesh of
    :data:`PROCESS_ROWS_MESHES` (rows as a ``range``, a ``slice`` or a list of row numbers). The truth is
    :func:`process_rows`: the engine's ``batch_share`` over the mesh each mode builds.

    Example:
        >>> check_process_rows({"data=8": range(32, 64), "data=4,model=2": range(32, 64),
        ...                     "model=2,data=4": range(64)}).passed
        True
    """
    name = "process-rows"
    if (result := _unanswered_dict(name, answer, PROCESS_ROWS_MESHES, "the rows")) is not None:
        return result
    truths = {mesh: process_rows(mesh, PROCESS_ROWS_PROCESSES, PROCESS_ROWS_BATCH, mode)
              for mesh, mode in PROCESS_ROWS_MESHES.items()}
    wrong = []
    for mesh, shares in truths.items():
        said, asked = _as_rows(answer[mesh]), shares[PROCESS_ROWS_ASKED]
        if said is None or not said:
            wrong.append(f"{mesh}: give the rows as range(first, last + 1), not {answer[mesh]!r}")
        elif said != tuple(asked.rows):
            wrong.append(f"{mesh}: you said {_span(said)}; {_rows_hint(mesh, said, asked, shares)}")
    if wrong:
        return ExerciseResult(name, "failed", "; ".join(wrong))
    said = ", ".join(f"rows {shares[PROCESS_ROWS_ASKED].rows.start}-{shares[PROCESS_ROWS_ASKED].rows.stop - 1} on "
                     f"{mesh}" for mesh, shares in truths.items())
    return ExerciseResult(name, "passed", f"{said}: a process loads the rows its devices hold along 'data'. With "
                          "'model' first, each process's devices span all of 'data', so every process loads the "
                          "whole batch and the processes split the model instead")


__all__ = [
    "BYTES_KEYS", "ExerciseResult", "PROCESS_ROWS_MESHES", "ProcessRows", "all_reduce_truth", "bytes_per_device_truth",
    "check_all_reduce_bytes", "check_bytes_per_device", "check_dominant_collective", "check_fits_chip",
    "check_grad_scale", "check_gradient_sync", "check_process_rows", "check_restored_shard_shape",
    "dominant_collective_truth", "process_rows", "process_rows_table", "regression_loss", "regression_problem",
    "restored_shard_truth",
]


# --- 6. a checkpoint restored onto another layout -------------------------------------------------------

RESTORE_LEAF = "hidden1/kernel"  # the digits MLP's first kernel, 64 x 128
SAVED_UNDER, RESTORED_UNDER = ("fsdp", "data=8"), ("dp-tp", "data=4,model=2")


def restored_shard_truth() -> dict[str, Any]:
    """The leaf's global shape, and its spec and shard shape as saved (fsdp on data=8) and as restored (dp-tp on
    data=4,model=2): the layouts the two modes read and write a checkpoint in, from the layout engine.

    Example:
        >>> restored_shard_truth()["restored_shard"]
        (64, 64)
    """
    saved = model_layout("mlp", SAVED_UNDER[1], SAVED_UNDER[0]).params.leaf(RESTORE_LEAF).layout
    restored = model_layout("mlp", RESTORED_UNDER[1], RESTORED_UNDER[0]).params.leaf(RESTORE_LEAF).layout
    return {"shape": tuple(saved.shape), "saved_shard": tuple(saved.shard_shape),
            "restored_spec": format_spec(restored.spec), "restored_shard": tuple(restored.shard_shape)}


def check_restored_shard_shape(answer: Any) -> ExerciseResult:
    """Check the shard shape (a tuple) each device holds of the MLP's ``hidden1/kernel`` once a checkpoint saved
    under fsdp on ``data=8`` is restored under dp-tp on ``data=4,model=2``.

    Example:
        >>> check_restored_shard_shape((64, 128)).status
        'failed'
    """
    name = "restored-shard-shape"
    if (result := _unanswered(name, answer)) is not None:
        return result
    truth = restored_shard_truth()
    dims = [_whole_number(value) for value in answer] if isinstance(answer, (tuple, list)) else None
    if dims is None or len(dims) != len(truth["shape"]) or None in dims:
        return ExerciseResult(name, "failed", f"give the shard shape as a tuple of {len(truth['shape'])} "
                              "whole numbers, "
                              f"like the kernel's global shape {truth['shape']}, not {answer!r}")
    dims = tuple(dims)
    if dims == truth["restored_shard"]:
        return ExerciseResult(name, "passed", f"under {RESTORED_UNDER[0]} the kernel is laid out "
                              f"P({truth['restored_spec']}): each device reads {dims} of {truth['shape']} straight "
                              "from the checkpoint, whatever layout it was saved in")
    if dims == truth["saved_shard"]:
        hint = (f"that is the shard fsdp saved on {SAVED_UNDER[1]}; a restore reads into the new mode's layout, "
                "not the saved one")
    elif dims == truth["shape"]:
        hint = f"that is the whole kernel: {RESTORED_UNDER[0]} splits it over the 'model' axis (tensor parallelism)"
    else:
        hint = (f"under {RESTORED_UNDER[0]} on {RESTORED_UNDER[1]} the kernel is replicated over 'data' and split over "
                "'model': which dimension does tensor parallelism split for a first layer, and into how many parts?")
    return ExerciseResult(name, "failed", f"you said {dims}; {hint}")


# --- 7. which collective dominates a profiled fsdp step (notebook 02, part 7) ---------------------------------

DOMINANT_MODE = "fsdp"
DOMINANT_KEYS = ("kind", "bytes")
# Why each kind costs what it does in an fsdp step: the pass message's explanation, whichever kind the profile names.
_FSDP_KIND_STORY = {
    "all-gather": "fsdp gathers each layer's parameters before the layer runs, and most of them again for the "
                  "backward pass, so the all-gathers carry more than one copy of the parameters",
    "reduce-scatter": "fsdp reduce-scatters each sharded gradient once, so every device receives only its own slice",
    "all-reduce": "the leaves fsdp cannot split (like the 10-value output bias) are all-reduced whole, as in dp",
}


def _profiled_timeline(report: Any) -> Any:
    """The timeline of ``report``, a profile of an fsdp run with collectives; a WorkbenchError saying why not."""
    if not hasattr(report, "timeline") or not hasattr(report, "folder"):
        raise WorkbenchError(f"nothing to judge by: pass the report of an {DOMINANT_MODE} profile "
                             f"(report = wb.read_profile(trainer.profile(5))), not {type(report).__name__}")
    if report.timeline is None:
        raise WorkbenchError(f"the profile in {report.folder} has no timeline ({report.timeline_error}): profile "
                             "the run again")
    try:
        mode = load_run(Path(report.folder).parent.parent).config.get("mode")
    except RunError:
        mode = None  # a profile folder outside a run folder: judged as it is
    if mode not in (None, DOMINANT_MODE):
        raise WorkbenchError(f"this is a profile of a {mode} run, the exercise asks about {DOMINANT_MODE}: pass "
                             f"the report of the {DOMINANT_MODE} run's profile")
    if not report.timeline.collectives:
        raise WorkbenchError(f"the profiled step in {report.folder} runs no collective: profile an {DOMINANT_MODE} "
                             "run on several devices")
    return report.timeline


def dominant_collective_truth(report: Any) -> dict[str, Any]:
    """What a profiled fsdp step spends its collective time on, read from ``report``'s timeline
    (a :class:`~workbench.analysis.ProfileReport`):

    * ``kind``: the collective kind with the most time per step (first in ``timeline.collective_time_by_kind()``,
      the median time of each of its ops times how often the op runs in a step);
    * ``bytes``: the bytes per device per step of all that kind's ops, each op's bytes from the compiled step's
      ledger times how often it runs (``timeline.collective_bytes_by_kind()``);
    * ``ops``: the bytes of each of that kind's ops, once per run in a step; ``time_us`` and ``bytes_by_kind``:
      the time and the bytes of every kind; ``devices``: the profiled devices.

    Raises:
        WorkbenchError: not a profile report, a profile without a timeline or without collectives, or one of
            another mode than fsdp.

    Example:
        >>> truth = dominant_collective_truth(read_profile("runs/mlp-fsdp"))  # a profiled fsdp run
        >>> truth["bytes"] == truth["bytes_by_kind"][truth["kind"]], truth["devices"]
        (True, 8)
    """
    timeline = _profiled_timeline(report)
    time_us, bytes_by_kind = timeline.collective_time_by_kind(), timeline.collective_bytes_by_kind()
    kind = next(iter(time_us))
    if kind not in bytes_by_kind:
        raise WorkbenchError(f"the profile in {report.folder} does not know the bytes of its {kind} ops (its step's "
                             "HLO is missing): profile the run again")
    ops = tuple(c.bytes for c in timeline.collectives if c.kind == kind for _ in range(c.occurrences))
    return {"kind": kind, "bytes": bytes_by_kind[kind], "ops": tuple(sorted(ops, reverse=True)), "time_us": time_us,
            "bytes_by_kind": bytes_by_kind, "devices": len(timeline.devices)}


def _collective_kind(value: Any) -> str | None:
    """``value`` as one of the ledger's collective kinds (``all_gather``, ``AllGather`` and ``all gather`` too)."""
    if not isinstance(value, str):
        return None
    squashed = value.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    return next((kind for kind in COLLECTIVE_KINDS if kind.replace("-", "") == squashed), None)


def _dominant_bytes_hint(said: int, truth: dict[str, Any]) -> str:
    """Why ``said`` bytes is not what ``truth['kind']`` carries per step, pointing at the idea to revisit."""
    dominant, ops, totals = truth["kind"], truth["ops"], truth["bytes_by_kind"]
    if said in ops and len(ops) > 1:
        return (f"that is one {dominant} op's bytes; the step runs {len(ops)} {dominant} ops (some arrays more than "
                "once): add up every one, each as often as it runs")
    others = [other for other, total in totals.items() if other != dominant and total == said]
    if others:
        return f"that is what the {others[0]} ops carry per step; the question is about the {dominant} ops"
    if said == sum(totals.values()) and len(totals) > 1:
        return f"that counts every collective of the step; count only the {dominant} ops"
    if said * truth["devices"] == truth["bytes"]:
        return ("that is one device's shard; the ledger counts the whole array each op gathers or reduces, per "
                "device")
    if said == truth["bytes"] * truth["devices"]:
        return f"that is summed over the {truth['devices']} devices; give the bytes per device"
    return (f"the step runs {len(ops)} {dominant} ops: add up their bytes per device, each as often as it runs "
            "(part 7's ledger lists each array with its count)")


def check_dominant_collective(answer: Any, report: Any) -> ExerciseResult:
    """Check ``(kind, bytes)`` (or ``{"kind": ..., "bytes": ...}``): the collective kind the profiled fsdp step of
    ``report`` spends the most time in, and the bytes per device that all of that kind's ops carry in one step,
    as :func:`dominant_collective_truth` reads them from the report's timeline. On simulated devices the times
    are noisy, so the kind is the one *this* profile measured.

    Raises:
        WorkbenchError: ``report`` is not a profile of an fsdp run with collectives (see the truth's).

    Example:
        >>> check_dominant_collective(("all-gather", -1), read_profile("runs/mlp-fsdp")).message
        'give the bytes as a whole number, 0 or more, not -1'
    """
    name = "dominant-collective"
    if (result := _unanswered(name, answer)) is not None:
        return result
    if isinstance(answer, dict):
        if (result := _unanswered_dict(name, answer, DOMINANT_KEYS, "your answer")) is not None:
            return result
        said_kind, said_bytes = answer["kind"], answer["bytes"]
    elif isinstance(answer, (tuple, list)) and len(answer) == 2:
        said_kind, said_bytes = answer
        if said_kind in (None, Ellipsis) or said_bytes in (None, Ellipsis):
            return ExerciseResult(name, "unanswered", "replace every ... with your answer and run the cell again")
    else:
        return ExerciseResult(name, "failed", f"give a pair (kind, bytes), like (\"all-reduce\", 1024), or a dict with "
                              f"the keys kind and bytes, not {answer!r}")
    kind, said = _collective_kind(said_kind), _whole_number(said_bytes)
    if kind is None:
        return ExerciseResult(name, "failed", f"{said_kind!r} is not a collective kind: "
                              f"give one of {', '.join(COLLECTIVE_KINDS)}")
    if said is None or said < 0:
        return ExerciseResult(name, "failed", f"give the bytes as a whole number, 0 or more, not {said_bytes!r}")
    truth = dominant_collective_truth(report)
    dominant, time_us = truth["kind"], truth["time_us"]
    collective_us = sum(time_us.values())
    wrong = []
    if kind != dominant:
        mine = (f"{kind} takes {time_us[kind]:,.0f} µs" if kind in time_us
                else f"the step runs no {kind} (its collectives: {', '.join(time_us)})")
        wrong.append(f"you said {kind}, but {mine}; the profile's per-kind times (timeline.collective_time_by_kind()) "
                     f"put another kind first")
        if said == truth["bytes_by_kind"].get(kind):
            wrong.append(f"your {said:,} B is what the {kind} ops carry: give the bytes of the kind that takes the "
                         "most time")
        elif said != truth["bytes"]:
            wrong.append(f"you said {said:,} B: add up the bytes per device of every op of the kind that takes the "
                         "most time, each as often as it runs (part 7's ledger lists each array with its count)")
    elif said != truth["bytes"]:
        wrong.append(f"you said {said:,} B; {_dominant_bytes_hint(said, truth)}")
    if wrong:
        return ExerciseResult(name, "failed", "; ".join(wrong))
    story = _FSDP_KIND_STORY.get(dominant, "")
    return ExerciseResult(name, "passed", f"{dominant} takes {time_us[dominant]:,.0f} of the {collective_us:,.0f} µs "
                          f"per step in collectives ({time_us[dominant] / collective_us:.0%}), and its "
                          f"{len(truth['ops'])} ops carry {truth['bytes']:,} B per device per step" +
                          (f": {story}" if story else "") + ". On simulated devices the times are mostly copying and "
                          "waiting: profile again and the order may change, the bytes will not")


# --- 9. beat the recommender (notebook 03) ---------------------------------------------------------------------

# The fleet of the exercise: the README's 1.3B transformer on 64 H100s (8 hosts of 8), 128 sequences of 2,048 tokens.
# Pure dp is the first guess and twice too slow here: its gradient all-reduce crosses hosts and outlasts the maths.
BEAT_FLEET: dict[str, Any] = {
    "model": "transformer", "target": "gpu:h100:64", "global_batch": 128, "seq_len": 2048,
    "model_options": {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000, "max_len": 2048},
}
LAYOUT_KEYS = ("mode", "mesh", "remat", "accum")
SAME_TIME = 1e-9  # relative: the same layout priced twice is the same float; a tie is a tie


def _priced(layout: dict[str, Any], recommended: Any) -> tuple[Any, StepTime]:
    """``layout`` planned on the fleet ``recommended`` (a Recommendation) was for, by the formulas and on its
    chips (as :func:`recommend` ranks before it simulates), and its step time. WorkbenchError for a layout the
    fleet cannot have (a mesh of another size, a mode the mesh does not suit)."""
    best = recommended.chosen.plan
    plan = plan_training(best.model, dict(best.model_options), str(layout["mesh"]), layout["mode"],
                         hardware=best.hardware, global_batch=recommended.global_batch, seq_len=recommended.seq_len,
                         optimizer=recommended.optimizer, precision=recommended.precision,
                         utilisation=recommended.utilisation, accum=int(layout["accum"]), remat=layout["remat"],
                         simulate=False)
    if plan.mesh.size != recommended.devices:
        raise WorkbenchError(f"the fleet is {recommended.devices:,} chips but mesh {plan.mesh} has "
                             f"{plan.mesh.size:,} devices: use every chip")
    return plan, step_time(plan)


def _why_slower(mine: StepTime, theirs: StepTime, layout: dict[str, Any]) -> str:
    """What to change, from what sets the learner's step time."""
    # Microbatches first: they also double a bf16 jit step's gradient sync (summed float32 accumulators), which is
    # what can make the collectives over 'data' outlast the maths.
    if int(layout["accum"]) > 1 and (mine.bound_kind == "overlapped" or mine.exposed_s > theirs.exposed_s):
        return ("each microbatch repeats the collectives over 'model' on smaller matmuls, and the gradients they "
                "sum are synced in float32: use fewer microbatches while the step fits")
    if mine.bound_kind == "overlapped":
        return ("your collectives over 'data' outlast the maths they should hide behind: shard fewer ways over "
                "'data' (a small 'model' axis inside a host takes the rest) so each chip syncs less")
    if layout["remat"] != "none" and mine.compute_s > theirs.compute_s:
        return "your remat policy recomputes the forward pass: use the lightest policy that still fits"
    if int(layout["accum"]) > 1:
        return ("each microbatch repeats the collectives over 'model' on smaller matmuls: use fewer microbatches "
                "while the step fits")
    if mine.exposed_s > theirs.exposed_s:
        return ("your collectives over 'model' are not overlapped and add to every step: a smaller 'model' axis, "
                "kept within a host's fast links")
    return "compare the compute and collective parts of the two steps above"


def check_beat_the_recommender(answer: Any, fleet: dict[str, Any] | None = None) -> ExerciseResult:
    """Check a layout ``{"mode", "mesh", "remat", "accum"}`` for ``fleet`` (default :data:`BEAT_FLEET`): it passes
    when it fits the chips and its predicted step time is at most that of :func:`recommend`'s choice. Both are
    priced by the planner the same way (the formulas, each collective on the link it crosses, data collectives
    overlapping the maths), and the message says what bounds each.

    Example:
        >>> check_beat_the_recommender({"mode": "dp", "mesh": "data=64", "remat": "none", "accum": 1}).status
        'failed'
    """
    name = "beat-the-recommender"
    fleet = BEAT_FLEET if fleet is None else fleet
    if (result := _unanswered_dict(name, answer, LAYOUT_KEYS, "your layout's setting")) is not None:
        return result
    recommended = recommend(fleet["model"], fleet["target"], fleet["global_batch"], seq_len=fleet.get("seq_len"),
                            model_options=fleet.get("model_options"), top=0, verify=False)
    best = recommended.chosen
    try:
        plan, mine = _priced(answer, recommended)
    except (WorkbenchError, TypeError, ValueError) as error:  # a mesh that is not text, an accum that is no number
        return ExerciseResult(name, "failed", f"that layout cannot run on {fleet['target']}: {error}")
    theirs = best.time
    yours = f"{answer['mode']} on {plan.mesh}, remat {answer['remat']}, {int(answer['accum'])} microbatch(es)"
    ours = f"{best.mode} on {best.mesh}, remat {best.remat}, {best.accum} microbatch(es)"
    if plan.peak_bytes > plan.device_memory:
        return ExerciseResult(name, "failed", f"{yours} needs {format_bytes(plan.peak_bytes)} per chip and an "
                              f"{plan.hardware.name} has {format_bytes(plan.device_memory)}: a faster step that "
                              "does not fit is no step; shard the state (fsdp) or recompute (remat)")
    both = (f"yours, {yours}: {format_seconds(mine.step_s)} a step, bound by {mine.bound}. The recommender's, "
            f"{ours}: {format_seconds(theirs.step_s)}, bound by {theirs.bound}")
    if mine.step_s <= theirs.step_s * (1 + SAME_TIME):
        won = "as fast as" if mine.step_s >= theirs.step_s * (1 - SAME_TIME) else "faster than"
        return ExerciseResult(name, "passed", f"{won} the recommender: {both}")
    return ExerciseResult(name, "failed", f"{mine.step_s / theirs.step_s:.2f}x the recommender's step time: {both}. "
                          f"{_why_slower(mine, theirs, answer)}")
