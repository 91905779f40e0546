"""fsdp's layers: which modules gather their own parameters, and what happens to a model that reads a
layer's parameters outside the layer's call (8 simulated devices, real collectives)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import workbench as wb
from workbench.training.modes import StepSetup, build_mode
from workbench.training.modes.core import init_state
from workbench.training.modes.param_gathering import layer_bytes, layer_paths, owning_layer


class Encoder(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(3)])
        self.norm = nnx.LayerNorm(8, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.norm(x)


class Nested(nnx.Module):
    """Layers inside a submodule's list, a Sequential, and a parameter the model owns itself."""

    def __init__(self, rngs):
        self.encoder = Encoder(rngs)
        self.head = nnx.Sequential(nnx.Linear(8, 16, rngs=rngs), nnx.relu, nnx.Linear(16, 2, rngs=rngs))
        self.scale = nnx.Param(jnp.ones(8))

    def __call__(self, x):
        return self.head(self.encoder(x * self.scale[...]))


def regression_loss(model, batch):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {"weight": jnp.float32(batch["x"].shape[0])}


def test_layers_are_list_elements_at_any_depth_and_other_children():
    assert (layer_paths(wb.training.build_model("transformer", n_layers=2))
            == ["blocks/0", "blocks/1", "embed", "final_norm", "head"])
    assert layer_paths(wb.training.build_model("mlp")) == ["hidden1", "hidden2", "output"]
    nested = Nested(nnx.Rngs(0))
    layers = layer_paths(nested)
    assert layers == ["encoder/layers/0", "encoder/layers/1", "encoder/layers/2", "encoder/norm",
                      "head/layers/0", "head/layers/2"]
    assert owning_layer("encoder/layers/1/kernel", layers) == "encoder/layers/1"
    assert owning_layer("scale", layers) is None
    sizes = layer_bytes(nested)
    assert sizes[None] == 8 * 4 and sizes["head/layers/0"] == (8 * 16 + 16) * 4
    assert sum(sizes.values()) == sum(x.nbytes for x in jax.tree.leaves(nnx.state(nested, nnx.Param)))


def _train(mode: str, module: nnx.Module, steps: int = 3):
    tx = optax.sgd(0.1)
    graphdef, state = init_state(module, tx)
    runner = build_mode(mode, StepSetup(graphdef, regression_loss, tx, wb.parse_mesh("data=8"), 64))
    rng = np.random.default_rng(0)
    state = runner.place_state(state)
    losses = []
    for _ in range(steps):
        batch = {"x": rng.normal(size=(64, 8)).astype(np.float32), "y": rng.normal(size=(64, 2)).astype(np.float32)}
        state, metrics = runner.step(state, runner.place_batch(batch))
        losses.append(float(metrics["loss"]))
    return np.array(losses), runner.export_state(state).params


def test_nested_layers_and_the_models_own_parameters_train_as_single_does():
    losses, params = _train("fsdp", Nested(nnx.Rngs(0)))
    reference, expected = _train("single", Nested(nnx.Rngs(0)))
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


class CalledOutOfOrder(nnx.Module):
    """Its layers listed (a_out, b_in) in another order than it calls them (b_in, then a_out)."""

    def __init__(self, rngs):
        self.a_out = nnx.Linear(8, 2, rngs=rngs)
        self.b_in = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        return self.a_out(nnx.relu(self.b_in(x)))


def test_the_last_layer_called_is_gathered_once_and_the_step_stays_exact():
    from workbench.analysis.hlo import collective_ops
    from workbench.training.modes.param_gathering import layer_call_order

    model = CalledOutOfOrder(nnx.Rngs(0))
    example = {"x": jax.ShapeDtypeStruct((2, 8), "float32"), "y": jax.ShapeDtypeStruct((2, 2), "float32")}
    assert layer_paths(model) == ["a_out", "b_in"]
    assert layer_call_order(model, regression_loss, example) == ["b_in", "a_out"]
    assert (layer_call_order(wb.training.build_model("transformer", n_layers=2), wb.training.model_class(
        "transformer").loss, {"x": jax.ShapeDtypeStruct((2, 8), "int32"), "y": jax.ShapeDtypeStruct((2, 8), "int32"),
                              "mask": jax.ShapeDtypeStruct((2,), "float32")})
            == ["embed", "blocks/0", "blocks/1", "final_norm", "head"])

    losses, params = _train("fsdp", CalledOutOfOrder(nnx.Rngs(0)))
    reference, expected = _train("single", CalledOutOfOrder(nnx.Rngs(0)))
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)

    # a_out, called last, keeps the kernel its forward pass gathered; b_in's backward pass needs no gradient of its
    # input (the batch), so its kernel is gathered once too: two kernel gathers, one of each
    tx = optax.sgd(0.1)
    graphdef, state = init_state(CalledOutOfOrder(nnx.Rngs(0)), tx)
    runner = build_mode("fsdp", StepSetup(graphdef, regression_loss, tx, wb.parse_mesh("data=8"), 64))
    batch = {"x": np.zeros((64, 8), np.float32), "y": np.zeros((64, 2), np.float32)}
    text = runner.compile_step(runner.place_state(state), runner.place_batch(batch)).as_text()
    kernels = sorted(op.shapes[0] for op in collective_ops(text, "data=8") if op.kind == "all-gather"
                     for _ in range(op.count) if len(op.shapes[0]) == 2)
    assert kernels == [(8, 2), (8, 8)], kernels


