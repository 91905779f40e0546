"""What training across processes costs: gloo's collectives against in-process ones, and the start-up.

What is measured, for one configuration (model ``mlp`` on ``digits``, mode ``dp`` on ``data=8``, global
batch 256, Adam, ``STEPS`` steps logged every ``LOG_EVERY``, no gradient-sync diagnostics, evaluation only
at the end):

* steady-state step time on 2 processes x 4 devices (``TrainConfig(processes=2)``: two workers on a loopback
  ``jax.distributed`` coordinator, the gradient all-reduce through gloo) against 1 process x 8 devices (this
  process: the all-reduce between the devices of one process). Each run's ``step_time_s`` and
  ``examples_per_s`` are read from its ``metrics.jsonl``, the first logging interval dropped (it holds step 1's
  compile), and their medians taken. ``ROUNDS`` rounds of one run of each, the order alternating; the figure is
  the median of the rounds' ratios (2 processes / 1 process), reported, not held to anything;
* start-up on 2 processes: from ``Trainer.start`` (the config checked and the step built here, the workers
  started, each importing JAX, joining the coordinator, building and compiling) to the first step's metrics
  record, as the trainer relays it (it reads process 0's files every 0.25 s). The workers get a fresh
  compilation cache folder, so the first round starts cold and the later ones find its programs.

How to read it: the 8 devices are simulated on this machine's cores, so the ratio is the cost of gloo's
loopback TCP and of two processes sharing the cores against in-process memory copies, not of a network.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import workbench as wb  # first: 8 simulated devices before JAX starts, when run on its own
from timing import machine, record

ROUNDS = 3
STEPS, LOG_EVERY = 200, 20
RUN_TIMEOUT_S = 300  # a run still going after this is stopped and the benchmark fails
CONFIG = dict(model="mlp", data="digits", mode="dp", mesh="data=8", batch=256, steps=STEPS, log_every=LOG_EVERY,
              sync_every=0, eval_every=0)


def steady_state(run_path) -> tuple[float, float]:
    """(median step seconds, median examples/s) of a finished run's logging intervals, the first one dropped."""
    timed = [m for m in wb.load_run(run_path).metrics if "step_time_s" in m][1:]
    if not timed:
        raise RuntimeError(f"{run_path}: no logging interval after the first; raise STEPS / LOG_EVERY")
    return statistics.median(m["step_time_s"] for m in timed), statistics.median(m["examples_per_s"] for m in timed)


def train(processes: int, runs: str) -> dict:
    """One run: its steady-state figures and, across processes, the seconds from start() to step 1's record."""
    trainer = wb.Trainer(wb.TrainConfig(**CONFIG, processes=processes), run_root=runs)
    first = {}

    def on_event(event):
        if event.kind == "metrics" and event.step == 1 and "at" not in first:
            first["at"] = time.perf_counter()

    trainer.subscribe(on_event)
    started = time.perf_counter()
    trainer.start()
    summary = trainer.wait(RUN_TIMEOUT_S)
    if summary is None:
        trainer.stop()
        trainer.wait(30)
        raise RuntimeError(f"{processes}-process run {trainer.run_name} ran over {RUN_TIMEOUT_S} s and was stopped")
    if trainer.status != "finished":
        raise RuntimeError(f"{processes}-process run {trainer.run_name} {trainer.status}: {summary.get('error')}")
    step_s, examples_per_s = steady_state(trainer.run_path)
    return {"step_s": step_s, "examples_per_s": examples_per_s, "startup_s": first.get("at", float("nan")) - started}


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-processes-") as root:
        cache_before = os.environ.get("WORKBENCH_COMPILATION_CACHE")
        os.environ["WORKBENCH_COMPILATION_CACHE"] = os.path.join(root, "cache")  # read by the workers only
        try:
            rounds = []
            for round_ in range(ROUNDS):
                sides = (1, 2) if round_ % 2 == 0 else (2, 1)
                rounds.append({processes: train(processes, os.path.join(root, "runs")) for processes in sides})
        finally:
            if cache_before is None:
                os.environ.pop("WORKBENCH_COMPILATION_CACHE", None)
            else:
                os.environ["WORKBENCH_COMPILATION_CACHE"] = cache_before

    ratios = sorted(r[2]["step_s"] / r[1]["step_s"] for r in rounds)
    one = statistics.median(r[1]["step_s"] for r in rounds)
    two = statistics.median(r[2]["step_s"] for r in rounds)
    speeds = [statistics.median(r[p]["examples_per_s"] for r in rounds) for p in (1, 2)]
    startups = [r[2]["startup_s"] for r in rounds]
    where = (f"mlp dp on data=8, batch {CONFIG['batch']}, {STEPS} steps logged every {LOG_EVERY}, the first interval "
             f"dropped; {machine()}")
    return [
        record("dp step time, 2 processes x 4 devices / 1 process x 8", statistics.median(ratios), "x", note=(
            f"median of {ROUNDS} alternated rounds (range {ratios[0]:.2f}-{ratios[-1]:.2f}); step time 1 process "
            f"{one * 1e3:.1f} ms, 2 processes {two * 1e3:.1f} ms; examples/s {speeds[0]:,.0f} and {speeds[1]:,.0f}; "
            f"{where}")),
        record("start-up to the first step's record, 2 processes, empty cache", startups[0], "s", note=(
            f"Trainer.start to step 1's metrics record as relayed (0.25 s polling); first run, workers with a fresh "
            f"compilation cache; {where}")),
        record("start-up to the first step's record, 2 processes, cache filled", statistics.median(startups[1:]), "s",
               note=(f"the same, median of the {ROUNDS - 1} later runs ({', '.join(f'{s:.1f}' for s in startups[1:])} "
                     f"s), the workers reading the first run's compiled programs; {where}")),
    ]


if __name__ == "__main__":
    import json

    for result in run():
        print(json.dumps(result))
