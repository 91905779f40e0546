"""Production planning on abstract meshes: will a model train in a mode on a mesh, and what will a step cost?

:func:`plan_training` lays out the model's parameters and optimizer state (shapes only, nothing allocated)
the way the mode would, and adds up memory per device, the collectives a step runs (ring model) and its
compute time into a :class:`~.training_plan.TrainingPlan`, whose :meth:`~.training_plan.TrainingPlan.rules_code`
exports the layout as a rule table to paste. What it assumes and adds up: docs/design/production-planning.md.
The pieces, each in its own module: the model (:mod:`.planned_model`), the collectives
(:mod:`.planned_collectives`), the other estimates (:mod:`.plan_estimates`), the exported table
(:mod:`.exported_rules`), the simulated step (:mod:`.planned_step`), the record (:mod:`.training_plan`) and
its text (:mod:`.plan_text`).

A mode and mesh are judged as the trainer judges them (:func:`~workbench.mesh_fit`): a pair that cannot
train raises the trainer's error; devices along axes the mode does not use hold copies, and the notes say so.

Example:
    >>> plan = plan_training("transformer", {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000},
    ...                      "data=64,model=8", "fsdp")
    >>> plan.params, plan.fits, format_bytes(plan.total_bytes)
    (1339674624, True, '319.4 MiB')
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
from flax import nnx

from ..errors import MeshError, WorkbenchError, nearest_multiples
from ..layout.lint import DEFAULT_MIN_BYTES, lint_layout
from ..layout.mesh import DATA_AXIS, MODEL_AXIS, MeshShape, abstract_mesh, parse_mesh
from ..layout.rules import RuleTable
from ..layout.tree_layout import layout_tree
from ..training.config import make_optimizer
from ..training.modes import PRECISIONS, mesh_fit, mode_class
from ..training.modes.base import MODEL_SPLIT_PLACEMENTS, placement_argument
from ..training.remat import validate_remat
from ..training.step import validate_compiles_ahead
from .byte_size import parse_byte_size
from .compile_target import validate_target, parse_target
from .compiler_rules import compiler_rules
from .cost_model import DEFAULT_UTILISATION, Hardware, compute_time
from .cost_model import hardware as lookup_hardware
from .exported_rules import export_table
from .gpu_memory_budget import over_budget_note
from .plan_estimates import (
    COMPUTE_BYTES,
    GRADIENT_BYTES,
    activation_all_reduces,
    activation_bytes,
    assumption_note,
    bound_by_compute,
    flops_per_device,
    not_regathered_bytes,
    remat_flops_per_device,
    tensor_parallel_notes,
    transient_params_bytes,
)
from .planned_collectives import PlannedCollective, step_collectives
from .planned_model import planned_seq_len, planned_tensor_parallel_rules, resolve_planned_model
from .planned_step import simulated_memory, step_config
from .training_plan import TrainingPlan
from .exported_step import OwnModel
from .verification import planned_hardware, verify_plan, verify_settings, verify_step

# Examples (sequences for the transformer) per data-parallel replica when no global batch is given:
# small enough to fit activations of a 1B model on a 16 GiB chip at the preset's 128 tokens.
DEFAULT_EXAMPLES_PER_REPLICA = 16
NOT_SIMULATED = "not simulated (simulate=False): the analytic formulas alone"


def plan_training(
    model: Any,
    model_options: dict[str, Any] | str | None,
    mesh: Any,
    mode: str | type,
    optimizer: str = "adamw",
    hardware: str | Hardware | None = None,
    device_memory: int | str | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    precision: str = "bf16",
    accum: int = 1,
    global_batch_tokens: int | None = None,
    utilisation: float = DEFAULT_UTILISATION,
    rules: Any = None,
    lint_min_bytes: int = DEFAULT_MIN_BYTES,
    verify: Any = None,
    loss: Any = None,
    example_batch: Any = None,
    compiler: str | None = None,
    remat: str = "none",
    simulate: bool = True,
) -> TrainingPlan:
    """Plan training ``model`` in ``mode`` on ``mesh`` (of any size): memory, collectives, step time.

    Nothing is allocated and no device is needed: parameters and optimizer state are ``ShapeDtypeStruct``
    leaves laid out on an abstract mesh.

    Args:
        model, model_options: a registered model's name and overrides of its preset (a dict, or
            ``key=value,...`` text as ``--config`` takes); or your own ``nnx.Module``: an instance (real
            or from ``nnx.eval_shape``) or a function of no arguments that builds one, which is only
            ever traced (a 70B model costs no memory). Give ``model_options`` as None for your own.
            Its compute is estimated as 6 FLOPs per parameter per example (per token with ``seq_len``)
            and its activations are not estimated.
        mesh: e.g. ``"data=64,model=8"``.
        mode: a parallel mode (see :data:`workbench.training.modes.MODES`), or its class where the name was
            resolved already (:func:`~workbench.mode_class`).
        optimizer: ``sgd``, ``adam`` or ``adamw`` (what its state holds is read from optax itself).
        hardware: a preset name of :data:`workbench.analysis.cost_model.HARDWARE` or a ``Hardware``;
            default ``tpu-v5p``, or the preset of the TPU topology ``verify`` names.
        device_memory: bytes per device (or text like ``"16GiB"``); default: the hardware's memory.
        global_batch: examples (sequences) per step over all devices and microbatches; default
            ``DEFAULT_EXAMPLES_PER_REPLICA`` (16) per data-parallel replica (rounded up to whole microbatches).
        seq_len: tokens per sequence for the transformer; default its ``max_len``.
        precision: ``bf16`` (bfloat16 compute, float32 master weights, as the trainer does) or ``fp32``.
        accum: microbatches per step, as :class:`~workbench.TrainConfig`'s ``accum`` trains them (gradients
            summed over a ``lax.scan``, one update): a device holds one microbatch's activations at a time and
            the summed gradients beside them; per-layer gathers and tp's activation all-reduces run once per
            microbatch, the gradient sync over 'data' once per step.
        global_batch_tokens: the global batch in tokens instead of sequences: ``global_batch`` is
            ``global_batch_tokens / seq_len`` (give one of the two).
        utilisation: assumed fraction of peak FLOP/s the maths reaches (MFU).
        rules: your own rule table (a :class:`~workbench.layout.rules.RuleTable` or ``(regex, spec)`` pairs)
            instead of the mode's placement; the mode still decides where the batch goes. A leaf whose
            spec does not fit is planned replicated and reported in ``warnings``, with every other.
        lint_min_bytes: the smallest replicated leaf the layout linter warns about
            (:func:`~workbench.layout.lint.lint_layout`).
        verify: also compile the real step for this mesh and attach the compiler's figures (``compiled``,
            ``comparison``): ``"cpu"`` (simulated CPU devices, up to 2048) or ``"tpu:v5p:8x8x8"`` (any
            topology libtpu knows; needs the ``tpu`` extra), or :class:`~.verification.VerifySettings`
            for a time limit and progress messages; a ``gpu:<chip>:<count>`` target compiles with XLA:GPU, no
            GPU needed. Your own module (with ``loss`` and ``example_batch``), or any model with ``rules``, is
            traced and exported here and compiled there (:mod:`.exported_step`): the compiled step lays out the
            state as this plan does. See :mod:`workbench.analysis.verification` to run it in the background.
        loss, example_batch: for your own module, ``loss(model, batch) -> (value, aux)`` (default: the
            module's ``loss`` method) and a batch of its input (arrays or ``ShapeDtypeStruct``s, any
            number of rows), so that its step can be traced and its memory simulated; without them its
            peak is not modelled.
        compiler: whose buffers the simulated peak follows: ``"cpu"`` (XLA:CPU), ``"gpu"`` (XLA:GPU) or
            ``"tpu"`` (libtpu) (:mod:`.compiler_rules`); default: ``verify``'s target, else the hardware's.
        remat: what each transformer block keeps for the backward pass (:mod:`workbench.training.remat`):
            ``none``, ``block`` or ``dots``; priced in the activations, the simulated step and the FLOPs.
        simulate: trace the step to simulate its memory (seconds for a 1B model); False keeps the analytic
            formulas alone (``memory_caveat`` says so), for a first pass over many layouts (:mod:`.recommender`).

    Raises :class:`~workbench.errors.WorkbenchError` (or a subclass) naming the bad argument and a fix.

    Example:
        >>> plan = plan_training("mlp", {"hidden": 256}, "data=8", "fsdp", hardware="cpu")
        >>> plan.params_bytes * 8 >= plan.params_layout.total_bytes
        True
    """
    settings = None if verify is None else verify_settings(verify)
    hw = lookup_hardware(planned_hardware(hardware, settings))
    memory_rules = compiler_rules(compiler or (parse_target(settings.target).kind if settings is not None
                                               else hw.compiler))
    memory = hw.memory_bytes if device_memory is None else parse_byte_size(device_memory)
    compute_time(0.0, hw, utilisation)  # checks utilisation now, not when the plan is printed
    declared = mode if isinstance(mode, type) else mode_class(mode)  # unknown: the modes' message, listing them
    mode = declared.name
    if precision not in PRECISIONS:
        raise WorkbenchError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    mesh_shape = parse_mesh(mesh)  # parsed once, here; everything below takes the record
    if settings is not None:
        _check_verifiable(settings, mesh_shape, declared)
    notes = _check_mesh(mesh_shape, declared)
    custom_rules = RuleTable(rules) if rules is not None else None
    planned = resolve_planned_model(model, model_options, seq_len, notes)
    # Your own module, or your table: the child cannot rebuild it, so verify traces it here (checked before planning).
    own = OwnModel(planned.name if planned.registered else planned.abstract, loss, example_batch, rules) \
        if settings is not None and (not planned.registered or rules is not None) else None
    remat = validate_remat(remat, planned.name if planned.registered else None,
                           planned.model_class.REMAT_POLICIES if planned.model_class is not None else ("none",))
    abstract = planned.abstract
    tp_rules = planned_tensor_parallel_rules(declared, planned, custom_rules)

    # The state, laid out exactly as the mode builds it (ShardedJitMode.state_layout), from the same declaration.
    params = nnx.state(abstract, nnx.Param)
    opt_state = jax.eval_shape(_optimizer_for_shapes(optimizer).init, params)
    target = abstract_mesh(mesh_shape)
    if custom_rules is not None:
        placement, kind = custom_rules, "custom"
    else:
        placement, kind = placement_argument(declared.state_placement, tp_rules), declared.state_placement
    params_layout = layout_tree(params, target, placement, data_axis=DATA_AXIS, on_invalid="replicate")
    opt_layout = layout_tree(opt_state, target, placement, data_axis=DATA_AXIS, on_invalid="replicate")
    warnings = lint_layout(params_layout, min_bytes=lint_min_bytes, optimizer_state=opt_layout)
    table = export_table(kind, tp_rules, [(params, params_layout), (opt_state, opt_layout)], target, custom_rules)

    # The batch and the maths one device does with it.
    tensor_parallel = declared.state_placement in MODEL_SPLIT_PLACEMENTS
    data_size = 1 if declared.one_device else declared.batch_parts(mesh_shape)
    model_size = mesh_shape.axis_size(MODEL_AXIS) if tensor_parallel else 1
    # Your own model: tokens per sequence only if you say so (then compute counts tokens, not examples).
    seq_len = planned_seq_len(planned, seq_len)
    batch = _batch(global_batch, global_batch_tokens, seq_len, data_size, accum)
    examples = batch // data_size
    microbatch_examples = examples // accum  # what the activations and tp's all-reduces are sized by
    n_params = sum(math.prod(leaf.layout.shape) for leaf in params_layout.leaves)  # no second walk of the model
    tokens = examples * seq_len if seq_len else examples
    flops = flops_per_device(planned, n_params, seq_len, tokens, model_size, notes, remat)
    remat_flops = (remat_flops_per_device(abstract, seq_len, tokens, model_size, remat)
                   if planned.transformer_estimates else 0.0)

    # What a step sends, and whether its compute hides it.
    compute_bytes = COMPUTE_BYTES[precision]
    # The model declares it (TRANSFORMER_ESTIMATES); the formulas count tokens, so it reads sequences too.
    formula_seq_len = seq_len if planned.transformer_estimates else None
    transformer_formulas = formula_seq_len is not None
    # (B_local, T, d_model) activations summed over 'model' after each row-parallel layer of a block, in the
    # compute dtype as the compiler holds it (measured, bf16 dp-tp on data=8,model=2: XLA:GPU and libtpu reduce
    # bfloat16; XLA:CPU widens bfloat16 to float32, its reductions too)
    partial_sum_bytes = memory_rules.float_bytes.get("bfloat16", compute_bytes) if precision == "bf16" else 4
    block_activation = (microbatch_examples * formula_seq_len * abstract.d_model * partial_sum_bytes
                        if transformer_formulas else None)
    # A bf16 step's collectives in bf16 where the compiler keeps them narrow (not XLA:CPU, which widens them): a jit
    # step's gradient all-reduce sits on a bf16 matmul's output (measured, dp-tp on gpu:h100:512: 1.4 GiB over 'data'
    # where float32 gradients are 2.7 GiB); shard_map and pmap steps sum float32 gradients themselves, and so does a
    # jit step's microbatch accumulation, which sums its float32 accumulators once (measured, dp-tp with 4
    # microbatches on tpu:v5e:2x2: 4.0 MiB over 'data' where one microbatch's bf16 gradients are 2.0).
    narrow_collectives = precision == "bf16" and not memory_rules.widens_collectives
    gradient_bytes = 2 if narrow_collectives and declared.gradient_sync == "compiler" and accum == 1 else GRADIENT_BYTES
    collectives, sync_bytes = step_collectives(
        declared, mesh_shape, params_layout, hw, block_activation,
        activation_all_reduces(abstract, remat, memory_rules.reassociates_all_reduces) if transformer_formulas else 0,
        notes,
        custom=custom_rules is not None,
        # bf16 parameters on the wire: a per-layer gathering mode casts its shards before it gathers them where the
        # compiler gathers bf16 (param_gathering.gathers_narrow); XLA:GPU moves fsdp-whole-tree's cast there itself.
        gathered_bytes_per_float=2 if narrow_collectives and (
            memory_rules.casts_before_gathering or declared.parameter_gathering == "per-layer") else 4,
        gradient_bytes_per_float=gradient_bytes,
        microbatches=accum,
        not_regathered_bytes=not_regathered_bytes(declared, planned, params_layout, seq_len, loss, example_batch,
                                                  remat, notes),
    )
    notes += tensor_parallel_notes(planned, tensor_parallel, model_size)
    bound = bound_by_compute(declared, sync_bytes, data_size, flops, tokens, seq_len, hw, utilisation, notes,
                             gradient_bytes)

    # Memory beside the training state.
    activations = None
    if transformer_formulas:
        activations = activation_bytes(abstract, microbatch_examples, formula_seq_len, model_size, compute_bytes,
                                       remat)
    elif planned.registered:
        notes.append(f"activations of {planned.name!r} are not estimated (small for this model at these batch sizes)")
    transient = transient_params_bytes(declared, params_layout, precision, notes, abstract,
                                       gathers_bf16=not memory_rules.widens_collectives)
    simulated, caveat = simulated_memory(planned, declared, mesh_shape, batch, seq_len, precision, optimizer,
                                         custom_rules, loss, example_batch, memory_rules, accum, remat) \
        if simulate else (None, NOT_SIMULATED)
    notes.append(assumption_note(precision, utilisation))

    plan = TrainingPlan(
        model=planned.name, model_options=planned.options, mesh=mesh_shape, mode=mode, optimizer=optimizer,
        precision=precision, hardware=hw, device_memory=memory, utilisation=utilisation, params=n_params,
        global_batch=batch, seq_len=seq_len, data_parallel_size=data_size, examples_per_device=examples,
        tokens_per_device=tokens, params_layout=params_layout, opt_state_layout=opt_layout, rule_table=table,
        activation_bytes=activations, transient_params_bytes=int(transient), flops_per_device=float(flops),
        collectives=tuple(collectives), compute_bound=bound, notes=tuple(notes), warnings=tuple(warnings),
        memory=simulated, memory_caveat=caveat, compiler=memory_rules.kind, accum=accum, remat=remat,
        remat_flops_per_device=remat_flops,
    )
    budget = plan.gpu_budget  # known only once the step is simulated for XLA:GPU
    over_budget = over_budget_note(budget, simulated.temp_bytes, simulated.peak_bytes) \
        if budget is not None and simulated else None
    if over_budget is not None:
        plan = dataclasses.replace(plan, notes=(*plan.notes, over_budget))
    if settings is None:
        return plan
    if own is not None:
        return plan.with_compiled(verify_plan(plan, settings, own))
    # The step the plan describes, from the records read above: the compile checks it without reading text again.
    step = step_config(planned.name, dict(planned.options), declared, mesh_shape, batch, precision, optimizer,
                       planned.model_class, accum, remat)
    return plan.with_compiled(verify_step(step, settings.target, seq_len=seq_len, timeout=settings.timeout,
                                          on_progress=settings.on_progress))


def _check_mesh(mesh: MeshShape, declared: type) -> list[str]:
    """The trainer's own verdict on mode ``declared`` (its class) x ``mesh`` (:func:`~workbench.mesh_fit`): its
    MeshError when the mode cannot train there, else notes for devices that only repeat others' work or stay idle."""
    fit = mesh_fit(declared, mesh)
    if not fit.ok:
        raise MeshError(fit.message)
    return [fit.message] if fit.level == "warning" or "idle" in fit.message else []


