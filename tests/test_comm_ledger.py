"""The communication ledger reads real compiled steps (8 simulated CPU devices) and hand-written HLO.

Real compiles: ``dp``'s one gradient all-reduce measures the gradient bytes, ``fsdp`` gathers its
parameters layer by layer (twice) and ``fsdp-whole-tree`` once, ``dp-tp`` reduces over both mesh axes, and replica
groups name mesh *positions* (a mesh over permuted devices compiles to the same groups). Hand-written snippets
pin the parser: async pairs, tuple shapes, the three replica-group forms, element sizes, loops, and lines that
only mention a collective.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import workbench as wb
from workbench.analysis.collectives import COLLECTIVE_KINDS
from workbench.analysis.ledger import (
    MEMORY_LABEL, PREDICTION_LABEL, Collective, CommLedger, collectives_from_hlo, compare_with_theory,
    float_param_bytes, ledger_for_mode, ledger_table, theoretical_collectives,
)
from workbench.training.models import model_config_for_data, tensor_parallel_rules
from workbench.training.modes import StepSetup, build_mode
from workbench.training.modes.core import init_state
from workbench.training.config import make_optimizer

BATCH = 256


@functools.cache
def _setup():
    data = wb.load_dataset("digits")
    tx = make_optimizer("adam", 1e-3)
    graphdef, state = init_state(model_config_for_data("mlp", data).build(seed=0), tx)
    return graphdef, state, tx, next(data.batches(BATCH, seed=0))


@functools.cache
def ledger(mode_name: str, mesh: str = "data=8"):
    """(ledger, mode, placed state) of one compiled step of the digits mlp with Adam."""
    graphdef, state, tx, batch = _setup()
    setup = StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh(mesh), BATCH, 1, "fp32",
                      tuple(tensor_parallel_rules("mlp")))
    mode = build_mode(mode_name, setup)
    placed = mode.place_state(state)
    return ledger_for_mode(mode, placed, mode.place_batch(batch)), mode, placed


def gradient_bytes() -> int:
    return float_param_bytes(_setup()[1].params)


def rows(result: CommLedger, kind: str) -> list[Collective]:
    return [c for c in result.collectives if c.kind == kind]


# --- real compiles -----------------------------------------------------------------------------------------


def test_dp_all_reduces_the_gradient_bytes_over_data():
    result, _, _ = ledger("dp")
    measured = result.bytes_by_kind()["all-reduce"]
    # the ordinary step also all-reduces the scalar loss (4 bytes): well inside 2%
    assert abs(measured - gradient_bytes()) <= 0.02 * gradient_bytes(), (measured, gradient_bytes())
    assert set(result.bytes_by_kind()) == {"all-reduce"}
    assert all(c.axes == ("data",) and c.group_size == 8 for c in result.collectives)


def test_dp_matches_theory():
    result, _, _ = ledger("dp")
    comparison = compare_with_theory(result, "dp", gradient_bytes())
    assert set(comparison) == {"all-reduce"}
    assert 0.98 <= comparison["all-reduce"]["ratio"] <= 1.02
    assert comparison["all-reduce"]["theory"] == gradient_bytes()


def test_ledger_carries_memory_figures_with_their_labels():
    result, mode, placed = ledger("dp")
    assert result.predicted_bytes_per_device == mode.state_layout(placed).bytes_per_device
    assert set(result.memory) == {"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes"}
    assert result.memory["argument_bytes"] >= result.predicted_bytes_per_device  # the state goes in, with the batch
    as_json = result.to_json()
    assert as_json["memory"]["label"] == MEMORY_LABEL and as_json["predicted"]["label"] == PREDICTION_LABEL
    assert as_json["mode"] == "dp" and as_json["total_bytes"] == result.total_bytes
    assert set(as_json["collectives"][0]) >= {"kind", "bytes", "axes", "count", "dtype"}
    table = ledger_table(result)
    assert "all-reduce" in table and MEMORY_LABEL in table and PREDICTION_LABEL in table


def _sharded_param_bytes(mode, placed) -> int:
    """Bytes of the parameters split over 'data' (leaves with no dimension divisible by 8, such as the
    10-class bias, stay whole on every device and are never gathered)."""
    return sum(leaf.layout.total_bytes for leaf in mode.state_layout(placed).leaves
               if leaf.path.startswith("params/") and not leaf.layout.is_fully_replicated)


def test_fsdp_whole_tree_gathers_parameters_and_reduces_gradients():
    result, mode, placed = ledger("fsdp-whole-tree")
    by_kind = result.bytes_by_kind()
    sharded = _sharded_param_bytes(mode, placed)
    assert abs(by_kind["all-gather"] - sharded) <= 0.02 * sharded, (by_kind, sharded)  # each leaf once
    assert all(c.axes == ("data",) for c in result.collectives)
    # the gradient comes back as a reduce-scatter of exactly those leaves; only the replicated bias and
    # scalars (the loss, the weight) are all-reduced
    assert abs(by_kind["reduce-scatter"] - sharded) <= 0.02 * sharded, (by_kind, sharded)
    assert by_kind.get("all-reduce", 0) < 0.01 * gradient_bytes(), by_kind
    comparison = compare_with_theory(result, "fsdp-whole-tree", gradient_bytes())
    assert 0.98 <= comparison["all-gather"]["ratio"] <= 1.0
    assert comparison["reduce-scatter"]["theory"] == gradient_bytes()


def test_fsdp_gathers_each_layer_again_for_the_backward_pass():
    result, mode, placed = ledger("fsdp")
    by_kind = result.bytes_by_kind()
    sharded = _sharded_param_bytes(mode, placed)
    kernels = {c.shapes[0]: c.count for c in rows(result, "all-gather") if len(c.shapes[0]) == 2}
    # hidden2 is gathered for the forward pass and again for the backward pass; hidden1's backward pass needs
    # no gradient of its input (the batch), so its kernel is gathered once; output, the last layer called, keeps
    # its forward pass's parameters for its backward pass, which comes right after
    assert kernels == {(64, 128): 1, (128, 128): 2, (128, 10): 1}, kernels
    assert sharded < by_kind["all-gather"] <= 2 * sharded
    assert abs(by_kind["reduce-scatter"] - sharded) <= 0.02 * sharded, (by_kind, sharded)  # each gradient once
    assert by_kind.get("all-reduce", 0) < 0.01 * gradient_bytes(), by_kind
    assert compare_with_theory(result, "fsdp", gradient_bytes())["all-gather"]["theory"] == 2 * gradient_bytes()


def test_fsdp_holds_one_layer_of_gathered_parameters_at_a_time():
    """Compiled temporaries (XLA's memory analysis) of a 4-layer transformer step with a small batch and its
    blocks recomputed (remat block), so that parameters, not activations, dominate: gathering layer by layer
    needs a fraction of what gathering the whole tree needs, and less than the whole parameters (the forward
    pass keeps no gathered parameter for the backward pass, which gathers each layer again)."""
    tx = make_optimizer("sgd", 0.1)
    model = wb.training.build_model("transformer", d_model=64, n_heads=4, n_layers=4, vocab=512, max_len=16,
                                    remat="block")
    graphdef, state = init_state(model, tx)
    tokens = np.zeros((8, 16), np.int32)
    batch = {"x": tokens, "y": tokens, "mask": np.ones(8, np.float32)}
    temps = {}
    for name in ("fsdp", "fsdp-whole-tree"):
        setup = StepSetup(graphdef, wb.training.model_class("transformer").loss, tx, wb.parse_mesh("data=8"), 8)
        mode = build_mode(name, setup)
        compiled = mode.compile_step(mode.place_state(state), mode.place_batch(batch))
        temps[name] = compiled.memory_analysis().temp_size_in_bytes
    whole = float_param_bytes(state.params)
    assert temps["fsdp"] < 0.5 * temps["fsdp-whole-tree"] and temps["fsdp"] < 0.5 * whole, (temps, whole)


@pytest.mark.parametrize("mode_name", ["dp", "dp-shard-map", "fsdp-whole-tree", "fsdp"])
def test_accumulation_synchronises_once_per_step(mode_name):
    # The microbatch loop is a while loop in the HLO. Left to itself the compiler put jit dp's
    # all-reduce inside it (4 per step with accum=4): the gradient must be reduced once, after it.
    # fsdp reduce-scatters each microbatch's gradients inside the loop, by design: a device then only
    # ever accumulates its own 1/8 of them (ZeRO-3), as it only ever holds one layer of them whole.
    graphdef, state, tx, batch = _setup()
    setup = StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh("data=8"), BATCH, 4)
    mode = build_mode(mode_name, setup)
    result = ledger_for_mode(mode, mode.place_state(state), mode.place_batch(batch))
    per_step = 4 if mode_name == "fsdp" else 1
    gradient_reductions = [c for c in result.collectives
                           if c.kind in ("all-reduce", "reduce-scatter") and c.bytes > 1000]
    assert gradient_reductions and all(c.count == per_step for c in gradient_reductions), result.collectives
    reduced = sum(c.total_bytes for c in result.collectives if c.kind != "all-gather" and c.bytes > 1000)
    assert abs(reduced - per_step * gradient_bytes()) <= 0.02 * per_step * gradient_bytes()


def test_dp_tp_reduces_over_both_axes():
    result, mode, placed = ledger("dp-tp", "data=4,model=2")
    axes = {c.axes for c in rows(result, "all-reduce")}
    assert ("model",) in axes and ("data",) in axes
    assert {c.group_size for c in result.collectives if c.axes == ("model",)} == {2}
    assert {c.group_size for c in result.collectives if c.axes == ("data",)} == {4}
    # the gradient all-reduce over 'data' moves each device's share of the parameters, as laid out
    over_data = sum(c.total_bytes for c in rows(result, "all-reduce") if c.axes == ("data",))
    params_per_device = mode.state_layout(placed).group_bytes_per_device(1)["params"]
    assert abs(over_data - params_per_device) <= 0.02 * params_per_device
    comparison = compare_with_theory(result, "dp-tp", gradient_bytes())
    assert comparison["all-reduce"]["theory"] is None and comparison["all-reduce"]["ratio"] is None


def test_replica_groups_are_mesh_positions_not_device_ids():
    devices = jax.devices()
    texts = {}
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [3, 1, 0, 2, 7, 5, 6, 4]):
        mesh = Mesh(np.array([devices[i] for i in order]).reshape(4, 2), ("data", "model"))
        x = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, PartitionSpec("data", "model")))
        step = jax.shard_map(lambda a: jax.lax.psum(a, "model"), mesh=mesh,
                             in_specs=PartitionSpec("data", "model"), out_specs=PartitionSpec("data"))
        texts[tuple(order)] = text = jax.jit(step).lower(x).compile().as_text()
        assert [(c.kind, c.axes) for c in collectives_from_hlo(text, mesh)] == [("all-reduce", ("model",))]
    assert len(set(texts.values())) == 1  # the device order never reaches the HLO


# --- hand-written HLO ----------------------------------------------------------------------------------------

ASYNC = """
HloModule m, num_partitions=8
ENTRY %main (p: f32[1024], q: f32[128]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %q = f32[128]{0} parameter(1)
  %ars = f32[1024]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ard = f32[1024]{0} all-reduce-done(%ars)
  %ags = (f32[128]{0}, f32[1024]{0}) all-gather-start(%q), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %agd = f32[1024]{0} all-gather-done(%ags)
  %cps = (f32[128]{0}, f32[128]{0}, u32[], u32[]) collective-permute-start(%q), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}
  %cpd = f32[128]{0} collective-permute-done(%cps)
  %rss = ((f32[1024]{0}), f32[128]{0}) reduce-scatter-start(%p), channel_id=4, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, to_apply=%add
  %rsd = f32[128]{0} reduce-scatter-done(%rss)
  ROOT %r = f32[1024]{0} add(%ard, %agd)
}
"""  # noqa: E501 - HLO as XLA prints it: one instruction a line


def test_async_pairs_count_once_with_whole_array_bytes():
    found = {c.kind: c for c in collectives_from_hlo(ASYNC, "data=4,model=2")}
    assert set(found) == {"all-reduce", "all-gather", "collective-permute", "reduce-scatter"}
    assert all(c.count == 1 for c in found.values())
    assert found["all-reduce"].bytes == 4096 and found["all-reduce"].axes == ("data", "model")
    assert found["all-gather"].bytes == 4096 and found["all-gather"].shapes == ((1024,),)  # the gathered output
    assert found["reduce-scatter"].bytes == 4096  # the operand, before scattering
    assert found["collective-permute"].bytes == 512 and found["collective-permute"].axes == ("model",)


def test_an_all_reduce_start_returning_its_operands_and_results_counts_the_results():
    # JAX 0.12's XLA:GPU prints an asynchronous all-reduce as ((operands), results), the results aliasing the
    # operands (it counted each array twice: the plan's tp activation all-reduces looked 1.375x the compiler's).
    hlo = """
