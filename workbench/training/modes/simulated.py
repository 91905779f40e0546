"""``simulated``: data parallelism explained without devices. One device, a Python loop over N shards.

The global batch is cut into N equal shards (N = the size of the mesh's ``data`` axis), exactly as
``dp`` would split it over N devices. Each shard's gradient is computed on its own, as one device would;
the loop then averages them (the all-reduce, written out) and applies ONE optimizer update. Read this
file next to ``dp.py``: the arithmetic is the same, only the place where the average happens differs.

Averaging is weighted by each shard's example count, so a padded final batch whose shards hold
different numbers of real examples still gives the gradient of the global batch's mean loss; with
equal shards the weights are equal and it is the plain mean.

Teaching faults (see :mod:`.faults`): ``psum`` adds the shards' mean gradients and forgets to divide
by N; ``per-shard-update`` calls the optimizer inside the loop, once per shard.
"""

from __future__ import annotations

from typing import Any

import jax
from ...layout.tree_layout import TreeLayout, layout_tree
from .base import DATA_AXIS, ParallelMode, StepSetup, host_copy, single_device_mesh, step_sums
from .core import TrainState, add_sums, finish_step, means, weighted_sums


class SimulatedDataParallel(ParallelMode):
    name = "simulated"
    summary = "one device, a Python loop over N shards, gradients averaged, one update"
    sharded = "nothing: one device loops over N batch shards, as N devices would, then updates once"
    axes = (DATA_AXIS,)  # its size is the number of simulated devices
    mesh_example = "data=8"
    one_device = True
    other_axes = "ignore"
    batch_axis = DATA_AXIS
    state_placement = "replicate"
    gradient_sync = "loop"
    collectives = ()  # the loop's sum is the all-reduce, written out on one device
    supported_faults = ("psum", "per-shard-update", "optimizer-reset")
    fault_reasons = {
        "skip-sync": "its loop has one copy of the parameters, so there are no replicas to drift apart",
        "vma-double-count": "it differentiates outside shard_map, where check_vma does not apply",
        "same-shard": "it runs in one process, which loads the whole batch",
    }

    def __init__(self, setup: StepSetup):
        super().__init__(setup)
        self.shards = self.data_parallel_size
        self.device = jax.devices()[0]
        # What one simulated device computes: weighted gradient sums of its shard.
        self._shard_sums = jax.jit(lambda state, shard: step_sums(setup, state.params, state.other, shard))
        self._add = jax.jit(add_sums)  # one call per shard, not one per leaf
        # The psum fault: the loop's total is divided by one shard's weight, not all N: N times the mean.
        grad_scale = float(self.shards) if "psum" in self.faults else 1.0
        self._update = jax.jit(
            lambda state, sums, diagnostics: finish_step(
                setup.optimizer, state, _scaled_grads(means(sums), grad_scale), diagnostics, self.faults
            ),
            static_argnames="diagnostics", donate_argnums=0,  # the new state reuses the old one's buffers
        )
        self._eval = jax.jit(
            lambda state, batch: weighted_sums(
                setup.graphdef, setup.loss, setup.precision, state.params, state.other, batch, with_grads=False
            )
        )

    def place_state(self, state: TrainState) -> TrainState:
        return jax.device_put(host_copy(state), self.device)  # buffers of its own: the update donates them

    def place_batch(self, batch: Any) -> Any:
        # Cut on the host into the N shards a real data axis would hold.
        return [jax.device_put(jax.tree.map(lambda x, i=i: x[i], batch), self.device) for i in self._shard_rows(batch)]

    def _shard_rows(self, batch: Any) -> list[slice]:
        rows = len(jax.tree.leaves(batch)[0]) // self.shards
        return [slice(i * rows, (i + 1) * rows) for i in range(self.shards)]

    def step(self, state: TrainState, shards: list[Any], diagnostics: bool = False):
        if "per-shard-update" in self.faults:  # the fault: the optimizer inside the loop, N updates
            reported = None
            for shard in shards:
                state, metrics = self._update(state, self._shard_sums(state, shard), diagnostics=diagnostics)
                reported = reported or metrics  # the first shard's, computed at the step's starting parameters
            return state, reported
        total = None
        for shard in shards:  # device i's work, one after another
            sums = self._shard_sums(state, shard)
            total = sums if total is None else self._add(total, sums)  # the all-reduce, as a sum
        # Divides by the total weight: the average; one update.
        return self._update(state, total, diagnostics=diagnostics)

    def precompile(self, state: TrainState, shards: list[Any]) -> None:
        sums = jax.eval_shape(self._shard_sums, state, shards[0])
        self._update.lower(state, sums, diagnostics=False).compile()

    def eval_sums(self, state: TrainState, shards: list[Any]) -> dict[str, Any]:
        total = self._eval(state, shards[0])
        for shard in shards[1:]:
            total = self._add(total, self._eval(state, shard))
        return total

    def state_layout(self, state: TrainState) -> TreeLayout:
        return layout_tree(state, single_device_mesh(), "replicate")


def _scaled_grads(result: dict[str, Any], factor: float) -> dict[str, Any]:
    if factor == 1.0:
        return result
    return {**result, "grads": jax.tree.map(lambda g: g * factor, result["grads"])}
