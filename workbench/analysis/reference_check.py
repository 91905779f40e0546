"""The reference check: is a parallel step computing the update it should? Measured against ``single``.

:func:`reference_check` runs a mode's step for a few steps (at least 3, so a lost optimizer state shows)
next to the ``single`` reference on the same global batches, and measures:

* ``grad_scale``: the norm of the gradient the step applied at step 1 over the reference's (1.00);
* ``param_diffs``: the largest parameter difference from the reference after each step;
* ``replica_divergence``: the largest difference between replicas' copies of a parameter (0.0);
* the gradient-sync diagnostics at step 1 (:func:`~workbench.training.sync_diagnostics.sync_report`): each
  replica's local gradient norm and the synchronised norm, computed independently of the step.

From these alone it reaches a verdict. Each problem is a :class:`Finding` named for its symptom:

=====================  ===========================================================================
``grad-scale``         the applied gradient is not the global batch's mean gradient
``replica-divergence`` replicas hold different parameters after the update
``update-mismatch``    the parameters differ from the reference's
=====================  ===========================================================================

A finding's ``causes`` are the teaching faults (:mod:`workbench.training.modes.faults`) the evidence points to,
most likely first. They are *inferred*, never read off the fault switches, in two ways:

* the size of the error: a gradient ``N`` times too large is a sum where a mean belongs (``psum``, or
  ``vma-double-count`` where the sync is written in shard_map); one whose norm equals a single replica's
  local norm was never averaged (``skip-sync``, ``per-shard-update``);
* replaying each fault on one device from the same start and batches (:func:`fault_trajectories`)
  and keeping the faults whose trajectory reproduces the observed parameters; the closest comes first.

The same measurements would judge a user's own step function: nothing here looks inside the mode.

Example:
    >>> report = run_check("dp-shard-map", model="mlp", mesh="data=4", faults=["psum"])
    >>> report.verdict, {p.name: p.causes for p in report.problems}
    ('problem', {'grad-scale': ('psum', 'vma-double-count'), 'update-mismatch': ('psum', 'vma-double-count')})
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from ..training.config import ResolvedConfig, TrainConfig, validate_positive
from ..training.models import model_class
from ..training.step import build_step
from .findings import Finding
from .ledger import Collective, CommLedger, float_param_bytes, ledger_for_mode
from .model_layout import default_data
from .process_check import ProcessCheckReport, check_across_processes
from ..training.process_share import host_values
from ..errors import WorkbenchError
from ..layout.mesh import parse_mesh
from ..training.modes import StepSetup, build_mode
from ..training.modes.base import ParallelMode, step_sums
from ..training.modes.core import TrainState, means
from ..training.modes.faults import FAULTS
from ..training.sync_diagnostics import SyncReport, state_divergence, sync_report

MIN_STEPS = 3
SCALE_TOLERANCE = 1e-3  # |grad_scale - 1| above this is a finding; correct modes measure ~1e-7
UPDATE_TOLERANCE = 1e-2  # parameter difference, as a fraction of the reference's largest step
# Under bf16 a near-zero gradient can round to the other sign in the sharded sum than in single's, and Adam
# turns that into a full step the other way: ~0.04% of an mlp's parameters differ by 2 x lr on a correct
# step. So bf16 is judged on the RMS difference, as a fraction of the reference's RMS step: correct steps
# measured 0.024-0.028 (dp, data=4, accum 2, Adam), optimizer-reset 0.59 from its second step, skip-sync 0.99.
BF16_UPDATE_TOLERANCE = 0.1
EXPLAINED = 0.1  # a replayed fault explains a mismatch when its residual is under 10% of it
LOCAL_NORM_MATCH = 1e-3  # relative: "the applied gradient's norm is one replica's local norm"

_SUMMING = ("vma-double-count", "psum")  # the faults that sum N gradients where their mean belongs
_UNSYNCED = ("skip-sync", "per-shard-update")
_WRONG_ROWS = ("same-shard",)  # the faults that train on other rows than the global batch's


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What :func:`reference_check` measured and concluded (see the module docstring)."""

    mode: str
    mesh: dict[str, int]
    steps: int
    precision: str  # what was checked: the step's own compute precision, accumulation and global batch
    accum: int
    batch: int
    problems: tuple[Finding, ...]
    grad_scale: float
    grad_norm: float
    reference_grad_norm: float
    param_diffs: tuple[float, ...]
    reference_step: float
    param_rms_diffs: tuple[float, ...]  # the RMS parameter difference per step (what bf16 is judged on)
    reference_rms_step: float
    replica_divergence: float
    sync: SyncReport
    param_bytes: int
    ledger: CommLedger | None
    fault_residuals: dict[str, float]  # each replayed fault's distance from the observed parameters (RMS under bf16)
    remat: str = "none"  # the step's remat policy, which the reference computes with too (a built step's config)

    @property
    def verdict(self) -> str:
        """``"ok"`` when nothing was found, else ``"problem"``."""
        return "problem" if self.problems else "ok"

    @property
    def max_param_diff(self) -> float:
        return max(self.param_diffs, default=0.0)

    def to_json(self) -> dict[str, Any]:
        """The ``workbench check --json`` object: plain values only."""
        return {
            "mode": self.mode,
            "mesh": dict(self.mesh),
            "steps": self.steps,
            "precision": self.precision,
            "remat": self.remat,
            "accum": self.accum,
            "batch": self.batch,
            "verdict": self.verdict,
            "problems": [p.to_json() for p in self.problems],
            "grad_scale": self.grad_scale,
            "grad_norm": self.grad_norm,
            "reference_grad_norm": self.reference_grad_norm,
            "max_param_diff": self.max_param_diff,
            "param_diffs": list(self.param_diffs),
            "reference_step": self.reference_step,
            "param_rms_diffs": list(self.param_rms_diffs),
            "reference_rms_step": self.reference_rms_step,
            "replica_divergence": self.replica_divergence,
            "per_replica_grad_norms": list(self.sync.per_replica_grad_norms),
            "synced_grad_norm": self.sync.synced_grad_norm,
            "cosine_to_synced": list(self.sync.cosine_to_synced),
            "param_bytes": self.param_bytes,
            "collectives": [_collective_json(c) for c in self.ledger.collectives] if self.ledger else [],
            "memory": self.ledger.to_json()["memory"] if self.ledger else None,
            "predicted": self.ledger.to_json()["predicted"] if self.ledger else None,
            "fault_residuals": dict(self.fault_residuals),
        }

    def to_text(self) -> str:
        """A short human-readable report: the verdict, the figures, then each finding in full."""
        replicas = ", ".join(f"{n:.4g}" for n in self.sync.per_replica_grad_norms)
        lines = [
            f"{self.mode} on {parse_mesh(self.mesh)}, {self.steps} steps against 'single': {self.verdict.upper()}",
            f"  step checked       {self.precision}, batch {self.batch}"
            + (f" in {self.accum} microbatches" if self.accum > 1 else "")
            + (f", remat {self.remat}" if self.remat != "none" else ""),
            f"  gradient scale     {self.grad_scale:.6f}  (applied {self.grad_norm:.6g}, reference "
            f"{self.reference_grad_norm:.6g}; 1.000000 expected)",
            f"  parameter diff     {', '.join(f'{d:.3g}' for d in self.param_diffs)}  (per step; the reference "
            f"moves parameters by up to {self.reference_step:.3g} per step)",
            *([f"  RMS diff (bf16)    {', '.join(f'{d:.3g}' for d in self.param_rms_diffs)}  (judged on this: held to "
               f"{BF16_UPDATE_TOLERANCE:.0%} of the reference's RMS step {self.reference_rms_step:.3g})"]
              if self.precision == "bf16" else []),
            f"  replica divergence {self.replica_divergence:.3g}  (0 expected)",
            f"  per-replica norms  {replicas}  -> synchronised {self.sync.synced_grad_norm:.4g}",
        ]
        if self.ledger is not None:
            moved = sum(c.total_bytes for c in self.ledger.collectives)
            lines.append(f"  collectives        {sum(c.count for c in self.ledger.collectives)} per step, "
                         f"{moved:,} B per device "
                         f"(parameters: {self.param_bytes:,} B)")
            memory, predicted = self.ledger.memory, self.ledger.predicted_bytes_per_device
            if memory is not None and predicted is not None:
                lines.append(f"  memory per device  compiler estimate {memory['argument_bytes']:,} B of arguments + "
                             f"{memory['temp_bytes']:,} B temporaries; "
                             f"layout engine prediction {predicted:,} B of state")
        for finding in self.problems:
            causes = ", ".join(finding.causes) if finding.causes else "no known fault"
            lines += ["", f"{finding.name}: {finding.message}", f"  likely cause: {causes}",
                      f"  why: {finding.explanation}", f"  fix: {finding.fix}"]
        return "\n".join(lines)