def _batch(global_batch: int | None, global_batch_tokens: int | None, seq_len: int | None, parts: int,
           accum: int) -> int:
    """The global batch in sequences (examples), checked: whole, and split into ``accum`` microbatches of ``parts``
    equal shares, as the trainer splits it (:meth:`~workbench.training.modes.ParallelMode.validate_batch_split`)."""
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise WorkbenchError(f"accum={accum!r} must be a whole number >= 1 (microbatches per step): use e.g. --accum 4")
    if global_batch_tokens is not None:
        global_batch = _sequences(global_batch_tokens, seq_len, global_batch)
    unit = parts * accum
    if global_batch is None:  # 16 per replica, rounded up to whole microbatches
        return -(-DEFAULT_EXAMPLES_PER_REPLICA // accum) * unit
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise WorkbenchError(
            f"global batch {global_batch!r} must be a whole number >= 1: use e.g. --batch {16 * unit}"
        )
    if global_batch % unit:
        nearest = nearest_multiples(global_batch, unit)
        split = f"into {accum} microbatches over" if accum > 1 else "over"
        raise WorkbenchError(f"global batch {global_batch} does not split {split} {parts} data-parallel devices: use a "
                             f"batch of {nearest} (a multiple of {unit})")
    return global_batch


def _sequences(tokens: int, seq_len: int | None, global_batch: int | None) -> int:
    """The global batch in sequences that ``tokens`` tokens per step make."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise WorkbenchError(f"global batch of {tokens!r} tokens must be a whole number >= 1: use e.g. "
                             "--batch-tokens 1048576")
    if seq_len is None:
        raise WorkbenchError(f"a global batch of {tokens:,} tokens needs the tokens per sequence: give --seq-len "
                             "(seq_len=...), or the batch in sequences (--batch)")
    if tokens % seq_len:
        nearest = nearest_multiples(tokens, seq_len)
        raise WorkbenchError(f"a global batch of {tokens:,} tokens is not whole sequences of {seq_len:,} tokens: use "
                             f"{nearest} tokens (a multiple of seq_len {seq_len})")
    if global_batch is not None and global_batch != tokens // seq_len:
        raise WorkbenchError(f"global batch {global_batch} sequences and {tokens:,} tokens ({tokens // seq_len:,} "
                             f"sequences of {seq_len:,}) disagree: give one of --batch and --batch-tokens")
    return tokens // seq_len


@functools.cache
def _optimizer_for_shapes(name: str) -> Any:
    """One optimizer per name for tracing the state's shapes, so JAX's trace cache answers a re-plan of the
    same model (a 65B model's 2,568 moment leaves take 0.5 s to trace)."""
    return make_optimizer(name, 1e-3)


def _check_verifiable(settings: Any, mesh: MeshShape, declared: type) -> None:
    """Bad ``verify`` input, before anything is planned: the target against the mesh, a mode that is not one
    program."""
    validate_compiles_ahead(declared)
    validate_target(settings.target, mesh)


__all__ = [
    "DEFAULT_EXAMPLES_PER_REPLICA", "PlannedCollective", "TrainingPlan", "parse_byte_size", "plan_training",
]
