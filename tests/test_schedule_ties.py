"""The ties that order a backward pass (workbench/training/schedule_ties.py) change no value and no gradient; the order
they set is a compiler's to honour, measured in tests/test_gpu_memory_model.py and tests/test_param_gathering.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from workbench.training.models import FeedForward
from workbench.training.schedule_ties import weight_gradients_first


def _loss(call):
    def loss(state, graphdef, x):
        return jnp.sum(jnp.sin(call(nnx.merge(graphdef, state), x)))
    return loss


def test_weight_gradients_first_changes_no_value_or_gradient():
    layer = FeedForward(6, 12, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (3, 5, 6))
    plain, tied = (jax.jit(jax.value_and_grad(_loss(call), argnums=(0, 2)), static_argnums=1)(state, graphdef, x)
                   for call in (FeedForward.forward, weight_gradients_first(FeedForward.forward)))
    for got, expected in zip(jax.tree.leaves(tied), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_the_input_gradient_waits_behind_a_barrier_with_the_weight_gradients():
    layer = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    jaxpr = jax.make_jaxpr(jax.grad(_loss(weight_gradients_first(nnx.Linear.__call__)), argnums=(0, 2)))(
        state, graphdef, jnp.ones((2, 4)))
    barriers = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "optimization_barrier"]
    assert len(barriers) == 1
    shapes = sorted(tuple(var.aval.shape) for var in barriers[0].invars)
    # the input's gradient, the bias's, and the kernel's as its matmul computes it: [out, in]
    assert shapes == [(2, 4), (3,), (3, 4)], shapes
