"""Which layout should I use? :func:`recommend` weighs every mode, mesh, remat policy and microbatch count a fleet
allows, ranks them by predicted step time, and compiles the best with the target's compiler.

Three passes, each dearer and on fewer layouts: every choice (:mod:`.layout_search`) is planned with the
analytic formulas (:func:`~.planning.plan_training` with ``simulate=False``, a fraction of a second each) and
ranked by :func:`~.step_time.step_time`; the fastest are re-planned with their memory simulated from the traced
step until ``top`` fit; those are compiled for the target in child processes (:mod:`.verification`, each with a
time limit, all stopped on every way out) and re-ranked on the compiler's peak and collective bytes, with every
disagreement named. The records are in :mod:`.recommendation`. Why three passes: docs/design/recommend.md.

Example:
    >>> rec = recommend("mlp", "cpu", 64, verify=False)
    >>> rec.chosen.fits, rec.analysed >= 8
    (True, True)
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from ..errors import StepDoesNotFit, VerificationError, WorkbenchError, nearest_multiples
from ..formatting import format_bytes, format_seconds
from ..layout.mesh import DATA_AXIS, MODEL_AXIS, MeshShape
from ..training.modes import mode_class
from .compile_target import DEVICES_PER_CHIP, parse_target, validate_target
from .cost_model import DEFAULT_UTILISATION
from .cost_model import hardware as lookup_hardware
from .layout_search import MAX_TENSOR_PARALLEL, LayoutChoice, candidate_modes, layout_choices, remat_choices
from .plan_estimates import flops_per_device
from .planned_model import resolve_planned_model
from .planning import plan_training
from .recommendation import Candidate, FamilyVerdict, Recommendation
from .step_time import step_time
from .exported_step import OwnModel
from .verification import VerificationJob, VerifySettings, start_plan_verification

DEFAULT_TOP = 3
VERIFY_TIMEOUT_S = 600.0  # per compile; the 1.3B model on 512 chips compiles in well under a minute on 2 cores
# How far the compiler's figures may stray from the plan's before the table says so.
PEAK_TOLERANCE = 0.25
BYTES_TOLERANCE = 1.5
SIMULATION_BUDGET_S = 60.0  # each round of the second pass stops simulating after this long, with what fits so far
# Rounds of compiles after the first, each replacing the layouts the compiler turned down in the one before; a
# refused layout's replacement can be refused in turn where the plan is under the compiler all along.
REPLACEMENT_ROUNDS = 2
POLL_S = 0.1  # how often the wait for the compiles looks at ``stop``
ProgressFn = Callable[[str], None]


class RecommendationError(WorkbenchError):
    """No layout for this model, batch and fleet: no mesh splits the batch, or none fits the chips' memory."""


