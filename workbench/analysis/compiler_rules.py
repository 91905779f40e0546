"""Where XLA's compilers store a step's values differently: the rules the memory simulation follows per compiler.

:mod:`.step_memory` simulates a step's buffers with XLA's fusion rules; most are shared by every backend, a
few differ, and each difference moves a transformer's peak by a block's activations: bytes per bf16 element
(XLA:CPU computes in f32), whether f32 ``exp``/``div`` read by several fusions are stored (XLA:CPU) or
recomputed (XLA:GPU), whether shared broadcasts are stored, whether cheap work is fused into a matmul's
operands, whether FSDP's weights are gathered after their bf16 cast, whether a residual sum its reductions read is
stored, and whether combined all-reduces are scheduled as one op. One rule is the planned collectives': whether
all-reduces that are added are added first and sent once. Each was read off the compiler's buffer assignment
(``XLA_FLAGS=--xla_dump_to=DIR``) or its collectives; the table and the measurements are in
docs/design/compile-verification.md. libtpu schedules each TPU generation its own way, so its rules carry a
note saying which figure to trust.

Example:
    >>> compiler_rules("gpu").name
    'XLA:GPU'
    >>> compiler_rules("cpu").float_bytes["bfloat16"]
    4
"""

from __future__ import annotations

import dataclasses

import jax

from ..errors import WorkbenchError

# Elementwise work XLA does not copy into several consumers (InstructionFusion::IsExpensive).
EXPENSIVE = frozenset({"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "cbrt", "pow",
                       "div", "rem", "erf", "erfc", "erf_inv", "sin", "cos", "tan", "atan2", "lgamma", "digamma"})


