"""``fsdp-tp``: fully sharded data parallelism x tensor parallelism on a 2-D ``data x model`` mesh.

Each leaf of the parameters and optimizer state is split over ``model`` as ``dp-tp`` splits it (the
model's column-/row-parallel pairs, ``tensor_parallel_rules``) and, like ``fsdp``, over ``data`` too: on
its largest dimension divisible by the data axis that the model axis leaves unsplit (small leaves stay
whole over ``data``; :class:`~workbench.layout.ShardedRuleTable`). A tp-split kernel on
``data=4,model=2`` is stored 1/8 per device. The batch is split over ``data``.

The step is ``fsdp``'s (:mod:`.fsdp`: each layer gathered over ``data`` when called and again for the
backward pass; its gradients reduce-scattered), in a ``jax.shard_map`` manual over
``data`` only: ``model`` stays the compiler's, which inserts the all-reduce after each row-parallel layer as
in ``dp-tp``. A gather keeps each leaf's ``model`` split (:func:`~.param_gathering.gather` says how), so a
device holds one layer's ``model`` part at a time. Why not a plain ``jit`` with both shardings: the compiler
all-reduced whole gradients and added collective-permutes (measured; docs/design/production-steps.md).

How it relates to the modes it combines: on ``data=N,model=1`` the model axis splits nothing, and the
layout, the step and the results are ``fsdp``'s (tested); ``data=1,model=M`` is refused, ``tp`` the fix (XLA
rejects it: :meth:`~.sharded_state.ShardedStateMode.fit_mesh`); on ``data=N,model=M`` it computes what ``dp-tp``
computes, storing about 1/N of dp-tp's state per device, and moves each layer's ``model`` part over ``data``
(gathered twice, but the last layer called once; reduce-scattered once) where ``dp-tp`` all-reduces whole gradients.

Example:
    >>> FullyShardedTensorParallel.state_placement, FullyShardedTensorParallel.manual_axes
    ('shard-tensor-parallel', ('data',))
"""

from __future__ import annotations

from ...layout.mesh import DATA_AXIS, MODEL_AXIS
from .fsdp import FullyShardedDataParallel
from .tp import ACTIVATION_ALL_REDUCE


class FullyShardedTensorParallel(FullyShardedDataParallel):
    name = "fsdp-tp"
    summary = ("2-D mesh: layers split over 'model'; parameters and optimizer state sharded over 'data' too, "
               "gathered layer by layer")
    sharded = ("the batch over 'data'; the layers' weights over 'model' and every leaf over 'data' too "
               "(each device stores 1/(data x model) of a split weight)")
    axes = (DATA_AXIS, MODEL_AXIS)
    mesh_example = "data=4,model=2"
    state_placement = "shard-tensor-parallel"
    collectives = (*FullyShardedDataParallel.collectives, ACTIVATION_ALL_REDUCE)
    manual_axes = (DATA_AXIS,)
