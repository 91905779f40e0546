"""``fsdp-tp``: fully sharded data parallelism x tensor parallelism on a 2-D ``data x model`` mesh.

Each leaf of the parameters and optimizer state is split over ``model`` as ``dp-tp`` splits it (the
model's column-/row-parallel pairs, ``tensor_parallel_rules``) and, like ``fsdp``, over ``data`` too: on
its largest dimension divisible by the data axis that the model axis leaves unsplit (small leaves stay
whole over ``data``; :class:`~workbench.layout.ShardedRuleTable`). A tp-split kernel on
``data=4,model=2`` is stored 1/8 per device. The batch is split over ``data``.

The step is ``fsdp``'s (:mod:`.fsdp`), in a ``jax.shard_map`` manual over ``data`` only: ``model`` stays
the compiler's (Auto), as in ``dp-tp``, so it inserts the all-reduce after each row-parallel layer. Each
layer gathers its parameters over ``data`` when it is called and again, recomputing the layer, in the
backward pass, and reduce-scatters its gradients over ``data``; a gather keeps the ``model`` split (it
runs in a shard_map nested over ``model``, :func:`~.param_gathering.gather` says why), so a device holds
one layer's ``model`` part at a time.

Why not one plain ``jit`` with both shardings: measured on XLA:CPU for the small transformer, the
compiler all-reduced whole gradients over ``data`` (no reduce-scatter), gathered parameters when it
liked and added collective-permutes across both axes; ``fsdp`` documents the same for one axis.

How it relates to the other modes:

* ``fsdp``: on ``data=N,model=1`` the model axis splits nothing, so the layout, the step and its
  results are ``fsdp``'s (tested: the same losses and parameters).
* ``dp-tp``: the same computation on the same mesh (both equal ``single``); ``fsdp-tp`` stores 1/N of
  dp-tp's state per device (N = data size) and moves each layer's ``model`` part over ``data``
  (gathered twice, reduce-scattered once) where ``dp-tp`` all-reduces whole gradients.
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
