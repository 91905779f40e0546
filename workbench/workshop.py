"""Exercises of the workshop notebooks, each with a check the student runs on their own answer.

A check measures the truth with the engine (layouts, the compiled step's ledger, the reference check,
a real ``shard_map`` on the simulated devices) and compares the student's answer with it. It never
raises on a wrong or missing answer: it returns an :class:`ExerciseResult` whose message says what is
wrong and points at the idea to revisit, and which shows as one line in a notebook.

============================  ==============================================================
:func:`check_bytes_per_device`  predict bytes per device of the MLP's kernels under dp and fsdp
:func:`check_all_reduce_bytes`  predict what the compiler's all-reduce carries per dp step
:func:`check_grad_scale`        predict the gradient scale of the ``psum`` fault on N devices
:func:`check_gradient_sync`     fix a shard_map step whose gradients come out N times too large
:func:`check_fits_chip`         predict whether a planned layout fits its chip, before the compiler answers
:func:`check_restored_shard_shape`  predict a leaf's shard shape once an fsdp checkpoint is restored under dp-tp
============================  ==============================================================

Example:
    >>> check_bytes_per_device(...).status
    'unanswered'
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

WORKSHOP_DEVICES = 8  # the notebook's simulated devices; the checks use fewer if the machine has fewer
_MARKS = {"passed": "✅ correct", "failed": "❌ not yet", "unanswered": "✏️ not answered yet"}


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
    from .analysis.model_layout import model_layout

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
    if (result := _unanswered(name, answer)) is not None:
        return result
    if not isinstance(answer, dict) or set(answer) != set(BYTES_KEYS):
        return ExerciseResult(name, "failed", f"give a dict with exactly the keys {', '.join(BYTES_KEYS)}")
    if any(value is Ellipsis or value is None for value in answer.values()):
        return ExerciseResult(name, "unanswered", "replace every ... with a number of bytes and run the cell again")
    truth = bytes_per_device_truth(WORKSHOP_DEVICES)
    hints = {
        "kernel_dp": "data parallelism keeps a whole copy on every device: 64 x 128 float32 values",
        "kernel_fsdp": f"fsdp splits the largest dimension divisible by {WORKSHOP_DEVICES} over 'data'",
        "bias_fsdp": f"10 does not divide by {WORKSHOP_DEVICES}: such a leaf cannot be split evenly",
    }
    wrong = [f"{key}: you said {answer[key]!r}; {hints[key]}" for key in BYTES_KEYS if _whole_number(answer[key]) != truth[key]]
    if wrong:
        return ExerciseResult(name, "failed", "; ".join(wrong))
    return ExerciseResult(name, "passed", f"{truth['kernel_dp']:,} B whole, {truth['kernel_fsdp']:,} B as one of "
                          f"{WORKSHOP_DEVICES} shards, and the bias stays whole ({truth['bias_fsdp']} B) on every device")


# --- 2. the all-reduce the compiler inserts -------------------------------------------------------


def all_reduce_truth(devices: int = WORKSHOP_DEVICES) -> tuple[int, int]:
    """(gradient bytes of the digits MLP, all-reduce bytes of its compiled dp step on ``data=devices``)."""
    from .analysis.model_layout import model_layout
    from .analysis.step_ledger import ledger_for_config
    from .training.config import TrainConfig

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
    from .analysis.reference_check import run_check

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
        return ExerciseResult(name, "failed", f"give a function local_gradients(params, shard), not {local_gradients!r}")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .layout.mesh import build_mesh

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
    except Exception as error:  # the student's code: any failure is feedback, not a crash
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        hint = ""
        if "out_specs" in str(error) or "vary" in str(error):
            hint = ("; the result still varies over 'data': reduce it across devices (lax.pmean) so every "
                    "device returns the same gradient")
        return ExerciseResult(name, "failed", f"your step raised {type(error).__name__}: {first_line[:300]}{hint}")
    if jax.tree.structure(grads) != jax.tree.structure(reference):
        return ExerciseResult(name, "failed", "return the gradients with the same structure as params: {'w': ..., 'b': ...}")
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
    from .errors import WorkbenchError

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


def check_fits_chip(answer: Any, plan: Any, compiled: Any = None) -> ExerciseResult:
    """Check a prediction of whether ``plan``'s step fits its chip: ``True`` if the compiler's peak per device
    is at most ``plan.device_memory``, else ``False``. The compiler is the judge, not the plan's own figure.

    ``compiled`` is the compiler's record of the same step: a :class:`~workbench.VerificationJob` (waited
    for, so the learner answers while it compiles), a :class:`~workbench.CompiledStep`, or None when
    ``plan`` is verified (``plan.compiled``). A failed compile raises its WorkbenchError.

    Example:
        >>> plan = plan_training("mlp", {}, "data=16", "fsdp", device_memory="1GiB")  # doctest: +SKIP
        >>> check_fits_chip(True, plan, start_plan_verification(plan)).passed  # doctest: +SKIP
        True
    """
    from .formatting import format_bytes

    name = "fits-the-chip"
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


__all__ = [
    "BYTES_KEYS", "ExerciseResult", "all_reduce_truth", "bytes_per_device_truth", "check_all_reduce_bytes",
    "check_bytes_per_device", "check_fits_chip", "check_grad_scale", "check_gradient_sync", "regression_loss",
    "regression_problem",
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
    from .analysis.model_layout import model_layout
    from .layout.specs import format_spec

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
        return ExerciseResult(name, "failed", f"give the shard shape as a tuple of {len(truth['shape'])} whole numbers, "
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
