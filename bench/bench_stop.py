"""How long Stop takes to end a run whose steps are slow (the browser test checks that Stop works; this times it).

What is measured: in this process, a ``dp`` transformer run on ``data=8`` (steps of a few hundred ms on
simulated devices, logged every 1,000 so no metrics read drains the queue) is stopped 3 s after its first
step; the latency is the time from
``Trainer.stop()`` to the run's ``end`` event, median of ``REPEATS`` runs. Stop acts at a step boundary
after the queued steps have run (at most ``MAX_IN_FLIGHT``, see docs/design/in-flight-steps.md), so the
latency is a few steps' time. Held: <= 2 s.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time

from timing import machine, record

REPEATS = 3
TARGET_S = 2.0


def stop_latency(runs: str) -> tuple[float, float]:
    """(seconds from stop() to the end event, mean step seconds) of one run."""
    import workbench as wb

    config = wb.TrainConfig(model="transformer", data="text", mode="dp", mesh="data=8", batch=64, steps=100_000,
                            log_every=1000, eval_every=0, sync_every=0)
    trainer = wb.Trainer(config, run_root=runs)
    marks, ended = {}, threading.Event()  # "first": step 1 done; "stop": stop() called; "end": the end event

    def stop_later():
        marks["stop"] = time.perf_counter()
        trainer.stop()

    def on_event(event):
        if event.kind == "compiled":
            marks["first"] = time.perf_counter()
            threading.Timer(3.0, stop_later).start()
        elif event.kind == "end":
            marks["end"], marks["steps"] = time.perf_counter(), event.step
            ended.set()

    trainer.subscribe(on_event)
    trainer.start()
    try:
        if not ended.wait(300):
            raise RuntimeError("the run did not stop within 300 s")
    finally:
        trainer.stop()
        trainer.wait(60)
    step_s = (marks["end"] - marks["first"]) / max(1, marks["steps"] - 1)  # steps after the first, to the end
    return marks["end"] - marks["stop"], step_s

def run() -> list[dict]:
    from workbench.training.in_flight import MAX_IN_FLIGHT

    latencies, steps = [], []
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as runs:
        for _ in range(REPEATS):
            latency, step = stop_latency(runs)
            latencies.append(latency)
            steps.append(step)
    note = (f"transformer dp data=8 batch 64, step {statistics.median(steps):.3f} s, up to {MAX_IN_FLIGHT} steps "
            f"queued; median of {REPEATS}; {machine()}")
    return [record("Stop latency, slow steps", statistics.median(latencies), "s", ("<=", TARGET_S), note)]