def recommend(model: Any, target: Any, global_batch: int | None = None, *, seq_len: int | None = None,
              global_batch_tokens: int | None = None, model_options: dict[str, Any] | str | None = None,
              optimizer: str = "adamw", precision: str = "bf16", utilisation: float = DEFAULT_UTILISATION,
              devices: int | None = None, device_memory: int | str | None = None, top: int = DEFAULT_TOP,
              verify: bool = True, timeout: float = VERIFY_TIMEOUT_S, rules: Any = None, loss: Any = None,
              example_batch: Any = None, on_progress: ProgressFn | None = None,
              stop: threading.Event | None = None) -> Recommendation:
    """Recommend a layout (mode, mesh, remat, microbatches) for ``model`` trained on ``target``'s chips.

    Args:
        model, model_options: a registered model's name and preset overrides, or your own ``nnx.Module`` (as
            :func:`~.planning.plan_training` takes it; with ``rules``, ``loss`` and ``example_batch`` there too).
        target: ``"gpu:h100:512"``, ``"tpu:v5p:8x8x8"`` or ``"cpu"`` (``devices`` simulated CPU devices, default
            those JAX has): the chips, their hardware preset and the compiler that verifies.
        global_batch: sequences (examples) per step; or ``global_batch_tokens`` with ``seq_len``.
        optimizer, precision, utilisation, device_memory: as :func:`~.planning.plan_training` takes them.
        top: how many of the best layouts to simulate and compile (0: none).
        verify: compile the ``top`` layouts for the target; False ranks on the plan alone (marked unverified).
            Your own module (given ``example_batch``), and any model with ``rules``, is traced and exported here
            and compiled there (:mod:`.exported_step`); without an ``example_batch`` its ranking is the plan's,
            and ``verification_note`` says what to pass.
        timeout: seconds each compile may take.
        on_progress: called with a line of text as each stage goes.
        stop: an event another thread sets to stop it (a widget's Cancel): the compiles are killed and
            :class:`~workbench.errors.VerificationError` is raised within a fraction of a second.

    Raises :class:`RecommendationError` when no layout splits the batch (naming the nearest batches that work)
    or none fits (naming the smallest fleet, or the largest batch, that would), and a
    :class:`~workbench.errors.WorkbenchError` for bad input. A compiler that is not installed is not an error:
    the answer is the plan's, marked unverified, and ``verification_note`` says how to install it.

    Example:
        >>> rec = recommend("transformer", "gpu:h100:512", 1024, seq_len=2048,  # doctest: +SKIP
        ...                 model_options={"d_model": 2048, "n_layers": 24, "n_heads": 16, "max_len": 2048})
        >>> print(rec.to_text())  # doctest: +SKIP
        >>> rec = recommend(lambda: MyMLP(rngs=nnx.Rngs(0)), "tpu:v5e:4x4", 256, loss=my_loss,  # doctest: +SKIP
        ...                 example_batch={"x": np.zeros((8, 256)), "y": np.zeros((8, 1))},
        ...                 rules=[("up/kernel", "None, model"), ("down/kernel", "model, None")])
        >>> rec.chosen.compiler_peak_bytes  # doctest: +SKIP
    """
    say = on_progress or (lambda text: None)
    parsed = parse_target(target)
    hw = lookup_hardware(parsed.hardware or "cpu")
    chips = _chips(parsed, devices)
    _validate_top(top)
    notes: list[str] = []
    planned = resolve_planned_model(model, model_options, seq_len, notes)
    options = planned.options if planned.registered else None
    batch = _global_batch(global_batch, global_batch_tokens, seq_len)
    heads = getattr(planned.abstract, "n_heads", None)
    max_model = min(MAX_TENSOR_PARALLEL, hw.devices_per_host or MAX_TENSOR_PARALLEL)
    choices, no_layout = layout_choices(model, chips, batch, max_model, heads if isinstance(heads, int) else None)
    if not choices:
        raise RecommendationError(_no_split_message(batch, chips, max_model, no_layout))

    def plan(choice: LayoutChoice, simulate: bool, examples: int = batch) -> Any:
        return plan_training(model, options, choice.mesh, choice.mode, optimizer=optimizer, hardware=hw,
                             device_memory=device_memory, global_batch=examples, seq_len=seq_len, precision=precision,
                             accum=choice.accum, utilisation=utilisation, rules=rules, loss=loss,
                             example_batch=example_batch, simulate=simulate, remat=choice.remat)

    def candidate(choice: LayoutChoice, simulate: bool) -> Candidate:
        planned_step = plan(choice, simulate)
        model_size = choice.mesh.axis_size(MODEL_AXIS) if MODEL_AXIS in choice.mesh.names else 1
        useful = flops_per_device(planned, planned_step.params, planned_step.seq_len, planned_step.tokens_per_device,
                                  model_size if mode_class(choice.mode).state_placement != "replicate" else 1, [])
        return Candidate(choice, planned_step, step_time(planned_step), useful)

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    say(f"planning {len(choices)} layouts for {chips:,} x {hw.name}")
    analysed, failed = [], {}
    policies = remat_choices(model)
    for choice in choices:
        for remat in policies:  # a policy that recomputes more only where the lighter ones do not fit
            _stop_if_asked(stop)
            try:
                tried = candidate(dataclasses.replace(choice, remat=remat), simulate=False)
            except WorkbenchError as error:
                failed.setdefault(choice.mode, f"{choice.mode}: {error}")
                break
            analysed.append(tried)
            if tried.fits:
                break
    seconds["analysis"] = time.perf_counter() - started
    ranked = sorted((c for c in analysed if c.fits), key=_speed)
    unfit = [c for c in analysed if not c.fits]
    if not ranked:
        raise RecommendationError(_none_fits_message(analysed, chips, plan, batch, failed))

    verify_note = _verification_problem(parsed, chips, verify, top)
    own, own_note = _own_model(model, loss, example_batch, rules, planned.registered) if verify_note is None \
        else (None, None)
    verify_note = verify_note or own_note
    jobs: dict[int, VerificationJob] = {}
    refused: dict[int, str] = {}
    checked: dict[int, Candidate] = {}  # id of a shortlisted candidate -> it with the compiler's figures
    taken: set[int] = set()  # ids in ``ranked`` already simulated
    simulations_left = 4 * top + 4  # and SIMULATION_BUDGET_S a round: a 1.3B step traces in 3-10 s, scanned 0.5

    def shortlist_more(wanted: int, refused_at: int | None = None) -> list[Candidate]:
        """Simulate the fastest layouts not yet taken until ``wanted`` fit, and start compiling each; those planned
        below ``refused_at`` bytes (the least the compiler turned down) first."""
        nonlocal simulations_left
        fresh: list[Candidate] = []
        began = time.perf_counter()

        def order(c: Candidate) -> tuple:
            return (refused_at is not None and c.analytic_peak_bytes >= refused_at, *_speed(c))

        for fast in _distinct_first(sorted((c for c in ranked if id(c) not in taken), key=order)):
            _stop_if_asked(stop)
            if len(fresh) >= wanted or simulations_left <= 0 or time.perf_counter() - began > SIMULATION_BUDGET_S:
                break
            simulations_left -= 1
            say(f"simulating the step's memory: {fast.choice}")
            simulated = candidate(fast.choice, simulate=True) if planned.registered or example_batch else fast
            ranked[ranked.index(fast)] = simulated
            taken.update((id(fast), id(simulated)))
            heavier = list(policies[policies.index(fast.remat) + 1:])
            # The same layout with the next remat policy, simulated too, where it does not fit, or where it fits only
            # as XLA:GPU recomputes values itself (unpriced; a policy's recomputation is priced). Over the budget
            # but fitting, the lighter one stays ranked, after every layout within it.
            while not simulated.fits or (simulated.over_gpu_budget and heavier):
                if not simulated.fits:
                    ranked.remove(simulated)
                    unfit.append(simulated)
                if not heavier:
                    break
                say(f"simulating the step's memory: {fast.choice} with remat {heavier[0]}")
                simulated = candidate(dataclasses.replace(fast.choice, remat=heavier.pop(0)), simulate=True)
                ranked.append(simulated)
                taken.add(id(simulated))
            if not simulated.fits:
                continue
            fresh.append(simulated)
            if verify_note is None:
                say(f"compiling for {parsed}: {simulated.choice}")
                try:
                    jobs[id(simulated)] = start_plan_verification(simulated.plan, VerifySettings(parsed, timeout),
                                                                  own)
                except WorkbenchError as error:  # refused before any process started: said in its row
                    refused[id(simulated)] = f"not verified: {error}"
        return fresh

    def heavier_remat(turned_down: Candidate) -> Candidate | None:
        """``turned_down``'s layout with the next remat policy, planned by the formulas, if it has one and it is new."""
        heavier = policies[policies.index(turned_down.remat) + 1:]
        choice = dataclasses.replace(turned_down.choice, remat=heavier[0]) if heavier else None
        if choice is None or any(c.choice == choice for c in (*ranked, *unfit)):
            return None
        try:
            replacement = candidate(choice, simulate=False)
        except WorkbenchError:
            return None
        return replacement if replacement.fits else None

    seconds.update(simulation=0.0, verification=0.0)
    wanted, refused_at = top, None
    try:
        # A layout the compiler turns down (libtpu refuses a step too large for a chip; any compiler's peak can be
        # over the chip's memory) is replaced: the same layout with the next remat policy joins the ranking, and the
        # next fastest are compiled in its place, those planned smaller than what was turned down first, for at most
        # REPLACEMENT_ROUNDS more rounds. So the answer is a compiled layout wherever the ranking has one that fits,
        # not an unverified one behind the refusals.
        for round_ in range(1 + REPLACEMENT_ROUNDS):
            started = time.perf_counter()
            fresh = shortlist_more(wanted, refused_at)
            seconds["simulation"] += time.perf_counter() - started
            started = time.perf_counter()
            for job in (jobs[id(c)] for c in fresh if id(c) in jobs):
                while not job.done:
                    _stop_if_asked(stop)
                    time.sleep(POLL_S)
            for c in fresh:
                checked[id(c)] = _verified(c, jobs.get(id(c)), refused.get(id(c), verify_note), say)
            seconds["verification"] += time.perf_counter() - started
            turned_down = [checked[id(c)] for c in fresh if not checked[id(c)].fits]
            if not turned_down or round_ == REPLACEMENT_ROUNDS:
                break
            replacements = [c for c in map(heavier_remat, turned_down) if c is not None]
            ranked += replacements
            analysed += replacements
            wanted, refused_at = len(turned_down), min(c.analytic_peak_bytes for c in turned_down)
            say(f"the compiler turned down {wanted} of the layouts: compiling the next {wanted} in their place")
    finally:
        for job in jobs.values():  # an error or Ctrl-C on the way: no compile is left running
            if not job.done:
                job.cancel()
    ranked = [checked.get(id(c)) or _unverified(c, verify_note, top, len(checked)) for c in ranked]
    unfit += [c for c in ranked if not c.fits]
    # Ranked by speed among the layouts whose fit was simulated or compiled; those planned by the formulas alone
    # (their memory errs both ways, 0.5-2x) after them.
    # Layouts over XLA:GPU's budget after those within it: their step time leaves out the compiler's recomputation.
    fitting = sorted((c for c in ranked if c.fits), key=lambda c: (_unconfirmed(c), c.over_gpu_budget, *_speed(c)))
    if not fitting:
        raise RecommendationError(_none_fits_message(unfit, chips, plan, batch, failed))
    fitting = _flag_over_budget(_flag_reordering(fitting))
    final = tuple(_ranked(c, i + 1) for i, c in enumerate(fitting))
    families = _families(final, unfit, no_layout, failed)
    return Recommendation(
        model=planned.name, model_options=dict(planned.options), target=str(parsed), devices=chips,
        global_batch=batch, seq_len=final[0].plan.seq_len, optimizer=optimizer, precision=precision,
        utilisation=utilisation, candidates=final, unfit=tuple(sorted(unfit, key=lambda c: c.peak_bytes)),
        families=families, analysed=len(analysed), verification_note=verify_note, seconds=seconds, own=own,
    )


