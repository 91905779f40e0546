"""``single``: the reference. One device computes the whole global batch; every other mode must match it.

A mesh given to this mode is accepted and only its size ignored, so switching a run between ``single``
and a parallel mode changes one word. Gradient accumulation and bf16 work here too, so each parallel
mode can be compared with ``single`` under the same options.
"""

from __future__ import annotations

from jax.sharding import AbstractMesh, Mesh

from .base import ShardedJitMode, StepSetup, single_device_mesh

_ONE_DEVICE = "it computes on one device, so there is nothing to synchronise"


class SingleDevice(ShardedJitMode):
    name = "single"
    summary = "one device, the whole batch: the reference every mode is checked against"
    sharded = "nothing: one device holds everything and computes the whole batch"
    axes = ()
    mesh_example = "data=1"
    one_device = True
    other_axes = "ignore"
    batch_axis = None
    state_placement = "replicate"
    gradient_sync = "none"
    collectives = ()
    supported_faults = ("optimizer-reset",)
    fault_reasons = {"skip-sync": _ONE_DEVICE, "psum": _ONE_DEVICE, "vma-double-count": _ONE_DEVICE,
                     "per-shard-update": "it does not split the batch into shards", "same-shard": _ONE_DEVICE}

    def build_mesh(self, setup: StepSetup) -> Mesh | AbstractMesh:
        # A one-device mesh keeps the code path of the other jit modes; nothing is split.
        return single_device_mesh(setup.devices)
