"""The plan's peak per device, simulated from the step's jaxpr (workbench/analysis/step_memory.py), against
XLA:CPU's compiled memory analysis of the same step (arguments + outputs - aliased + temporaries): within
0.85-1.15 on a matrix of models x modes x meshes x precision, including a user's own nnx.Module.
The ratios over a wider matrix (with the configs it does not reach) are a bench: bench/bench_step_memory.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P

from workbench.analysis.compiler_rules import LIBTPU, XLA_CPU, XLA_GPU
from workbench.analysis.planning import plan_training
from workbench.analysis.step_memory import planned_step_memory, simulate_step_memory
from workbench.training.config import TrainConfig
from workbench.training.step import CustomModel, build_abstract_step

LM = {"d_model": 128, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 64}
SCANNED = {**LM, "scan_layers": True}  # the blocks in one lax.scan (workbench/training/layer_stack.py)
# 128 tokens a sequence: 4,096 rows a device at the batches below, where XLA:CPU computes each layer norm's backward
# pass in one YNN fusion reading its operands stored (step_memory._store_large_norm_operands: counted fused, these
# rows planned 0.81-0.90 of its peak).
LONG_ROWS = {**LM, "max_len": 128}
MATRIX = [  # model, options, mode, mesh, precision, global batch
    ("mlp", {"hidden": 512}, "dp", "data=8", "fp32", 256),
    ("mlp", {"hidden": 512}, "fsdp", "data=8", "bf16", 256),
    ("transformer", LM, "dp", "data=8", "fp32", 32),
    ("transformer", LM, "dp", "data=8", "bf16", 32),
    ("transformer", LM, "dp-shard-map", "data=8", "fp32", 32),
    ("transformer", LM, "fsdp-whole-tree", "data=8", "fp32", 32),
    ("transformer", LM, "fsdp", "data=8", "bf16", 32),
    ("transformer", LM, "dp-tp", "data=4,model=2", "fp32", 32),
    ("transformer", LM, "tp", "model=8", "fp32", 32),
    ("transformer", SCANNED, "fsdp", "data=8", "fp32", 32),
    ("transformer", SCANNED, "dp", "data=8", "fp32", 32),
    ("transformer", LM, "fsdp-tp", "data=4,model=2", "fp32", 32),  # a shard_map manual over 'data' alone
    ("transformer", LM, "fsdp-tp", "data=4,model=2", "bf16", 32),
    ("transformer", SCANNED, "fsdp-tp", "data=4,model=2", "fp32", 32),
    ("transformer", LONG_ROWS, "tp", "model=8", "fp32", 32),
    ("transformer", LONG_ROWS, "dp-tp", "data=2,model=4", "bf16", 64),
    ("transformer", LONG_ROWS, "fsdp-tp", "data=2,model=4", "bf16", 64),
    ("transformer", LONG_ROWS, "fsdp", "data=8", "bf16", 256),
]


class OwnMLP(nnx.Module):
    """A user's model: two hidden layers over flattened 8x8 digits, 10 classes."""

    def __init__(self, rngs):
        self.hidden1 = nnx.Linear(64, 256, rngs=rngs)
        self.hidden2 = nnx.Linear(256, 256, rngs=rngs)
        self.output = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.output(jax.nn.gelu(self.hidden2(jax.nn.gelu(self.hidden1(x)))))


def own_loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


EXAMPLE = {"x": jax.ShapeDtypeStruct((1, 64), "float32"), "y": jax.ShapeDtypeStruct((1,), "int32")}


def _compiled_peak(step) -> int:
    stats = step.compile().memory_analysis()
    return (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes)


def _matrix_params():
    for row in MATRIX:
        model, options, mode, mesh, precision, _ = row
        yield pytest.param(*row, id=f"{model}{'-scanned' * bool(options.get('scan_layers'))}-{mode}-{mesh}-{precision}"
                                    f"{'-4096-rows' * (options is LONG_ROWS)}")


@pytest.mark.parametrize("model,options,mode,mesh,precision,batch", list(_matrix_params()))
def test_plan_peak_is_within_15_percent_of_the_compilers(model, options, mode, mesh, precision, batch):
    plan = plan_training(model, options, mesh, mode, hardware="cpu", global_batch=batch, precision=precision)
    config = TrainConfig(model=model, model_options=options, mode=mode, mesh=mesh, precision=precision, batch=batch,
                         optimizer="adamw")
    compiled = _compiled_peak(build_abstract_step(config))
    assert plan.memory is not None and 0.85 <= plan.peak_bytes / compiled <= 1.15, (plan.peak_bytes, compiled)


