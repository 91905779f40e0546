"""Scanned layers (``LayerStack``, the transformer's ``scan_layers``): the same values as an unrolled loop,
the same training as ``single`` in every mode that shards parameters, and per-layer fsdp that gathers one
layer per loop iteration (8 simulated devices, real collectives)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import workbench as wb
from helpers import trained
from workbench.analysis.ledger import ledger_for_mode
from workbench.training.layer_stack import LayerStack
from workbench.training.modes import StepSetup, build_mode
from workbench.training.modes.core import init_state
from workbench.training.modes.param_gathering import layer_bytes, layer_paths


class Residual(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        return x + nnx.relu(self.dense(x))


class Stacked(nnx.Module):
    def __init__(self, rngs, scanned=True):
        self.blocks = (LayerStack(Residual, 4, rngs=rngs) if scanned
                       else nnx.List([Residual(rngs) for _ in range(4)]))
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        if isinstance(self.blocks, LayerStack):
            return self.out(self.blocks(x))
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def unrolled_copy(model: Stacked) -> Stacked:
    """The same parameters as ``model``, its stack unrolled into a list of layers."""
    copy = Stacked(nnx.Rngs(1), scanned=False)
    stacked = nnx.state(model.blocks.layer, nnx.Param)
    for i, block in enumerate(copy.blocks):
        nnx.update(block, jax.tree.map(lambda leaf, i=i: leaf[i], stacked))
    nnx.update(copy.out, nnx.state(model.out))
    return copy


def regression_loss(model, batch):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {"weight": jnp.float32(batch["x"].shape[0])}


def test_a_stack_computes_what_the_unrolled_loop_computes():
    model = Stacked(nnx.Rngs(0))
    assert model.blocks.layer.dense.kernel.shape == (4, 8, 8)
    x = jax.random.normal(jax.random.key(1), (5, 8))
    np.testing.assert_allclose(model(x), unrolled_copy(model)(x), rtol=1e-6, atol=1e-6)


def test_a_stack_is_one_layer_that_gathers_one_of_its_layers():
    model = Stacked(nnx.Rngs(0))
    assert layer_paths(model) == ["blocks", "out"]
    assert layer_bytes(model)["blocks"] == (8 * 8 + 8) * 4  # one Residual, not four


def _mode(name: str, module: nnx.Module):
    tx = optax.sgd(0.1)
    graphdef, state = init_state(module, tx)
    return build_mode(name, StepSetup(graphdef, regression_loss, tx, wb.parse_mesh("data=8"), 64)), state


def _batches(steps: int = 3):
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(64, 8)).astype(np.float32), "y": rng.normal(size=(64, 2)).astype(np.float32)}
            for _ in range(steps)]


@pytest.mark.parametrize("mode_name", ["fsdp", "fsdp-whole-tree", "dp"])
def test_stacked_layers_train_as_single_does(mode_name):
    results = {}
    for name in (mode_name, "single"):
        runner, state = _mode(name, Stacked(nnx.Rngs(0)))
        state = runner.place_state(state)
        losses = []
        for batch in _batches():
            state, metrics = runner.step(state, runner.place_batch(batch))
            losses.append(float(metrics["loss"]))
        results[name] = (np.array(losses), runner.export_state(state).params)
    (losses, params), (reference, expected) = results[mode_name], results["single"]
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _collectives(module: nnx.Module):
    runner, state = _mode("fsdp", module)
    batch = _batches(1)[0]
    return ledger_for_mode(runner, runner.place_state(state), runner.place_batch(batch))


def test_fsdp_gathers_a_stack_one_layer_per_iteration():
    """The loop's all-gathers move one layer's kernel each, and as many bytes per step as the unrolled
    model's gathers (loop counts multiplied): per-layer gathering, not the whole stack at once. Unrolled, the
    first layer is not gathered again: its input is the batch, so its backward pass reads no kernel."""
    scanned, unrolled = _collectives(Stacked(nnx.Rngs(0))), _collectives(Stacked(nnx.Rngs(0), scanned=False))
    gathered_shapes = {shape for row in scanned.collectives if row.kind == "all-gather" for shape in row.shapes}
    assert (8, 8) in gathered_shapes and (4, 8, 8) not in gathered_shapes, gathered_shapes
    assert scanned.bytes_by_kind()["all-gather"] == unrolled.bytes_by_kind()["all-gather"] + 8 * 8 * 4
    assert scanned.bytes_by_kind()["reduce-scatter"] == unrolled.bytes_by_kind()["reduce-scatter"]


def test_tensor_parallel_rules_never_split_the_layer_axis():
    params = wb.model_layout("transformer", "model=4", "tp", model_options={"n_layers": 2, "scan_layers": True}).params
    spec = lambda path: tuple(params.leaf(path).layout.spec)  # noqa: E731
    assert spec("blocks/layer/attn/q/kernel") == (None, None, "model")
    assert spec("blocks/layer/attn/q/bias") == (None, "model")
    assert spec("blocks/layer/mlp/down/kernel") == (None, "model", None)


def test_the_scanned_transformer_trains_exactly_in_fsdp():
    # The losses and parameters of `single` (test_fsdp_gathers_a_stack_one_layer_per_iteration counts the gathers).
    def run(mode):
        return trained(wb.TrainConfig(model="transformer", data="tokens", optimizer="sgd", lr=0.1, batch=64,
                                      model_options={"d_model": 32, "n_heads": 4, "n_layers": 2, "scan_layers": True},
                                      mode=mode, mesh="data=8" if mode == "fsdp" else "data=1"), 3)

    (losses, params), (reference, reference_params) = run("fsdp"), run("single")
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    for leaf, expected in zip(jax.tree.leaves(params), jax.tree.leaves(reference_params), strict=True):
        np.testing.assert_allclose(leaf, expected, rtol=1e-4, atol=1e-6)
    assert losses[-1] < losses[0]