def _collective_json(collective: Collective) -> dict[str, Any]:
    row = collective.to_json()
    return {key: row[key] for key in ("kind", "bytes", "axes", "count", "dtype")}


# --- replaying faults on one device -----------------------------------------------------------------


class _Replay:
    """One-device re-implementations of a correct step and of each fault, from the same arithmetic."""

    def __init__(self, setup: StepSetup, shards: int, first_process_rows: slice | None = None):
        self.setup, self.shards, self.first_process_rows = setup, shards, first_process_rows
        self.grads = jax.jit(lambda params, other, batch: means(step_sums(setup, params, other, batch))["grads"])
        self.init = jax.jit(setup.optimizer.init)

        def update(params, opt_state, grads, scale):
            grads = jax.tree.map(lambda g: g * scale, grads)
            updates, opt_state = setup.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self.update = jax.jit(update)

    def _shard(self, batch: Any, index: int) -> Any:
        rows = len(jax.tree.leaves(batch)[0]) // self.shards
        return jax.tree.map(lambda x: x[index * rows:(index + 1) * rows], batch)

    def trajectory(self, fault: str | None, state: TrainState, batches: Sequence[Any]) -> list[np.ndarray]:
        """The flattened parameters after each step, as ``fault`` (None: no fault) would leave them."""
        params, opt_state, other = state.params, state.opt_state, state.other
        out = []
        for batch in batches:
            if fault == "optimizer-reset":
                opt_state = self.init(params)
            if fault == "per-shard-update":
                for index in range(self.shards):
                    grads = self.grads(params, other, self._shard(batch, index))
                    params, opt_state = self.update(params, opt_state, grads, 1.0)
            else:
                source = self._shard(batch, 0) if fault == "skip-sync" else batch  # replica 0's own view
                if fault == "same-shard":  # every process's rows are process 0's: the mean is theirs
                    source = jax.tree.map(lambda x: x[self.first_process_rows], batch)
                scale = float(self.shards) if fault in ("psum", "vma-double-count") else 1.0
                params, opt_state = self.update(params, opt_state, self.grads(params, other, source), scale)
            out.append(_flat(params))
        return out


