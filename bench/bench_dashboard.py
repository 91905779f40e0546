"""What the training dashboard costs training: the same run with the dashboard attached and headless.

What is measured: steady-state training speed, in steps per second, of one configuration (model ``mlp``
on ``digits``, mode ``dp`` on ``data=8``, batch 256, Adam, 300 steps, metrics every 5 steps so the
dashboard gets an event every few milliseconds, gradient-sync diagnostics every 50 and an evaluation every
100) run two ways:

* attached: :meth:`TrainingDashboard.start`, so the dashboard's subscriber records every event and
  redraws its four figures and the progress bar (throttled, at most every 0.25 s, plus a final flush);
* headless: a plain :class:`workbench.Trainer` with the same configuration and no subscriber of its own.

How: each side has its own trainer, kept between runs so it compiles once; one untimed run per side
first (compilation). Then for ``REPEATS`` rounds one run of each side is timed, back to back, which
side goes first alternating between rounds. A run's time is measured by a subscriber added on both
sides, from the ``compiled`` event (step 1 done and compiled) to the ``end`` event (after the last step,
the final evaluation and, when attached, the dashboard's own handling of ``end``): everything after
compilation, including the dashboard's work in the training thread. Each round gives a ratio,
headless speed / attached speed (1.00: the dashboard costs nothing; 1.05 would be 5% slower with it);
the figure is the median of the rounds' ratios (the two runs of a round are neighbours in time, so the
machine's slower drifts cancel), target <= 1.05. Each side's median speed is in the note.

The trainer's own ``examples_per_s`` is not used for the ratio: it times the logging intervals only,
and subscribers run outside them, so it would not see the dashboard at all (its medians are in the note).

How to read it: there is no browser here, so the widgets' messages go nowhere; what is measured is
everything the kernel does for the dashboard (bookkeeping, downsampling, building and serialising each
redraw), not the browser's drawing, which happens in another process. The 8 devices are simulated on
this machine's CPU cores, and the noise of a shared machine shows in the spread of per-round ratios
given in the note.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import workbench as wb  # first: 8 simulated devices before JAX starts, when run on its own
from timing import machine, record

from widgets.common import Selection
from widgets.dashboard import TrainingDashboard

REPEATS = 31  # timed rounds per side; the median of 31 paired ratios moved by 2%, of 11 by 8%
TARGET = 1.05  # headless speed / attached speed
MESH, MODE = "data=8", "dp"
OPTIONS = {"steps": 300, "batch": 256, "log_every": 5, "sync_every": 50, "eval_every": 100}


class _Timer:
    """A subscriber that notes when the run's step 1 is compiled and when the run ends."""

    def __init__(self):
        self.compiled = self.ended = None
        self.steps = 0

    def __call__(self, event) -> None:
        if event.kind == "compiled":
            self.compiled = time.perf_counter()
        elif event.kind == "end":
            self.ended, self.steps = time.perf_counter(), event.step

    def steps_per_s(self) -> float:
        return (self.steps - 1) / (self.ended - self.compiled)


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as root:
        selection = Selection(mesh=MESH, mode=MODE, options=dict(OPTIONS))
        dashboard = TrainingDashboard(selection, run_root=f"{root}/attached")
        headless = wb.Trainer(selection.train_config(), run_root=f"{root}/headless")

        dashboard.start()  # warm-up runs: compilation, untimed
        dashboard.wait()
        headless.start()
        headless.wait()
        if dashboard.trainer.status != "finished" or headless.status != "finished":
            raise RuntimeError(f"warm-up failed: {dashboard.status.last}, {headless.status}")

        # Added after the dashboard's own subscriber, so its handling of "end" is inside the timed span.
        timers = {"attached": _Timer(), "headless": _Timer()}
        dashboard.trainer.subscribe(timers["attached"])
        headless.subscribe(timers["headless"])

        def attached() -> tuple[float, float]:
            dashboard.start()
            summary = dashboard.wait()
            return timers["attached"].steps_per_s(), summary["examples_per_s"]

        def plain() -> tuple[float, float]:
            headless.start()
            summary = headless.wait()
            return timers["headless"].steps_per_s(), summary["examples_per_s"]

        speeds = {"attached": [], "headless": []}
        reported = {"attached": [], "headless": []}
        for round_ in range(REPEATS):
            order = (("attached", attached), ("headless", plain))
            for side, function in order if round_ % 2 == 0 else order[::-1]:
                steps_per_s, examples_per_s = function()
                speeds[side].append(steps_per_s)
                reported[side].append(examples_per_s)
        redraws = len(dashboard.loss_figure.data[0].x)
        dashboard.close()

    attached_speed = statistics.median(speeds["attached"])
    headless_speed = statistics.median(speeds["headless"])
    per_round = sorted(h / a for h, a in zip(speeds["headless"], speeds["attached"], strict=True))
    ratio = statistics.median(per_round)  # paired: each round's two runs are neighbours in time
    note = (
        f"steady-state steps/s, median of {REPEATS} alternated rounds: headless {headless_speed:.1f}, "
        f"attached {attached_speed:.1f}; per-round ratios {per_round[0]:.3f}-{per_round[-1]:.3f}; "
        f"trainer-reported examples/s (subscribers not timed) headless "
        f"{statistics.median(reported['headless']):,.0f}, attached {statistics.median(reported['attached']):,.0f}; "
        f"{OPTIONS['steps']} steps of mlp {MODE} on {MESH}, batch {OPTIONS['batch']}, metrics every "
        f"{OPTIONS['log_every']} steps ({redraws} loss points plotted); no browser attached; {machine()}"
    )
    return [record("dashboard attached vs headless training speed", ratio, "x", ("<=", TARGET), note=note)]