@dataclasses.dataclass(frozen=True)
class CompilerRules:
    """How one compiler stores a step's values, where XLA's backends differ (see the module docstring).

    Attributes:
        name: the compiler, e.g. ``"XLA:GPU"``.
        kind: the compile target kind it serves: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        float_bytes: bytes per element by dtype name where the backend computes in a wider type.
        expensive: elementwise ops stored once when several fusions read them (in any float type).
        cheap_in_f32: ops of ``expensive`` the compiler recomputes instead when their result is f32 or f16.
        stores_shared_broadcasts: whether a non-scalar broadcast read by several fusions is stored.
        fuses_matmul_operands: whether a matmul reads elementwise work on its operands fused (not stored): a chain of
            cheap work over one stored value (XLA:GPU's GEMM fusion).
        fuses_any_matmul_operand_work: with ``fuses_matmul_operands``, whether a matmul reads any elementwise work on
            its operands fused, however many stored values it combines and expensive or not (libtpu's convolution
            fusions: a layer norm computed from the stored residual sum and its row statistics, a GELU from the
            stored pre-activation, the weights' bfloat16 cast).
        casts_before_gathering: whether an all-gather read only by a narrowing cast gathers the cast values.
        widens_collectives: whether a bfloat16 all-gather or all-reduce moves float32 (XLA:CPU converts around the
            collective). Elsewhere a per-layer gathering mode gathers bf16 shards (``param_gathering.gathers_narrow``)
            and a jit step's gradient all-reduce, which the partitioner puts on a bf16 matmul's output, sums bf16.
        stores_reduced_sums: whether work combining two or more computed values (a residual sum) is stored
            where a reduction and other work read it, rather than computed again inside each reader.
        stores_large_norm_operands: whether a layer norm of 4,096 rows or more per device reads its operands
            stored (XLA:CPU's YNN fusion of the norm's backward pass): its scale's product with ``rsqrt(var)``, and
            in bfloat16 the float32 cast of the sum it normalises, the sum itself stored in bfloat16.
        reassociates_all_reduces: whether all-reduces whose results are added are added first and all-reduced once
            (XLA's AllReduceReassociate: XLA:GPU and libtpu do, XLA:CPU does not, so there a transformer block's
            q, k and v input gradients are three all-reduces over 'model', not one): in the planned collectives,
            and in the simulated memory one buffer where there were several (``step_memory._reassociate_all_reduces``).
        runs_combined_all_reduces_as_one: whether the all-reduces the compiler combines are scheduled as one op
            (XLA:GPU starts and ends each asynchronously: held as one, its 8-GPU dp plan of a small module rose
            from 1.10 to 1.17 of the compiler's peak).
        copies_shared_matmul_operands: whether each matmul reading a stored value of a type ``float_bytes`` widens
            that another matmul reads too converts its own copy to float32 (JAX 0.10's XLA:CPU, whose bfloat16
            matmuls compute in float32): see ``step_memory._copy_shared_matmul_operands``.
        copies_handed_down_gradients: whether a transformer block's float32 input gradient, handed down to the block
            below, is computed again by each reader there (a copy for each matmul and reduction) rather than stored
            once (XLA:CPU): see ``step_memory._copy_handed_down_gradients``.
        narrow_results: primitives whose results in a type ``float_bytes`` widens are stored in their own type
            (JAX 0.12's XLA:CPU multiplies bfloat16 matrices natively and stores bfloat16 products, and keeps a scan's
            loop state, the saved activations of a scanned stack, in bfloat16).
        stores_one_element_values: whether elementwise work with a one-element result is a fusion of its own rather
            than computed inside its readers (JAX 0.10's XLA:CPU: a gradient's one-element slice that a schedule tie
            reads, ``slice_convert_fusion``; 0.12's computes it in the reader).
        stores_narrow_expensive_work: whether expensive work in a type ``float_bytes`` widens (bfloat16) is stored once
            where several fusions read it, as float32 work is, and a division by a constant, scalar or broadcast counts
            as the multiplication XLA's simplifier makes it (JAX 0.12's XLA:CPU). JAX 0.10's rules were measured
            counting bfloat16 work cheap: see ``step_memory._duplicable``.
        tree_reduces_narrow_sums: whether a sum in a widened type over more than 32 elements reads its operand stored
            (XLA:CPU's tree reduction: ``step_memory._store_tree_reduced_operands``).
        keeps_partial_manual_casts_wide: whether, inside a shard_map that leaves axes to the compiler (fsdp-tp's
            body), a softmax's exponentials are kept in one float32 buffer for every reader rather than copied to
            bfloat16 (``step_memory._copy_summed_exponentials``; JAX 0.12's XLA:CPU, measured on a 16-head fsdp-tp
            step; fsdp, dp and dp-tp steps keep a bf16 copy).
        stores_shared_recomputed_work: whether elementwise work in a widened type that a rematerialised block
            recomputes is stored, in its own type, where two stored ops read it (JAX 0.12's XLA:CPU: a recomputed GELU's
            pieces, each a ``*_convert_fusion``): see ``step_memory._store_shared_recomputed_work``.
        shares_squares: whether ``x ** 3`` is computed as ``x * x * x`` reading the ``x ** 2`` of the same ``x`` that
            its derivative reads (XLA expands integer powers, then merges the equal products), so that square is
            shared work (``step_memory._share_squares``; stored on JAX 0.12's XLA:CPU: ``multiply_convert_fusion``).
        schedules_breadth_first: whether the compiler schedules breadth-first (XLA:CPU's default,
            ``BFSMemoryScheduler``), which the simulation then follows (``step_memory._breadth_first_order``); where
            not, the cheaper of program and list order stands in for its scheduler.
        trust: where the simulation cannot follow this compiler, which figure to trust and why; None where
            it does (the simulated peak holds ±15% of the compiler's from 4 MiB per device).
    """

    name: str
    kind: str
    float_bytes: dict
    expensive: frozenset = EXPENSIVE
    cheap_in_f32: frozenset = frozenset()
    stores_shared_broadcasts: bool = True
    fuses_matmul_operands: bool = False
    fuses_any_matmul_operand_work: bool = False
    casts_before_gathering: bool = False
    widens_collectives: bool = False
    stores_reduced_sums: bool = False
    stores_large_norm_operands: bool = False
    reassociates_all_reduces: bool = True
    runs_combined_all_reduces_as_one: bool = False
    copies_shared_matmul_operands: bool = False
    copies_handed_down_gradients: bool = False
    narrow_results: frozenset = frozenset()
    stores_one_element_values: bool = False
    stores_narrow_expensive_work: bool = False
    tree_reduces_narrow_sums: bool = False
    keeps_partial_manual_casts_wide: bool = False
    stores_shared_recomputed_work: bool = False
    shares_squares: bool = False
    schedules_breadth_first: bool = False
    trust: str | None = None

    def is_expensive(self, op: str, dtype_name: str) -> bool:
        """Whether the compiler stores ``op``'s result of ``dtype_name`` rather than recompute it per reader.

        Example:
            >>> XLA_GPU.is_expensive("exp", "float32"), XLA_CPU.is_expensive("exp", "float32")
            (False, True)
        """
        if op not in self.expensive:
            return False
        return not (op in self.cheap_in_f32 and dtype_name in ("float32", "float16"))


