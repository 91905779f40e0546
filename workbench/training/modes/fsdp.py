"""``fsdp``: fully sharded data parallelism (ZeRO-3), one layer's parameters gathered at a time.

Like ``dp`` the batch is split over ``data``; parameters and optimizer state are sharded over ``data``
too, each leaf along its largest dimension divisible by the axis size (small leaves, such as biases of
10 classes, stay whole on every device; :meth:`state_layout` says which and why). Each device stores
1/N of them.

The step runs in ``jax.shard_map``. Each layer of the model (see :mod:`.param_gathering`) all-gathers
its parameters when it is called and drops them after, keeping its activations as the remat policy
says (``TrainConfig.remat``: ``block`` recomputes the layer); in the backward pass it gathers them
again, and its gradients are reduce-scattered (the all-gather's transpose) before the layer below
starts. So a device holds one layer's whole parameters and gradients at a time, as production FSDP
does (PyTorch FSDP's units, MaxText's scanned layers), at the cost of a second all-gather per layer. The
last layer called (a language model's head) keeps its parameters for its backward pass, which starts with
it, as PyTorch FSDP2 leaves the last layer unsharded after its forward pass: one gather less, the same peak.

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

import jax.numpy as jnp
from flax import nnx

from .base import DATA_AXIS
from .core import accumulate, cast_floats, weighted_sums_of
from .declaration import CollectiveNeed
from .param_gathering import gathers_narrow, layer_paths, layered_model
from .sharded_state import SHARDED_GRADIENT_REDUCE_SCATTER, WHOLE_LEAVES_ALL_REDUCE, ShardedStateMode


class FullyShardedDataParallel(ShardedStateMode):
    name = "fsdp"
    summary = "batch split over 'data'; parameters and optimizer state sharded over it, gathered layer by layer"
    parameter_gathering = "per-layer"
    collectives = (
        CollectiveNeed("all-gather", DATA_AXIS, "sharded-parameters",
                       "parameters, gathered layer by layer for the forward pass"),
        CollectiveNeed("all-gather", DATA_AXIS, "regathered-parameters",
                       "parameters, gathered again layer by layer for the backward pass (not the last layer called: "
                       "it keeps its own)"),
        SHARDED_GRADIENT_REDUCE_SCATTER,
        WHOLE_LEAVES_ALL_REDUCE,
    )

    def _local_sums(self, shards: Any, other: Any, batch_shard: Any, dims: Any, kept: Any = None) -> dict[str, Any]:
        setup = self.setup
        layers = layer_paths(nnx.merge(setup.graphdef, shards, other))  # traced once, with the step
        bf16 = setup.precision == "bf16"
        prepare = (lambda params: cast_floats(params, jnp.bfloat16)) if bf16 else (lambda params: params)
        # bf16 shards gathered in bf16 (half the bytes), except on XLA:CPU, which widens bf16 all-gathers to float32
        cast_first = bf16 and gathers_narrow(self.mesh)

        def sums_of(micro):
            micro = cast_floats(micro, jnp.bfloat16) if bf16 else micro

            def objective(params):
                model = layered_model(setup.graphdef, params, other, dims, layers, prepare, kept, cast_first)
                value, aux = setup.loss(model, micro)
                return value.astype(jnp.float32), aux

            # The gradients come out of the layers' reduce-scatters summed over devices (and whole leaves'
            # through shard_map's psum for replicated inputs).
            return weighted_sums_of(objective, shards, micro)

        return accumulate(sums_of, batch_shard, setup.accum)  # a reduce-scatter per microbatch
