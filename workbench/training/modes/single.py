"""``single``: the reference. One device computes the whole global batch; every other mode must match it.

A mesh given to this mode is accepted and only its size ignored, so switching a run between ``single``
and a parallel mode changes one word. Gradient accumulation and bf16 work here too, so each parallel
mode can be compared with ``single`` under the same options.
"""

from __future__ import annotations

from jax.sharding import Mesh

from .base import ShardedJitMode, StepPlan, check_batch, single_device_mesh


class SingleDevice(ShardedJitMode):
    name = "single"
    summary = "one device, the whole batch: the reference every mode is checked against"
    gradient_sync = "none"

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        check_batch(plan, 1, "1 device")

    def build_mesh(self, plan: StepPlan) -> Mesh:
        # A one-device mesh keeps the code path of the other jit modes; nothing is split.
        return single_device_mesh()
