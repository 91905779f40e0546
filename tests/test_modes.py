"""Every parallel mode computes the update ``single`` computes, on 8 simulated devices with real collectives.

Each case trains a few steps on the same global batches (the last one padded, so shards hold unequal
numbers of real examples) and compares with ``single``:

* fp32 + SGD: the loss of every step, and every parameter, within 1e-5 relative. A parameter is
  compared relative to its own largest value, with a floor of 1e-3 on that scale: the attention key
  bias has a true gradient of exactly zero (softmax ignores a shift shared by all keys), so it holds
  only round-off (~1e-10) that no relative bound can fix.
* fp32 + Adam: the loss within 1e-4 relative. Adam divides by sqrt(v): round-off in a near-zero
  gradient (that key bias again) becomes a full-size update, so parameters are not compared.
* bf16 (bfloat16 compute, float32 master weights): the loss within 2e-2 relative of ``single`` in bf16.
  bfloat16 keeps 8 significant bits (relative rounding 2^-8 = 0.4%); summing partial gradients in
  another order moves results by a few roundings.
* Accumulation over k microbatches equals one step on the whole batch (fp32 + SGD, 1e-5).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import workbench as wb
from helpers import mode_mesh
from workbench.training.data import load_dataset
from workbench.training.models import model_config_for_data, tensor_parallel_rules
from workbench.training.modes import DATA_PARALLEL_MODES, MODES, StepSetup, build_mode, mode_class
from workbench.training.modes.base import MODEL_SPLIT_PLACEMENTS
from workbench.training.modes.core import init_state
from workbench.training.config import make_optimizer

BATCH, STEPS, PADDED_ROWS = 64, 3, 13
CASES = {  # model -> (data, data options, model options): small, so 32 combinations compile quickly
    "linear": ("regression", {}, {}),
    "mlp": ("digits", {}, {"hidden": 32}),
    "cnn": ("digits", {}, {"conv1_channels": 4, "conv2_channels": 8}),
    "transformer": (
        "tokens", {"seq_len": 16, "num_train": 256, "num_eval": 64, "vocab_size": 32},
        {"d_model": 32, "n_heads": 4, "n_layers": 1},
    ),
}


@functools.cache
def _batches(model: str) -> tuple[dict, ...]:
    data, data_options, _ = CASES[model]
    batches = load_dataset(data, **data_options).batches(BATCH, seed=0)
    chosen = [next(batches) for _ in range(STEPS)]
    chosen[-1]["mask"][-PADDED_ROWS:] = 0  # a padded final batch: shards count unequal examples
    return tuple(chosen)


@functools.cache
def train(mode: str, model: str, optimizer: str = "sgd", accum: int = 1, precision: str = "fp32"):
    """(per-step losses, final parameters as NumPy leaves with paths) of ``STEPS`` steps of ``mode``."""
    data, data_options, model_options = CASES[model]
    config = model_config_for_data(model, load_dataset(data, **data_options), **model_options)
    tx = make_optimizer(optimizer, 0.1 if optimizer == "sgd" else 1e-2)
    graphdef, state = init_state(config.build(seed=0), tx)
    setup = StepSetup(graphdef, wb.training.model_class(model).loss, tx, wb.parse_mesh(mode_mesh(mode)),
                      BATCH, accum,
                      precision, tuple(tensor_parallel_rules(model)))
    runner = build_mode(mode, setup)
    state = runner.place_state(state)
    losses = []
    for batch in _batches(model):
        state, metrics = runner.step(state, runner.place_batch(batch))
        losses.append(metrics["loss"])
    params = runner.export_state(state).params
    return np.array(jax.device_get(losses)), [(p, np.asarray(v)) for p, v in wb.layout.leaves_with_paths(params)]


def assert_losses_close(losses, reference, rtol):
    worst = np.max(np.abs(losses - reference) / np.abs(reference))
    assert worst <= rtol, f"loss differs by {worst:.2e} relative (bound {rtol}): {losses} vs {reference}"


def assert_params_close(params, reference, rtol=1e-5, scale_floor=1e-3):
    assert [p for p, _ in params] == [p for p, _ in reference]
    for (path, value), (_, expected) in zip(params, reference, strict=True):
        scale = max(float(np.max(np.abs(expected))), scale_floor)
        worst = float(np.max(np.abs(value - expected))) / scale
        assert worst <= rtol, f"parameter {path} differs by {worst:.2e} of its scale (bound {rtol})"


def _supported(mode: str, model: str) -> bool:
    return not (mode_class(mode).state_placement in MODEL_SPLIT_PLACEMENTS and model == "linear")


EXACT_CASES = [(mode, model) for model in CASES for mode in MODES if mode != "single" and _supported(mode, model)]


@pytest.mark.parametrize("mode,model", EXACT_CASES)
def test_mode_matches_single_with_sgd(mode, model):
    losses, params = train(mode, model)
    ref_losses, ref_params = train("single", model)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert_params_close(params, ref_params)
    assert losses[-1] < losses[0]  # it trains, too


@pytest.mark.parametrize("mode", [m for m in MODES if m != "single"])
def test_mode_matches_single_with_adam(mode):
    assert_losses_close(train(mode, "mlp", "adam")[0], train("single", "mlp", "adam")[0], 1e-4)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "single"])
def test_mode_matches_single_in_bf16(mode):
    losses = train(mode, "mlp", precision="bf16")[0]
    reference = train("single", "mlp", precision="bf16")[0]
    assert_losses_close(losses, reference, 2e-2)
    # and bf16 is really in use: its losses are not the fp32 ones
    assert np.max(np.abs(reference - train("single", "mlp")[0])) > 1e-6


def test_bf16_transformer_trains_close_to_fp32():
    losses, fp32 = train("dp", "transformer", precision="bf16")[0], train("single", "transformer")[0]
    assert_losses_close(losses, fp32, 2e-2)


@pytest.mark.parametrize("mode", MODES)
def test_accumulation_matches_one_step_on_the_whole_batch(mode):
    losses, params = train(mode, "mlp", accum=2)
    ref_losses, ref_params = train("single", "mlp")
    assert_losses_close(losses, ref_losses, 1e-5)
    assert_params_close(params, ref_params)


def test_accumulation_in_the_transformer():
    losses, params = train("dp", "transformer", accum=4)
    ref_losses, ref_params = train("single", "transformer")
    assert_losses_close(losses, ref_losses, 1e-5)
    assert_params_close(params, ref_params)


def test_data_parallel_modes_split_the_batch_over_the_data_axis():
    setup = StepSetup(*_setup_parts(), mesh=wb.parse_mesh("data=8"), global_batch=64)
    for mode in DATA_PARALLEL_MODES:
        expected = 1 if mode == "single" else 8
        assert build_mode(mode, setup).data_parallel_size == expected, mode


def _setup_parts():
    tx = make_optimizer("sgd", 0.1)
    graphdef, _ = init_state(wb.training.build_model("mlp", hidden=16), tx)
    return graphdef, wb.training.model_class("mlp").loss, tx


def test_fsdp_shards_parameters_and_optimizer_state():
    tx = make_optimizer("adam", 1e-3)
    graphdef, state = init_state(wb.training.build_model("mlp", hidden=64), tx)
    mode = build_mode("fsdp", StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh("data=8"), 64))
    placed = mode.place_state(state)
    kernel = placed.params["hidden2"]["kernel"][...]
    mu = placed.opt_state.inner_state[0].mu["hidden2"]["kernel"][...]
    for array in (kernel, mu):
        assert array.addressable_shards[0].data.size * 8 == array.size  # each device holds 1/8
    state, _ = mode.step(placed, mode.place_batch(_batches("mlp")[0]))
    assert state.params["hidden2"]["kernel"][...].sharding.spec == kernel.sharding.spec  # still sharded


def test_tensor_parallel_splits_the_hidden_layers_over_model():
    tx = make_optimizer("sgd", 0.1)
    graphdef, state = init_state(wb.training.build_model("mlp", hidden=64), tx)
    setup = StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh("model=2"), 64,
                      tp_rules=tuple(tensor_parallel_rules("mlp")))
    placed = build_mode("tp", setup).place_state(state)
    assert placed.params["hidden1"]["kernel"][...].addressable_shards[0].data.shape == (64, 32)  # columns
    assert placed.params["hidden2"]["kernel"][...].addressable_shards[0].data.shape == (32, 64)  # rows
    assert placed.params["output"]["kernel"][...].sharding.is_fully_replicated


BAD_PLANS = [
    ("tp", {"mesh": wb.parse_mesh("data=8")}, "needs a mesh axis 'model'"),
    ("dp-tp", {"mesh": wb.parse_mesh("model=2"), "tp_rules": tuple(tensor_parallel_rules("mlp"))},
     "needs a mesh axis 'data'"),
    ("tp", {"mesh": wb.parse_mesh("model=2")}, "no splittable layer pair"),  # the model declares no tp rules here
    ("dp-pmap", {"mesh": wb.parse_mesh("data=4,model=2")}, "uses only mesh axes .data."),
    ("dp", {"global_batch": 100}, "96 or 104"),
    ("dp", {"accum": 3}, "3 microbatches"),
    ("simulated", {"global_batch": 12}, "8 or 16"),
    ("dp", {"mesh": wb.parse_mesh("data=16")}, "needs 16 devices but JAX has 8"),
    ("dp", {"precision": "fp16"}, "precision 'fp16'"),
    ("dp", {"accum": 0}, "accum=0"),
]


@pytest.mark.parametrize("mode,changes,message", BAD_PLANS)
def test_bad_combinations_are_refused_before_compiling(mode, changes, message):
    setup = StepSetup(*_setup_parts(), **{"mesh": wb.parse_mesh("data=8"), "global_batch": 64, **changes})
    with pytest.raises(wb.WorkbenchError, match=message.replace("(", r"\(")):
        build_mode(mode, setup)


def test_tensor_parallelism_needs_a_splittable_layer():
    tx = make_optimizer("sgd", 0.1)
    graphdef, _ = init_state(wb.training.build_model("linear"), tx)
    setup = StepSetup(graphdef, wb.training.model_class("linear").loss, tx, wb.parse_mesh("model=2"), 64, tp_rules=())
    with pytest.raises(wb.WorkbenchError, match="no splittable layer"):
        build_mode("tp", setup)


def test_single_accepts_any_mesh_and_ignores_its_size():
    setup = StepSetup(*_setup_parts(), mesh=wb.parse_mesh("data=4,model=2"), global_batch=64)
    assert build_mode("single", setup).mesh.size == 1


def test_unknown_mode_lists_the_modes():
    with pytest.raises(wb.WorkbenchError, match="choose one of single, simulated, dp"):
        build_mode("ddp", StepSetup(*_setup_parts()))


def _state_bytes_per_device(placed) -> int:
    """Bytes of a placed state on one device (every device holds the same amount)."""
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(placed))


@pytest.mark.parametrize("mode", [m for m in MODES if m != "simulated"])
def test_every_compiled_step_donates_its_state(mode):
    """The compiled step (ordinary and diagnostics) aliases the whole state: the new state is written over
    the old one, as production steps do, so no device holds both. The caller's host state survives."""
    tx = make_optimizer("adam", 1e-2)
    graphdef, state = init_state(wb.training.build_model("mlp", hidden=32), tx)
    setup = StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh(mode_mesh(mode)),
                      BATCH, tp_rules=tuple(tensor_parallel_rules("mlp")))
    runner = build_mode(mode, setup)
    placed, batch = runner.place_state(state), runner.place_batch(_batches("mlp")[0])
    for diagnostics in (False, True):
        memory = runner.compile_step(placed, batch, diagnostics=diagnostics).memory_analysis()
        assert memory.alias_size_in_bytes == _state_bytes_per_device(placed), (mode, diagnostics)
    stepped, _ = runner.step(placed, batch)
    placed_leaves, host_leaves = jax.tree.leaves(placed), jax.tree.leaves(state)
    assert placed_leaves and all(leaf.is_deleted() for leaf in placed_leaves)  # donated
    assert host_leaves and not any(leaf.is_deleted() for leaf in host_leaves)  # the host state is the caller's
    runner.step(runner.place_state(state), batch)  # so the same start state can be stepped again