def fault_trajectories(setup: StepSetup, replicas: int, state: TrainState, batches: Sequence[Any],
                       first_process_rows: slice | None = None) -> dict:
    """Fault name -> the parameters after each step (flattened) if the step had that fault.

    ``psum`` and ``vma-double-count`` both apply N times the gradient, so they share one trajectory.
    ``same-shard`` is replayed only across processes: ``first_process_rows`` are the rows process 0 loads.

    Example:
        >>> trajectories = fault_trajectories(mode.setup, 8, state, [batch, batch])  # mode: dp on data=8
        >>> len(trajectories["optimizer-reset"]), trajectories["optimizer-reset"][0].shape  # 2 steps of 26,122 floats
        (2, (26122,))
    """
    replay = _Replay(setup, replicas, first_process_rows)
    summed = replay.trajectory("psum", state, batches)
    out = {}
    for fault in FAULTS:
        if fault in _WRONG_ROWS and first_process_rows is None:
            continue
        out[fault] = summed if fault == "vma-double-count" else replay.trajectory(fault, state, batches)
    return out


def _flat(params: Any) -> np.ndarray:
    leaves = [np.ravel(np.asarray(leaf, np.float64)) for leaf in jax.tree.leaves(host_values(params))]
    return np.concatenate(leaves) if leaves else np.zeros(0)


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values)))) if values.size else 0.0


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray], rms: bool = False) -> float:
    """The largest difference between two trajectories (with ``rms``: the largest per-step RMS difference)."""
    each = (_rms(x - y) if rms else float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))
    return max(each, default=0.0)