HloModule m, num_partitions=8
ENTRY %main (p: bf16[16,32,64], q: bf16[64]) -> bf16[16,32,64] {
  %p = bf16[16,32,64]{2,1,0} parameter(0)
  %q = bf16[64]{0} parameter(1)
  %ars = ((bf16[16,32,64]{2,1,0}), bf16[16,32,64]{2,1,0}) all-reduce-start(%p), channel_id=1, replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add
  %ard = bf16[16,32,64]{2,1,0} all-reduce-done(%ars)
  %two = ((bf16[16,32,64]{2,1,0}, bf16[64]{0}), (bf16[16,32,64]{2,1,0}, bf16[64]{0})) all-reduce-start(%ard, %q), channel_id=2, replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add
  ROOT %done = (bf16[16,32,64]{2,1,0}, bf16[64]{0}) all-reduce-done(%two)
}
"""  # noqa: E501 - HLO as XLA prints it: one instruction a line
    rows = collectives_from_hlo(hlo, "data=4,model=2")
    assert sorted((c.bytes, c.shapes) for c in rows) == [(16 * 32 * 64 * 2, ((16, 32, 64),)),
                                                         ((16 * 32 * 64 + 64) * 2, ((16, 32, 64), (64,)))]


def test_tuple_shaped_collectives_sum_every_element():
    line = ("%ar = (f32[64,128]{1,0}, f32[128]{0}, /*index=2*/f32[]) all-reduce(%a, %b, %c), channel_id=1, "
            "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add")
    (row,) = collectives_from_hlo(line, "data=8")
    assert row.bytes == (64 * 128 + 128 + 1) * 4
    assert row.shapes == ((64, 128), (128,), ())
    assert row.dtype == "float32" and row.axes == ("data",)


@pytest.mark.parametrize("groups,axes,size", [
    ("[2,4]<=[8]", ("model",), 4),  # {0,1,2,3},{4,5,6,7}: along the minor axis
    ("[4,2]<=[2,4]T(1,0)", ("data",), 2),  # {0,4},{1,5},{2,6},{3,7}: along the major axis
    ("[1,8]<=[8]", ("data", "model"), 8),
    ("{{0,4},{1,5},{2,6},{3,7}}", ("data",), 2),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", ("model",), 4),
    ("mesh['axis_0'=1,'axis_1'=8] {'axis_1'}", ("data", "model"), 8),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_1':(2)2}", ("model",), 2),  # {0,2},{1,3},...: a sub-axis of 'model'
    ("mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(0,2,1)) {'axis_1':(2)2}", ("model",), 2),
    ("mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(0,2,1)) {'axis_0'}", ("data",), 2),
])
def test_replica_group_forms_map_to_mesh_axes(groups, axes, size):
    line = (f"%x = f32[8]{{0}} all-reduce(%a), channel_id=1, replica_groups={groups}, "
            "use_global_device_ids=true, to_apply=%add")
    (row,) = collectives_from_hlo(line, "data=2,model=4")
    assert (row.axes, row.group_size) == (axes, size)


def test_element_sizes_follow_the_hlo_dtype():
    lines = "\n".join([
        "%a = bf16[64,128]{1,0} all-reduce(%x), replica_groups={{0,1}}, to_apply=%add",
        "%b = f16[10]{0} all-reduce(%x), replica_groups={{0,1}}, to_apply=%add",
        "%c = (s8[16]{0}, pred[16]{0}, f64[2]{0}) all-to-all(%x, %y, %z), replica_groups={{0,1}}",
        "%d = u32[3]{0} collective-permute(%x), source_target_pairs={{0,1},{1,0}}",
    ])
    found = {c.kind: c for c in collectives_from_hlo(lines, "data=2")}
    small = sorted((c.bytes, c.dtype) for c in collectives_from_hlo(lines, "data=2") if c.kind == "all-reduce")
    assert small == [(20, "float16"), (64 * 128 * 2, "bfloat16")]
    assert (found["all-to-all"].bytes, found["all-to-all"].dtype) == (16 + 16 + 16, "bool+float64+int8")
    assert found["collective-permute"].bytes == 12


def test_lines_that_only_mention_a_collective_are_ignored():
    lines = "\n".join([
        "%all-reduce.3 = f32[8]{0} fusion(%all-gather), kind=kLoop, calls=%fused",
        "%gte = f32[8]{0} get-tuple-element(%all-reduce), index=0",
        '%m = f32[8]{0} add(%a, %b), metadata={op_name="jit(f)/all-reduce(x)"}',
        "%ard = f32[8]{0} all-reduce-done(%ars)",
        "// an all-gather(%x) in a comment",
    ])
    assert collectives_from_hlo(lines, "data=8") == []
    assert ledger_table(CommLedger([])) == "no collectives: each device computes alone"


def test_collectives_in_a_loop_count_once_per_iteration():
    text = """
