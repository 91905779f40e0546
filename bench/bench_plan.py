"""Production planning at scale: ``workbench plan`` of a 1.3B-parameter transformer on a 512-device mesh.

Targets: under 2 s and under 1 GiB of memory. Time is measured twice: warm (median of repeats in this
process, the cost of re-planning in a notebook) and cold (a fresh process's first plan, which also traces
the model once). Memory is the peak resident set of a fresh process that plans (``VmHWM``), reported
absolute (what the machine must have: the target) and above the peak of a fresh process that only imports
workbench (what planning itself adds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from timing import machine, median_seconds, record

from workbench.analysis.planning import plan_training

MODEL = "transformer"
OPTIONS = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000}
MESH, MODE = "data=64,model=8", "fsdp"
MiB = 2**20

# The peak is read from /proc/self/status (VmHWM), not ru_maxrss: Linux carries ru_maxrss over fork and
# exec, so a child started by a large parent (this benchmark, after planning) reports the parent's peak.
_CHILD = """
import json, resource, sys, time

def peak_kib():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except OSError:  # not Linux: ru_maxrss (KiB on Linux, bytes on macOS) may include the parent's peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)

import workbench
after_import = peak_kib()
seconds = None
if sys.argv[1] == "plan":
    from workbench.analysis.planning import plan_training
    start = time.perf_counter()
    plan_training({model!r}, {options!r}, {mesh!r}, {mode!r})
    seconds = time.perf_counter() - start
print(json.dumps({{"after_import_kib": after_import, "peak_kib": peak_kib(), "seconds": seconds}}))
"""


def _fresh_process(what: str) -> dict:
    """Run the child script in a new interpreter: ``plan`` or ``import`` only; peaks in KiB."""
    code = _CHILD.format(model=MODEL, options=OPTIONS, mesh=MESH, mode=MODE)
    # No compilation cache: the figure is a first plan ever, not one helped by an earlier process.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "WORKBENCH_COMPILATION_CACHE": "off"}
    done = subprocess.run([sys.executable, "-c", code, what], capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run() -> list[dict]:
    plan = plan_training(MODEL, OPTIONS, MESH, MODE)
    warm = median_seconds(lambda: plan_training(MODEL, OPTIONS, MESH, MODE), repeats=5)
    planned = _fresh_process("plan")
    baseline = _fresh_process("import")
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
