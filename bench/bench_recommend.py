"""Which layout? ``workbench recommend`` for the README's 1.3B transformer on 512 chips.

Targets: at least 16 layouts analysed with the formulas in at most 5 s (the first pass, ``top=0``: nothing
simulated or compiled; a warm process, the model traced once before), and the whole recommendation, the top 3
simulated and compiled by the target's compiler, in at most 3 minutes for ``gpu:h100:512`` and ``tpu:v5p:8x8x8``
(each reported when its compiler is installed: ``make gpu-compile``, the ``tpu`` extra).
"""

from __future__ import annotations

import json
import time

from timing import machine, record

from workbench.analysis import recommend
from workbench.analysis.compile_target import libtpu_installed
from workbench.analysis.gpu_target import gpu_compiler_problem

# scan_layers: the blocks in one loop, as production models compile (the README's --verify example): libtpu compiles
# the unrolled 24 blocks in ~150 s a layout, the loop in ~45 s.
OPTIONS = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000, "max_len": 2048, "scan_layers": True}
BATCH, SEQ_LEN = 1024, 2048  # 2M tokens a step, 4,096 tokens per chip


def _recommend(target: str, top: int):
    return recommend("transformer", target, BATCH, seq_len=SEQ_LEN, model_options=OPTIONS, top=top)


def run() -> list[dict]:
    _recommend("gpu:h100:512", 0)  # traces the model and the optimizer once, as a notebook's first call would
    first = _recommend("gpu:h100:512", 0)
    records = [
        record("recommend 1.3B on 512 chips: layouts analysed", first.analysed, "", (">=", 16),
               note=f"modes, meshes and microbatch counts for batch {BATCH} x {SEQ_LEN} on gpu:h100:512"),
        record("recommend 1.3B on 512 chips: formulas pass", first.seconds["analysis"], "s", ("<=", 5.0),
               note=f"{first.analysed} plans with simulate=False, warm process; {machine()}"),
    ]
    targets = []
    if gpu_compiler_problem() is None:
        targets.append("gpu:h100:512")
    if libtpu_installed():
        targets.append("tpu:v5p:8x8x8")
    for target in targets:
        started = time.perf_counter()
        rec = _recommend(target, 3)
        seconds = time.perf_counter() - started
        chosen = rec.chosen
        stages = ", ".join(f"{stage} {value:.0f} s" for stage, value in rec.seconds.items())
        records.append(record(
            f"recommend 1.3B on {target}, top 3 compiled", seconds, "s", ("<=", 180.0),
            note=f"{stages}; chose {chosen.mode} on {chosen.mesh} x{chosen.accum}, "
                 f"{chosen.step_s * 1e3:.0f} ms a step, compiler peak {chosen.peak_bytes / 2**30:.1f} GiB; "
                 f"{len(rec.verified)} verified; {machine()}"))
    return records


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