HloModule m, num_partitions=2
%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %g = f32[8]{0} get-tuple-element(%p), index=1
  %ar = f32[8]{0} all-reduce(%g), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %ar)
}
ENTRY %main (a: f32[8]) -> f32[8] {
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %ag = f32[16]{0} all-gather(%a), channel_id=2, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
}
"""
    found = {c.kind: c for c in collectives_from_hlo(text, "data=2")}
    assert (found["all-reduce"].count, found["all-gather"].count) == (3, 1)
    assert CommLedger(list(found.values())).total_bytes == 3 * 32 + 64


def test_group_modes_without_global_ids():
    # no channel_id: cross-replica; with one replica per program each device is alone (nothing moves)
    text = ("HloModule m, replica_count=1, num_partitions=4\n"
            "  %x = f32[8]{0} all-reduce(%a), replica_groups={}, to_apply=%add")
    assert collectives_from_hlo(text, "data=4")[0].axes == ()
    # channel_id without use_global_device_ids: cross-replica-and-partition spans every partition
    text = text.replace("replica_groups={}", "channel_id=1, replica_groups={{0}}")
    assert collectives_from_hlo(text, "data=4")[0].axes == ("data",)


def test_a_device_outside_the_mesh_is_refused():
    line = "%x = f32[8]{0} all-reduce(%a), replica_groups={{0,9}}, to_apply=%add"
    with pytest.raises(wb.WorkbenchError, match="device 9 but mesh data=8 has 8 devices"):
        collectives_from_hlo(line, "data=8")


# --- theory and tables ---------------------------------------------------------------------------------------


def test_theory_per_mode():
    assert theoretical_collectives("single", 100) == []
    for mode in ("dp", "dp-shard-map", "dp-pmap"):
        assert [(e["kind"], e["bytes"]) for e in theoretical_collectives(mode, 100)] == [("all-reduce", 100)]
    assert [(e["kind"], e["bytes"]) for e in theoretical_collectives("fsdp-whole-tree", 100)] == [
        ("all-gather", 100), ("reduce-scatter", 100), ("all-reduce", None)]  # the leaves too small to split
    assert [(e["kind"], e["bytes"]) for e in theoretical_collectives("fsdp", 100)] == [  # forward and backward pass
        ("all-gather", 100), ("all-gather", 100), ("reduce-scatter", 100), ("all-reduce", None)]
    assert [(e["carries"], e["bytes"]) for e in theoretical_collectives("tp", 100)] == [("activations", None)]
    with pytest.raises(wb.WorkbenchError, match="unknown mode 'ddp': choose one of"):
        theoretical_collectives("ddp", 100)


def test_table_shows_every_kind():
    all_to_all = "%a2a = f32[64]{0} all-to-all(%q), channel_id=5, replica_groups={{0,1}}"
    found = collectives_from_hlo(ASYNC + all_to_all, "data=8")
    table = ledger_table(CommLedger(found))
    for kind in COLLECTIVE_KINDS:
        assert kind in table, kind
    assert "total per device per step" in table
    header, rule = table.splitlines()[:2]
    assert len(header) <= len(rule)  # aligned columns


TPU_STYLE_LOOP = """HloModule m

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  %bound = s32[] constant(24)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %bound), direction=LT
}