# --- running the step ---------------------------------------------------------------------------------


def _run(mode: ParallelMode, state: TrainState, batches: Sequence[Any]) -> tuple[float, list[np.ndarray], float]:
    """(first step's applied gradient norm, flattened params after each step, largest replica divergence)."""
    placed, share = mode.place_state(state), mode.batch_share()
    first_norm, params, divergence = None, [], 0.0
    for batch in batches:
        placed, metrics = mode.step(placed, mode.place_batch(share.take(batch)), diagnostics=True)
        if first_norm is None:
            first_norm = float(jax.device_get(metrics["grad_norm"]))
        params.append(_flat(mode.export_state(placed).params))
        divergence = max(divergence, state_divergence(mode, placed))
    if first_norm is None:
        raise WorkbenchError("the reference check needs at least one batch to step on")
    return first_norm, params, divergence


def _ledger(mode: ParallelMode, state: TrainState, batch: Any) -> CommLedger | None:
    try:
        return ledger_for_mode(mode, mode.place_state(state), mode.place_batch(mode.batch_share().take(batch)))
    except WorkbenchError:  # several programs per step (simulated): no single compiled step to read
        return None


# --- inference -------------------------------------------------------------------------------------------


def _finding(name: str, causes: Sequence[str], message: str, unexplained: tuple[str, str]) -> Finding:
    causes = tuple(dict.fromkeys(causes))
    if causes:
        fault = FAULTS[causes[0]]
        return Finding(name, causes, message, fault.explanation, fault.fix)
    return Finding(name, (), message, *unexplained)


def _by_residual(faults: Sequence[str], residuals: dict[str, float]) -> list[str]:
    order = {fault: index for index, fault in enumerate(faults)}  # ties keep the given order
    return sorted(faults, key=lambda f: (residuals[f], order[f]))


def _summed_causes(mode, reduced_ratio: float | None) -> tuple[str, ...]:
    """The summing faults possible where ``mode`` combines gradients, most likely first.

    The ledger tells them apart when there is one: a double count reduces the gradient twice (jax.grad's
    implicit psum, then the pmean), so the step all-reduces about twice the gradient bytes.
    """
    sync = getattr(mode, "gradient_sync", None)  # a user's own step may not say: then any sum is plausible
    plausible = tuple(f for f in _SUMMING if sync in FAULTS[f].written_in) or ("psum", "vma-double-count")
    if reduced_ratio is not None and len(plausible) > 1:
        twice = abs(reduced_ratio - 2.0) < abs(reduced_ratio - 1.0)
        return ("vma-double-count", "psum") if twice else ("psum", "vma-double-count")
    return plausible


