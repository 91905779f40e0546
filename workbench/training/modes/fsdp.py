"""``fsdp``: fully sharded data parallelism (ZeRO-3), one layer's parameters gathered at a time.

Like ``dp`` the batch is split over ``data``; parameters and optimizer state are sharded over ``data``
too, each leaf along its largest dimension divisible by the axis size (small leaves, such as biases of
10 classes, stay whole on every device; :meth:`state_layout` says which and why). Each device stores
1/N of them.

The step runs in ``jax.shard_map``. Each layer of the model (see :mod:`.param_gathering`) all-gathers
its parameters when it is called and drops them after; in the backward pass it gathers them again,
recomputes its forward pass from its saved input, and its gradients are reduce-scattered (the
all-gather's transpose) before the layer below starts. So a device holds one layer's whole
parameters and gradients at a time, as production FSDP does (PyTorch FSDP's units, MaxText's scanned
layers), at the cost of a second all-gather and a second forward pass per layer.

Outside the shard_map the optimizer updates each shard where it lives: Adam is element-wise, so no
device ever needs another's optimizer state. ``fsdp-whole-tree`` is the same algorithm with the whole
tree gathered at once: shorter to read, and it moves exactly ``dp``'s bytes.

Why not plain ``jit`` with sharded parameters (MaxText's way): measured on XLA:CPU, the compiler
gathered every parameter at the start of the step, all-reduced whole gradients (no reduce-scatter), and
at small per-device batches moved activations instead of weights; its temporaries for the README's 1.3B
plan were 2.9 times the whole parameter tree (see docs/design/production-steps.md).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec

from .base import DATA_AXIS, ShardedJitMode
from .core import TrainState, accumulate, cast_floats, finish_step, means, weighted_sums_of
from .declaration import CollectiveNeed
from .fsdp_whole_tree import FSDP_FAULT_REASONS, SHARDED_GRADIENT_REDUCE_SCATTER, WHOLE_LEAVES_ALL_REDUCE
from .param_gathering import layer_paths, layered_model, split_dims


class FullyShardedDataParallel(ShardedJitMode):
    name = "fsdp"
    summary = "batch split over 'data'; parameters and optimizer state sharded over it, gathered layer by layer"
    sharded = "the batch, parameters and optimizer state, all over 'data' (each device stores 1/N)"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "shard"
    parameter_gathering = "per-layer"
    gradient_sync = "shard_map"
    collectives = (
        CollectiveNeed("all-gather", DATA_AXIS, "sharded-parameters",
                       "parameters, gathered layer by layer for the forward pass and again for the backward pass",
                       times=2),
        SHARDED_GRADIENT_REDUCE_SCATTER,
        WHOLE_LEAVES_ALL_REDUCE,
    )
    fault_reasons = FSDP_FAULT_REASONS

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        plan = self.plan
        layers = layer_paths(nnx.merge(plan.graphdef, state.params, state.other))  # traced once, with the step
        param_specs = jax.tree.map(lambda s: s.spec, self.state_shardings(state).params)
        dims = split_dims(param_specs)
        bf16 = plan.precision == "bf16"
        prepare = (lambda params: cast_floats(params, jnp.bfloat16)) if bf16 else (lambda params: params)

        def local_sums(shards, other, batch_shard):
            def sums_of(micro):
                micro = cast_floats(micro, jnp.bfloat16) if bf16 else micro

                def objective(params):
                    value, aux = plan.loss(layered_model(plan.graphdef, params, other, dims, layers, prepare), micro)
                    return value.astype(jnp.float32), aux

                # Gradients come out of the layers' reduce-scatters summed over devices (and whole leaves'
                # through shard_map's psum for replicated inputs): only the metrics are summed below.
                return weighted_sums_of(objective, shards, micro)

            sums = accumulate(sums_of, batch_shard, plan.accum)  # a reduce-scatter per microbatch
            return {"grads": sums["grads"], "metrics": lax.psum(sums["metrics"], DATA_AXIS),
                    "weight": lax.psum(sums["weight"], DATA_AXIS)}

        sums = jax.shard_map(
            local_sums,
            mesh=self.mesh,
            in_specs=(param_specs, PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs={"grads": param_specs, "metrics": PartitionSpec(), "weight": PartitionSpec()},
            check_vma=True,
        )(state.params, state.other, batch)
        return finish_step(plan.optimizer, state, means(sums), diagnostics, self.faults)  # updates each shard in place