def _stop_if_asked(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise VerificationError("cancelled: the recommendation was stopped (its compiles with it)")


def _distinct_first(ranked: list[Candidate]) -> list[Candidate]:
    """``ranked`` with the fastest of each mode and mesh first, so the compiled few are different layouts rather
    than one layout's microbatch counts."""
    seen: set[tuple] = set()
    first, rest = [], []
    for candidate in ranked:
        key = (candidate.mode, candidate.mesh)
        (rest if key in seen else first).append(candidate)
        seen.add(key)
    return first + rest


def _unconfirmed(candidate: Candidate) -> bool:
    """Whether ``candidate``'s fit rests on the formulas alone (neither simulated nor compiled)."""
    return not candidate.verified and candidate.memory_source == "formulas"


def _speed(candidate: Candidate) -> tuple:
    """The ranking key: step time; on a tie, fewer microbatches (fewer, larger matmuls), then less memory."""
    return (round(candidate.step_s, 12), candidate.accum, candidate.peak_bytes)


def _chips(target: Any, devices: int | None) -> int:
    if target.kind == "cpu":
        chips = jax.device_count() if devices is None else devices
    else:
        chips = (target.chips or 1) * DEVICES_PER_CHIP.get(target.generation or "", 1)
        if devices is not None and devices != chips:
            raise WorkbenchError(f"devices={devices} contradicts target {target}, which has {chips:,}: drop devices")
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise WorkbenchError(f"devices={chips!r} must be a whole number >= 1: use e.g. devices=8")
    return chips


def _validate_top(top: Any) -> None:
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise WorkbenchError(f"top={top!r} must be a whole number >= 0 (layouts to compile): use e.g. --top 3")


def _global_batch(global_batch: int | None, tokens: int | None, seq_len: int | None) -> int:
    """The global batch in sequences, from sequences or tokens (the planner validates the rest)."""
    if tokens is not None:
        if global_batch is not None:
            raise WorkbenchError("give the batch once: --batch (sequences) or --batch-tokens (tokens), not both")
        if not seq_len:
            raise WorkbenchError(f"a batch of {tokens:,} tokens needs the tokens per sequence: give --seq-len")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1 or tokens % seq_len:
            raise WorkbenchError(f"a batch of {tokens!r} tokens is not whole sequences of {seq_len:,}: use "
                                 f"{nearest_multiples(max(int(tokens), 1), seq_len)} tokens")
        return tokens // seq_len
    if global_batch is None:
        raise WorkbenchError("recommend needs the global batch: give --batch N (sequences) or --batch-tokens N "
                             "with --seq-len")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise WorkbenchError(f"global batch {global_batch!r} must be a whole number >= 1: use e.g. --batch 1024")
    return global_batch


def _no_split_message(batch: int, chips: int, max_model: int, no_layout: dict[str, str]) -> str:
    # The fewest data-parallel replicas any mesh has: the batch must be a multiple of it.
    fewest = max(1, chips // max(m for m in range(1, max_model + 1) if chips % m == 0))
    reasons = "; ".join(no_layout.values())
    return (f"no layout of {chips:,} chips splits a global batch of {batch}: use a batch of "
            f"{nearest_multiples(batch, fewest)} (a multiple of {fewest:,}, the fewest data-parallel replicas a mesh "
            f"of {chips:,} chips has) ({reasons})")


def _none_fits_message(analysed: list[Candidate], chips: int, plan: Callable[..., Any], batch: int,
                       failed: dict[str, str]) -> str:
    if not analysed:
        return "no layout could be planned: " + "; ".join(failed.values())
    if all(c.refused for c in analysed):
        return f"no layout fits: {analysed[0].refused}"
    smallest = min((c for c in analysed if not c.refused), key=lambda c: c.peak_bytes)
    memory = smallest.plan.device_memory
    policies = remat_choices(smallest.plan.model)
    tried = f" (remat {', '.join(policies)} tried)" if len(policies) > 1 else ""
    words = (f"no layout fits{tried}: the smallest, {smallest.choice}, needs {format_bytes(smallest.peak_bytes)} "
             f"per chip and a chip has {format_bytes(memory)}")
    advice = []
    fleet = _smallest_fleet(smallest, chips, plan)
    if fleet:
        advice.append(f"a fleet of {fleet:,} chips would fit it ({smallest.mode} on data={fleet})")
    largest = _largest_batch(smallest, plan, batch)
    if largest:
        advice.append(f"a global batch of {largest} would fit on these chips")
    return words + (": " + ", or ".join(advice) if advice else ": use a smaller model or chips with more memory")


def _smallest_fleet(smallest: Candidate, chips: int, plan: Callable[..., Any]) -> int | None:
    """The fewest chips, doubling up to 64 times the fleet, on which ``smallest``'s mode fits over 'data' alone."""
    if set(mode_class(smallest.mode).axes) != {DATA_AXIS}:
        return None
    for factor in (2, 4, 8, 16, 32, 64):
        mesh = MeshShape((DATA_AXIS,), (chips * factor,))
        try:
            bigger = plan(LayoutChoice(smallest.mode, mesh, smallest.remat, 1), False)
        except WorkbenchError:
            continue
        if bigger.fits:
            return chips * factor
    return None


def _largest_batch(smallest: Candidate, plan: Callable[..., Any], batch: int) -> int | None:
    """The largest batch below ``batch`` (halving, a multiple of the replicas) on which ``smallest``'s layout fits."""
    replicas = smallest.plan.data_parallel_size * smallest.accum
    trial = batch // 2 // replicas * replicas
    while trial >= replicas:
        try:
            if plan(smallest.choice, False, trial).fits:
                return trial
        except WorkbenchError:
            pass
        trial = trial // 2 // replicas * replicas
    return None


def _own_model(model: Any, loss: Any, example_batch: Any, rules: Any,
               registered: bool) -> tuple[OwnModel | None, str | None]:
    """(what the compiles trace here, for your own module or rule table: None for a registered model's own layout;
    why nothing is compiled, if your module cannot be traced: no example batch, no loss)."""
    if registered and rules is None:
        return None, None  # the child rebuilds the step from its config
    try:
        return OwnModel(model, loss, example_batch, rules), None
    except WorkbenchError as error:
        return None, f"not verified: {error}; meanwhile the ranking is the plan's alone"


def _verification_problem(target: Any, chips: int, verify: bool, top: int) -> str | None:
    """Why nothing is compiled, in words (None: the top layouts are)."""
    if not verify or top == 0:
        return "not verified (--no-verify): the ranking is the plan's alone"
    try:
        validate_target(target, MeshShape((DATA_AXIS,), (chips,)))
    except WorkbenchError as error:
        return f"not verified: {error}; meanwhile the answer is the plan's alone"
    return None


def _verified(candidate: Candidate, job: VerificationJob | None, note: str | None, say: ProgressFn) -> Candidate:
    """``candidate`` with the compiler's figures, re-priced and compared, or saying why it has none."""
    if job is None:
        return _unverified(candidate, note, 0)
    try:
        compiled = job.result()
    except StepDoesNotFit as error:  # the compiler's answer outranks the plan's: it does not fit
        return Candidate(candidate.choice, candidate.plan, candidate.time, candidate.model_flops,
                         verification=f"refused by the compiler: {error}", refused=str(error))
    except WorkbenchError as error:
        return Candidate(candidate.choice, candidate.plan, candidate.time, candidate.model_flops,
                         verification=f"the compile failed: {error}")
    say(f"compiled {candidate.choice} in {format_seconds(compiled.compile_seconds)}")
    plan = candidate.plan.with_compiled(compiled)
    planned, measured = candidate.analytic_bytes_by_collective(), compiled.bytes_by_kind()
    compiled_time = step_time(plan, compiled.collectives)  # the compiler's bytes, each kind on its own axes
    disagreements = []
    memory = plan.device_memory
    if compiled.peak_bytes > memory:
        disagreements.append(f"does not fit after all: the compiler needs {format_bytes(compiled.peak_bytes)} per "
                             f"device, {format_bytes(memory)} available (the plan said "
                             f"{format_bytes(candidate.analytic_peak_bytes)})")
    elif not math.isclose(candidate.analytic_peak_bytes, compiled.peak_bytes, rel_tol=PEAK_TOLERANCE):
        disagreements.append(f"peak memory: the compiler's {format_bytes(compiled.peak_bytes)}, the plan's "
                             f"{format_bytes(candidate.analytic_peak_bytes)} "
                             f"({candidate.analytic_peak_bytes / max(compiled.peak_bytes, 1):.2f}x)")
    scalars = {c.kind for c in compiled.collectives if c.bytes <= 8 * c.arrays}
    for kind, nbytes in measured.items():
        only_scalars = all(c.bytes <= 8 * c.arrays for c in compiled.collectives if c.kind == kind)
        if kind not in planned and not (kind in scalars and only_scalars):
            disagreements.append(f"unexpected collective: {format_bytes(nbytes)} of {kind} per step the plan does "
                                 "not price")
        elif planned.get(kind) and not 1 / BYTES_TOLERANCE <= nbytes / planned[kind] <= BYTES_TOLERANCE:
            disagreements.append(f"{kind}: the compiler sends {format_bytes(nbytes)} per step, the plan "
                                 f"{format_bytes(planned[kind])} ({nbytes / planned[kind]:.2f}x)")
    words = (f"compiled for {compiled.target} in {format_seconds(compiled.compile_seconds)}: peak "
             f"{format_bytes(compiled.peak_bytes)} per device")
    return Candidate(candidate.choice, plan, candidate.time, candidate.model_flops, compiled_time, words,
                     tuple(disagreements))


def _unverified(candidate: Candidate, note: str | None, top: int, compiled: int = 0) -> Candidate:
    """``candidate`` saying why it was not compiled: ``note``, or that only the top ``top`` were (``compiled`` in
    all, with the layouts compiled in place of those the compiler turned down)."""
    if candidate.verified or candidate.verification != "not verified":
        return candidate
    replaced = f" ({compiled} with those compiled in place of the ones the compiler turned down)" \
        if compiled > top else ""
    why = note or f"not verified: only the top {top} are compiled{replaced}"
    return Candidate(candidate.choice, candidate.plan, candidate.time, candidate.model_flops, verification=why)


def _flag_reordering(fitting: list[Candidate]) -> list[Candidate]:
    """Say where the compiler's figures rank a verified layout otherwise than the plan's did."""
    verified = [c for c in fitting if c.verified]
    by_plan = sorted(verified, key=lambda c: c.time.step_s)
    flagged = {}
    for place, candidate in enumerate(verified):
        planned_place = by_plan.index(candidate)
        if planned_place != place:
            flagged[id(candidate)] = (f"ranked {_ordinal(planned_place + 1)} of the verified by the plan, "
                                      f"{_ordinal(place + 1)} on the compiler's figures")
    return [Candidate(c.choice, c.plan, c.time, c.model_flops, c.compiled_time, c.verification,
                      (*c.disagreements, flagged[id(c)])) if id(c) in flagged else c for c in fitting]


def _flag_over_budget(fitting: list[Candidate]) -> list[Candidate]:
    """Say where a layout fits only as XLA:GPU recomputes values to stay within its budget."""
    def flagged(c: Candidate) -> Candidate:
        budget, memory = c.plan.gpu_budget, c.plan.memory
        if not c.over_gpu_budget or budget is None or memory is None:
            return c
        words = (f"over XLA:GPU's budget: {format_bytes(memory.temp_bytes)} of temporaries where "
                 f"{format_bytes(budget.on_gpu)} are its limit on the GPU, so the compiler will compute "
                 "values again to fit, slower than this row says (a heavier remat policy prices it)")
        return Candidate(c.choice, c.plan, c.time, c.model_flops, c.compiled_time, c.verification,
                         (*c.disagreements, words))

    return [flagged(c) for c in fitting]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _ranked(candidate: Candidate, rank: int) -> Candidate:
    return Candidate(candidate.choice, candidate.plan, candidate.time, candidate.model_flops, candidate.compiled_time,
                     candidate.verification, candidate.disagreements, rank)


def _families(ranked: tuple[Candidate, ...], unfit: list[Candidate], no_layout: dict[str, str],
              failed: dict[str, str]) -> tuple[FamilyVerdict, ...]:
    """One line per candidate mode: chosen, slower (its best, and what bounds it), does not fit, or no layout."""
    best = ranked[0]
    verdicts = []
    for mode in candidate_modes():
        fitting = [c for c in ranked if c.mode == mode]
        tried = [c for c in unfit if c.mode == mode]
        if mode in no_layout:
            verdicts.append(FamilyVerdict(mode, "no layout", no_layout[mode]))
        elif fitting and fitting[0] is best:
            verdicts.append(FamilyVerdict(mode, "chosen", f"{best.choice}: {best.bound}"))
        elif fitting:
            top = fitting[0]
            bound = top.plan.compute_bound
            test = f"; {bound.sentence}" if bound is not None and not bound.compute_bound else ""
            verdicts.append(FamilyVerdict(mode, "slower", f"{mode} at best {top.choice}: "
                                          f"{format_seconds(top.step_s)} a step, {top.step_s / best.step_s:.2f}x "
                                          f"the chosen; {top.bound}{test}"))
        elif tried and all(c.refused for c in tried):
            verdicts.append(FamilyVerdict(mode, "does not fit", f"{mode}: {tried[0].refused}"))
        elif tried:
            smallest = min((c for c in tried if not c.refused), key=lambda c: c.peak_bytes)
            plan = smallest.plan
            state = (f"; its parameters, gradients and {plan.optimizer} state alone take "
                     f"{format_bytes(plan.total_bytes)}" if plan.total_bytes > plan.device_memory / 4 else "")
            verdicts.append(FamilyVerdict(mode, "does not fit", f"{mode}: {format_bytes(smallest.peak_bytes)} per "
                                          f"chip at best ({smallest.choice}), {format_bytes(plan.device_memory)} "
                                          f"per chip{state}"))
        else:
            verdicts.append(FamilyVerdict(mode, "no layout", failed.get(mode, f"{mode}: no layout was planned")))
    return tuple(verdicts)


__all__ = ["DEFAULT_TOP", "RecommendationError", "VERIFY_TIMEOUT_S", "recommend"]