def _grad_scale_finding(mode, scale, applied, sync, residuals, reduced_ratio) -> Finding | None:
    if abs(scale - 1.0) <= SCALE_TOLERANCE:
        return None
    replicas, norms = sync.replicas, sync.per_replica_grad_norms
    named = {f"replica {i}'s local gradient norm": n for i, n in enumerate(norms)}
    named["the mean of the replicas' local gradient norms"] = float(np.mean(norms))
    local = next((what for what, norm in named.items()
                  if norm > 0 and abs(applied / norm - 1) <= LOCAL_NORM_MATCH), None)
    if replicas > 1 and abs(scale / replicas - 1.0) <= 0.01:
        causes = _summed_causes(mode, reduced_ratio)
        message = (f"the applied gradient is {scale:.4f} times the reference's, i.e. {replicas} devices' gradients "
                   f"summed where their mean belongs")
        if reduced_ratio is not None:
            message += f"; the step all-reduces {reduced_ratio:.2f} times the gradient bytes"
    elif local is not None:
        causes = _by_residual(_UNSYNCED, residuals)
        message = (f"the applied gradient's norm {applied:.6g} is {local} (replicas: "
                   f"{', '.join(f'{n:.6g}' for n in norms)}), not the synchronised norm {sync.synced_grad_norm:.6g}: "
                   "the gradients were never averaged")
    elif any(f in residuals and residuals[f] <= min(residuals.values()) for f in _WRONG_ROWS):
        causes = tuple(f for f in _WRONG_ROWS if f in residuals)
        message = (f"the applied gradient is {scale:.4f} times the reference's: it is the gradient of other rows than "
                   "the global batch's")
    else:
        causes = ()
        message = f"the applied gradient is {scale:.4f} times the reference's, matching no known fault"
    return _finding("grad-scale", causes, message, (
        "The step's gradient is not the gradient of the global batch's mean loss.",
        "Compare your gradient with the single-device gradient on the same batch, leaf by leaf.",
    ))


def _divergence_finding(divergence: float) -> Finding | None:
    if divergence <= 0.0:
        return None
    message = (f"replicas' copies of the same parameter differ by up to {divergence:.3g} after the update "
               "(0 when every replica applies the same synchronised update)")
    return _finding("replica-divergence", ("skip-sync",), message, ("", ""))


def _fraction(diff: float, step: float) -> float:
    """``diff`` as a fraction of the reference's ``step`` (any difference is infinitely large next to no step)."""
    return diff / step if step else (math.inf if diff else 0.0)


def _update_finding(mode, diffs, reference_step, residuals, reduced_ratio, rms=None) -> Finding | None:
    """The parameters differ from single's beyond round-off: judged on the largest difference, or under
    bf16 (``rms`` = (RMS differences, the reference's RMS step)) on the RMS difference."""
    worst = max(diffs if rms is None else rms[0], default=0.0)  # what the replays' residuals are measured like
    if rms is None:
        measured, allowed, judged = [_fraction(d, reference_step) for d in diffs], UPDATE_TOLERANCE, ""
    else:
        measured, allowed = [_fraction(d, rms[1]) for d in rms[0]], BF16_UPDATE_TOLERANCE
        judged = (f"; under bf16 the RMS difference is {max(measured):.3g} of the reference's RMS step (held to "
                  f"{allowed:.0%})")
    if max(measured, default=0.0) <= allowed:
        return None
    first = next(i for i, m in enumerate(measured) if m > allowed) + 1
    summed = _summed_causes(mode, reduced_ratio)
    impossible = {"psum", "vma-double-count"} - set(summed)  # e.g. no double count without check_vma
    ranked = [f for f in residuals if residuals[f] <= EXPLAINED * worst and f not in impossible]
    ranked = sorted(ranked, key=lambda f: (residuals[f], summed.index(f) if f in summed else len(summed)))
    matched = f"step {first - 1} matches" if first > 1 else "the first step already differs"
    message = (f"the parameters differ from single's by up to {worst:.3g} (per step: "
               f"{', '.join(f'{d:.3g}' for d in diffs)}; {matched}); the reference moves them by up to "
               f"{reference_step:.3g} per step{judged}")
    if ranked:
        message += f"; replaying {ranked[0]!r} on one device reproduces them to {residuals[ranked[0]]:.3g}"
    return _finding("update-mismatch", ranked, message, (
        "The step applies a different update from the single-device reference, and none of the known "
        "faults reproduces it.",
        "Run your step and the single-device step side by side on one batch and compare the gradients, "
        "then the optimizer state, then the update.",
    ))


