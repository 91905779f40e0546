"""A step's memory per device, simulated from its jaxpr: the compiler's peak, without compiling.

A compiled step's memory per device is its arguments + outputs - aliased (donated) + temporaries
(:data:`~.compiled_step.PEAK_FORMULA`). Arguments, outputs and aliases follow from the step's input and
output shapes and shardings. The temporaries are the high-water mark of the buffers the program keeps
alive at once: :func:`simulate_step_memory` flattens the step's equations (inlining ``jit``, ``shard_map``,
``custom_vjp`` and remat bodies; a loop's body per iteration), decides which values are buffers, orders the ops
as the compiler's scheduler would, allocates each buffer when produced and frees it after its last reader.

Which values are buffers follows XLA's own rules, each checked against XLA:CPU's buffer assignment
(listed in docs/design/compile-verification.md, "step memory"): elementwise work is fused into its
consumers unless one cannot take it fused (a matmul, collective, scatter, loop); views are their operand's
buffer; reductions and gathers store only their result. Where XLA's compilers differ (bf16 takes 4 bytes on
XLA:CPU; XLA:GPU recomputes a softmax's exponentials) the simulation follows one compiler's
:class:`~.compiler_rules.CompilerRules`. Outside ``shard_map``, and inside one over the axes it leaves to the
compiler, each value's sharding is propagated from the step's inputs as the partitioner does.

Example:
    >>> from workbench.training.config import TrainConfig
    >>> from workbench.training.step import build_abstract_step
    >>> step = build_abstract_step(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64))
    >>> memory = step_memory(step)
    >>> memory.peak_bytes >= memory.argument_bytes > 0  # the state and batch are live at the start at least
    True
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import jax.core  # jax.core.ShapedArray: jax imports the submodule but does not export the name
import jax.extend  # noqa: F401  (jax.extend.core)
import numpy as np
from jax.extend.core import jaxprs_in_params

from ..compat import scan_operand_counts
from ..errors import WorkbenchError
from ..training.config import resolve_config
from ..training.data_parallel import type_varying_axes
from ..training.models import model_config
from ..training.modes.base import ABSTRACT_DEVICES
from ..training.step import build_abstract_step
from .compiler_rules import XLA_CPU, CompilerRules, compiler_rules

# Per array dimension, the mesh axis names it is split over (not a PartitionSpec: always one tuple each).
AxesPerDimension = tuple

# Pure views: the output is the operand's buffer (a bitcast), never a new one.
_VIEWS = {"reshape", "squeeze", "expand_dims", "pvary", "pcast", "stop_gradient", "copy_p", "reduce_precision",
          "optimization_barrier", "psum_invariant"}
# Elementwise work XLA fuses into its consumers.
_FUSIBLE = {
    "add", "sub", "mul", "div", "rem", "max", "min", "neg", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sqrt", "rsqrt", "cbrt", "integer_pow", "pow", "square", "abs", "sign", "floor", "ceil", "round",
    "select_n", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "convert_element_type", "is_finite",
    "erf", "erfc", "erf_inv", "sin", "cos", "tan", "atan2", "add_any", "clamp", "nextafter", "broadcast_in_dim",
    "iota", "slice", "pad", "concatenate", "rev", "transpose", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "population_count", "imag", "real", "conj", "copy", "random_bits", "random_wrap",
    "random_unwrap", "random_seed", "threefry2x32", "dynamic_slice", "reshard", "sharding_constraint",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma", "mul_add",
    "one_minus_square",  # JAX 0.12: tanh's derivative, 1 - x**2, as one primitive
}
# Consumers that read their operands fused (XLA's reduce and gather fusions), storing only their result.
_FUSES_OPERANDS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                   "argmax", "argmin", "gather", "reduce_precision"}
# The reductions among them: XLA:CPU stores a value combining computed values that one reads (_store_reduced_sums).
_REDUCTIONS = _FUSES_OPERANDS - {"gather", "reduce_precision"}
PARTITIONER_ALL_REDUCE = "all-reduce (partitioner)"
# XLA:CPU's tree reduction: a sum over more elements than this is a reduce-window of this many, then a reduce.
_TREE_REDUCTION_WINDOW = 32
# Rows per device from which XLA:CPU computes a layer norm's backward pass in a YNN fusion (_store_large_norm_operands).
_YNN_NORM_ROWS = 4096
# A matmul's operand of its result's shape shares no positions with it (d_model = heads x head_dim): no split passes.
_CONTRACTIONS = {"dot_general", "conv_general_dilated"}
# Ops that write into their first operand's buffer (scatters): a fused operand needs no buffer of its own.
_IN_PLACE = {"scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min", "scatter-max",
             "dynamic_update_slice"}
# remat2: jax.checkpoint's transposed body (the recomputation and the backward pass), by the name JAX 0.10 prints
_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "shard_map"}
_LOOPS = {"scan", "while", "cond"}


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one compiled step, as simulated (see the module docstring).

    ``peak_bytes`` is arguments + outputs - aliased + temporaries, the compiler's own formula.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def to_json(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes}


class _Value:
    """One value of the flattened program: its shape, per-device bytes, sharding and producer."""

    __slots__ = ("shape", "dtype", "spec", "nbytes", "producer", "operands", "materialised", "is_arg", "is_output",
                 "readers", "position", "buffers", "itemsize", "origin", "carried", "varies", "constant", "block",
                 "partial_manual")
    operands: tuple[_Value, ...] | list[_Value]  # the values it reads (empty for an argument)
    buffers: list[_Value] | None  # the materialised buffers a reader of it reads (None: not yet worked out)

    def __init__(self, aval: Any, spec: AxesPerDimension, sizes: dict[str, int], float_bytes: dict):
        self.shape = tuple(aval.shape)
        self.dtype, self.itemsize = _dtype_and_size(aval.dtype, float_bytes)
        self.resplit(spec, sizes)
        self.producer, self.operands = "arg", ()
        self.materialised = self.is_arg = self.is_output = False
        self.position = -1
        self.buffers = None
        self.origin = ""  # the name stack of the equation that made it (e.g. "jvp(blocks/0)/attn")
        self.carried = None  # a loop's carry out: the value it started from (the loop updates that buffer)
        # Inside shard_map: it differs between the devices of a manual axis (the batch's work), so it is not made
        # from nothing even where no axis left to the compiler splits it (see _split_created_values).
        self.varies = bool(type_varying_axes(aval))
        self.constant = False  # a constant of the program (a NumPy array the model closes over), not an input
        self.block: int | None = None  # the block it belongs to where its origin names none (see _owning_block)
        self.partial_manual = False  # made inside a shard_map that leaves axes to the compiler (fsdp-tp's body)

    def resplit(self, spec: AxesPerDimension, sizes: dict[str, int]) -> None:
        self.spec = _fit(spec, self.shape, sizes)
        # a dimension the axes do not divide is padded to a multiple of them (XLA's uneven sharding): ceil per device
        self.nbytes = math.prod(-(-dim // math.prod(sizes[a] for a in entry))
                                for dim, entry in zip(self.shape, self.spec, strict=True)) * self.itemsize

    def narrow(self, sizes: dict[str, int]) -> None:
        """Count it in its own type, where the compiler stores it so (not widened by ``float_bytes``)."""
        if self.dtype is not None and self.itemsize != self.dtype.itemsize:
            self.itemsize = self.dtype.itemsize
            self.resplit(self.spec, sizes)


_DTYPES: dict[tuple, tuple] = {}


def _dtype_and_size(dtype: Any, float_bytes: dict) -> tuple:
    """(NumPy dtype or None for PRNG keys, bytes per element on the backend), cached per dtype."""
    key = (dtype, tuple(sorted(float_bytes.items())))
    if key not in _DTYPES:
        if jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
            _DTYPES[key] = (None, 8)
        else:
            numpy_dtype = np.dtype(dtype)
            _DTYPES[key] = (numpy_dtype, float_bytes.get(numpy_dtype.name, numpy_dtype.itemsize))
    return _DTYPES[key]


_UNSPLIT = tuple(((),) * rank for rank in range(9))


def _fit(spec: AxesPerDimension, shape: tuple, sizes: dict[str, int]) -> AxesPerDimension:
    """``spec`` padded or cut to ``shape``'s rank, dropping axes from dimensions of size 1. A dimension its axes
    do not divide stays split: the partitioner pads it to a multiple of them (measured: tp's 4 attention heads
    on model=8, counted unsplit, were 4x XLA:CPU's (batch, 1, T, T) buffers per device)."""
    if not any(spec):
        return _UNSPLIT[len(shape)] if len(shape) < len(_UNSPLIT) else ((),) * len(shape)
    spec = tuple(spec)[: len(shape)] + ((),) * max(0, len(shape) - len(spec))
    out = []
    for entry, dim in zip(spec, shape, strict=True):  # spec was padded or cut to the rank just above
        entry = tuple(a for a in entry if a in sizes)
        out.append(entry if entry and dim > 1 else ())
    return tuple(out)


def spec_of(partition_spec: Any, rank: int) -> AxesPerDimension:
    """Per-dimension axis tuples of a ``PartitionSpec`` (None entries: not split).

    Example:
        >>> spec_of(jax.sharding.PartitionSpec("data", None), 3)
        (('data',), (), ())
    """
    entries = []
    for entry in tuple(partition_spec or ())[:rank]:
        entries.append(() if entry is None else (entry,) if isinstance(entry, str) else tuple(entry))
    return tuple(entries) + ((),) * (rank - len(entries))


class _Program:
    """The step flattened into one list of equations over :class:`_Value`s, shardings propagated."""

    def __init__(self, sizes: dict[str, int], rules: CompilerRules):
        self.sizes, self.rules, self.float_bytes = sizes, rules, rules.float_bytes
        self.ops: list[tuple[str, list[_Value], list[_Value], int]] = []  # name, ins, outs, body temporaries
        self.origin = ""  # the name stack of the equation being added
        self.block_at_peak = 0  # one block's bytes live at the peak: what each further block adds (_peak)
        # Per loop (by its outputs' list), one block's bytes live at its body's peak (_peak): a loop over microbatches
        # (gradient accumulation) runs every block inside its body, so each further block adds there.
        self.body_blocks: dict[int, int] = {}
        self.broadcasts: dict[tuple, _Value] = {}  # implicit broadcasts, by operand and shape (XLA's CSE)
        # A matmul's result (id) -> the form it reads each operand in: the dimensions it contracts, or "batched".
        self.matmul_forms: dict[int, tuple] = {}
        self.exponents: dict[int, int] = {}  # an integer power's result (id) -> its exponent (see _share_squares)
        # The axes the innermost shard_map that leaves axes to the compiler leaves it (fsdp-tp's body); empty outside.
        self.kept: frozenset = frozenset()

    def value(self, aval: Any, spec: AxesPerDimension) -> _Value:
        value = _Value(aval, spec, self.sizes, self.float_bytes)
        value.origin = self.origin
        value.partial_manual = bool(self.kept)
        return value

    def inline(self, jaxpr: Any, inputs: list[Any], local: bool) -> list[Any]:
        """Append ``jaxpr``'s equations with its inputs bound to ``inputs``; its outputs' values.
        ``local``: shapes are per device (inside shard_map): every value is unsplit."""
        env: dict[Any, Any] = {}
        for var, value in zip(jaxpr.invars, inputs, strict=False):
            env[var] = value
        for var in jaxpr.constvars:
            env[var] = self.value(var.aval, ())  # closed-over constants: small, held like arguments
            env[var].is_arg = env[var].materialised = env[var].constant = True

        def read(atom):
            return env.get(atom) if not isinstance(atom, jax.extend.core.Literal) else None

        for eqn in jaxpr.eqns:
            ins = [read(atom) for atom in eqn.invars]
            outer, stack = self.origin, str(eqn.source_info.name_stack)
            self.origin = f"{outer}/{stack}" if outer and stack else outer or stack
            outs = self.equation(eqn, ins, local)
            self.origin = outer
            for var, value in zip(eqn.outvars, outs, strict=False):
                env[var] = value
        return [read(atom) for atom in jaxpr.outvars]

    def equation(self, eqn: Any, ins: list[Any], local: bool) -> list[_Value]:
        name = eqn.primitive.name
        inner = _inner_jaxpr(eqn)
        if name == "shard_map" and inner is not None:
            left = () if local else _axes_left_to_compiler(eqn.params, self.sizes)
            if left:  # partial-manual: inside, each value stays split over the axes the compiler keeps
                ins = [self._inside(value, var.aval, left) for value, var in zip(ins, inner.invars, strict=False)]
            kept, self.kept = self.kept, (left or self.kept)
            outs = self.inline(inner, ins, local=not left)
            self.kept = kept
            specs = eqn.params.get("out_specs") or eqn.params.get("out_names") or ()
            result = []
            for var, value, spec in zip(eqn.outvars, outs, specs, strict=False):
                manual = spec_of(spec, len(var.aval.shape))
                if left and value is not None and len(value.spec) == len(manual):  # the compiler's split as well
                    manual = tuple(m + tuple(a for a in kept if a not in m) for m, kept in zip(manual, value.spec,
                                                                                            strict=True))
                outer = self.value(var.aval, () if local else manual)
                self._view(outer, value)
                result.append(outer)
            return result
        if name in _CALLS and inner is not None:
            jaxpr = inner.jaxpr if hasattr(inner, "jaxpr") else inner
            return self.inline(jaxpr, ins[len(ins) - len(jaxpr.invars):], local)  # custom_jvp's consts first
        body = 0
        if name in _LOOPS:
            body, body_block, specs, blocks = _loop_temporaries(eqn, ins, self.sizes, self.rules, local, self.kept)
        else:
            specs, blocks = _propagate(eqn, ins, local), []
        outs = [self.value(var.aval, spec) for var, spec in zip(eqn.outvars, specs, strict=False)]
        for out, block in zip(outs, blocks, strict=False):
            out.block = block
        if name in self.rules.narrow_results:
            for out in outs:
                out.narrow(self.sizes)
        if body:
            self.body_blocks[id(outs)] = body_block
        for out, start in zip(outs, _carried_in(eqn, ins), strict=False):
            out.carried = start
        # A view narrowed to its own type is a buffer of its own (XLA:CPU's bf16 copy of a saved matmul result).
        if name in _VIEWS and name not in self.rules.narrow_results and ins and ins[0] is not None and len(outs) == 1:
            self._view(outs[0], ins[0])
            return outs
        if name == "optimization_barrier":
            # What a barrier passes on in a type the compiler widens (XLA:CPU's bfloat16) is stored in its own type:
            # XLA:CPU expands the barrier before it schedules, leaving the conversion there (a ``wrapped_convert``).
            # Counted widened, the attention's score gradient that weighted_values hands on through its barrier held
            # a 16-head, 1,024-token bf16 fsdp-tp step under remat ``block`` at 1.15x JAX 0.12's XLA:CPU peak (0.97).
            for out in outs:
                out.narrow(self.sizes)
        if name in _FUSIBLE and name != "broadcast_in_dim" and len(outs) == 1:
            ins = [self._broadcast(v, outs[0]) for v in ins]
        for out in outs:
            out.producer, out.operands = name, [v for v in ins if v is not None]
        self.ops.append((name, [v for v in ins if v is not None], outs, body))
        if name == "integer_pow":
            self.exponents[id(outs[0])] = eqn.params["y"]
        if name == "dot_general":
            (contracting, batch) = eqn.params["dimension_numbers"]
            # A batched matmul (attention's) reads its operands as they are; a plain one contracting an operand's
            # leading dimensions (a weight gradient) reads a transposed copy: the form a float32 copy takes.
            self.matmul_forms[id(outs[0])] = (("batched",) * 2 if any(batch)
                                              else tuple(tuple(dims) for dims in contracting))
        if not local and _sums_over_split_dimension(eqn, ins):
            # The partitioner computes each device's partial result and sums it over the split axes: an
            # all-reduce into a buffer of its own (XLA combines independent ones: see _schedule).
            summed = [self.value(var.aval, out.spec) for var, out in zip(eqn.outvars, outs, strict=False)]
            for partial, total in zip(outs, summed, strict=True):  # one sum per partial result
                total.producer, total.operands = PARTITIONER_ALL_REDUCE, [partial]
            self.ops.append((PARTITIONER_ALL_REDUCE, list(outs), summed, 0))
            return summed
        return outs

    def like(self, value: _Value, spec: AxesPerDimension) -> _Value:
        """A new value of ``value``'s shape and type, counted in ``value``'s bytes per element, split as ``spec``."""
        made = self.value(jax.core.ShapedArray(value.shape, value.dtype or np.float32), spec)
        made.itemsize = value.itemsize
        made.resplit(spec, self.sizes)
        return made

    def _broadcast(self, value: Any, out: _Value) -> Any:
        """``value`` as elementwise work on ``out`` reads it: an operand with size-1 dimensions (``x * scale``
        with ``scale`` of shape (1, 1, d)) is broadcast in HLO by a broadcast of its own, which XLA's CSE
        shares between every reader of the same operand at the same shape (a layer norm's forward and backward
        passes); read twice, XLA:CPU stores it (see _duplicable)."""
        if value is None or value.shape == out.shape or len(value.shape) != len(out.shape) or not value.shape:
            return value
        key = (id(value), out.shape)
        if key not in self.broadcasts:
            broadcast = self.value(jax.core.ShapedArray(out.shape, out.dtype or np.float32), out.spec)
            broadcast.producer, broadcast.operands = "broadcast_in_dim", [value]
            self.ops.append(("broadcast_in_dim", [value], [broadcast], 0))
            self.broadcasts[key] = broadcast
        return self.broadcasts[key]

    def _inside(self, value: Any, aval: Any, left: frozenset) -> Any:
        """``value`` as a partial-manual shard_map's body reads it (of the per-device shape ``aval`` over the
        manual axes): split over the axes ``left`` to the compiler as it is outside, a view of it."""
        if value is None:
            return None
        inner = self.value(aval, tuple(tuple(a for a in entry if a in left) for entry in value.spec))
        self._view(inner, value)
        return inner

    @staticmethod
    def _view(outer: _Value, value: Any) -> None:
        outer.producer, outer.operands = "view", [value] if value is not None else []


def _axes_left_to_compiler(params: dict, sizes: dict[str, int]) -> frozenset:
    """The mesh axes (of more than one device) a shard_map leaves to the compiler: ``fsdp-tp``'s step and jit
    modes' accumulation are manual over ``data`` only, and the partitioner splits their bodies over ``model``
    as it would outside (measured: simulating that body unsplit held 1.36-1.63x XLA:CPU's peak, fsdp-tp)."""
    mesh = params.get("mesh")
    manual = set(params.get("newly_manual_axes") or ()) | set(getattr(mesh, "manual_axes", ()) or ())
    if mesh is None or not manual:  # an older shard_map that names no manual axes: all of them
        return frozenset()
    return frozenset(a for a in getattr(mesh, "axis_names", ()) if a not in manual and sizes.get(a, 1) > 1)


def _inner_jaxpr(eqn: Any) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    return None


def _carried_in(eqn: Any, ins: list[Any]) -> list[Any]:
    """Per output of a loop, the input its carry starts from (XLA runs a loop on its carry's buffer, in place):
    a scan's carry outputs come first, then its stacked outputs (None); a while loop's outputs are its carry."""
    name, params = eqn.primitive.name, eqn.params
    if name == "scan":
        start, carried = scan_operand_counts(params)
        return ins[start: start + carried]
    if name == "while":
        return ins[params["cond_nconsts"] + params["body_nconsts"]:]
    return []


def _loop_temporaries(eqn: Any, ins: list[Any], sizes: dict, rules: CompilerRules, local: bool,
                      kept: frozenset = frozenset()) -> tuple[int, int, list, list]:
    """Buffers a loop or branch holds while it runs, beyond its inputs and outputs: its body's peak, per
    iteration (a scan's body sees one slice of each scanned input, split as that input is); of those, the first
    block's forward buffers (see :func:`_peak`); the shardings of its outputs, as its body leaves them (a
    scan's stacked outputs: split as one iteration's); and the block each output belongs to (a loop over
    microbatches carries each block's summed gradients out)."""
    bodies = []  # (body jaxpr, the specs of its inputs, the loop operand each input is, None: carried or sliced)
    specs = [v.spec if v is not None else () for v in ins]
    name, params = eqn.primitive.name, eqn.params
    if name == "scan":
        n_consts, n_carry = scan_operand_counts(params)
        sliced = [spec[1:] for spec in specs[n_consts + n_carry:]]
        bodies.append((params["jaxpr"], specs[: n_consts + n_carry] + sliced,
                       ins[:n_consts] + [None] * (len(specs) - n_consts)))
    elif name == "while":
        body_consts, cond_consts = params["body_nconsts"], params["cond_nconsts"]
        carry = specs[cond_consts + body_consts:]
        bodies.append((params["cond_jaxpr"], specs[:cond_consts] + carry, ins[:cond_consts] + [None] * len(carry)))
        bodies.append((params["body_jaxpr"], specs[cond_consts: cond_consts + body_consts] + carry,
                       ins[cond_consts: cond_consts + body_consts] + [None] * len(carry)))
    elif name == "cond":
        bodies += [(branch, specs[1:], [None] * (len(specs) - 1)) for branch in params["branches"]]
    peaks, body_out_specs, out_blocks = [], [], []
    for body, body_specs, constants in bodies:
        body = body.jaxpr if hasattr(body, "jaxpr") else body
        program = _Program(sizes, rules)
        program.kept = kept  # a loop in a partial-manual shard_map's body (see _Value.partial_manual)
        inputs = [program.value(v.aval, () if local else spec)
                  for v, spec in zip(body.invars, body_specs, strict=False)]
        created = [_created(outer) for outer in constants]
        for value, made in zip(inputs, created, strict=False):
            if made:  # made from nothing split: it takes its reader's split in the body (below)
                value.producer, value.operands = "broadcast_in_dim", []
            else:
                value.is_arg = value.materialised = True
        for value, outer in zip(inputs, constants, strict=False):  # a block's parameters stay that block's inside
            block = None if outer is None else _parameters_block(outer)
            if block is not None:
                value.origin = f"blocks/{block}"
        outputs = program.inline(body, inputs, local=local)
        # Values made from nothing inside the body take their readers' split too: a rematerialised block makes its
        # attention mask again in the backward loop's body (measured: that (batch, heads, T, T) fill counted
        # unsplit put the scanned 1.3B's dp-tp `block` plan at 4.4x XLA:CPU's peak, 41.1 against 9.3 GiB).
        _split_created_values(program)
        if any(created):
            for value, made, outer in zip(inputs, created, constants, strict=False):
                if made and any(value.spec) and not any(_source(outer).spec):
                    _source(outer).resplit(value.spec, sizes)  # the partitioner splits it as the body reads it
                if made and not _sinkable(outer):  # a broadcast of an input: passed in, a buffer of its own
                    value.is_arg = value.materialised = True
        peaks.append((_simulate(program, inputs, outputs), program.block_at_peak))
        body_out_specs.append([v.spec if v is not None else () for v in outputs])
        out_blocks = [None if v is None else _summed_block(v) for v in outputs]
    out_specs = _propagate(eqn, ins, local)
    if not local and body_out_specs:
        if name == "scan":
            n_carry = scan_operand_counts(params)[1]
            carry = body_out_specs[-1][:n_carry]
            stacked = [((),) + spec for spec in body_out_specs[-1][n_carry:]]
            out_specs = carry + stacked
        else:  # a while loop's carry, a cond's branch outputs
            out_specs = body_out_specs[-1]
    peak, block = max(peaks, default=(0, 0))
    return peak, block, out_specs, out_blocks


# --- sharding propagation (values outside shard_map, on meshes whose axes are not in the types) ---------


def _propagate(eqn: Any, ins: list[Any], local: bool) -> list[AxesPerDimension]:
    outs = eqn.outvars
    if local:
        return [()] * len(outs)
    explicit = [s for s in (_aval_spec(var.aval) for var in outs) if s is not None]
    if len(explicit) == len(outs):  # JAX tracked every output's sharding in its type
        return explicit
    name, params = eqn.primitive.name, eqn.params
    if name in ("sharding_constraint", "reshard"):
        sharding = params.get("sharding") or params.get("dst_sharding")
        return [spec_of(getattr(sharding, "spec", None), len(outs[0].aval.shape))]
    if name == "dot_general" and len(ins) == 2 and None not in ins:
        return [_dot_spec(params["dimension_numbers"], ins[0], ins[1])]
    if name == "broadcast_in_dim" and ins and ins[0] is not None:
        spec = [()] * len(outs[0].aval.shape)
        for i, d in enumerate(params["broadcast_dimensions"]):
            if ins[0].shape[i] == outs[0].aval.shape[d]:
                spec[d] = ins[0].spec[i]
        return [tuple(spec)]
    if name == "transpose" and ins and ins[0] is not None:
        return [tuple(ins[0].spec[p] for p in params["permutation"])]
    if name in ("reshape", "squeeze", "expand_dims") and ins and ins[0] is not None:
        return [_reshape_spec(ins[0].shape, ins[0].spec, tuple(outs[0].aval.shape))]
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        axes = set(params.get("axes", ()))
        source = ins[0]
        if source is None:
            return [()] * len(outs)
        return [tuple(s for i, s in enumerate(source.spec) if i not in axes)] * len(outs)
    result = []
    for var in outs:  # elementwise and the rest (scatters): per dimension, an operand's of that size there
        shape = tuple(var.aval.shape)
        spec, used = [], set()
        for d, size in enumerate(shape):
            entry = next((v.spec[d] for v in ins if v is not None and len(v.shape) > d
                          and v.shape[d] == size and v.spec[d]), ())
            entry = tuple(a for a in entry if a not in used)
            used.update(entry)
            spec.append(entry)
        result.append(tuple(spec))
    return result


def _split_created_values(program: _Program) -> None:
    """Backward propagation: a value made from nothing split (zeros, iota, a broadcast scalar) takes the
    sharding of the same-shaped result it feeds, as the partitioner creates it where it is used. Inside a
    partial-manual shard_map the batch's activations are not split over the compiler's axes either, but they vary
    over the manual ones: they are computed, not made, and keep their sharding (measured: taking the split of
    their readers halved fsdp-tp's layer norms over 'model', 0.82 of XLA:CPU's peak)."""
    for name, ins, outs, _ in reversed(program.ops):
        out = outs[0] if outs else None
        if out is None or not any(out.spec) or name in _CONTRACTIONS:
            continue
        for value in map(_source, ins):  # through views: a created value crosses a shard_map's boundary as one
            if (value.shape == out.shape and not any(value.spec) and not value.is_arg and value.producer in _FUSIBLE
                    and not value.varies and all(not any(v.spec) and not v.varies for v in value.operands)):
                value.resplit(out.spec, program.sizes)


def _sums_over_split_dimension(eqn: Any, ins: list[Any]) -> bool:
    """A matmul contracting, or a reduction reducing, a dimension split over devices."""
    name = eqn.primitive.name
    if name == "dot_general" and len(ins) == 2 and ins[0] is not None:
        (lc, _), _ = eqn.params["dimension_numbers"]
        return any(ins[0].spec[d] for d in lc)
    if name in ("reduce_sum", "reduce_max", "reduce_min") and ins and ins[0] is not None:
        return any(ins[0].spec[d] for d in eqn.params.get("axes", ()))
    return False


_EXPLICIT: dict[Any, frozenset] = {}


def _aval_spec(aval: Any) -> AxesPerDimension | None:
    """The sharding JAX tracked in the type (Explicit mesh axes), or None."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or mesh is None or not getattr(mesh, "axis_names", ()):
        return None
    explicit = _EXPLICIT.get(mesh)
    if explicit is None:
        explicit = _EXPLICIT[mesh] = frozenset(
            name for name, kind in zip(mesh.axis_names, getattr(mesh, "axis_types", ()), strict=False)
            if "Explicit" in str(kind))
    if not explicit:
        return None
    return tuple(tuple(a for a in entry if a in explicit) for entry in spec_of(spec, len(aval.shape)))


def _dot_spec(dimension_numbers: Any, lhs: _Value, rhs: _Value) -> AxesPerDimension:
    (lc, rc), (lb, rb) = dimension_numbers
    batch = [tuple(dict.fromkeys(lhs.spec[a] + rhs.spec[b])) for a, b in zip(lb, rb, strict=False)]
    lhs_free = [lhs.spec[i] for i in range(len(lhs.shape)) if i not in lc and i not in lb]
    rhs_free = [rhs.spec[i] for i in range(len(rhs.shape)) if i not in rc and i not in rb]
    spec, used = [], set()
    for entry in batch + lhs_free + rhs_free:  # an axis splits at most one dimension
        keep = tuple(a for a in entry if a not in used)
        used.update(keep)
        spec.append(keep)
    return tuple(spec)


def _reshape_spec(old: tuple, spec: AxesPerDimension, new: tuple) -> AxesPerDimension:
    """A split dimension keeps its axes on the first new dimension of its group (merges and splits)."""
    out = [()] * len(new)
    i = j = 0
    while i < len(old) and j < len(new):
        gi, gj = [i], [j]
        a, b = old[i], new[j]
        while a != b:
            if a < b:
                i += 1
                gi.append(i)
                a *= old[i]
            else:
                j += 1
                gj.append(j)
                b *= new[j]
        axes = spec[gi[0]] if spec else ()
        if axes:  # on the group's first dimension larger than 1 (_fit drops axes from a dimension of 1)
            out[next((j for j in gj if new[j] > 1), gj[0])] = axes
        i, j = i + 1, j + 1
    return tuple(out)


# --- the simulation --------------------------------------------------------------------------------------


def _buffers(value: _Value) -> list[_Value]:
    """The materialised buffers a consumer reads when it reads ``value`` (through fused work and views)."""
    if value.buffers is None:
        if value.materialised:
            value.buffers = [value]
        else:
            found: dict[int, _Value] = {}
            for operand in value.operands:
                for buffer in _buffers(operand):
                    found[id(buffer)] = buffer
            value.buffers = list(found.values())
    return value.buffers


def _created(value: _Value | None) -> bool:
    """A value made from nothing split (a broadcast scalar, an iota, a broadcast of an unsplit input such as the
    causal mask), which the partitioner splits as its readers need it: passed to a loop, as the loop's body reads
    it (measured: the 1.3B's (batch, heads, T, T) mask counted unsplit put a scanned dp-tp plan at 4x XLA:CPU)."""
    value = _source(value) if value is not None else None  # through views (a shard_map's boundary)
    return (value is not None and value.producer in ("broadcast_in_dim", "iota") and not value.is_arg
            and not value.varies and all(not any(v.spec) and not v.varies for v in value.operands))


def _sinkable(value: _Value | None) -> bool:
    """A loop's constant operand made from nothing (a broadcast scalar, an iota): XLA sinks it into the loop's
    body (``WhileLoopConstantSinking``), where it is made as the body reads it, instead of passing a buffer.
    Measured: a scanned dp-tp transformer's attention fills, broadcast to (batch, heads, T, T) outside the scan
    and counted whole there, put the plan at 1.33x XLA:CPU's peak (d_model 512; 4.2x, 221 GiB, for the 1.3B on
    data=64,model=8)."""
    value = _source(value) if value is not None else None
    return (value is not None and value.producer in ("broadcast_in_dim", "iota") and not value.operands
            and not value.is_arg)


def _demand(value: _Value) -> None:
    """A consumer needs ``value`` stored: a fused value becomes a buffer (a view: its source does)."""
    while value.producer == "view" and value.operands:
        value = value.operands[0]
    if not value.materialised:
        value.materialised = True


def _duplicable(name: str, ins: list, outs: list, consumers: dict[int, int], rules: CompilerRules,
                divisors: set[int]) -> bool:
    """Whether XLA recomputes this fused work inside each of its consumers rather than storing it: not for
    an expensive float op read twice, nor (XLA:CPU) a broadcast of a non-scalar read twice, unless only as a
    divisor (``divisors``): XLA's algebraic simplifier turns ``a / broadcast(b)`` into ``a * broadcast(1 / b)``,
    each reader its own small reciprocal (measured: a softmax's row sums, read by its forward and backward
    divisions, are broadcast inside both fusions on XLA:CPU, never stored), or a broadcast of a constant of the
    program (the causal mask, a NumPy array): XLA keeps the constant and broadcasts it inside each reader
    (measured: stored, the (batch, heads, T, T) masks of a rematerialised 512-token model put its plan at 1.16x
    XLA:CPU's peak under ``block``; 0.99 fused)."""
    if (rules.stores_one_element_values and all(math.prod(out.shape) == 1 for out in outs)
            and any(consumers.get(id(out), 0) for out in outs)):
        # A step ahead of its readers in a breadth-first schedule (a schedule tie's marker, a slice of a gradient):
        # fused into the tie, the mlp's fsdp bf16 step re-gathered a layer before its weight gradient was
        # reduce-scattered, 1.34 of JAX 0.10's XLA:CPU peak (1.04 stored).
        return False
    if not any(consumers.get(id(out), 0) > 1 for out in outs):
        return True
    # Without stores_narrow_expensive_work (JAX 0.10's XLA:CPU), bfloat16 work (NumPy's kind "V", not "f") is never
    # counted expensive, so a bf16 softmax's exponentials are computed again in each reader. Against XLA's rule, but
    # 0.10's rules were measured with it: counted expensive (jnp.issubdtype alone, 2026-11-28), 0.10's 16-head fsdp-tp
    # rows fell to 0.78-0.92 of its peak. JAX 0.12's compiler: docs/design/compile-verification.md.
    narrow_too = rules.stores_narrow_expensive_work
    floats = [out.dtype for out in outs if out.dtype is not None
              and (jnp.issubdtype(out.dtype, jnp.floating) if narrow_too else out.dtype.kind == "f")]
    if (any(rules.is_expensive(name, dtype.name) for dtype in floats)
            and not (narrow_too and _multiplies(name, ins, outs))):
        return False
    if name == "broadcast_in_dim" and rules.stores_shared_broadcasts:
        return (not ins or math.prod(ins[0].shape) <= 1 or _source(ins[0]).constant
                or all(id(out) in divisors for out in outs))
    return True


def _multiplies(name: str, ins: list, outs: list) -> bool:
    """A division by a constant, a scalar or a broadcast: XLA's algebraic simplifier makes it a multiplication by a
    reciprocal computed once, cheap work fused into each reader (the attention's ``scores / sqrt(head_dim)``: stored,
    a 16-head, 1,024-token bf16 step kept another (batch, heads, T, T) buffer per block that JAX 0.12's XLA:CPU does
    not)."""
    if name != "div":
        return False
    if len(ins) < 2:  # the divisor is a literal
        return True
    size, divisor = math.prod(outs[0].shape), _source(ins[1])
    return math.prod(ins[1].shape) < size or (divisor.producer == "broadcast_in_dim"
                                              and all(math.prod(v.shape) < size for v in divisor.operands))


def _divisors_only(program: _Program) -> set[int]:
    """The ids of values every reader of which divides by them (see :func:`_duplicable`)."""
    divisors: set[int] = set()
    other: set[int] = set()
    for name, ins, _, _ in program.ops:
        for position, value in enumerate(ins):
            (divisors if name == "div" and position == 1 else other).add(id(value))
    return divisors - other


def _schedule(running: list, as_one: bool, argument_shapes: set[tuple]) -> list:
    """``running`` with the partitioner's all-reduces combined as XLA's all-reduce combiner does: each waits
    until a reader needs its result, and then all waiting ones run at once (one tuple all-reduce).

    Where the compiler runs them as one (``as_one``, XLA:CPU), a parameter's gradient (a sum shaped like one of the
    step's arguments) passed on by an optimisation barrier or a transpose keeps waiting, that part of the barrier moved
    after the sums: XLA:CPU expands the barriers before it combines all-reduces. Measured (the 2-block transformer's
    dp step under remat ``block``, JAX 0.10): both blocks' gradients summed in one all-reduce at the end of block 0's
    backward pass, block 1's live through it; summed at the barrier, they were gone there, and the plan held 0.95 of
    the compiler's peak (0.96 so). Only gradients: moving the tensor-parallel activations' sums too put JAX 0.12's
    fsdp-tp bf16 ``dots`` row at 0.84 (0.97 so)."""
    ordered, waiting, produced_by_waiting = [], [], set()
    moved: list = []  # (as_one) what only passes a waiting sum on: it runs after the sums
    for op in running:
        if op[0] == PARTITIONER_ALL_REDUCE:
            waiting.append(op)
            produced_by_waiting.update(id(out) for out in op[2])
            continue
        parts = [op]
        if as_one and waiting and op[0] in _PASSES_ON:
            kept, passed = _split_passing_on(op, produced_by_waiting, argument_shapes)
            if passed is not None:
                moved.append(passed)
                produced_by_waiting.update(id(out) for out in passed[2])
            parts = [kept] if kept is not None else []
        for name, ins, outs, body in parts:
            if waiting and any(id(buffer) in produced_by_waiting for value in ins for buffer in _buffers(value)):
                ordered += _combined(waiting, as_one) + moved
                waiting, produced_by_waiting, moved = [], set(), []
            ordered.append((name, ins, outs, body))
    return ordered + _combined(waiting, as_one) + moved


# Ops that only pass a sum on (see _schedule): an optimisation barrier (output i is operand i) and a transpose.
_PASSES_ON = {"optimization_barrier", "transpose"}


def _split_passing_on(op: tuple, waiting: set[int], argument_shapes: set[tuple]) -> tuple[tuple | None, tuple | None]:
    """``op`` (in ``_PASSES_ON``) as the part to run now and the part that passes parameters' gradients among the
    ``waiting`` sums on, to run after them; either is None where it would have no operands."""
    name, ins, outs, body = op
    if name != "optimization_barrier" or len(ins) != len(outs):
        pairs = [(ins, outs)]
    else:
        pairs = [([value], [out]) for value, out in zip(ins, outs, strict=True)]
    # A transposed sum of an argument's size passes a parameter's gradient on too: a kernel contracted as
    # (d_model, heads, head_dim) (training/head_projection.py) has its gradient computed as (heads, head_dim, d_model),
    # transposed, and reshaped to the kernel's shape (a view).
    passes = [all(out.shape in argument_shapes or (name == "transpose" and _sized_as_an_argument(out, argument_shapes))
                  for out in part_outs)
              and any(id(buffer) in waiting for value in part_ins for buffer in _buffers(value))
              for part_ins, part_outs in pairs]

    def part(which: bool) -> tuple | None:
        chosen = [pair for pair, passing in zip(pairs, passes, strict=True) if passing == which]
        if not chosen:
            return None
        return (name, [v for ins_, _ in chosen for v in ins_], [o for _, outs_ in chosen for o in outs_], body)

    return part(False), part(True)


def _sized_as_an_argument(value: _Value, argument_shapes: set[tuple]) -> bool:
    """Whether ``value`` has as many elements as one of the step's arguments (shapes ``argument_shapes``), in at
    least as many dimensions of more than one element (a parameter's gradient, its dimensions split or permuted)."""
    dims = [d for d in value.shape if d != 1]
    return any(math.prod(dims) == math.prod(shape) and len(dims) >= len([d for d in shape if d != 1])
               for shape in argument_shapes if shape)


def _combined(waiting: list, as_one: bool) -> list:
    """The partitioner's all-reduces that run together, as one op where the compiler runs them as one (XLA:CPU's
    combined tuple all-reduce): a scheduler cannot run one of them apart from the others. Measured: scheduled
    apart, the list schedule ran each as soon as its partial sum was ready and held a per-layer fsdp-tp step at
    0.85 of XLA:CPU's peak (0.88 combined; the 8-device mlp's gradient all-reduce, 0.95 apart, 1.00 combined)."""
    if not as_one or len(waiting) < 2:
        return waiting
    return [(PARTITIONER_ALL_REDUCE, [v for op in waiting for v in op[1]], [v for op in waiting for v in op[2]], 0)]


def _source(value: _Value) -> _Value:
    """The value ``value`` is a view of (itself if it is none)."""
    while value.producer == "view" and value.operands:
        value = value.operands[0]
    return value


def _reads_only_inputs(value: Any) -> bool:
    """A broadcast of constants or of the step's inputs alone (nothing computed): zeros, a bias."""
    return (value is not None and value.producer == "broadcast_in_dim"
            and all(operand.is_arg for operand in value.operands))


# The block of a registered transformer that made a value, from its name stack ("jvp(blocks/0)/attn",
# "transpose(jvp(blocks/1))/..."): the first one named.
_BLOCK_NAME = re.compile(r"(?:^|[/(])blocks/(\d+)(?:$|[/)])")


def _block(origin: str) -> int | None:
    found = _BLOCK_NAME.search(origin)
    return int(found.group(1)) if found else None


_FIRST_BLOCK_STATE = re.compile(r"\['blocks'\]\[0\]")  # its leaves' paths: ...['blocks'][0]['attn']...


def _fused_into_matmul(name: str, value: _Value, rules: CompilerRules) -> bool:
    """Whether a matmul reads ``value`` fused into its operand. XLA:GPU's GEMM fusion takes a chain of cheap
    elementwise work over one stored value and the step's inputs (a ReLU after a bias add, a cast): not work
    that combines two computed values (a GELU's ``x * f(x)``, a softmax's normalisation), which is stored.
    libtpu's convolution fusions take any elementwise work (``fuses_any_matmul_operand_work``)."""
    if name != "dot_general" or not rules.fuses_matmul_operands or value.producer not in _FUSIBLE:
        return False
    if rules.fuses_any_matmul_operand_work:
        return True
    while value.producer in _FUSIBLE or value.producer == "view":
        if rules.is_expensive(value.producer, value.dtype.name if value.dtype is not None else ""):
            return False
        computed = [operand for operand in value.operands if not _from_inputs(operand)]
        if len(computed) > 1:
            return False
        if not computed:
            return True
        value = computed[0]
    return True


def _owning_block(value: _Value) -> int | None:
    """The block a value belongs to: the one that made it, by its name (``_block``), else the one a loop's
    output carries, else the one whose parameters alone it is made of (``_parameters_block``)."""
    made_by = _block(value.origin)
    if made_by is not None:
        return made_by
    return value.block if value.block is not None else _parameters_block(value)


def _summed_block(value: _Value, depth: int = 5) -> int | None:
    """The block of a loop's output: its own (``_owning_block``), or where a few elementwise ops and views combine one
    block's values with the loop's inputs and blockless work (a gradient weighted by the batch's, reshaped to a shape
    of its own and summed over microbatches: training/shapes_apart.py), that block."""
    own = _owning_block(value)
    if own is not None or (value.producer not in _FUSIBLE and value.producer != "view") or not depth:
        return own
    blocks = {_summed_block(operand, depth - 1) for operand in value.operands if not operand.is_arg} - {None}
    return blocks.pop() if len(blocks) == 1 else None


def _parameters_block(value: _Value, depth: int = 4) -> int | None:
    """The block whose parameters alone ``value`` is made of by a few elementwise ops or views, outside the block's
    own work (the bfloat16 copy of a block's weights, cast at the start of the step): it is that block's, however
    deep the model. None if it reads work, or the parameters of no block or of several."""
    if value.is_arg:
        return _block(value.origin)
    if not (value.producer in _FUSIBLE or value.producer == "view") or not value.operands or not depth:
        return None
    blocks = {_parameters_block(operand, depth - 1) for operand in value.operands}
    return blocks.pop() if len(blocks) == 1 else None


def _from_inputs(value: _Value) -> bool:
    """A value made of the step's inputs and constants alone (a parameter, a bias broadcast): no work."""
    if value.is_arg:
        return True
    return ((value.producer in _FUSIBLE or value.producer == "view")
            and all(_from_inputs(operand) for operand in value.operands))


def _absorb_transposes(program: _Program, consumers: dict[int, int]) -> None:
    """A matmul's result read only by a transpose is written in the transposed layout (XLA's layout
    assignment picks the dot's output layout): the transpose is a view of the matmul's buffer, not a copy
    (measured: a gradient ``x.T @ dy`` transposed for its reduce-scatter is one buffer on XLA:CPU and GPU)."""
    for name, ins, outs, _ in program.ops:
        if (name == "transpose" and len(ins) == 1 and len(outs) == 1 and ins[0].producer == "dot_general"
                and consumers.get(id(ins[0])) == 1):
            outs[0].producer = "view"


def _cast_before_gathering(program: _Program) -> None:
    """XLA:GPU gathers the cast values when an all-gather's one large reader narrows it (f32 -> bf16): the
    gathered buffer takes the narrow type and the cast is a view of it (measured: fsdp's bf16 step sends half
    the all-gather bytes of its fp32 step on XLA:GPU, the same on XLA:CPU). Readers of a few of its elements
    (a slice the partitioner takes of a replicated weight) do not stop it."""
    readers: dict[int, list] = {}
    for op in program.ops:
        for value in op[1]:
            readers.setdefault(id(value), []).append(op)
    for name, _, outs, _ in program.ops:
        if name != "all_gather" or len(outs) != 1:
            continue
        gathered = outs[0]
        value, casts = gathered, []
        while True:  # through views (a reshape, shard_map's output) to the cast
            large = [op for op in readers.get(id(value), ()) if math.prod(op[2][0].shape) * 64 > math.prod(value.shape)]
            if len(large) != 1:
                break
            op = large[0]
            if op[0] == "convert_element_type" and op[2][0].itemsize < gathered.itemsize:
                casts.append(op[2][0])
                break
            if op[2][0].producer != "view":
                break
            value = op[2][0]
        for cast in casts:
            gathered.nbytes = gathered.nbytes * cast.itemsize // gathered.itemsize
            cast.producer, cast.operands = "view", [value]


def _simulate(program: _Program, inputs: list[Any], outputs: list[Any]) -> int:
    """Peak bytes of temporaries: buffers neither inputs nor outputs, live at once."""
    _drop_dead_ops(program, outputs)
    if program.rules.reassociates_all_reduces:
        _reassociate_all_reduces(program, outputs)
    if program.rules.shares_squares:
        _share_squares(program)
    consumers: dict[int, int] = {}
    for _, ins, _, _ in program.ops:
        for value in ins:
            consumers[id(value)] = consumers.get(id(value), 0) + 1
    _fold_scatters_into_sums(program, consumers)
    _absorb_transposes(program, consumers)
    if program.rules.casts_before_gathering:
        _cast_before_gathering(program)
    for name, ins, outs, _ in program.ops:
        if name not in _FUSIBLE:
            for out in outs:
                out.materialised = True
            if name not in _FUSES_OPERANDS:
                for value in ins[1:] if name in _IN_PLACE else ins:
                    if not _fused_into_matmul(name, value, program.rules) and not (name in _LOOPS and _sinkable(value)):
                        _demand(value)
            if name in _IN_PLACE and ins and _reads_only_inputs(_source(ins[0])):
                _source(ins[0]).materialised = True  # zeros a scatter writes into: stored at the start (below)
    if program.rules.tree_reduces_narrow_sums:
        _store_tree_reduced_operands(program)
    divisors = _divisors_only(program)
    for name, ins, outs, _ in program.ops:
        if name in _FUSIBLE and not _duplicable(name, ins, outs, consumers, program.rules, divisors):
            for out in outs:
                out.materialised = True
    if program.rules.stores_reduced_sums:
        _store_reduced_sums(program, consumers)
    if program.rules.stores_narrow_expensive_work:
        _copy_summed_exponentials(program)
    if program.rules.stores_large_norm_operands:
        _store_large_norm_operands(program, consumers)
    if program.rules.copies_shared_matmul_operands:
        _copy_shared_matmul_operands(program)
    if program.rules.copies_handed_down_gradients:
        _copy_handed_down_gradients(program, consumers, divisors)
    if program.rules.stores_shared_recomputed_work:
        _store_shared_recomputed_work(program)
    for value in outputs:
        if value is not None:
            _demand(value)
            root = value
            while root.producer == "view" and root.operands:
                root = root.operands[0]
            root.is_output = True
    # The ops that run, in program order: those that store a value (fused work runs inside its consumers).
    running = _schedule([op for op in program.ops if any(out.materialised for out in op[2]) or op[0] not in _FUSIBLE],
                        program.rules.runs_combined_all_reduces_as_one,
                        {value.shape for value in inputs if value is not None})
    # XLA:CPU's scheduler runs stored broadcasts of the step's inputs and constants first, right after the
    # parameters (measured: the zeros of the embedding gradient's scatter-add are live from the start).
    first = [op for op in running
             if op[0] == "broadcast_in_dim" and op[2][0].materialised and _reads_only_inputs(op[2][0])]
    if first:
        moved = {id(op) for op in first}
        running = first + [op for op in running if id(op) not in moved]
    # XLA:CPU schedules breadth-first (see _breadth_first_order). For the other compilers, whose schedulers the
    # simulation does not follow op by op, the cheaper of program order and _list_order stands in: XLA's
    # DefaultMemoryScheduler keeps the least memory of a list, a depth-first and a post-order schedule.
    if program.rules.schedules_breadth_first:
        peak, program.block_at_peak = _peak(program, _breadth_first_order(running))
        return peak
    in_order, listed = _peak(program, running), _peak(program, _list_order(running))
    peak, program.block_at_peak = min(in_order, listed)
    return peak


def _reassociate_all_reduces(program: _Program, outputs: list[Any]) -> None:
    """XLA's AllReduceReassociate: the sum of two of the partitioner's all-reduces, each read by that sum alone, is
    the all-reduce of their partial results' sum, one buffer where there were two (a transformer block's q, k and v
    input gradients, summed over 'model' once). Measured on libtpu: the unrolled fsdp-tp step under remat block held
    three such all-reduced (batch, T, d_model) gradients at the plan's peak, 1.29x libtpu's HBM block (1.13 so). An
    all-reduce the program also returns is left as it is."""
    readers: dict[int, int] = {id(_source(value)): 2 for value in outputs if value is not None}
    for _, ins, _, _ in program.ops:
        for value in ins:  # through views: a reshape of an all-reduce reads it too
            readers[id(_source(value))] = readers.get(id(_source(value)), 0) + 1
    producing = {id(out): op for op in program.ops for out in op[2]}
    dropped: set[int] = set()
    ops = []
    for op in program.ops:
        name, ins, outs, body = op
        sums = [producing.get(id(value)) for value in ins]
        if (name in ("add", "add_any") and len(ins) == 2 and len(outs) == 1
                and all(s is not None and s[0] == PARTITIONER_ALL_REDUCE and len(s[2]) == 1
                        and readers.get(id(value)) == 1 and value.shape == outs[0].shape
                        for s, value in zip(sums, ins, strict=True))):
            partials = [s[1][0] for s in sums if s is not None]
            if partials[0].spec == partials[1].spec:
                dropped.update(id(s) for s in sums)
                total = outs[0]
                partial = program.like(partials[0], partials[0].spec)
                partial.producer, partial.operands = name, list(partials)
                total.producer, total.operands = PARTITIONER_ALL_REDUCE, [partial]
                ops += [(name, list(partials), [partial], body), (PARTITIONER_ALL_REDUCE, [partial], [total], 0)]
                producing[id(total)] = ops[-1]
                continue
        ops.append(op)
    program.ops = [op for op in ops if id(op) not in dropped]


def _store_tree_reduced_operands(program: _Program) -> None:
    """Store what a sum in a type the compiler widens (bfloat16 on XLA:CPU) sums over more than 32 elements reads.
    XLA:CPU computes such a sum in float32, rounding each partial sum to bfloat16 (the reduction's computation
    converts), which its YNN library fusion does not take; it then sums in a tree (``TreeReductionRewriter``: a
    reduce-window of 32, then a reduce), and the reduce-window fuses no producer, so the summed operand is stored, in
    float32. Measured (JAX 0.12): the softmax's backward row sum of a 16-head, 1,024-token bf16 step reads a stored
    f32 (batch, heads, T, T) ``convert_convert_fusion``, the step's peak under remat ``block``; the bias gradients'
    sums over the batch's rows read stored ``wrapped_convert``s."""
    for name, ins, outs, _ in program.ops:
        if (name == "reduce_sum" and ins and outs and outs[0].dtype is not None
                and outs[0].itemsize != outs[0].dtype.itemsize
                and math.prod(ins[0].shape) > _TREE_REDUCTION_WINDOW * math.prod(outs[0].shape)):
            _demand(ins[0])


def _drop_dead_ops(program: _Program, outputs: list[Any]) -> None:
    """Drop the ops no output of the step depends on, as XLA's dead code elimination does. The jaxpr has some: a
    block that ``fsdp``'s gathering recomputes under remat ``block`` computes its output again (``jax.vjp``'s primal),
    which nothing reads. Counted, its down projection and that matmul's float32 operand copy were live until a
    breadth-first schedule reached them: JAX 0.10's ``fsdp`` bf16 ``block`` rows of the tests' matrix planned 1.24
    and 1.19 of XLA:CPU's peak (1.12 and 1.10 dropped)."""
    producer = {id(out): k for k, op in enumerate(program.ops) for out in op[2]}
    live_ops: set[int] = set()
    seen: set[int] = set()
    stack = [value for value in outputs if value is not None]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        k = producer.get(id(value))
        if k is None:  # a view (or an input): what it reads
            stack.extend(value.operands)
        elif k not in live_ops:
            live_ops.add(k)
            stack.extend(program.ops[k][1])
    program.ops[:] = [op for k, op in enumerate(program.ops) if k in live_ops]


_SUMS = {"add", "add_any"}


def _fold_scatters_into_sums(program: _Program, consumers: dict[int, int]) -> None:
    """``a + scatter-add(zeros, indices, updates)`` computed as ``scatter-add(a, indices, updates)``, in ``a``'s buffer.

    XLA's algebraic simplifier does so where the scatter reads nothing but broadcast zeros and only the sum reads it:
    the zeros are never made, and the sum is no buffer of its own; ``a`` is stored for the scatter to write into.
    Where: a cross-entropy's gradient, the softmax's part plus the labels' scatter (XLA:CPU's ``wrapped_scatter``
    writes into the softmax gradient's fusion). Counted as the jaxpr has it, the logits-sized zeros and sum put the
    planned peak of the tests' 2-block transformer 2-4% above XLA:CPU's under remat ``none``, at the head's backward
    pass, where its step peaks (dp-tp: 1.033, 0.994 now; fsdp-tp: 1.036, 0.994)."""
    position = {id(out): k for k, op in enumerate(program.ops) for out in op[2]}
    dropped: set[int] = set()
    for k, (name, ins, outs, _) in enumerate(program.ops):
        if name not in _SUMS or len(ins) != 2 or len(outs) != 1:
            continue
        for scattered, other in ((ins[0], ins[1]), (ins[1], ins[0])):
            read = scattered.operands[0] if scattered.operands else None
            zeros = _source(read) if read is not None else None  # through views (a shard_map's pvary)
            if (scattered.producer == "scatter-add" and consumers.get(id(scattered)) == 1 and zeros is not None
                    and zeros.producer == "broadcast_in_dim" and not zeros.operands and not zeros.is_arg
                    and consumers.get(id(read)) == 1 and consumers.get(id(zeros), 0) <= int(read is zeros)
                    and other.shape == scattered.shape and other.dtype == scattered.dtype):
                break
        else:
            continue
        s = position[id(scattered)]
        scatter_name, scatter_ins, scatter_outs, body = program.ops[s]
        scatter_ins = [other, *scatter_ins[1:]]
        scattered.operands = [other, *scattered.operands[1:]]
        _demand(other)  # the buffer the scatter writes into
        program.ops[k] = (scatter_name, scatter_ins, scatter_outs, body)  # the scatter runs where the sum ran
        outs[0].producer, outs[0].operands = "view", [scattered]
        dropped.update((s, position[id(zeros)]))
    if dropped:
        program.ops[:] = [op for k, op in enumerate(program.ops) if k not in dropped]


def _store_reduced_sums(program: _Program, consumers: dict[int, int]) -> None:
    """Store elementwise work that combines two or more computed values (a residual sum ``x + attn(x)``) where a
    reduction reads it and so does other work: XLA:CPU's reduction fusions (YNN) take such a value as a stored
    operand rather than compute it again inside each reader, as XLA fuses work of one operand (a square, a
    scaling). Measured on a per-layer fsdp-tp step: each block's residual sums are ``add_add_fusion`` buffers
    read by the layer norms' ``ynn_fusion`` reductions; counted fused instead, the simulation kept both
    all-reduced block outputs they add alive for the backward pass, 5.1 MiB a block against XLA:CPU's 3.1 (d_model
    256, 256 tokens), and the unrolled 1.3B fsdp-tp plan at 1.44x the compiler's peak (0.93 with this rule). In
    bf16 the layer norm reads the sum through a cast to float32, which the reduction's fusion takes in. XLA:GPU
    stores the sum as well: its unrolled 1.3B fsdp-tp step under remat block on 512 H100s keeps one 64 MiB sum a
    block (1.63x its peak counted fused, 0.99 stored)."""
    reduced = {id(value) for name, ins, _, _ in program.ops if name in _REDUCTIONS for value in ins}
    # A cast the reduction reads (a bfloat16 sum a layer norm computes its statistics of in float32) is fused into
    # the reduction: the reduction reads the sum itself.
    reduced |= {id(ins[0]) for name, ins, outs, _ in program.ops
                if name == "convert_element_type" and len(ins) == 1 and id(outs[0]) in reduced}
    for name, ins, outs, _ in program.ops:
        if (name in _FUSIBLE and len(outs) == 1 and id(outs[0]) in reduced and consumers.get(id(outs[0]), 0) > 1
                and _combines_computed_values(ins, outs[0])):
            outs[0].materialised = True


def _share_squares(program: _Program) -> None:
    """Compute ``x ** 3`` as ``x ** 2 * x`` where the program squares the same ``x`` too, as XLA does: it expands an
    integer power into products and merges equal ones, so a GELU's cube and its derivative's square read one ``x * x``.
    The square then has two readers, and JAX 0.12's XLA:CPU stores it in a recomputed GELU
    (``multiply_convert_fusion``, see :func:`_store_shared_recomputed_work`). The square moves ahead of the cube."""
    ops = program.ops
    squares = {id(op[1][0]): op for op in ops
               if op[0] == "integer_pow" and op[1] and program.exponents.get(id(op[2][0])) == 2}
    for name, ins, outs, body in list(ops):
        square_op = squares.get(id(ins[0])) if name == "integer_pow" and ins else None
        if square_op is None or program.exponents.get(id(outs[0])) != 3:
            continue
        cube = ops.index((name, ins, outs, body))
        if ops.index(square_op) > cube:
            ops.remove(square_op)
            ops.insert(cube, square_op)
            cube += 1
        operands = [square_op[2][0], ins[0]]
        outs[0].producer, outs[0].operands = "mul", operands
        ops[cube] = ("mul", operands, outs, body)


# JAX's name for the work a rematerialised block does again in the backward pass (its name stack's entry).
_RECOMPUTED = "rematted_computation"


def _store_shared_recomputed_work(program: _Program) -> None:
    """Store elementwise work in a widened type (bfloat16 on XLA:CPU) that a rematerialised block recomputes and that
    two stored ops read (through fused work), in its own type, as JAX 0.12's XLA:CPU does. Its recomputed GELU is
    read by the backward pass's GELU derivative and by the weight gradient's matmul (through the GELU's output), and
    each shared piece is a fusion of its own: the block's input to GELU, the square, tanh, ``1 + tanh`` and the
    output's factor (``add_convert``, ``multiply_convert``, ``tanh_convert`` fusions).

    That matters for the order, more than the bytes: a longer chain of fusions puts the FFN's backward sum after the
    recomputed attention's exponentials in the breadth-first schedule, and XLA:CPU's peak of a remat ``dots`` step is
    there, with both live. Measured (JAX 0.12, 2026-11-29): the tests' bf16 ``dots`` rows planned 0.825 (fsdp, 128
    tokens, batch 256) and 0.826 (scanned fsdp) of XLA:CPU's peak without this and :func:`_share_squares`; 0.949 and
    1.042 with both. Counting an op's direct readers rather than the stored ops they end in: the same figures. Applied
    outside rematerialised blocks too (without the squares), 512-token ``dp-tp`` ``dots`` fell to 0.815."""
    ops = program.ops
    readers: dict[int, list[int]] = {}
    for index, (_, ins, _, _) in enumerate(ops):
        for value in ins:
            readers.setdefault(id(value), []).append(index)
    ends: dict[int, frozenset] = {}

    def stored_readers(value: _Value) -> frozenset:
        """The stored ops that read ``value``, through the fused work (and views) that reads it."""
        if id(value) not in ends:
            found: set[int] = set()
            for index in readers.get(id(value), ()):
                name, _, outs, _ = ops[index]
                if (name in _FUSIBLE or name in _VIEWS) and outs and not any(out.materialised for out in outs):
                    for out in outs:
                        found |= stored_readers(out)
                else:
                    found.add(index)
            ends[id(value)] = frozenset(found)
        return ends[id(value)]

    # Casts, moves, selections and predicates: not the arithmetic the compiler stores a fusion of (its convert is part
    # of each stored piece, and a broadcast's own rule is _duplicable's).
    not_work = {"broadcast_in_dim", "iota", "convert_element_type", "slice", "pad", "concatenate", "transpose",
                "dynamic_slice", "copy", "select_n", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"}
    stored = False
    for name, _, outs, _ in reversed(ops):  # readers first: what a value's readers end in is settled before it
        if name not in _FUSIBLE or name in not_work or len(outs) != 1:
            continue
        out = outs[0]
        if (out.materialised or out.dtype is None or out.itemsize == out.dtype.itemsize or not out.shape
                or _RECOMPUTED not in out.origin):
            continue
        if len(stored_readers(out)) >= 2:
            out.materialised = True
            out.narrow(program.sizes)
            ends.clear()
            stored = True
    if stored:  # what each op reads, worked out before, may now stop at these
        for _, ins, outs, _ in ops:
            for value in (*ins, *outs):
                value.buffers = None


def _copy_summed_exponentials(program: _Program) -> None:
    """A stored bfloat16 ``exp`` that a sum reads through a float32 cast (a softmax's) as XLA:CPU (JAX 0.12) stores it:
    one YNN fusion computes the row maximum, the subtraction and the exponentials, in float32; the sum reads that
    float32 buffer, and a ``wrapped_convert`` makes the bfloat16 copy every other reader reads (the probabilities, the
    backward pass), so the float32 buffer is gone once both have run. Inside a shard_map that leaves axes to the
    compiler (fsdp-tp's body) the compiler keeps the one float32 buffer for every reader instead
    (``keeps_partial_manual_casts_wide``). Measured: a 16-head, 1,024-token bf16 fsdp step saves a 256 MiB bf16 copy
    a block beside a 512 MiB f32 buffer freed two ops later; fsdp-tp's saves the 512 MiB f32 buffer."""
    reduced = {id(value) for name, ins, _, _ in program.ops if name in _REDUCTIONS for value in ins}
    casts: dict[int, _Value] = {}  # id(exp) -> its float32 cast that a sum reads
    for name, ins, outs, _ in program.ops:
        if (name == "convert_element_type" and len(ins) == 1 and id(outs[0]) in reduced and ins[0].producer == "exp"
                and ins[0].materialised and ins[0].dtype is not None and ins[0].itemsize != ins[0].dtype.itemsize
                and not (program.rules.keeps_partial_manual_casts_wide and ins[0].partial_manual)):
            casts[id(ins[0])] = outs[0]
    if not casts:
        return
    copies: dict[int, _Value] = {}
    ops = []
    for name, ins, outs, body in program.ops:
        if name == "convert_element_type" and len(ins) == 1 and casts.get(id(ins[0])) is outs[0]:
            outs[0].producer, outs[0].operands = "view", [ins[0]]  # the sum reads the float32 exponentials as they are
            continue
        ins = [copies.get(id(value), value) for value in ins]  # every other reader reads the bfloat16 copy
        for out in outs:
            out.operands = [copies.get(id(value), value) for value in out.operands]
        ops.append((name, ins, outs, body))
        if name == "exp" and id(outs[0]) in casts:
            exponentials = outs[0]
            copy = program.value(jax.core.ShapedArray(exponentials.shape, exponentials.dtype), exponentials.spec)
            copy.narrow(program.sizes)
            copy.origin, copy.block, copy.materialised = exponentials.origin, exponentials.block, True
            copy.producer, copy.operands = "convert_element_type", [exponentials]
            copies[id(exponentials)] = copy
            ops.append(("convert_element_type", [exponentials], [copy], 0))
    program.ops[:] = ops


def _store_large_norm_operands(program: _Program, consumers: dict[int, int]) -> None:
    """Store a layer norm's operands as XLA:CPU does where the norm has ``_YNN_NORM_ROWS`` rows or more per device:
    it then computes the norm's backward pass in one YNN reduction fusion, which takes its operands stored.
    Below that the norm's passes are loop and reduce fusions that compute them inside (the rules of the rest of the
    simulation). Two operands:

    * the product of two stored broadcasts, ``rsqrt(var) * scale`` broadcast over the norm's (batch, T, d_model)
      input, read by several fusions (the forward pass computes it again inside its own);
    * in bfloat16, the float32 cast of a stored sum the norm reads (the residual stream), while the sum itself is
      stored in bfloat16 (2 bytes an element, not the 4 the simulation counts bfloat16 work in on XLA:CPU): the
      norm reads the cast, the next block's residual sum and a rematerialised block's saved input the sum.

    Measured (transformer, d_model 128 to 2048, fp32 and bf16, dp, fsdp, tp, dp-tp and fsdp-tp): no stored product
    at 2,048, 3,584 and 4,000 rows, one ``broadcast_multiply_fusion`` a norm at 4,096, 4,160 and 65,536; at 16,384
    rows in bf16 each residual sum a 64 MiB bf16 ``add_convert_fusion`` and a 128 MiB f32 ``wrapped_convert``.
    Counted fused and as one 4-byte sum, the unrolled 1.3B fsdp-tp plan on data=64,model=8 was 0.80 of XLA:CPU's peak
    without remat and 1.26 under ``block`` (its saved block inputs counted 4 bytes an element); 0.92 and 0.98 so.
    Where the compiler keeps the sum as one float32 buffer instead (a jit ``dp-tp`` step; JAX 0.12's per-layer
    fsdp-tp), this counts half a sum more: those rows plan 1.03-1.13 of its peak."""
    reduced = {id(value) for name, ins, _, _ in program.ops if name in _REDUCTIONS for value in ins}
    for name, ins, outs, _ in program.ops:
        if len(outs) != 1 or outs[0].materialised:
            continue
        out = outs[0]
        if name == "mul" and consumers.get(id(out), 0) > 1 and out.shape and _rows(out) >= _YNN_NORM_ROWS:
            broadcasts = [value for value in ins if value is not None and len(value.shape) >= len(out.shape)
                          and _source(value).producer == "broadcast_in_dim" and _source(value).materialised]
            out.materialised = len(broadcasts) >= 2
        elif (name == "convert_element_type" and id(out) in reduced and len(ins) == 1 and ins[0].materialised
              and ins[0].dtype is not None and out.dtype is not None and out.shape and _rows(out) >= _YNN_NORM_ROWS
              and ins[0].dtype.itemsize < out.dtype.itemsize):
            out.materialised = True
            if not (program.rules.stores_narrow_expensive_work and ins[0].producer == "exp"):
                ins[0].narrow(program.sizes)  # (a summed exponential: _copy_summed_exponentials)


def _copy_shared_matmul_operands(program: _Program) -> None:
    """Give each matmul that reads a stored bfloat16 value (computed in float32, ``float_bytes``) read by two or more
    matmuls a float32 copy of its own, made just before it: XLA:CPU (JAX 0.10) computes a bfloat16 matmul in float32
    and converts each operand for it, and where several matmuls read one stored value, each conversion (with the
    transpose a weight gradient's operand takes) is a loop fusion of its own. With one reader the conversion is the
    producer's own output, as the simulation counts it.

    Measured (a 128-wide transformer, 4,096 tokens a device in bf16 under remat ``dots``): the feed-forward's GELU
    gradient, read by the up projection's input and weight gradients, is three float32 copies beside its bf16 buffer
    (``wrapped_convert``, a transposing ``copy_bitcast_fusion``, ``convert_bitcast_fusion``), live together at the
    peak; without them, ``fsdp`` at 4,096 tokens a device in bf16 under remat ``dots`` plans 0.87 of the compiler's
    peak (0.92 with). JAX 0.12's XLA:CPU multiplies bfloat16 natively (``narrow_results``) and copies a few operands
    once: not this.

    One copy per operand and form (the dimensions a matmul contracts it over): XLA's CSE merges identical conversions,
    so the q, k and v projections share their input's copy, and so do their weight gradients their transposed one
    (counted apart, breadth-first, the copies of a block's layer-norm outputs were live together: ``fsdp-tp`` bf16
    planned 1.10 of XLA:CPU's peak and ``dp-tp`` bf16 at 4,096 rows 1.13; 1.01 and 1.03 shared). A reduction of such
    a value (a bias's gradient: the sum of the GELU gradient the matmuls read) takes a float32 copy of its own too
    (``wrapped_convert``): without it, remat ``dots`` in bf16 planned 0.77 and 0.82 of the compiler's peak for
    ``fsdp`` and ``dp`` (0.87 and 0.89 with; their ``block`` rows 1.02 and 1.00, 1.12 and 1.09 with). A batched
    matmul (attention's) reads its copy as it is, so the probabilities' two matmuls share one: counted apart,
    breadth-first, a 512-token model's ``fsdp`` bf16 ``block`` step planned 1.31 of XLA:CPU's peak (1.13 shared)."""
    readers: dict[int, tuple[_Value, list[tuple[int, int]]]] = {}
    form: dict[tuple[int, int], Any] = {}  # how each read takes its copy (see below)
    for index, (name, ins, outs, _) in enumerate(program.ops):
        if name == "dot_general":
            for position, value in enumerate(ins):
                stored = _stored_operand(value)
                if stored is not None:
                    readers.setdefault(id(stored), (stored, []))[1].append((index, position))
                    form[(index, position)] = program.matmul_forms[id(outs[0])][position]
    for index, (name, ins, _, _) in enumerate(program.ops):
        if name in _REDUCTIONS and name != "reduce_precision" and ins:
            stored = _stored_operand(ins[0])
            if stored is not None and id(stored) in readers:
                readers[id(stored)][1].append((index, 0))
                form[(index, 0)] = "reduction"
    for _, reads_ in readers.values():
        reads_.sort()  # the first reader gets the copy it shares
    reads = [read for _, reads in readers.values() if len(reads) > 1 for read in reads]
    _float32_copies(program, reads, "convert_element_type", [form[read] for read in reads])


def _float32_copies(program: _Program, reads: list[tuple[int, int]], producer: str,
                    forms: list[Any] | None = None) -> None:
    """Give each read in ``reads`` (an op's index and the position of the operand it reads) a float32 copy of that
    operand, a buffer of its own that an op ``producer`` makes just before the reader. With ``forms`` (one per
    read), reads of one operand in one form share a copy, made before the first of them (XLA's CSE merges identical
    conversions)."""
    copies = []
    made: dict[tuple, _Value] = {}
    for number, (index, position) in enumerate(reads):
        operands = program.ops[index][1]
        read = operands[position]
        key = (id(read), forms[number]) if forms is not None else None
        if key in made:
            operands[position] = made[key]
            continue
        copy = program.value(jax.core.ShapedArray(read.shape, np.float32), read.spec)
        copy.origin, copy.producer, copy.operands = read.origin, producer, [read]
        copy.materialised = True
        operands[position] = copy
        if key is not None:
            made[key] = copy
        copies.append((index, (producer, [read], [copy], 0)))
    for index, op in sorted(copies, key=lambda copy: -copy[0]):  # from the last, so earlier indices hold
        program.ops.insert(index, op)


def _copy_handed_down_gradients(program: _Program, consumers: dict[int, int], divisors: set[int]) -> None:
    """Compute a block's float32 input gradient, handed down to the block below, again in each of its readers there,
    as XLA:CPU does: a copy made just before each matmul and reduction that reads it, the work fused into its other
    readers, and the buffers it is computed from kept until the last of them (it is elementwise work the
    simulation had stored once, at its first reader's demand).

    Measured (JAX 0.10 and 0.12, the 2-block transformer's fsdp-tp step under remat ``block`` in float32, 1,024
    tokens a device): block 1's input gradient, the end of its first norm's backward pass plus the residual
    stream's gradient, tied after the block's reduce-scatters, is computed inside four fusions of block 0's
    backward pass: a copy for the down projection's input-gradient matmul, a transposed one for its weight
    gradient, one for its bias gradient's reduction, and the residual sum; three buffers it is computed from live
    until the last. Stored once, the plan held 0.89 of the compiler's peak; 1.00 so (fsdp in float32 0.96 ->
    1.04; 4 blocks of fsdp-tp 0.90 -> 0.94). In bfloat16 the gradient ends in a cast, which JAX 0.12's XLA:CPU
    stores once (``add_convert_fusion``): float32 only.

    A jit step hands its gradient down through an optimisation barrier (``schedule_ties.handed_down_after``), which
    XLA:CPU expands: the gradient is stored once, as the simulation counts the barrier's output, and the weight-gradient
    matmul that contracts over its rows reads a transposed copy of it. Measured (the dp step under remat ``block``, the
    same transformer at 1,024 tokens a device): ``copy_bitcast_fusion.11``, f32[128,1024], live through block 0's
    feed-forward backward pass, the step's peak; without it the plan held 0.958 of the compiler's peak (0.968 with;
    JAX 0.12 0.989 and 0.999)."""
    reads_of: dict[int, list[tuple[int, int, str, list]]] = {}
    for index, (name, ins, outs, _) in enumerate(program.ops):
        for position, value in enumerate(ins):
            reads_of.setdefault(id(value), []).append((index, position, name, outs))

    def reads(value: _Value, depth: int = 0) -> list[tuple[int, int, str, str]]:
        """Who reads ``value``, through views and transposes: (op index, operand position, op name, its origin)."""
        found = []
        for index, position, name, outs in reads_of.get(id(value), []):
            view = outs[0] if len(outs) == 1 else None
            if name in _VIEWS | {"transpose"} and view is not None and not view.materialised and depth < 4:
                found += reads(view, depth + 1)
            else:
                found.append((index, position, name, outs[0].origin if outs else ""))
        return found

    def handed_down(value: _Value, readers: list) -> bool:
        block = _block(value.origin)
        return block is not None and all(_block(origin) not in (None, block) for *_, origin in readers)

    copied = {"dot_general"} | _REDUCTIONS
    copies: list[tuple[int, int]] = []
    for name, ins, outs, _ in program.ops:
        if name == "optimization_barrier":  # a jit step's hand-down: a transposed copy for the weight gradient
            for value in outs:
                if value.materialised and value.dtype == np.float32 and "transpose(" in value.origin:
                    readers = reads(value)
                    if handed_down(value, readers):
                        copies += [(index, position) for index, position, reader, _ in readers
                                   if reader == "dot_general"  # contracting its rows: a result of lower rank
                                   and len(program.ops[index][2][0].shape) < len(value.shape)]
            continue
        if len(outs) != 1:
            continue
        value = outs[0]
        if (name not in _FUSIBLE or name in ("broadcast_in_dim", "iota", "transpose")
                or not value.materialised or value.is_arg or value.is_output or value.carried is not None
                or value.dtype != np.float32 or "transpose(" not in value.origin
                or not _duplicable(name, ins, outs, consumers, program.rules, divisors)):
            continue
        readers = reads(value)
        to_copy = [read for read in readers if read[2] in copied]
        if (not handed_down(value, readers) or len(readers) < 2 or not to_copy
                or any(read[2] not in _FUSIBLE for read in readers if read[2] not in copied)):
            continue
        value.materialised = False  # its readers' buffers are now what it is computed from
        copies += [(index, position) for index, position, _, _ in to_copy]
    _float32_copies(program, copies, "copy")


def _stored_operand(value: _Value) -> _Value | None:
    """The stored value a matmul operand is, through views, transposes and casts the matmul reads fused, where it is
    elementwise work in a type the compiler widens (``float_bytes``); else None."""
    while not value.materialised and not value.is_arg and len(value.operands) == 1 and value.producer in (
            "view", "transpose", "convert_element_type"):
        value = value.operands[0]
    widened = value.dtype is not None and value.itemsize > value.dtype.itemsize
    return value if value.materialised and not value.is_arg and widened and value.producer in _FUSIBLE else None


def _rows(value: _Value) -> int:
    """Rows per device of ``value``: its elements on one device over its last dimension (a layer norm's tokens)."""
    return value.nbytes // max(value.itemsize, 1) // max(value.shape[-1], 1)


def _combines_computed_values(ins: list, out: _Value) -> bool:
    """More than one operand of ``out``'s full rank that is not a broadcast, an iota or a scalar: XLA's
    ``InstructionFusion::EffectivelyAtMostUnary`` is false, so copying the work into several readers would read
    more than one input again in each."""
    full = [value for value in {id(v): v for v in ins if v is not None}.values()
            if _source(value).producer not in ("broadcast_in_dim", "iota") and len(value.shape) >= len(out.shape)
            and math.prod(value.shape) > 1]
    return len(full) > 1


class _Dependencies:
    """The ops of ``running`` (a list of ops) as the graph a scheduler walks: which ops each waits for, and what running
    one frees. An op waits for the producers of the buffers it reads; one that overwrites its first operand in place
    (a scatter) waits for every other reader of that buffer too."""

    def __init__(self, running: list):
        self.running = running
        producer = {id(out): index for index, (_, _, outs, _) in enumerate(running) for out in outs}
        readers: dict[int, list[int]] = {}
        deps: list[set[int]] = [set() for _ in running]
        for index, (_, ins, _, _) in enumerate(running):
            for value in ins:
                for buffer in _buffers(value):
                    readers.setdefault(id(buffer), []).append(index)
                    source = producer.get(id(buffer))
                    if source is not None and source != index:
                        deps[index].add(source)
        for index, (name, ins, _, _) in enumerate(running):
            if name in _IN_PLACE and ins:
                for buffer in _buffers(ins[0]):
                    deps[index].update(r for r in readers.get(id(buffer), ()) if r != index)
        self.unread = {key: len(set(indices)) for key, indices in readers.items()}  # readers yet to run, per buffer
        self.dependants: list[list[int]] = [[] for _ in running]  # in program order
        for index, waits_for in enumerate(deps):
            for source in waits_for:
                self.dependants[source].append(index)
        self.waiting = [len(waits_for) for waits_for in deps]

    def initially_ready(self) -> list[int]:
        """The ops that wait for none, in program order."""
        return [index for index, count in enumerate(self.waiting) if count == 0]

    def net_freed(self, index: int) -> int:
        """Bytes running op ``index`` now would free (the buffers it reads last) less those it stores."""
        _, ins, outs, _ = self.running[index]
        freed = sum(buffer.nbytes for key, buffer in {id(b): b for v in ins for b in _buffers(v)}.items()
                    if self.unread[key] == 1 and not buffer.is_arg and not buffer.is_output)
        made = sum(out.nbytes for out in outs if out.materialised and not out.is_output and not out.is_arg)
        return freed - made

    def run(self, index: int) -> list[int]:
        """Op ``index`` has run: the ops that it made ready (in program order)."""
        for key in {id(b) for v in self.running[index][1] for b in _buffers(v)}:
            self.unread[key] -= 1
        made_ready = []
        for follower in self.dependants[index]:
            self.waiting[follower] -= 1
            if self.waiting[follower] == 0:
                made_ready.append(follower)
        return made_ready


def _list_order(running: list) -> list:
    """``running`` reordered as XLA's list scheduler would: of the ops whose operands are ready, the one that
    frees the most bytes net of what it allocates runs next; of those, the one whose result more ops read; of those,
    the one made ready last (XLA's ``ListScheduler`` takes the last of a multimap's equal priorities). A layer's input
    gradient, the last reader of its gathered weights, then runs before its weight gradient allocates. With program
    order, it stands in for the schedulers of the compilers the simulation does not follow op by op (XLA:GPU's,
    libtpu's): see :func:`_simulate`.

    Ties went to program order until 2026-11-28, which ran a rematerialised block's recomputed softmax ahead of the
    feed-forward's backward pass where XLA:CPU runs it after: at 4,096 tokens a device the plan under remat ``dots``
    held 1.21x the compiler's peak for ``dp`` in float32 (1.00 so; then the stand-in for XLA:CPU too)."""
    graph = _Dependencies(running)
    ready = graph.initially_ready()
    made_ready = {index: turn for turn, index in enumerate(ready)}  # when each op became ready
    order = []
    while ready:
        best = max(ready, key=lambda index: (graph.net_freed(index), len(graph.dependants[index]), made_ready[index]))
        ready.remove(best)
        order.append(running[best])
        for follower in graph.run(best):
            made_ready[follower] = len(made_ready)
            ready.append(follower)
    return order if len(order) == len(running) else running  # a cycle (never expected): keep program order


def _breadth_first_order(running: list) -> list:
    """``running`` reordered as XLA:CPU's default scheduler orders it: breadth-first (``BFSMemoryScheduler``, chosen
    by ``--xla_cpu_enable_concurrency_optimized_scheduler``, on by default), each op queued when the last op it waits
    for has run, and run in the order queued. That decides what rematerialisation saves there: the 2-block
    transformer's dp-tp step under remat ``block`` (tests/test_remat.py) compiles to 15.2 MiB a device (JAX 0.10.2;
    0.12: 15.0), and to 25.1 MiB (16.6) with the depth-first scheduler the flag turns off.

    XLA queues the ops one op makes ready in the order of that op's users in its graph, which the jaxpr does not
    show; here the one freeing the most bytes net goes first. Measured (JAX 0.12): queued in program order, the
    float32 ``block`` rows of the tests' matrix planned 0.98-1.10 of XLA:CPU's peak and ``fsdp`` in bf16 1.15 (a
    recomputed block's GELU ran before the backward pass's sum it could have freed); 0.93-1.01 and 1.08 so. (JAX
    0.10's bf16 ``block`` rows go the other way, 0.95-1.02 in program order and 1.00-1.12 so, within the target.)

    Until 2026-11-28 the simulation stood in for it with the cheaper of program order and :func:`_list_order`, which
    recomputed a block's layer norms and softmax ahead of the work that frees memory: remat ``dots`` planned 1.08-1.14
    of XLA:CPU's peak in float32 (0.96-1.06 now), and JAX 0.12's ``fsdp`` bf16 ``dots`` at 4,096 tokens 0.76 (0.91)."""
    graph = _Dependencies(running)
    queue = collections.deque(graph.initially_ready())
    order = []
    while queue:
        index = queue.popleft()
        order.append(running[index])
        queue.extend(sorted(graph.run(index), key=lambda follower: -graph.net_freed(follower)))
    return order if len(order) == len(running) else running  # a cycle (never expected): keep program order


def _peak(program: _Program, running: list) -> tuple[int, int]:
    """Peak bytes of temporaries when ``running`` runs in this order; of them, what each further block would add.

    That is one block's bytes live at the peak, of a block other than the one running there: at the end of the
    forward pass or in a later block's backward, the first block's saved activations; in the first block's own
    backward (where dp's peak is once its blocks are recomputed), the second block's leftovers, its gradients, but
    not the gradient it passes to the block running (one at a time, however deep the model)."""
    last_read: dict[int, int] = {}
    for position, (_, ins, _, _) in enumerate(running):
        for value in ins:
            for buffer in _buffers(value):
                last_read[id(buffer)] = position
    live = peak = block_at_peak = 0
    held: dict[int, int] = {}
    block_of: dict[int, tuple] = {}  # buffer -> (the block that made it (see _block), passed to which block)
    per_block: dict[tuple, int] = {}  # (block, passed to) -> their bytes live now
    op_block = [_block(op[2][0].origin) if op[2] else None for op in running]  # the block each op runs in

    def free(buffer: _Value, position: int | None) -> None:
        nonlocal live
        if last_read.get(id(buffer)) == position and id(buffer) in held:
            live -= held[id(buffer)]
            if id(buffer) in block_of:
                per_block[block_of[id(buffer)]] -= held[id(buffer)]
                del block_of[id(buffer)]
            del held[id(buffer)]

    for position, (name, ins, outs, body) in enumerate(running):
        if name in _IN_PLACE and ins:  # the result takes its first operand's buffer when that is its last use
            for buffer in _buffers(ins[0]):
                free(buffer, position)
        for out in outs:  # a loop's carry: the buffer it started from, when nothing reads that afterwards
            if out.carried is not None:
                for buffer in _buffers(out.carried):
                    free(buffer, position)
        new = [out for out in outs if out.materialised and not out.is_output and not out.is_arg]
        for out in new:
            held[id(out)] = out.nbytes
            live += out.nbytes
            block = _owning_block(out)
            if block is not None:  # its block; for the backward's work, also the block its last reader runs in
                last = last_read.get(id(out))
                key = (block, op_block[last] if "transpose(" in out.origin and last is not None else None)
                block_of[id(out)] = key
                per_block[key] = per_block.get(key, 0) + out.nbytes
        if live + body > peak:
            running_block = op_block[position]
            other = 1 if running_block == 0 else 0
            held_by_other = sum(size for (block, passed), size in per_block.items()
                                if block == other and (passed is None or passed != running_block))
            peak, block_at_peak = live + body, held_by_other + (program.body_blocks.get(id(outs), 0) if body else 0)
        for value in ins:
            for buffer in _buffers(value):
                free(buffer, position)
        for out in new:  # stored but never read (a dead value the compiler would drop)
            free(out, None)
    return peak, block_at_peak


def simulate_step_memory(closed_jaxpr: Any, in_specs: list[AxesPerDimension], out_specs: list[AxesPerDimension | None],
                         mesh_sizes: dict[str, int], donated: list[bool] | None = None,
                         compiler: CompilerRules | str = XLA_CPU) -> StepMemory:
    """Simulate the memory of the compiled step ``closed_jaxpr`` (see the module docstring).

    Args:
        closed_jaxpr: the step's jaxpr (``jax.jit(step).trace(*args).jaxpr``).
        in_specs, out_specs: per input and output, its sharding as per-dimension axis tuples
            (:func:`spec_of`); None for an output: propagated.
        mesh_sizes: mesh axis name -> size.
        donated: per input, whether the step donates it (an output of its shape takes its buffer).
        compiler: the compiler whose buffers are simulated: :class:`~.compiler_rules.CompilerRules` or its
            target kind (``"cpu"``, ``"gpu"``, ``"tpu"``).
    """
    return _simulate_step(closed_jaxpr, in_specs, out_specs, mesh_sizes, donated, _rules(compiler))[0]


def _rules(compiler: CompilerRules | str) -> CompilerRules:
    return compiler if isinstance(compiler, CompilerRules) else compiler_rules(compiler)


def _simulate_step(closed_jaxpr: Any, in_specs: list[AxesPerDimension], out_specs: list[AxesPerDimension | None],
                   mesh_sizes: dict[str, int], donated: list[bool] | None, rules: CompilerRules,
                   input_names: list[str] | None = None) -> tuple[StepMemory, int]:
    """:func:`simulate_step_memory`, and what each further block adds to its temporaries at the peak (``_peak``).
    ``input_names``: per input, its path in the state (``blocks/0/attn/q/kernel``), which names its block."""
    program = _Program(dict(mesh_sizes), rules)
    jaxpr = closed_jaxpr.jaxpr
    inputs = [program.value(var.aval, spec) for var, spec in zip(jaxpr.invars, in_specs, strict=False)]
    for value, name in zip(inputs, input_names or [], strict=False):
        value.origin = name
    exact = _Program(dict(mesh_sizes), dataclasses.replace(rules, float_bytes={}))  # arguments, outputs: own dtypes
    argument_sizes = [exact.value(var.aval, spec).nbytes for var, spec in zip(jaxpr.invars, in_specs, strict=False)]
    for value in inputs:
        value.is_arg = value.materialised = True
    outputs = program.inline(jaxpr, inputs, local=False)
    output_sizes = []
    for var, value, spec in zip(jaxpr.outvars, outputs, out_specs, strict=False):
        spec = spec if spec is not None else (value.spec if value is not None else ())
        output_sizes.append(exact.value(var.aval, spec).nbytes)
    _split_created_values(program)
    temp = _simulate(program, inputs, outputs)
    alias = _aliased(argument_sizes, [v.aval for v in jaxpr.invars], donated or [], output_sizes,
                     [v.aval for v in jaxpr.outvars])
    return StepMemory(sum(argument_sizes), sum(output_sizes), alias, temp), program.block_at_peak


class NotSimulated(WorkbenchError):
    """The step uses something whose buffers the simulation cannot see; the message says what."""


# Primitives whose compiled buffers the jaxpr does not show, so a step using them is not simulated.
# Measured: XLA:CPU expands max-pool's gradient (select_and_scatter_add) into one int32 index array per
# dimension of the pooled input, live from the start of the step (a small cnn: plan/compiler 0.40-0.45).
UNMODELLED_PRIMITIVES = {
    "select_and_scatter_add": "max-pooling's gradient, which XLA:CPU expands into index arrays the jaxpr does not show",
}


def unmodelled_reason(closed_jaxpr: Any) -> str | None:
    """Why the step traced as ``closed_jaxpr`` cannot be simulated (see :data:`UNMODELLED_PRIMITIVES`), or None.

    Example:
        >>> unmodelled_reason(jax.make_jaxpr(lambda x: x * 2)(1.0)) is None
        True
    """
    seen: set[int] = set()

    def walk(jaxpr: Any) -> str | None:
        if id(jaxpr) in seen:
            return None
        seen.add(id(jaxpr))
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in UNMODELLED_PRIMITIVES:
                return UNMODELLED_PRIMITIVES[eqn.primitive.name]
            for sub in jaxprs_in_params(eqn.params):
                found = walk(sub)
                if found:
                    return found
        return None

    return walk(closed_jaxpr.jaxpr)


def step_memory(step: Any, compiler: CompilerRules | str = XLA_CPU) -> StepMemory:
    """The simulated memory of an :class:`~workbench.training.step.AbstractStep`'s compiled step: its
    mode's jitted step traced (nothing compiled) and simulated with the state donated.

    Example:
        >>> from workbench.training.config import TrainConfig
        >>> from workbench.training.step import build_abstract_step
        >>> step = build_abstract_step(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64))
        >>> step_memory(step, "gpu").peak_bytes > 0
        True
    """
    return _step_memory(step, _rules(compiler))[0]


def _step_memory(step: Any, rules: CompilerRules) -> tuple[StepMemory, int, int]:
    """:func:`step_memory`; what each further block adds to the temporaries at the peak (``_peak``); the bytes per
    device of the first block's state (its parameters and optimizer state: an argument, output and alias)."""
    mode = step.mode
    traced = mode._compiled_step(step.state, False).trace(step.state, step.batch)
    paths_and_leaves, _ = jax.tree_util.tree_flatten_with_path(step.state)
    state_leaves, batch_leaves = [leaf for _, leaf in paths_and_leaves], jax.tree.leaves(step.batch)
    in_specs = [spec_of(leaf.sharding.spec, len(leaf.shape)) for leaf in state_leaves + batch_leaves]
    donated = [True] * len(state_leaves) + [False] * len(batch_leaves)
    out_specs = [spec_of(leaf.sharding.spec, len(leaf.shape)) for leaf in state_leaves]
    out_specs += [None] * (len(traced.jaxpr.jaxpr.outvars) - len(out_specs))
    sizes = dict(mode.mesh.shape)
    reason = unmodelled_reason(traced.jaxpr)
    if reason:
        raise NotSimulated(f"the step computes {reason}")
    names = ["/".join(str(getattr(key, "key", getattr(key, "idx", key))) for key in path)
             for path, _ in paths_and_leaves]
    memory, block_temp = _simulate_step(traced.jaxpr, in_specs, out_specs, sizes, donated, rules, names)
    block_state = sum(_Value(leaf, spec, sizes, {}).nbytes
                      for (path, leaf), spec in zip(paths_and_leaves, in_specs, strict=False)
                      if _FIRST_BLOCK_STATE.search(jax.tree_util.keystr(path)))
    return memory, block_temp, block_state


def planned_step_memory(config: Any, *, seq_len: int | None = None, custom: Any = None, example_batch: Any = None,
                        compiler: CompilerRules | str = XLA_CPU, state_rules: Any = None) -> StepMemory:
    """The simulated memory of ``config``'s step on its mesh, of any size (traced over an abstract mesh).

    A registered model's identical blocks (counted by its ``BLOCKS_OPTION``: the transformer's ``n_layers``)
    each add the same buffers (measured: the simulated peak grows by the same bytes per block): deeper models
    are simulated with 2 blocks, traced once, and extended to their depth by what one block holds at the peak
    besides the block running there (its saved activations, or in the first block's backward the second's
    gradients: see ``_peak``), which keeps a 24-layer plan fast. A scanned stack (``scan_layers``) is one loop
    whose body is simulated once, whatever its depth: it is traced as it is. ``state_rules``: your rule table
    laying out the state instead of the mode's placement (:func:`~workbench.training.step.build_abstract_step`).

    Example:
        >>> config = TrainConfig(model="mlp", mode="fsdp", mesh="data=64", batch=1024)
        >>> planned_step_memory(config).alias_bytes > 0
        True
    """
    rules = _rules(compiler)
    resolved = resolve_config(config)  # once: every simulation below takes the record
    config = resolved.config

    def simulate(resolved):
        step = build_abstract_step(resolved, seq_len=seq_len, devices=ABSTRACT_DEVICES, custom=custom,
                                   example_batch=example_batch, state_rules=state_rules)
        return _step_memory(step, rules)

    options = model_config(config.model, **config.model_options).options if custom is None else {}
    # Only a model that declares identical blocks (BLOCKS_OPTION) is extended from 2 of them.
    blocks = resolved.model_class.BLOCKS_OPTION if custom is None and resolved.model_class is not None else None
    layers, scanned = options.get(blocks) if blocks else None, bool(options.get("scan_layers"))  # scanned: any depth
    if blocks is None or scanned or not layers or layers <= 2:
        return simulate(resolved)[0]

    def with_layers(n: int) -> Any:  # model options name no record: the parsed mesh and classes still hold
        return dataclasses.replace(resolved, config=dataclasses.replace(
            config, model_options={**config.model_options, blocks: n}))

    if resolved.mode_class.parameter_gathering == "whole-tree":
        # The whole tree is gathered outside the blocks' calls: their buffers are not the blocks' own, so the
        # increment per block is measured (1 and 2 blocks) rather than read off one trace.
        (one, _, _), (two, _, _) = simulate(with_layers(1)), simulate(with_layers(2))
        extend = lambda a, b: a + (layers - 1) * (b - a)  # noqa: E731
        return StepMemory(*(extend(getattr(one, f.name), getattr(two, f.name)) for f in dataclasses.fields(StepMemory)))
    # One trace of 2 blocks: each further block adds its state and what one block other than the running one holds
    # at the peak (saved activations, or gradients waiting for the update); equal to more blocks simulated (tests).
    two, block_temp, block_state = simulate(with_layers(2))
    more = layers - 2
    return StepMemory(two.argument_bytes + more * block_state, two.output_bytes + more * block_state,
                      two.alias_bytes + more * block_state, two.temp_bytes + more * block_temp)


def _aliased(arg_sizes: list[int], arg_avals: list, donated: list[bool], out_sizes: list[int], out_avals: list) -> int:
    """Bytes of outputs written over donated inputs of the same shape, dtype and size (as XLA pairs them)."""
    free: dict[tuple, int] = {}
    for size, aval, gives in zip(arg_sizes, arg_avals, donated, strict=False):
        if gives:
            key = (tuple(aval.shape), str(aval.dtype), size)
            free[key] = free.get(key, 0) + 1
    alias = 0
    for size, aval in zip(out_sizes, out_avals, strict=False):
        key = (tuple(aval.shape), str(aval.dtype), size)
        if free.get(key):
            free[key] -= 1
            alias += size
    return alias


__all__ = [
    "NotSimulated", "StepMemory", "UNMODELLED_PRIMITIVES", "planned_step_memory",
    "simulate_step_memory", "spec_of", "step_memory", "unmodelled_reason",
]
