"""What both FSDP modes share: parameters and optimizer state sharded over ``data``, and a step that
runs in ``jax.shard_map`` with the parameters going in and their gradients coming out as shards.

A subclass writes :meth:`ShardedStateMode._local_sums`, what one device computes from its shards and
its share of the batch; the gradients it returns are already summed over devices. The metrics and the
example count are summed here, and the optimizer updates each shard where it lives (Adam is
element-wise, so no device ever needs another's optimizer state).

Example:
    >>> from workbench.training.modes.fsdp import FullyShardedDataParallel
    >>> from workbench.training.modes.fsdp_whole_tree import WholeTreeShardedDataParallel
    >>> FullyShardedDataParallel.state_placement, WholeTreeShardedDataParallel.batch_axis
    ('shard', 'data')
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
from jax import lax
from jax.sharding import PartitionSpec

from ...layout.mesh import parse_mesh
from ...layout.specs import only_axes, without_axes
from .base import DATA_AXIS, ShardedJitMode
from .core import TrainState, finish_step, means
from .declaration import CollectiveNeed, MeshFit, mesh_fixes
from .dp import NO_HAND_WRITTEN_SYNC
from .param_gathering import split_dims

SHARDED_GRADIENT_REDUCE_SCATTER = CollectiveNeed(
    "reduce-scatter", DATA_AXIS, "sharded-gradients", "gradients, summed with each device keeping its own shard")
WHOLE_LEAVES_ALL_REDUCE = CollectiveNeed(
    "all-reduce", DATA_AXIS, "whole-gradients",
    "the loss, and the gradients of parameters too small to split (kept whole on every device)")


class ShardedStateMode(ShardedJitMode):
    """The declarations and the step both FSDP modes share (not a mode itself: it declares no name)."""

    sharded = "the batch, parameters and optimizer state, all over 'data' (each device stores 1/N)"
    axes = (DATA_AXIS,)
    mesh_example = "data=8"
    batch_axis = DATA_AXIS
    state_placement = "shard"
    gradient_sync = "shard_map"
    fault_reasons = {
        **NO_HAND_WRITTEN_SYNC,
        "psum": "its gradients are reduce-scattered leaf by leaf; the psum mistake is shown in dp-shard-map",
        "vma-double-count": "it marks the gathered parameters per-device by design; the trap is shown in dp-shard-map",
    }

    # The mesh axes the step's shard_map is manual over (None: all of them). ``fsdp-tp`` names ``data`` only,
    # leaving ``model`` to the compiler (see :mod:`.fsdp_tp`).
    manual_axes: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def fit_mesh(cls, mesh: Any, alternative: str | None = None) -> MeshFit:
        """As every mode's (:meth:`~.base.ParallelMode.fit_mesh`), and an error where a manual axis has one device
        while an axis left to the compiler has several: XLA's partitioner rejects that step ("Cross-partition
        allreduce must be in (partial) manual partitioning mode", JAX 0.10.2 and 0.12, ``fsdp-tp`` on
        ``data=1,model=8``), and sharding over one device would change nothing anyway.

        Example:
            >>> from workbench.training.modes.fsdp_tp import FullyShardedTensorParallel
            >>> fit = FullyShardedTensorParallel.fit_mesh("data=1,model=8", "tp")
            >>> fit.level, [(fix.mode, fix.mesh) for fix in fit.fixes]
            ('error', [('tp', None), (None, 'data=4,model=2')])
        """
        fit = super().fit_mesh(mesh, alternative)
        shape = parse_mesh(mesh)
        manual = cls.manual_axes or ()
        lone = [axis for axis in manual if shape.axes.get(axis) == 1]
        if not fit.ok or not lone or not any(shape.axes.get(a, 1) > 1 for a in cls.axes if a not in manual):
            return fit
        _, fixes, instead = mesh_fixes(cls.axes, shape, cls.mesh_example, alternative)
        message = f"mode {cls.name!r} shards over {lone[0]!r}, but mesh {shape} has 1 device there: {instead}"
        return MeshFit(cls.name, shape, "error", message, fixes)

    def _local_sums(self, shards: Any, other: Any, batch_shard: Any, dims: Any, kept: Any = None) -> dict[str, Any]:
        """Inside shard_map: weighted sums (see :mod:`.core`) of this device's batch shard, the gradients
        summed over devices and sharded like ``shards``; ``dims`` gives each leaf's split dimension and
        ``kept`` (None: nothing) its spec over the axes the shard_map leaves to the compiler."""
        raise NotImplementedError

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        placed = jax.tree.map(lambda s: s.spec, self.state_shardings(state).params)
        axes = set(self.mesh.axis_names if self.manual_axes is None else self.manual_axes)
        param_specs = _tree_of_specs(lambda spec: only_axes(spec, axes), placed)
        kept = None if self.manual_axes is None else _tree_of_specs(lambda spec: without_axes(spec, axes), placed)
        dims = split_dims(param_specs)

        def local(shards, other, batch_shard):
            sums = self._local_sums(shards, other, batch_shard, dims, kept)
            return {"grads": sums["grads"], "metrics": lax.psum(sums["metrics"], DATA_AXIS),
                    "weight": lax.psum(sums["weight"], DATA_AXIS)}

        sums = jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(param_specs, PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs={"grads": param_specs, "metrics": PartitionSpec(), "weight": PartitionSpec()},
            axis_names=axes,
            check_vma=True,
        )(state.params, state.other, batch)
        # Updates each shard in place.
        return finish_step(self.setup.optimizer, state, means(sums), diagnostics, self.faults)


def _tree_of_specs(change: Any, specs: Any) -> Any:
    return jax.tree.map(change, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
