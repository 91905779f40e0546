"""Production planning at scale: ``workbench plan`` of a 1.3B-parameter transformer on a 512-device mesh.

Targets: under 2 s and under 1 GiB of memory. Time is measured twice: warm (median of repeats in this
process, the cost of re-planning in a notebook) and cold (a fresh process's first plan, which also traces
the model once). Memory is the peak resident set of a fresh process that plans (``VmHWM``), reported
absolute (what the machine must have: the target) and above the peak of a fresh process that only imports
workbench (what planning itself adds).
"""

from __future__ import annotations

import json

from timing import machine, median_seconds, plan_in_fresh_process, record

from workbench.analysis.planning import plan_training

MODEL = "transformer"
OPTIONS = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000}
MESH, MODE = "data=64,model=8", "fsdp"
MiB = 2**20


def run() -> list[dict]:
    plan = plan_training(MODEL, OPTIONS, MESH, MODE)
    warm = median_seconds(lambda: plan_training(MODEL, OPTIONS, MESH, MODE), repeats=5)
    planned = plan_in_fresh_process((MODEL, OPTIONS, MESH, MODE))
    baseline = plan_in_fresh_process(None)
    peak = planned["peak_kib"] / 1024
    added = (planned["peak_kib"] - baseline["peak_kib"]) / 1024
    what = f"{plan.params / 1e9:.1f}B LM, {MODE}, {plan.mesh.size} devices"
    return [
        record(f"plan {what} (warm)", warm, "s", ("<=", 2.0),
               note=f"{plan.params:,} parameters on {MESH}, median of 5; {machine()}"),
        record(f"plan {what} (cold process)", planned["seconds"], "s", ("<=", 2.0),
               note=f"first plan after import, includes tracing the model; compilation cache off; {machine()}"),
        record("plan peak RSS (fresh process)", peak, "MiB", ("<=", 1024.0),
               note=f"import-only process peaks at {baseline['peak_kib'] / 1024:.0f} MiB; {machine()}"),
        record("plan peak RSS above import-only process", added, "MiB", ("<=", 1024.0), note=machine()),
    ]


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