# --- the check --------------------------------------------------------------------------------------------


def reference_check(mode: ParallelMode, state: TrainState, batches: Sequence[Any], *,
                    ledger: bool = True) -> CheckReport:
    """Check ``mode`` against ``single`` for ``len(batches)`` steps (see the module docstring).

    ``state`` is the host state to start from (``init_state(model, mode.setup.optimizer)``), ``batches``
    at least :data:`MIN_STEPS` global NumPy batches of ``mode.setup.global_batch`` rows. ``ledger`` adds
    the compiled step's collectives (for modes that compile one program per step).

    Example:
        >>> import itertools
        >>> from workbench.training.data import load_dataset
        >>> from workbench.training.models import build_model, model_class
        >>> from workbench.training.modes.core import init_state
        >>> graphdef, state = init_state(build_model("mlp"), optax.sgd(0.1))
        >>> setup = StepSetup(graphdef, model_class("mlp").loss, optax.sgd(0.1), parse_mesh("data=8"), 64)
        >>> batches = list(itertools.islice(load_dataset("digits").batches(64, seed=0), MIN_STEPS))
        >>> report = reference_check(build_mode("dp", setup), state, batches)
        >>> report.verdict, round(report.grad_scale, 6)
        ('ok', 1.0)
    """
    batches = list(batches)
    if len(batches) < MIN_STEPS:
        raise WorkbenchError(
            f"the reference check needs at least {MIN_STEPS} batches (steps), got {len(batches)}: a fault in "
            "the optimizer state only shows from the second update on"
        )
    reference = build_mode("single", dataclasses.replace(mode.setup, faults=()))
    sync = sync_report(mode, mode.place_state(state), mode.batch_share().take(batches[0]))
    applied, observed, divergence = _run(mode, state, batches)
    expected_norm, expected, _ = _run(reference, state, batches)
    start = _flat(state.params)
    # Each step's size: consecutive states (start, 1), (1, 2), ... (zip stops at the shorter list on purpose).
    reference_step = max(float(np.max(np.abs(b - a), initial=0.0))
                         for a, b in zip([start, *expected], expected, strict=False))
    diffs = tuple(float(np.max(np.abs(o - e), initial=0.0)) for o, e in zip(observed, expected, strict=True))
    reference_rms = max(_rms(b - a) for a, b in zip([start, *expected], expected, strict=False))
    rms_diffs = tuple(_rms(o - e) for o, e in zip(observed, expected, strict=True))
    bf16 = mode.setup.precision == "bf16"
    across = jax.process_count() > 1 and not mode.batch_share(0).whole
    replays = fault_trajectories(mode.setup, max(1, mode.data_parallel_size), state, batches,
                                 mode.batch_share(0).rows if across else None)
    residuals = {fault: _max_diff(observed, path, rms=bf16) for fault, path in replays.items()}
    scale = applied / expected_norm if expected_norm > 0 else math.inf
    param_bytes = float_param_bytes(state.params)
    compiled = _ledger(mode, state, batches[0]) if ledger else None
    reduced_ratio = compiled.bytes_by_kind().get("all-reduce", 0) / param_bytes if compiled and param_bytes else None
    found = (
        _grad_scale_finding(mode, scale, applied, sync, residuals, reduced_ratio),
        _divergence_finding(divergence),
        _update_finding(mode, diffs, reference_step, residuals, reduced_ratio,
                        (rms_diffs, reference_rms) if bf16 else None),
    )
    return CheckReport(
        mode=mode.name,
        mesh=dict(mode.setup.mesh.axes),
        steps=len(batches),
        precision=mode.setup.precision,
        accum=mode.setup.accum,
        batch=mode.setup.global_batch,
        problems=tuple(f for f in found if f is not None),
        grad_scale=scale,
        grad_norm=applied,
        reference_grad_norm=expected_norm,
        param_diffs=diffs,
        reference_step=reference_step,
        param_rms_diffs=rms_diffs,
        reference_rms_step=reference_rms,
        replica_divergence=divergence,
        sync=sync,
        param_bytes=param_bytes,
        ledger=compiled,
        fault_residuals=residuals,
    )