def test_simulated_update_donates_the_state():
    """``simulated`` runs several programs per step (one per shard, then the update): the update, the program
    that writes the new state, aliases the whole state."""
    tx = make_optimizer("adam", 1e-2)
    graphdef, state = init_state(wb.training.build_model("mlp", hidden=32), tx)
    setup = StepSetup(graphdef, wb.training.model_class("mlp").loss, tx, wb.parse_mesh("data=8"), BATCH)
    runner = build_mode("simulated", setup)
    placed, shards = runner.place_state(state), runner.place_batch(_batches("mlp")[0])
    sums = jax.eval_shape(runner._shard_sums, placed, shards[0])
    memory = runner._update.lower(placed, sums, diagnostics=False).compile().memory_analysis()
    assert memory.alias_size_in_bytes == _state_bytes_per_device(placed)
    runner.step(placed, shards)
    placed_leaves = jax.tree.leaves(placed)
    assert placed_leaves and all(leaf.is_deleted() for leaf in placed_leaves)


def test_fsdp_on_a_2d_mesh_matches_single():
    """fsdp shards over 'data' only; on data=4,model=2 the model=2 copies repeat the work, exactly."""
    config = functools.partial(wb.TrainConfig, steps=3, batch=64, optimizer="sgd", lr=0.1, eval_every=0, sync_every=0,
                               model_options={"hidden": 32})
    reference = wb.Trainer(config(mode="single"), run_root="/tmp/wb-test-runs").run()
    for mode in ("fsdp", "fsdp-whole-tree"):
        summary = wb.Trainer(config(mode=mode, mesh="data=4,model=2"), run_root="/tmp/wb-test-runs").run()
        assert summary["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5), mode