class BlockFirst(nnx.Module):
    """Its first layer is a block of two matmuls: the first's gradient reads the second's kernel."""

    def __init__(self, rngs):
        self.block = CalledOutOfOrder(rngs)
        self.out = nnx.Linear(2, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.block(x))


def test_a_first_layer_whose_backward_pass_reads_its_parameters_is_told_apart():
    from workbench.training.modes.param_gathering import first_layer_reads_parameters

    example = {"x": jax.ShapeDtypeStruct((2, 8), "float32"), "y": jax.ShapeDtypeStruct((2, 2), "float32")}
    assert first_layer_reads_parameters(BlockFirst(nnx.Rngs(0)), regression_loss, example)
    assert not first_layer_reads_parameters(CalledOutOfOrder(nnx.Rngs(0)), regression_loss, example)  # a dense layer
    lm = wb.training.build_model("transformer", n_layers=1)
    tokens = {"x": jax.ShapeDtypeStruct((2, 8), "int32"), "y": jax.ShapeDtypeStruct((2, 8), "int32"),
              "mask": jax.ShapeDtypeStruct((2,), "float32")}
    assert not first_layer_reads_parameters(lm, wb.training.model_class("transformer").loss, tokens)  # a lookup


class TiedLM(nnx.Module):
    """The output head is the embedding, transposed: its parameters are read outside the embed's call."""

    def __init__(self, rngs):
        self.embed = nnx.Embed(64, 16, rngs=rngs)

    def __call__(self, tokens):
        return self.embed.attend(self.embed(tokens))


def test_weights_read_outside_their_layer_are_refused_with_the_fix():
    tx = optax.sgd(0.1)
    graphdef, state = init_state(TiedLM(nnx.Rngs(0)), tx)
    setup = StepSetup(graphdef, wb.training.model_class("transformer").loss, tx, wb.parse_mesh("data=8"), 8)
    runner = build_mode("fsdp", setup)
    tokens = np.zeros((8, 4), np.int32)
    batch = runner.place_batch({"x": tokens, "y": tokens, "mask": np.ones(8, np.float32)})
    with pytest.raises(wb.WorkbenchError, match="'embed/embedding' was read outside its own call.*fsdp-whole-tree"):
        runner.step(runner.place_state(state), batch)
    fix = build_mode("fsdp-whole-tree", runner.setup)  # the fix the message names trains it
    batch = {"x": tokens, "y": tokens, "mask": np.ones(8, np.float32)}
    _, metrics = fix.step(fix.place_state(state), fix.place_batch(batch))
    assert np.isfinite(float(metrics["loss"]))


LM_OPTIONS = dict(vocab=64, d_model=16, n_heads=2, n_layers=1, max_len=16)


def _train_lm(mode: str, precision: str = "fp32", steps: int = 2):
    tx = optax.sgd(0.1)
    # 64 words: 3 tiles, the last padded
    model = wb.training.build_model("transformer", seed=0, loss_tile=24, **LM_OPTIONS)
    graphdef, state = init_state(model, tx)
    runner = build_mode(mode, StepSetup(graphdef, wb.training.model_class("transformer").loss, tx,
                                       wb.parse_mesh("data=8"), 16,
                                       precision=precision))
    rng = np.random.default_rng(0)
    state, losses = runner.place_state(state), []
    for _ in range(steps):
        tokens = rng.integers(0, 64, size=(16, 16)).astype(np.int32)
        mask = np.ones(16, np.float32)
        mask[-3:] = 0  # padding rows count for nothing in either mode
        batch = {"x": tokens, "y": np.roll(tokens, -1, axis=1), "mask": mask}
        state, metrics = runner.step(state, runner.place_batch(batch))
        losses.append(float(metrics["loss"]))
    return np.array(losses), runner.export_state(state).params


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_tiled_language_model_loss_trains_under_fsdp_as_single_does(precision):
    losses, params = _train_lm("fsdp", precision)
    reference, expected = _train_lm("single", precision)
    np.testing.assert_allclose(losses, reference, rtol=1e-5 if precision == "fp32" else 2e-2)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 if precision == "fp32" else 1e-2)


def _compiled_fsdp_step(loss_tile: int):
    options = dict(d_model=128, n_layers=2, n_heads=4, vocab=4096, loss_tile=loss_tile)
    from workbench.training.step import build_abstract_step

    step = build_abstract_step(wb.TrainConfig(model="transformer", model_options=options, mode="fsdp",
                                                 mesh="data=8", batch=16, optimizer="adamw", precision="fp32"))
    return step.compile()


