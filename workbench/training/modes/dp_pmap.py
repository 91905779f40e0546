"""``dp-pmap``: the legacy ``jax.pmap`` style, for readers of older tutorials.

The state is replicated with a leading device axis (one copy per device, stacked), the batch is
reshaped to ``(N, B/N, ...)``, and the function pmap maps sees one device's copy and shard. Under pmap
the gradient is each device's local one (pmap does not pre-sum), so ``lax.pmean`` averages it once;
every device then applies the same update to its own copy, and the copies stay identical.

Since JAX 0.8 ``pmap`` is implemented as ``jit(shard_map)`` and is in maintenance mode; new code
should use ``dp`` or ``dp-shard-map``. Mapping more rows than devices fails with a cryptic error, so
the mode checks the data axis against the device count first.

Teaching faults (see :mod:`.faults`): ``skip-sync`` leaves the pmean out, so each replica applies its
own local gradient and the stacked copies drift apart; ``psum`` sums where it should average.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from ..process_share import global_arrays
from ...errors import MeshError
from ...layout.mesh import build_mesh
from ...layout.tree_layout import TreeLayout, layout_tree
from .base import DATA_AXIS, ParallelMode, StepSetup, step_sums
from .core import TrainState, finish_step, means, weighted_sums
from .dp import GRADIENT_ALL_REDUCE


class PmapDataParallel(ParallelMode):
    name = "dp-pmap"
    summary = "legacy jax.pmap: stacked replicas, batch reshaped to (devices, B/devices, ...), pmean"
    sharded = "the batch, over 'data'; every device keeps a stacked copy of the state (legacy pmap)"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "replicate"
    other_axes = "refuse"  # pmap maps one axis of devices
    stacked_state = True  # row i of every state leaf is replica i's copy
    gradient_sync = "pmap"
    collectives = (GRADIENT_ALL_REDUCE,)
    supported_faults = ("skip-sync", "psum", "optimizer-reset", "same-shard")
    fault_reasons = {
        "per-shard-update": "each device updates once with its own shard; the per-shard loop is shown in simulated",
        "vma-double-count": "pmap does not pre-sum gradients (no check_vma): the trap needs shard_map",
    }

    def __init__(self, setup: StepSetup):
        super().__init__(setup)
        size = self.data_parallel_size
        if size > len(jax.devices()):  # pmap's own error for this is a cryptic squeeze
            raise MeshError(
                f"mode 'dp-pmap' maps over {size} devices but JAX has {len(jax.devices())}: "
                f"use --mesh data={len(jax.devices())} or fewer"
            )
        self.devices = jax.devices()[:size]
        self.mesh = build_mesh({DATA_AXIS: len(self.devices)}, axis_types="auto", devices=self.devices)
        # Metrics and eval sums are identical on every device after pmean/psum: return one copy.
        self._steps = {
            diagnostics: jax.pmap(
                functools.partial(self._local_step, diagnostics=diagnostics),
                axis_name=DATA_AXIS, devices=self.devices, out_axes=(0, None), donate_argnums=0,
            )
            for diagnostics in (False, True)
        }  # pmap compiles on first call: an unused variant costs nothing; the stacked state is donated
        self._eval = jax.pmap(self._local_eval, axis_name=DATA_AXIS, devices=self.devices, out_axes=None)

    def _local_step(self, state: TrainState, shard: Any, diagnostics: bool):
        sums = step_sums(self.setup, state.params, state.other, shard)  # this device's local gradient
        if "skip-sync" in self.faults:  # the fault: no all-reduce, each replica keeps its local gradient
            state, metrics = finish_step(self.setup.optimizer, state, means(sums), diagnostics, self.faults)
            return state, lax.pmean(metrics, DATA_AXIS)  # the replicas now report different values: log their mean
        # Mean of w*g over mean of w: means() divides. The psum fault sums the gradients instead.
        reduce_grads = lax.psum if "psum" in self.faults else lax.pmean
        sums = {"grads": reduce_grads(sums["grads"], DATA_AXIS), "metrics": lax.pmean(sums["metrics"], DATA_AXIS),
                "weight": lax.pmean(sums["weight"], DATA_AXIS)}
        return finish_step(self.setup.optimizer, state, means(sums), diagnostics, self.faults)

    def _local_eval(self, state: TrainState, shard: Any):
        setup = self.setup
        sums = weighted_sums(setup.graphdef, setup.loss, setup.precision, state.params, state.other, shard,
                             with_grads=False)
        return lax.psum(sums, DATA_AXIS)

    def _on_devices(self, stacked: Any) -> Any:
        """Row i of every leaf onto device i: where pmap expects it, so calls copy nothing."""
        return jax.device_put(stacked, NamedSharding(self.mesh, PartitionSpec(DATA_AXIS)))

    def place_state(self, state: TrainState) -> TrainState:
        copies = len(self.devices)
        return self._on_devices(jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (copies, *np.shape(x))), state))

    def place_batch(self, batch: Any) -> Any:
        """This process's rows reshaped to (its devices, rows per device, ...): row i onto device i."""
        copies, local = len(self.devices), len(jax.tree.leaves(batch)[0])
        mine = copies * local // self._global_leading(local)  # this process's devices
        stacked = jax.tree.map(lambda x: np.asarray(x).reshape(mine, -1, *np.shape(x)[1:]), batch)
        sharding = NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))
        return global_arrays(stacked, jax.tree.map(lambda _: sharding, stacked), copies)

    def step(self, state: TrainState, batch: Any, diagnostics: bool = False):
        return self._steps[diagnostics](state, batch)

    def eval_sums(self, state: TrainState, batch: Any) -> dict[str, Any]:
        return self._eval(state, batch)

    def compile_step(self, state: TrainState, batch: Any, diagnostics: bool = False,
                     compiler_options: dict[str, Any] | None = None):
        return self._steps[diagnostics].lower(state, batch).compile(compiler_options)

    def precompile(self, state: TrainState, batch: Any) -> None:
        self.compile_step(state, batch)

    def export_state(self, state: TrainState) -> TrainState:
        return jax.tree.map(lambda x: x[0], state)

    def state_layout(self, state: TrainState) -> TreeLayout:
        """The layout of a plain (exported) state: every device holds a whole copy."""
        return layout_tree(state, self.mesh, "replicate")