# XLA:CPU's bfloat16 matmuls: JAX 0.10.2's compute and store them in float32 (109 of 113 matmul fusions of a bf16
# fsdp step are f32); 0.12's store bfloat16 products and their transposes (52 of 100 bf16, and 15 bf16 dots).
# Counted widened on 0.12, the bf16 transformer rows of the tests' matrices held 1.07-1.30x its peak; narrow,
# 0.93-1.14 (0.11 not measured).
_CPU_NARROW_MATMULS = frozenset({"dot_general", "transpose"}) if jax.__version_info__ >= (0, 12) else frozenset()
# JAX 0.12's XLA:CPU keeps a scan's loop state in its declared types: a bf16 scanned stack's saved activations are
# bf16 (the while loop's tuple holds bf16[layers, batch, heads, T, T] probabilities). Counted widened, the README's
# scanned 1.3B on data=64,model=8 planned 1.29-1.80x its peak (0.94-1.04 narrow, fsdp `block` 1.21); 0.10's keeps
# the whole loop in float32.
_CPU_NARROW_LOOPS = frozenset({"scan"}) if jax.__version_info__ >= (0, 12) else frozenset()
# JAX 0.12's XLA:CPU stores bfloat16 elementwise work it stores at all in bfloat16 (each a ``*_convert_fusion``): the
# softmax's probabilities (``multiply_convert_fusion``, the division made a multiplication) and GELU's tanh
# (``tanh_convert_fusion``). Its exponentials come out of a YNN fusion in float32 (see keeps_partial_manual_casts_wide).
# Counted widened, with bf16 expensive work stored, the unrolled 1.3B on data=64,model=8 planned up to 1.30x its peak.
_JAX_0_12 = jax.__version_info__ >= (0, 12)
_CPU_NARROW_ELEMENTWISE = frozenset({"div", "tanh"}) if _JAX_0_12 else frozenset()
# A rematerialised step's saved matmul results (remat ``dots``: JAX marks each with ``reduce_precision``) are stored
# in their own type, a copy apart from the matmul's float32 result: XLA:CPU's ``reduce-precision_convert_fusion``.
XLA_CPU = CompilerRules("XLA:CPU", "cpu", {"bfloat16": 4, "float16": 4}, stores_reduced_sums=True,
                        stores_large_norm_operands=True,
                        widens_collectives=True, runs_combined_all_reduces_as_one=True, reassociates_all_reduces=False,
                        copies_shared_matmul_operands=not _CPU_NARROW_MATMULS, copies_handed_down_gradients=True,
                        narrow_results=(_CPU_NARROW_MATMULS | _CPU_NARROW_LOOPS | _CPU_NARROW_ELEMENTWISE
                                        | {"reduce_precision"}),
                        stores_one_element_values=not _CPU_NARROW_MATMULS, stores_narrow_expensive_work=_JAX_0_12,
                        tree_reduces_narrow_sums=_JAX_0_12, keeps_partial_manual_casts_wide=_JAX_0_12,
                        stores_shared_recomputed_work=_JAX_0_12, shares_squares=_JAX_0_12,
                        schedules_breadth_first=True)
