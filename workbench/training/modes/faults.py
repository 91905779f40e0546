"""Teaching faults: the classic data-parallel bugs, written into the modes so a workshop can watch them.

Each fault is the mistake exactly as it is commonly written, switched on per run
(``StepSetup(..., faults=("psum",))``, ``TrainConfig(faults=[...])``, ``workbench train --inject psum``).
No fault is ever on unless asked for. A mode lists the faults that make sense in it
(``supported_faults``); asking for another raises before anything compiles.

=====================  ====================================  ======================================
fault                  what the step does wrong              modes
=====================  ====================================  ======================================
``skip-sync``          no pmean: each replica updates with   dp-pmap
                       its own local gradient
``psum``               psum instead of pmean: the gradient   simulated, dp-shard-map, dp-pmap
                       is N times too large
``per-shard-update``   one optimizer update per shard:       simulated
                       N updates per step
``vma-double-count``   shard_map + pmean without pcast:      dp-shard-map
                       grad is already summed, N times
``optimizer-reset``    the optimizer state is rebuilt every  every mode
                       step (momentum and Adam moments lost)
``same-shard``         every process loads process 0's rows  every mode that splits the batch over
                       of the global batch                   processes (``--processes 2`` or more)
=====================  ====================================  ======================================

The reference check (:mod:`workbench.analysis.reference_check`) never reads these switches: it measures a
step against ``single`` and infers which of these faults the evidence points to, as it would for a
user's own step function. The explanations and fixes below are what it prints.

Example:
    >>> FAULTS["psum"].summary
    'psum instead of pmean: the gradient is N times too large'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from ...errors import WorkbenchError
from .registry import modes_supporting


@dataclasses.dataclass(frozen=True)
class Fault:
    """A teaching fault: its name, what goes wrong, why, the fix, and where the mistake can be written:
    ``written_in`` lists the gradient syncs (a mode's ``gradient_sync``) whose code can contain it."""

    name: str
    summary: str
    explanation: str
    fix: str
    written_in: tuple[str, ...] = ("none", "loop", "compiler", "shard_map", "pmap")


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault(
            "skip-sync",
            "no gradient all-reduce: each replica applies its own local gradient",
            "Each device computed the gradient of its own shard of the batch and applied it without "
            "averaging with the others, so every replica took a different step and the copies of the "
            "parameters drifted apart. The model no longer learns from the global batch, and which "
            "replica you save decides which model you get.",
            "Average the gradients over the data axis before the update: grads = lax.pmean(grads, 'data') "
            "(or let jit insert the all-reduce: mode 'dp').",
            written_in=('loop', 'shard_map', 'pmap'),
        ),
        Fault(
            "psum",
            "psum instead of pmean: the gradient is N times too large",
            "The per-device gradients were summed, not averaged, so the update uses N times the gradient of "
            "the global batch's mean loss. With SGD that multiplies the learning rate by N (and can diverge); "
            "Adam divides the scale away almost exactly, which is why this bug hides for so long.",
            "Average the gradients with pmean over the data axis (lax.pmean(grads, 'data')), or divide the "
            "psum by the axis size.",
            written_in=('loop', 'shard_map', 'pmap'),
        ),
        Fault(
            "per-shard-update",
            "one optimizer update per shard: N updates per step",
            "The optimizer was applied once per shard, each time with that shard's gradient, so one step "
            "made N small-batch updates in sequence instead of one update with the averaged gradient. "
            "It trains, but as a small-batch run with N times the steps, and no longer as data parallelism.",
            "Sum (or average) the shards' gradients first, then call the optimizer once per step.",
            written_in=('loop',),
        ),
        Fault(
            "vma-double-count",
            "shard_map + pmean without pcast: jax.grad already summed the gradient",
            "Inside shard_map with check_vma=True the parameters arrive replicated (unvarying over 'data'). "
            "The transpose of the implicit replicated-to-varying cast is a psum, so jax.grad already returned "
            "the SUM of the devices' gradients; the pmean after it averages N identical sums, which is still "
            "the sum: N times the right gradient.",
            "Mark the parameters per-device before differentiating, params = lax.pcast(params, 'data', "
            "to='varying'), then pmean the gradients; or drop the pmean and divide the already-summed "
            "gradient by the axis size.",
            written_in=('shard_map',),
        ),
        Fault(
            "optimizer-reset",
            "the optimizer state is rebuilt every step",
            "The optimizer state (momentum, Adam's moments and step count) was re-initialised before every "
            "update, so each step acts like the first: Adam's bias correction makes it a sign-like step of "
            "size lr, and momentum never builds up. The first step matches; every later one differs.",
            "Create the optimizer state once (opt_state = tx.init(params)) and carry the returned state "
            "from each step into the next (including through shard_map / pmap outputs).",
        ),
        Fault(
            "same-shard",
            "every process loads the same shard of the global batch",
            "Training across processes, each process must load its own rows of the global batch: the rows its "
            "devices hold. Here every process loaded process 0's rows, so the global batch is process 0's shard "
            "repeated, the other rows are never seen, and the gradient is that one shard's. Nothing crashes, "
            "and the loss still falls: the model just trains on a fraction of the data.",
            "Load the rows of jax.process_index(): the rows this process's devices hold (mode.batch_share() "
            "says which), then join the parts with jax.make_array_from_process_local_data.",
        ),
    )
}


def validate_faults(
    faults: Iterable[str], mode: str, supported: Iterable[str], reasons: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """``faults`` as a tuple, or a WorkbenchError naming the unknown or unsupported one and the fix.

    Example:
        >>> validate_faults(["psum"], "dp", ("optimizer-reset",), {"psum": "it has no hand-written gradient reduction"})
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: fault 'psum' does not apply to mode 'dp' (it has no hand-written ...
    """
    if isinstance(faults, str):
        faults = [f.strip() for f in faults.split(",") if f.strip()]
    faults = tuple(faults)
    supported = tuple(supported)
    for fault in faults:
        if fault not in FAULTS:
            raise WorkbenchError(f"unknown fault {fault!r}: choose from {', '.join(FAULTS)}")
        if fault not in supported:
            where = modes_supporting(fault)
            why = (reasons or {}).get(fault, "it does not apply there")
            raise WorkbenchError(f"fault {fault!r} does not apply to mode {mode!r} ({why}): "
                                 f"use it in mode {_or_list(where)}")
    if len(set(faults)) != len(faults):
        raise WorkbenchError(f"faults {list(faults)} name one fault twice: list each once")
    return faults


def _or_list(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