# Gradient accumulation: the trainer loops over every microbatch from zero sums, so each microbatch's activations
# are freed before the next (a loop over all but the first ran once at accum=2, and XLA dropped it: 173 MB of
# temporaries against 177 MB without accumulation, 92 MB now, for a 4-layer transformer on data=8).
# Smaller accumulated steps (2 layers of 64 tokens, accum 2 and 4) measured 0.88-1.02 (JAX 0.10.2): reported by
# bench/bench_step_memory.py, not held here.
ACCUMULATED = {**LM, "max_len": 256}


@pytest.mark.parametrize("mode, mesh", [
    ("fsdp", "data=8"), ("dp-tp", "data=4,model=2"), ("dp", "data=8"), ("fsdp-tp", "data=4,model=2"),
])
def test_accumulation_frees_each_microbatch_and_the_plan_follows(mode, mesh):
    peaks = {accum: _compiled_peak(build_abstract_step(TrainConfig(
        model="transformer", model_options=ACCUMULATED, mode=mode, mesh=mesh, precision="fp32", batch=64, accum=accum,
        optimizer="adamw"))) for accum in (1, 2)}
    assert peaks[2] < 0.8 * peaks[1], peaks  # the trainer's accumulation frees each microbatch's activations
    plan = plan_training("transformer", ACCUMULATED, mesh, mode, hardware="cpu", global_batch=64, accum=2,
                         precision="fp32")
    assert plan.memory is not None and 0.85 <= plan.peak_bytes / peaks[2] <= 1.15, (plan.peak_bytes, peaks[2])


def test_each_further_fsdp_tp_block_adds_what_the_compiler_adds():
    # Per-layer fsdp-tp keeps each block's output for the backward pass, and XLA:CPU stores it as one sum (its layer
    # norms' reductions read it stored). Counted fused, each block kept both all-reduced outputs the sum adds: 1.6x
    # the compiler's bytes per block here, and the unrolled 24-layer 1.3B plan at 1.44x XLA:CPU's peak (0.93 now).
    options = {**LM, "d_model": 256, "n_heads": 8, "max_len": 256}
    plans, compiled = [], []
    for layers in (2, 4):
        config = TrainConfig(model="transformer", model_options={**options, "n_layers": layers}, mode="fsdp-tp",
                             mesh="data=4,model=2", precision="fp32", batch=32, optimizer="adamw")
        plans.append(planned_step_memory(config).peak_bytes)
        compiled.append(_compiled_peak(build_abstract_step(config)))
    assert 0.9 <= (plans[1] - plans[0]) / (compiled[1] - compiled[0]) <= 1.1, (plans, compiled)


def test_a_matmuls_operand_does_not_take_the_split_of_its_result():
    # With d_model = heads x head_dim a projection's input and output have one shape but share no positions. The
    # input (a layer norm's output, replicated under tp) once took its output's split over 'model': tp's plan held
    # an eighth of XLA:CPU's layer-norm buffers (and was 0.86 of its peak by other errors cancelling; 1.06 now).
    square = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, w: (x * 2.0) @ w)(square, square)
    memory = simulate_step_memory(jaxpr, [((), ()), ((), ("model",))], [None], {"model": 8})
    assert memory.temp_bytes == 64 * 64 * 4  # x * 2, stored whole for the matmul


def test_a_dimension_its_axes_do_not_divide_is_padded_not_replicated():
    # tp's 4 attention heads on model=8: the partitioner pads them to 8, one head (or none) per device; counted
    # replicated, each (batch, heads, T, T) buffer was 4x XLA:CPU's.
    heads, weights = jax.ShapeDtypeStruct((4, 1024), jnp.float32), jax.ShapeDtypeStruct((1024, 8), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, w: jnp.exp(x) @ w)(heads, weights)
    memory = simulate_step_memory(jaxpr, [(("model",), ()), ((), ())], [None], {"model": 8})
    assert memory.temp_bytes == 1 * 1024 * 4  # exp(x), one head's row per device