# XLA:GPU stores a block's residual sum too (one buffer a block, the block's saved input under remat block):
# counted fused, the unrolled 1.3B fsdp-tp plan on 512 H100s under block was 1.63x the compiler's peak (0.99 so).
XLA_GPU = CompilerRules("XLA:GPU", "gpu", {}, cheap_in_f32=frozenset({"exp", "div", "sqrt", "rsqrt"}),
                        stores_shared_broadcasts=False, fuses_matmul_operands=True, casts_before_gathering=True,
                        stores_reduced_sums=True)
# Measured (tests/test_verification.py's configs, bench/bench_gpu_memory.py): libtpu lays out and schedules
# the same program differently per generation; the 4-block transformer's fsdp step on 8 chips held 202 MiB
# on v6e, 196 MiB on v5e and 386 MiB on v5p (its HBM block and arguments, 2026-11-29). No jaxpr-level rule follows
# that: v5e and v6e keep up to 112 MiB of such a step's temporaries on chip, in VMEM, which the plan counts in HBM.
# libtpu computes a broadcast inside each reader, as XLA:GPU does: the README's 1.3B fsdp-tp step under remat block
# holds no float32 (batch, T, d_model) buffer at all (its buffer assignment, v5p:8x8x8). Stored, a layer norm's
# broadcasts put 30 steps' plans (2 blocks of d_model 1,024-2,048 on 8 chips of v5p, v6e and v5e) at 0.76-2.61x
# libtpu's peak, 7 within 15%; computed in each reader, 0.75-1.65x, 12 within 15% (compile-verification.md).
# Its convolution fusions compute a matmul's operand from any elementwise work, and it stores a residual sum beside the
# layer norm's row statistics reduced from it, in one multi-output fusion (as XLA:GPU stores it). Read off the unrolled
# dp-tp step of those 30 on v5p: the up projection's fusion normalises the stored sum, the down projection's computes
# the GELU of the stored pre-activation, and both cast the float32 weights. Against libtpu's HBM block, the 30 planned
# 0.85-1.82x without these two rules (6 within 15%) and 0.81-1.74x with them (19 within 15%).
# Until 2026-11-29 libtpu split fsdp-tp's residual stream over 'model' (scanned, and under dots unrolled too), and the
# simulation followed it (22-24 of the 30 within 15% with that). Since the attention contracts its heads as
# (d_model, heads, head_dim) and the microbatches hold their parameters to their layout it keeps the stream whole, and
# so does the simulation: the 12 fsdp-tp and dp-tp rows compiled again plan 0.83-1.11, 11 within 15%; the README's
# 1.3B fsdp-tp on v5p:8x8x8 0.99 (none) and 0.95 (dots). dp-tp's microbatches under remat, split until loop buffers
# took shapes of their own, keep it whole too (compile-verification.md, "The split gone"; "Loop buffers in shapes of
# their own").
LIBTPU = CompilerRules(
    "libtpu", "tpu", {}, stores_shared_broadcasts=False, fuses_matmul_operands=True, fuses_any_matmul_operand_work=True,
    stores_reduced_sums=True,
    trust="libtpu lays out and schedules each TPU generation's memory its own way (the same 8-chip step held "
          "202 MiB on v6e, 196 MiB on v5e, 386 MiB on v5p), which the simulation does not follow (measured on 8 to 512 "
          "chips: 0.7-1.8 of libtpu's peak on small steps, where v5e and v6e keep up to 112 MiB on chip; 0.90-1.00 "
          "for a 1.3B model at 2-18 GiB a chip): trust the compiler's peak (--verify tpu:<generation>:<shape>)",
)
COMPILERS = {rules.kind: rules for rules in (XLA_CPU, XLA_GPU, LIBTPU)}


def compiler_rules(kind: str) -> CompilerRules:
    """The rules of the compiler for target kind ``kind`` (``cpu``, ``gpu`` or ``tpu``).

    Example:
        >>> compiler_rules("tpu").name
        'libtpu'
    """
    try:
        return COMPILERS[kind]
    except KeyError:
        raise WorkbenchError(f"unknown compiler kind {kind!r}: choose one of {', '.join(COMPILERS)}") from None


__all__ = ["COMPILERS", "CompilerRules", "EXPENSIVE", "LIBTPU", "XLA_CPU", "XLA_GPU", "compiler_rules"]
