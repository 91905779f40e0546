"""Time to the first training step, per model, and what JAX's persistent compilation cache saves.

What is measured: in a fresh Python process (``import workbench`` done, not timed), the time from
``Trainer.run`` to the trainer's ``compiled`` event, which it emits once step 1 has run and the ordinary
step is compiled: loading the data, building the model, placing the state, tracing and compiling both
step variants and running step 1. It is what a user waits for after pressing Start in a new kernel.

How: for each model (mode ``dp`` on ``data=8``, the model's preset on its data set), ``REPEATS`` times:
a new, empty cache folder (``WORKBENCH_COMPILATION_CACHE``); one process trains to its first step
(cold: it compiles and fills the cache), then a second process does the same with that folder (warm:
it reads the compiled programs back). Both run back to back, so they see the same machine. The
speed-up is cold / warm per pair, and its median over the pairs is held to >= 3; the absolute seconds
(medians) are reported with the machine. Each process also reports its whole life to the first step
(interpreter start and imports included), in the note.

How to read it: the cache saves compilation, not tracing, data loading or the step itself, so the
bigger the compiled program, the larger the saving. Absolute times are for simulated CPU devices.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from timing import machine, record

REPEATS = 3  # cold/warm pairs per model
TARGET = 3.0  # cold first step / warm first step
MODELS = [  # (model, data, data options, global batch)
    ("linear", "regression", {}, 64),
    ("mlp", "digits", {}, 64),
    ("cnn", "digits", {"image": True}, 64),
    ("transformer", "text", {}, 32),
]

# The child: train until step 1 is done and compiled, then stop (steps=2, so stopping skips the final eval).
_CHILD = """
import json, sys, time
import workbench as wb

model, data, data_options, batch = json.loads(sys.argv[1])
config = wb.TrainConfig(model=model, data=data, data_options=data_options, mode="dp", mesh="data=8", steps=2,
                        batch=batch, log_every=1, eval_every=0, sync_every=0)
trainer = wb.Trainer(config, run_root=sys.argv[2])
first = {}

def on_event(event):
    if event.kind == "compiled":
        first["at"] = time.perf_counter()
        trainer.stop()

trainer.subscribe(on_event)
start = time.perf_counter()
summary = trainer.run()
assert summary["steps"] == 1, summary
print(json.dumps({"seconds": first["at"] - start, "compile_s": summary["compile_s"],
                  "since_launch": time.time() - float(sys.argv[3])}))
"""


def first_step(case: tuple, cache: str, runs: str) -> dict:
    """One fresh process's time to its first step with ``cache`` as its compilation cache folder."""
    env = {**os.environ, "WORKBENCH_COMPILATION_CACHE": cache, "JAX_PLATFORMS": "cpu"}
    args = [sys.executable, "-c", _CHILD, json.dumps(case), runs, repr(time.time())]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"first-step process for {case[0]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(case: tuple) -> list[dict]:
    """Records for one model: cold and warm seconds to the first step, and the speed-up."""
    pairs = []
    with tempfile.TemporaryDirectory(prefix="bench-first-step-") as root:
        for repeat in range(REPEATS):
            cache = os.path.join(root, f"cache-{repeat}")
            cold = first_step(case, cache, os.path.join(root, "runs"))
            warm = first_step(case, cache, os.path.join(root, "runs"))
            pairs.append((cold, warm))
    model, data = case[0], case[1]
    cold_s = statistics.median(c["seconds"] for c, _ in pairs)
    warm_s = statistics.median(w["seconds"] for _, w in pairs)
    ratios = sorted(c["seconds"] / w["seconds"] for c, w in pairs)
    launch = (statistics.median(c["since_launch"] for c, _ in pairs),
              statistics.median(w["since_launch"] for _, w in pairs))
    where = f"{model} on {data}, dp on data=8, batch {case[3]}"
    return [
        record(f"first step {model} (fresh process, empty cache)", cold_s, "s", note=(
            f"{where}; from Trainer.run to step 1 compiled and run, median of {REPEATS}; from process launch "
            f"{launch[0]:.2f} s; {machine()}")),
        record(f"first step {model} (second process, cache)", warm_s, "s", note=(
            f"{where}; the same, reading the first process's compiled programs; from process launch "
            f"{launch[1]:.2f} s; {machine()}")),
        record(f"first-step speed-up from the cache ({model})", ratios[len(ratios) // 2], "x", (">=", TARGET), note=(
            f"cold / warm per pair of processes, median of {REPEATS} pairs (range {ratios[0]:.2f}-{ratios[-1]:.2f})")),
    ]


def run() -> list[dict]:
    return [r for case in MODELS for r in measure(case)]


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
