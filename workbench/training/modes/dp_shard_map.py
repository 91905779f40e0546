"""``dp-shard-map``: data parallelism written by hand with ``jax.shard_map`` and an explicit ``pmean``.

Inside ``shard_map`` each device runs the body on its own shard of the batch, and the body says where
devices talk. The classic recipe -- ``grads = jax.grad(loss)(params, shard); lax.pmean(grads)`` -- is
N times too large under ``check_vma=True`` (the default): the parameters come in replicated
("unvarying" over ``data``), and JAX's transpose of the implicit replicated-to-varying cast is a psum,
so ``jax.grad`` already returns the SUM of the devices' gradients, and ``pmean`` of a sum is the sum.

Why this version is correct: ``lax.pcast(params, "data", to="varying")`` declares the parameters
per-device *before* differentiating, so ``jax.grad`` returns each device's local gradient, and
:func:`~workbench.training.data_parallel.reduce_gradients` (``pmean``, which also refuses pre-summed gradients)
averages them once. The sums are weighted by each shard's example count and divided by the mean
weight, so unequal (padded) shards still give the global batch's gradient.

Teaching faults (see :mod:`.faults`): ``vma-double-count`` is the recipe as commonly written (no
pcast, ``lax.pmean`` on gradients that are already summed); ``psum`` sums where it should average.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec

from ..data_parallel import reduce_gradients
from .base import DATA_AXIS, ShardedJitMode, step_sums
from .core import TrainState, as_per_device, finish_step, means
from .dp import GRADIENT_ALL_REDUCE


class ShardMapDataParallel(ShardedJitMode):
    name = "dp-shard-map"
    summary = "jax.shard_map, per-device gradients, an explicit pmean (correct under check_vma=True)"
    sharded = "the batch, over 'data'; parameters and optimizer state replicated; the pmean is written by hand"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "replicate"
    gradient_sync = "shard_map"
    collectives = (GRADIENT_ALL_REDUCE,)
    supported_faults = ("psum", "vma-double-count", "optimizer-reset", "same-shard")
    fault_reasons = {
        "skip-sync": "its one program always averages; leaving the pmean out is shown with dp-pmap's replicas",
        "per-shard-update": "it computes all shards at once, so there is no per-shard loop to update in",
    }

    def _local_sums(self, params: Any, other: Any, shard: Any) -> dict[str, Any]:
        if "vma-double-count" not in self.faults:
            params = as_per_device(params, DATA_AXIS)  # lax.pcast: local gradients, not pre-summed (see above)
        sums = step_sums(self.setup, params, other, shard)
        if "psum" in self.faults:
            grads = lax.psum(sums["grads"], DATA_AXIS)  # the fault: a sum of N gradients, not their mean
        elif "vma-double-count" in self.faults:
            grads = lax.pmean(sums["grads"], DATA_AXIS)  # the fault: pmean of gradients grad already summed
        else:
            grads = reduce_gradients(sums["grads"], "mean", DATA_AXIS)
        return {
            "grads": grads,
            "metrics": lax.pmean(sums["metrics"], DATA_AXIS),
            "weight": lax.pmean(sums["weight"], DATA_AXIS),
        }  # mean of w*g over mean of w = sum of w*g over sum of w: means() divides

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        sums = jax.shard_map(
            self._local_sums,
            mesh=self.mesh,
            in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs=PartitionSpec(),
            check_vma=True,
        )(state.params, state.other, batch)
        return finish_step(self.setup.optimizer, state, means(sums), diagnostics, self.faults)