def test_fsdp_gathers_the_head_once_for_all_tiles_and_holds_one_tile_of_logits():
    from workbench.analysis.hlo import collective_ops

    tiled, whole = _compiled_fsdp_step(512), _compiled_fsdp_step(4096)  # 2 x 128 tokens per device, 8 tiles
    head_gathers = [op for op in collective_ops(tiled.as_text(), "data=8")
                    if op.kind == "all-gather" and "(head)" in " ".join(op.metadata)]
    # Once: not once per tile, and not again for the backward pass, which starts with the head (the last layer
    # called keeps the parameters its forward pass gathered)
    assert sum(op.count for op in head_gathers) == 1
    logits = 2 * 128 * 4096 * 4  # one device's float32 logits, whole
    saved = whole.memory_analysis().temp_size_in_bytes - tiled.memory_analysis().temp_size_in_bytes
    assert saved > logits  # the logits, their softmax and gradient are no longer held whole


def test_the_tiled_loss_is_the_plain_cross_entropy():
    """Every word in some tile, padded words never chosen: the same loss, gradient and accuracy."""
    from workbench.training.models import cross_entropy_loss, language_model_loss

    model = wb.training.build_model("transformer", seed=0, vocab=50, d_model=16, n_heads=2, n_layers=1, max_len=8,
                                    loss_tile=16)
    rng = np.random.default_rng(1)
    batch = {"x": rng.integers(0, 50, (4, 8)).astype(np.int32), "y": rng.integers(0, 50, (4, 8)).astype(np.int32),
             "mask": np.array([1, 1, 1, 0], np.float32)}
    # Jitted: op by op, the tiled loss's scan and its gradient dispatch hundreds of small programs, each compiled
    # once (two minutes with an empty compilation cache) for the same numbers.
    (tiled, tiled_aux), (plain, plain_aux) = (nnx.jit(fn)(model, batch)
                                              for fn in (language_model_loss, cross_entropy_loss))
    np.testing.assert_allclose(tiled, plain, rtol=1e-6)
    for key in plain_aux:
        np.testing.assert_allclose(tiled_aux[key], plain_aux[key], rtol=1e-6)
    grads = [nnx.jit(nnx.grad(lambda m, fn=fn: fn(m, batch)[0]))(model)
             for fn in (language_model_loss, cross_entropy_loss)]
    for got, want in zip(*(jax.tree.leaves(g) for g in grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("remat", ["none", "dots"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_forward_pass_keeps_activations_but_no_gathered_parameters(precision, remat):
    # Four 256-wide blocks and 4 tokens a device: the parameters are nearly all of the step. Each layer keeps its
    # activations for the backward pass (all, or under `dots` its matmuls' outputs, through the block's own
    # jax.checkpoint) but not its gathered (and, in bf16, cast) parameters, which the backward pass gathers again:
    # about one block's parameters and gradients are held (0.40-0.47 of the whole parameters, measured). Kept,
    # every block's would be held (1.09-1.10, as fsdp-whole-tree holds).
    from workbench.training.models import abstract_model
    from workbench.training.step import build_abstract_step

    options = dict(d_model=256, n_layers=4, n_heads=4, vocab=64, max_len=4)
    params = nnx.state(abstract_model("transformer", **options), nnx.Param)
    whole = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
    config = wb.TrainConfig(model="transformer", model_options=options, mode="fsdp", mesh="data=8", batch=8,
                            precision=precision, optimizer="sgd", remat=remat)
    temp = build_abstract_step(config).compile().memory_analysis().temp_size_in_bytes
    assert temp < 0.6 * whole, (temp, whole)


@pytest.mark.parametrize(("mode", "mesh"), [("fsdp", "data=8"), ("fsdp-tp", "data=4,model=2")])
def test_kernel_gradients_leave_the_matmul_in_its_own_order(mode, mesh):
    # JAX computes a kernel's gradient as the transpose of a matmul. Reduce-scattered as it was, XLA:CPU folded the
    # transpose into the matmul and ran it as a generic dot on a transposed copy of the output's gradient (12-14 in
    # this step; bench_modes' transformer fsdp-tp 1.36 of the hand-written step). Scattered in the matmul's order,
    # no matmul of the step is a folded transpose.
    import re

    from workbench.training.config import make_optimizer
    from workbench.training.models import tensor_parallel_rules

    tx = make_optimizer("adam", 1e-3)
    graphdef, state = init_state(wb.training.build_model("transformer", d_model=64, n_layers=2, n_heads=4,
                                                         vocab=64, max_len=16), tx)
    setup = StepSetup(graphdef, wb.training.model_class("transformer").loss, tx, wb.parse_mesh(mesh), 32,
                      tp_rules=tuple(tensor_parallel_rules("transformer")))
    runner = build_mode(mode, setup)
    tokens = np.zeros((32, 16), np.int32)
    batch = {"x": tokens, "y": tokens, "mask": np.ones(32, np.float32)}
    text = runner.compile_step(runner.place_state(state), runner.place_batch(batch)).as_text()
    matmuls = re.findall(r" dot\(.*", text)
    assert matmuls, "no matmul found: the HLO text changed"
    # Folded, the matmul contracts its first operand's leading dimension: [tokens, in] x [out, tokens] -> [in, out].
    folded = [line[:160] for line in matmuls if "lhs_contracting_dims={0}, rhs_contracting_dims={1}" in line]
    assert not folded, folded