def test_what_a_barrier_passes_on_is_stored_in_its_own_type():
    # XLA:CPU computes bfloat16 work in float32 and expands optimisation barriers before it schedules, converting
    # what one passes on to its declared type there. Counted in float32, the score gradient weighted_values hands on
    # through its barrier held a 16-head, 1,024-token bf16 fsdp-tp step under remat `block` at 1.15x JAX 0.12's
    # XLA:CPU peak (0.97 in bfloat16).
    n = 256
    square = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)

    def passed_on(x, w):
        scores, x = lax.optimization_barrier((x @ w, x))
        return jnp.sum(scores * x)

    memory = simulate_step_memory(jax.make_jaxpr(passed_on)(square, square), [((), ()), ((), ())], [None],
                                  {"data": 1})
    product = jax.make_jaxpr(lambda x, w: jnp.sum((x @ w) * x))(square, square)
    matmul_bytes = simulate_step_memory(product, [((), ()), ((), ())], [None], {"data": 1}).temp_bytes // n**2 * n**2
    assert memory.temp_bytes == matmul_bytes + 2 * n * n * 2  # the matmul's result, and both passed on in bf16


def _temp_bytes(fn, *args, mesh_sizes=None, in_specs=None, **rules) -> int:
    """The simulated temporaries of ``fn`` on ``args`` (whole on every device unless ``in_specs`` says otherwise),
    under XLA:CPU's rules with ``rules`` set as given: one rule at a time, whatever the installed JAX's defaults."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    in_specs = in_specs or [((),) * len(arg.shape) for arg in args]
    return simulate_step_memory(jaxpr, in_specs, [None] * len(jaxpr.out_avals), mesh_sizes or {"data": 1},
                                compiler=dataclasses.replace(XLA_CPU, **rules)).temp_bytes


def test_a_recomputed_gelus_shared_square_is_stored_in_bfloat16():
    # JAX 0.12's XLA:CPU expands the GELU's cube as x * x * x, shares x * x with its derivative's square, and stores
    # the shared pieces of a recomputed GELU one bf16 fusion each. That lengthens the backward pass's chain of
    # fusions, and so where its breadth-first schedule puts the peak: without the two rules, the tests' bf16 remat
    # `dots` rows planned 0.825 of its peak (step_memory._store_shared_recomputed_work).
    n, m = 64, 256
    h, w = jax.ShapeDtypeStruct((n, m), jnp.bfloat16), jax.ShapeDtypeStruct((m, m), jnp.bfloat16)
    recomputed = jax.checkpoint(lambda h: jax.nn.gelu(h, approximate=True))

    def temp_bytes(gelu, **rules) -> int:
        def loss(h, w):
            return jnp.sum((gelu(h) @ w).astype(jnp.float32))

        return _temp_bytes(jax.grad(loss, argnums=(0, 1)), h, w, stores_narrow_expensive_work=True, **rules)

    both = {"stores_shared_recomputed_work": True, "shares_squares": True}
    neither = {"stores_shared_recomputed_work": False, "shares_squares": False}
    added = temp_bytes(recomputed, **both) - temp_bytes(recomputed, **neither)
    assert added >= n * m * 2 and added % (n * m * 2) == 0  # the square, and what else two stored ops read, in bf16
    for alone in ({**neither, "stores_shared_recomputed_work": True}, {**neither, "shares_squares": True}):
        assert temp_bytes(recomputed, **alone) == temp_bytes(recomputed, **neither)  # the square unshared: fused
    plain = lambda h: jax.nn.gelu(h, approximate=True)  # noqa: E731
    assert temp_bytes(plain, **both) == temp_bytes(plain, **neither)  # not recomputed: each fusion computes its own


@pytest.mark.parametrize("width", [256, 32])
def test_a_widened_sum_over_more_than_32_elements_reads_its_operand_stored(width):
    # JAX 0.12's XLA:CPU sums a bf16 reduction in float32 as a tree (a reduce-window of 32, then a reduce), and the
    # reduce-window fuses no producer: the summed operand is stored, in float32 (the softmax's backward row sums of
    # a 16-head bf16 step, its peak under remat `block`). Over 32 elements or fewer, or summed in float32, the
    # reduction fuses its operand as before (step_memory._store_tree_reduced_operands).
    n = 64
    row_sums = lambda x: lax.reduce_sum(x * 3, axes=(1,)) + 1  # noqa: E731  (lax: jnp.sum would sum in float32)
    sums = n * 4  # the row sums, float32 on XLA:CPU

    def temp_bytes(dtype, tree) -> int:
        return _temp_bytes(row_sums, jax.ShapeDtypeStruct((n, width), dtype), tree_reduces_narrow_sums=tree)

    stored = n * width * 4 if width > 32 else 0
    assert temp_bytes(jnp.bfloat16, tree=True) == stored + sums
    assert temp_bytes(jnp.bfloat16, tree=False) == temp_bytes(jnp.float32, tree=True) == sums


def _softmax(x):
    exponentials = jnp.exp(x - lax.stop_gradient(x.max(-1, keepdims=True)))
    return exponentials / jnp.sum(exponentials, axis=-1, keepdims=True)  # jnp.sum: a float32 sum of a bf16 cast


def test_a_bfloat16_softmaxs_exponentials_are_stored_in_float32_with_a_bfloat16_copy_for_their_readers():
    # JAX 0.12's XLA:CPU computes the exponentials in float32 in one fusion and stores them; the row sum reads that
    # buffer and a convert makes the bf16 copy the division reads. Inside a shard_map that leaves an axis to the
    # compiler (fsdp-tp's body) it keeps the one float32 buffer for every reader
    # (step_memory._copy_summed_exponentials).
    n, m = 64, 256
    x = jax.ShapeDtypeStruct((n, m), jnp.bfloat16)
    sums = n * 4
    assert _temp_bytes(_softmax, x, stores_narrow_expensive_work=True) == n * m * (4 + 2) + sums
    # JAX 0.10's: bf16 work is cheap, recomputed inside each reader; stored are the row sums and their bf16 cast
    # (4 bytes an element each)
    assert _temp_bytes(_softmax, x, stores_narrow_expensive_work=False) == sums + n * 4

    mesh = jax.sharding.AbstractMesh((1, 2), ("data", "model"),
                                     axis_types=(jax.sharding.AxisType.Auto, jax.sharding.AxisType.Auto))
    partial_manual = jax.shard_map(_softmax, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})

    def inside(wide: bool) -> int:
        return _temp_bytes(partial_manual, x, mesh_sizes={"data": 1, "model": 2}, in_specs=[(("data",), ())],
                           stores_narrow_expensive_work=True, keeps_partial_manual_casts_wide=wide)

    assert inside(wide=True) == n * m * 4 + sums
    assert inside(wide=False) == n * m * (4 + 2) + sums


@pytest.mark.parametrize("divide", [lambda a, b: a / 3.0, lambda a, b: a / b[0, 0], lambda a, b: a / b[:, :1]],
                         ids=["by-a-constant", "by-a-scalar", "by-a-row-broadcast"])
def test_a_division_by_a_smaller_divisor_is_a_multiplication_fused_into_each_reader(divide):
    # XLA's algebraic simplifier makes `a / broadcast(b)` a multiplication by a reciprocal computed once: cheap work,
    # recomputed inside each reader, never stored (the attention's `scores / sqrt(head_dim)`: stored, a 16-head,
    # 1,024-token bf16 step kept another (batch, heads, T, T) buffer a block that JAX 0.12's XLA:CPU does not).
    n, m = 64, 256
    x = jax.ShapeDtypeStruct((n, m), jnp.float32)

    def two_readers(a, b):
        quotient = divide(a, b)
        return lax.reduce_max(quotient, axes=(1,)), jnp.tanh(quotient)

    quotient_bytes = n * m * 4
    assert _temp_bytes(two_readers, x, x, stores_narrow_expensive_work=True) < quotient_bytes  # (b[0, 0]: 4 bytes)
    # JAX 0.10's rules, measured without it: a float32 division counted expensive, stored for its two readers
    assert _temp_bytes(two_readers, x, x, stores_narrow_expensive_work=False) >= quotient_bytes


def test_libtpu_computes_a_layer_norms_broadcasts_inside_each_reader_where_xla_cpu_stores_them():
    # A layer norm's mean, inverse deviation and scale are each broadcast to (rows, d) and read by the forward and the
    # backward pass. XLA:CPU stores each broadcast; libtpu computes it inside each reader, as XLA:GPU does (the README's
    # 1.3B fsdp-tp step under remat block holds no float32 (batch, T, d_model) buffer: its buffer assignment, v5p).
    n, d = 512, 256
    x, scale = jax.ShapeDtypeStruct((n, d), jnp.float32), jax.ShapeDtypeStruct((d,), jnp.float32)

    def layer_norm_loss(x, scale):
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        return jnp.sum(((x - mean) * lax.rsqrt(variance + 1e-6) * scale) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(layer_norm_loss, argnums=(0, 1)))(x, scale)

    def temp_bytes(rules) -> int:
        return simulate_step_memory(jaxpr, [((), ()), ((),)], [None, None], {"data": 1}, compiler=rules).temp_bytes

    row_bytes = n * d * 4
    assert not LIBTPU.stores_shared_broadcasts
    assert temp_bytes(LIBTPU) < row_bytes  # only the (n, 1) statistics
    assert temp_bytes(XLA_CPU) >= 3 * row_bytes
    assert temp_bytes(dataclasses.replace(LIBTPU, stores_shared_broadcasts=True)) >= 3 * row_bytes


def test_libtpu_computes_a_layer_norm_and_a_gelu_inside_the_matmuls_that_read_them():
    # libtpu's convolution fusions read any elementwise work on their operands: the up projection's fusion normalises
    # the stored residual sum with its row statistics, the down projection's computes the GELU of the stored
    # pre-activation (the unrolled dp-tp step of 2 blocks of d_model 1,024 on v5p:2x2x2, its optimised HLO). XLA:GPU's
    # GEMM fusion takes only a chain of cheap work over one stored value, so it stores both.
    n, d, f = 512, 256, 1024
    x, w_up, w_down = (jax.ShapeDtypeStruct(shape, jnp.float32) for shape in ((n, d), (d, f), (f, d)))

    def feed_forward(x, w_up, w_down):
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        hidden = ((x - mean) * lax.rsqrt(variance + 1e-6)) @ w_up
        return jnp.sum(jax.nn.gelu(hidden) @ w_down)

    jaxpr = jax.make_jaxpr(feed_forward)(x, w_up, w_down)

    def temp_bytes(rules) -> int:
        return simulate_step_memory(jaxpr, [((), ())] * 3, [None] * 3, {"data": 1}, compiler=rules).temp_bytes

    hidden_bytes, row_bytes = n * f * 4, n * d * 4
    assert LIBTPU.fuses_any_matmul_operand_work
    assert temp_bytes(LIBTPU) < hidden_bytes + 2 * row_bytes  # the pre-activation and the output
    assert temp_bytes(XLA_GPU) >= 2 * hidden_bytes  # the GELU stored beside its pre-activation
    assert temp_bytes(dataclasses.replace(LIBTPU, fuses_any_matmul_operand_work=False)) >= 2 * hidden_bytes


def test_all_reduces_added_together_are_one_buffer_where_the_compiler_reassociates_them():
    # XLA's AllReduceReassociate (XLA:GPU, libtpu): the partial sums of three matmuls contracting a split dimension are
    # added first and all-reduced once. Counted as three all-reduced buffers, each kept until the last matmul reading
    # their sum (which libtpu computes inside that matmul), the unrolled fsdp-tp step under remat block planned 1.29x
    # libtpu's HBM block (1.13 so).
    n, d, k = 512, 256, 1024
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in ((n, d), (d, k), (d, k), (d, k), (k, k), (k, k))]

    def three_projections_summed(x, w1, w2, w3, v1, v2):
        total = x @ w1 + x @ w2 + x @ w3
        return ((jnp.tanh(total @ v1) @ v2) * total).sum()

    jaxpr = jax.make_jaxpr(three_projections_summed)(*args)
    specs = [((), ("model",))] + [(("model",), ())] * 3 + [((), ())] * 2

    def temp_bytes(rules) -> int:
        return simulate_step_memory(jaxpr, specs, [None], {"model": 4}, compiler=rules).temp_bytes

    assert LIBTPU.reassociates_all_reduces
    assert temp_bytes(LIBTPU) <= temp_bytes(dataclasses.replace(LIBTPU, reassociates_all_reduces=False)) - n * k * 4


def test_a_users_own_module_is_simulated_from_an_example_batch():
    plan = plan_training(lambda: OwnMLP(nnx.Rngs(0)), None, "data=8", "dp", hardware="cpu", global_batch=512,
                         loss=own_loss, example_batch=EXAMPLE, precision="fp32")
    config = TrainConfig(model="custom:OwnMLP", mode="dp", mesh="data=8", batch=512, precision="fp32")
    custom = CustomModel(OwnMLP(nnx.Rngs(0)), own_loss, batches=())
    compiled = _compiled_peak(build_abstract_step(config, custom=custom, example_batch=EXAMPLE))
    assert 0.85 <= plan.peak_bytes / compiled <= 1.15, (plan.peak_bytes, compiled)
    assert plan.memory.argument_bytes == plan.params_bytes + plan.opt_state_bytes + 512 // 8 * (64 * 4 + 4)


def test_without_an_example_batch_the_peak_is_not_modelled_and_says_why():
    plan = plan_training(lambda: OwnMLP(nnx.Rngs(0)), None, "data=8", "dp", hardware="cpu")
    assert plan.memory is None and "example_batch" in plan.memory_caveat
    peak_line = next(line for line in plan.to_text().splitlines() if line.strip().startswith("peak"))
    assert "not modelled" in peak_line and "example_batch" in peak_line
    assert plan.to_json()["per_device"]["memory_caveat"] == plan.memory_caveat


@pytest.mark.parametrize("mode,mesh", [("fsdp", "data=64,model=8"), ("dp-tp", "data=64,model=8"),
                                       ("fsdp-whole-tree", "data=64")])
def test_deep_transformers_extend_two_simulated_blocks(mode, mesh):
    # Identical blocks add identical buffers: 2 blocks traced once and extended to 4 by what the first block
    # holds at the peak (whole-tree fsdp: 1 and 2 blocks) equal 4 blocks simulated whole; the state exactly,
    # the temporaries to within a few KiB (the cheaper of two schedules is kept, and they differ by a small
    # buffer at some depths).
    config = TrainConfig(model="transformer", model_options={**LM, "n_layers": 4}, mode=mode,
                         mesh=mesh, batch=1024, precision="bf16")
    extended = planned_step_memory(config)
    from workbench.analysis.step_memory import step_memory
    whole = step_memory(build_abstract_step(config, devices="abstract"), "cpu")
    assert extended.argument_bytes == whole.argument_bytes and extended.alias_bytes == whole.alias_bytes > 0
    assert extended.output_bytes == whole.output_bytes
    assert abs(extended.temp_bytes - whole.temp_bytes) <= 4096 + whole.temp_bytes // 10_000


@pytest.mark.parametrize("mode,mesh", [("dp", "data=64"), ("dp-tp", "data=64,model=8"), ("fsdp-tp", "data=64,model=8")])
def test_deep_accumulated_transformers_extend_the_loop_body_per_block(mode, mesh):
    # With gradient accumulation every block runs inside the loop over microbatches: the first block's buffers at
    # the loop body's peak extend it, and outside the loop the gradients it sums for each block (without the
    # body's blocks, a 4-layer plan counted 2 layers' activations; without the sums, dp's was 0.91 of 4 blocks).
    config = TrainConfig(model="transformer", model_options={**LM, "n_layers": 4}, mode=mode, mesh=mesh,
                         batch=1024, precision="bf16", accum=2)
    extended = planned_step_memory(config)
    from workbench.analysis.step_memory import step_memory
    whole = step_memory(build_abstract_step(config, devices="abstract"), "cpu")
    assert extended.argument_bytes == whole.argument_bytes
    assert abs(extended.temp_bytes - whole.temp_bytes) <= 4096 + whole.temp_bytes // 10_000, (extended, whole)


def test_a_step_whose_buffers_the_jaxpr_hides_says_so_instead_of_a_number():
    """The cnn's max-pool gradient: XLA:CPU expands it into index arrays no jaxpr equation shows (the
    simulation measured 0.40-0.45 of the compiler), so the plan prints why, not a peak."""
    plan = plan_training("cnn", {}, "data=8", "dp", hardware="cpu", global_batch=64)
    assert plan.memory is None and "max-pooling's gradient" in plan.memory_caveat
    assert "not modelled" in plan.to_text()