%start_piece (a: f32[2]) -> f32[8] {
  %a = f32[2]{0} parameter(0)
  ROOT %ag.1 = f32[8]{0} all-gather(%a), channel_id=6, replica_groups={{0,1,2,3}}, dimensions={0}
}

%continuation (b: f32[2]) -> f32[8] {
  %b = f32[2]{0} parameter(0)
  ROOT %ag.2 = f32[8]{0} all-gather(%b), channel_id=6, replica_groups={{0,1,2,3}}, dimensions={0}
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %x = f32[2]{0} constant({1, 2})
  %f1 = f32[8]{0} fusion(%x), kind=kOutput, calls=%start_piece
  %f2 = f32[8]{0} fusion(%x), kind=kOutput, calls=%continuation
  %rs.1 = f32[2]{0} reduce-scatter(%f1), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %rs.2 = f32[2]{0} reduce-scatter(%f2), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %f2)
}

ENTRY %main (a: (s32[], f32[8])) -> (s32[], f32[8]) {
  %a = (s32[], f32[8]{0}) parameter(0)
  ROOT %w = (s32[], f32[8]{0}) while(%a), condition=%cond, body=%body
}
"""


def test_tpu_style_loops_count_their_iterations_and_split_collectives_once():
    """The TPU compiler's loops carry no known_trip_count (the condition's `i < 24` gives it), and it
    splits one asynchronous collective over fusions that each hold a copy with the same channel_id;
    instructions of one computation sharing a channel are still distinct collectives."""
    from workbench.analysis.hlo import loop_trip_counts

    assert loop_trip_counts(TPU_STYLE_LOOP) == [24]
    counts = {(c.kind, c.bytes): c.count for c in collectives_from_hlo(TPU_STYLE_LOOP)}
    assert counts == {("all-gather", 32): 24, ("reduce-scatter", 32): 48}, counts
