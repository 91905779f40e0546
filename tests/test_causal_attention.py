"""Causal attention's hand-written backward passes (workbench/training/causal_attention.py): the values and gradients
of the plain ``jnp.where`` and ``einsum``, and a scanned transformer's backward pass that reads no hoisted
(batch, heads, T, T) array. The memory they save is XLA:GPU's (tests/test_gpu_memory_model.py's scanned fsdp row)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

import workbench as wb
from workbench.training.causal_attention import causally_masked, weighted_values
from workbench.training.step import build_abstract_step


def _plain(scores, values):
    length = scores.shape[-1]
    masked = jnp.where(np.tril(np.ones((length, length), dtype=bool)), scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(masked, axis=-1), values)


def _ours(scores, values):
    return weighted_values(jax.nn.softmax(causally_masked(scores), axis=-1), values)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 4)], ids=lambda shape: "x".join(map(str, shape)))
def test_values_and_gradients_are_the_plain_computation(shape, dtype):
    batch, heads, length, width = shape
    keys = jax.random.split(jax.random.key(sum(shape)), 3)
    scores = jax.random.normal(keys[0], (batch, heads, length, length), dtype)
    values = jax.random.normal(keys[1], (batch, length, heads, width), dtype)
    cotangent = jax.random.normal(keys[2], (batch, length, heads, width), dtype)

    @jax.jit
    def outputs_and_gradients(scores, values, cotangent):
        return [(output, pullback(cotangent)) for output, pullback in
                (jax.vjp(attend, scores, values) for attend in (_ours, _plain))]

    (got, got_grads), (expected, expected_grads) = outputs_and_gradients(scores, values, cotangent)
    tolerance = 1e-6 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), atol=tolerance)
    for ours, plain in zip(got_grads, expected_grads, strict=True):
        assert ours.dtype == plain.dtype
        np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(plain, np.float32), atol=tolerance)


def test_the_masked_positions_get_no_gradient():
    weights = jax.random.normal(jax.random.key(0), (1, 1, 4, 4))
    grad = jax.grad(lambda s: (causally_masked(s) * weights).sum())(jnp.zeros((1, 1, 4, 4)))
    causal = np.tril(np.ones((4, 4), dtype=bool))
    assert np.array_equal(np.asarray(grad), np.where(causal, np.asarray(weights), 0.0))


def _scan_operands(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield from (var.aval for var in eqn.invars)
        for sub in jaxprs_in_params(eqn.params):
            yield from _scan_operands(sub)


@pytest.mark.parametrize("remat", ["none", "block"])
def test_a_scanned_stack_reads_no_hoisted_attention_sized_array(remat):
    # Through jnp.where, the mask broadcast to the scores' shape, its fill of the lowest value and the backward pass's
    # zero of that shape were the same in every layer, so JAX's scan computed them once, before the loop, and passed
    # them in: XLA:GPU held them for the whole loop (on the 1.3B under fsdp, heads not split: 1 GiB each a device).
    # What the loops may read of that shape is stacked, one per layer (a residual of the forward pass).
    length = 24  # unlike every other dimension of the model
    config = wb.TrainConfig(model="transformer", model_options={"d_model": 32, "n_heads": 4, "n_layers": 3,
                                                                "max_len": length, "scan_layers": True},
                            mode="dp", mesh="data=2", batch=4, precision="bf16", remat=remat)
    step = build_abstract_step(config, seq_len=length)
    jaxpr = step.mode._compiled_step(step.state, False).trace(step.state, step.batch).jaxpr.jaxpr
    operands = list(_scan_operands(jaxpr))
    assert operands and not [aval for aval in operands if aval.shape[-2:] == (length, length) and aval.ndim == 4]
