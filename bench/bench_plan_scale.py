"""Planning at the largest scale: a 65B transformer in ``dp-tp`` on ``data=2048,model=8`` (16,384 devices).

Targets: a re-plan under 1 s and a fresh process under 1 GiB. Shard shapes and bytes are worked out per
leaf and the per-device slices only when a view asks, so the mesh's size costs next to nothing: the
same plan on 512 devices is reported beside it (it should take the same time). Warm is the median of
repeats in this process (re-planning in a notebook); cold is a fresh process's first plan, which also
traces the model and the optimizer once. Memory is the fresh process's peak resident set (``VmHWM``).
"""

from __future__ import annotations

import json

from timing import machine, median_seconds, plan_in_fresh_process, record

from workbench.analysis.planning import plan_training

MODEL = "transformer"
OPTIONS = {"d_model": 8192, "n_layers": 80, "n_heads": 64, "vocab": 32000}
MESH, SMALLER_MESH, MODE = "data=2048,model=8", "data=64,model=8", "dp-tp"


def run() -> list[dict]:
    plan = plan_training(MODEL, OPTIONS, MESH, MODE)
    warm = median_seconds(lambda: plan_training(MODEL, OPTIONS, MESH, MODE), repeats=5)
    smaller = median_seconds(lambda: plan_training(MODEL, OPTIONS, SMALLER_MESH, MODE), repeats=5)
    planned = plan_in_fresh_process((MODEL, OPTIONS, MESH, MODE))
    what = f"{plan.params / 1e9:.0f}B LM, {MODE}"
    leaves = len(plan.params_layout.leaves) + len(plan.opt_state_layout.leaves)
    return [
        record(f"plan {what}, {plan.mesh.size:,} devices (warm)", warm, "s", ("<=", 1.0),
               note=f"{plan.params:,} parameters, {leaves:,} leaves on {MESH}, median of 5; {machine()}"),
        record(f"plan {what}, 512 devices (warm)", smaller, "s", None,
               note=f"the same plan on {SMALLER_MESH}, median of 5: the mesh's size should cost nothing; {machine()}"),
        record(f"plan {what}, {plan.mesh.size:,} devices (cold process)", planned["seconds"], "s", ("<=", 2.0),
               note=f"first plan after import, includes tracing the model and optimizer; {machine()}"),
        record(f"plan {what}, {plan.mesh.size:,} devices: peak RSS (fresh process)", planned["peak_kib"] / 1024,
               "MiB", ("<=", 1024.0), note=f"after import {planned['after_import_kib'] / 1024:.0f} MiB; {machine()}"),
    ]


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