def check_built_step(built, *, steps: int | None = None, ledger: bool = True) -> CheckReport:
    """:func:`reference_check` of a :class:`~workbench.training.step.BuiltStep` on its own first batches:
    the step exactly as it trains (accumulation, precision, data and model options, faults, custom model).

    Example:
        >>> check_built_step(build_step(TrainConfig(mode="dp", batch=64, accum=2, precision="bf16"))).verdict
        'ok'
    """
    steps = MIN_STEPS if steps is None else steps
    validate_positive("steps", steps, "--steps 3", integer=True)
    if steps < MIN_STEPS:
        raise WorkbenchError(f"steps={steps} is too few: the reference check needs at least {MIN_STEPS}, "
                             "e.g. --steps 3")
    report = reference_check(built.mode, built.state, built.first_whole_batches(steps), ledger=ledger)
    return dataclasses.replace(report, remat=built.config.remat)


def run_check(config: Any, *, steps: int = MIN_STEPS, ledger: bool = True,
              **options: Any) -> CheckReport | ProcessCheckReport:
    """The reference check of a training configuration: built by the trainer's own
    :func:`~workbench.training.step.build_step`, so what is checked is exactly what would train.

    ``config`` is a :class:`~workbench.TrainConfig` or the record :meth:`~workbench.TrainConfig.resolved` made of
    one where it entered (a widget's); a :class:`~workbench.Trainer` (its own step, custom model included); a
    :class:`~workbench.training.BuiltStep`; or a mode name with the config's fields as keywords
    (``model``, ``mesh``, ``faults``, ``batch``, ``lr``, ``optimizer``, ``data``, ``seed``, ``accum``,
    ``precision``, ``model_options``, ...; defaults for a quick check: mesh ``data=4``, batch 64, Adam).
    Everything is checked before anything compiles; a bad value raises a WorkbenchError naming it.

    A config with ``processes`` >= 2 is checked by that many processes on this machine
    (:func:`~workbench.analysis.process_check.check_across_processes`): the mode on each process's own rows.

    Example:
        >>> run_check("dp", mesh="data=8").verdict
        'ok'
        >>> run_check(TrainConfig(mode="fsdp", precision="bf16", accum=2, batch=64)).verdict
        'ok'
    """
    if isinstance(config, str):
        options = {"mesh": "data=4", "batch": 64, "optimizer": "adam", "lr": 1e-3, **options}
        model = options.setdefault("model", "mlp")
        model_class(model)  # an unknown model: its own message, before the data is chosen
        if options.get("data") is None:
            options["data"] = default_data(model)
        options["model_options"] = dict(options.get("model_options") or {})
        config = TrainConfig(mode=config, **options)
    elif options:
        raise WorkbenchError(f"run_check(config, ...) takes no other settings ({', '.join(options)}): "
                             "put them in the TrainConfig")
    across = config
    if isinstance(across, ResolvedConfig):  # resolved where it entered: how many processes is its config's
        across = across.config
    if getattr(across, "processes", 1) > 1 and jax.process_count() == 1:  # its own processes, on this machine
        return check_across_processes(across.validated(), steps=steps)
    if hasattr(config, "build") and callable(config.build):  # a Trainer: exactly the step it trains
        config = config.build()
    built = config if hasattr(config, "mode") and hasattr(config, "first_batches") else build_step(config)
    return check_built_step(built, steps=steps, ledger=ledger)
