"""What checkpoints cost training, and how long the transformer preset takes to save and restore.

* Training speed with ``checkpoint_every`` against none: model ``mlp`` on ``digits``, mode ``fsdp`` on
  ``data=8``, batch 256, 2,000 steps, metrics every 10, a checkpoint every 500 (4 per run: one every ~4 s of
  training here; real runs save every few minutes, so this is a demanding interval). Each side has its
  own trainer (compiled once, in an untimed first run); then for ``REPEATS`` rounds one run of each side,
  back to back, which side goes first alternating. A run is timed from its ``compiled`` event to its last
  step's ``metrics`` event: the saves' blocking parts (Orbax copies the state off the devices) and their
  background writing, competing for the same cores, are inside; the wait for the last save at the end of the
  run is not training and is reported on its own. Each round gives the speed without / with checkpoints;
  the figure is the median of the rounds' ratios, target <= 1.05.
* Save and restore of the transformer preset (its whole training state, fsdp on ``data=8``), restored into
  ``dp-tp`` on ``data=4,model=2``: the save call (what training waits for), the save until on disk, and the
  restore straight into the new shardings. Medians of ``IO_REPEATS``; reported.

The 8 devices are simulated on this machine's cores and the disk is whatever ``tempfile`` gives.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import numpy as np

import workbench as wb  # first: 8 simulated devices before JAX starts, when run on its own
from timing import machine, record

from workbench.training.checkpoints import CheckpointWriter, checkpoint_meta, latest_checkpoint, restore_state

REPEATS = 7  # rounds of two 2,000-step runs: about 3 minutes
IO_REPEATS = 5
TARGET = 1.05
RUN = dict(model="mlp", data="digits", mode="fsdp", mesh="data=8", steps=2000, batch=256, log_every=10,
           eval_every=0, sync_every=0)
EVERY = 500


class _Timer:
    """A subscriber noting when step 1 is compiled, when the last step's metrics are read, and when the run
    ends (after the wait for the last save)."""

    def __init__(self):
        self.compiled = self.trained = self.ended = None

    def __call__(self, event) -> None:
        if event.kind == "compiled":
            self.compiled = time.perf_counter()
        elif event.kind == "metrics" and event.step == RUN["steps"]:
            self.trained = time.perf_counter()
        elif event.kind == "end":
            self.ended = time.perf_counter()

    def steps_per_s(self) -> float:
        return (RUN["steps"] - 1) / (self.trained - self.compiled)


def _speed_ratio(root: str) -> dict:
    sides = {"none": wb.Trainer(wb.TrainConfig(**RUN), run_root=f"{root}/none"),
             "saving": wb.Trainer(wb.TrainConfig(**RUN, checkpoint_every=EVERY), run_root=f"{root}/saving")}
    timers = {}
    for side, trainer in sides.items():
        trainer.run()  # compiles, untimed
        if trainer.status != "finished":
            raise RuntimeError(f"warm-up of {side} ended {trainer.status}")
        timers[side] = _Timer()
        trainer.subscribe(timers[side])
    speeds, kept, last_wait = {side: [] for side in sides}, None, []
    for round_ in range(REPEATS):
        order = list(sides.items()) if round_ % 2 == 0 else list(sides.items())[::-1]
        for side, trainer in order:
            summary = trainer.run()
            speeds[side].append(timers[side].steps_per_s())
            if side == "saving":
                kept = summary.get("checkpoints")
                last_wait.append(timers[side].ended - timers[side].trained)
    ratios = sorted(n / s for n, s in zip(speeds["none"], speeds["saving"], strict=True))
    saves = RUN["steps"] // EVERY
    seconds_per_step = {kind: RUN["steps"] / statistics.median(speeds[kind]) for kind in ("saving", "none")}
    per_save = (seconds_per_step["saving"] - seconds_per_step["none"]) / saves
    note = (f"median of {REPEATS} alternated rounds (range {ratios[0]:.3f}-{ratios[-1]:.3f}); steps/s none "
            f"{statistics.median(speeds['none']):.1f}, saving {statistics.median(speeds['saving']):.1f} "
            "(each save costs "
            f"training about {per_save * 1e3:.0f} ms); "
            f"{RUN['steps']} steps of mlp {RUN['mode']} on {RUN['mesh']}, a checkpoint every {EVERY} (kept: {kept}); "
            f"after the last step, the final evaluation and the wait for the last save took "
            f"{statistics.median(last_wait) * 1e3:.0f} ms (median); "
            f"{machine()}")
    return record("training speed, no checkpoints / checkpoint_every=500", statistics.median(ratios), "x",
                  ("<=", TARGET), note=note)


def _transformer_io(root: str) -> list[dict]:
    config = wb.TrainConfig(model="transformer", data="text", mode="fsdp", mesh="data=8", batch=64)
    built = wb.build_step(config)
    state = built.mode.export_state(built.mode.place_state(built.state))
    meta = checkpoint_meta(config, 1, state)
    target_mode = wb.build_step(wb.TrainConfig(**{**config.to_json(), "mode": "dp-tp", "mesh": "data=4,model=2"})).mode
    shardings = target_mode.restore_shardings(state)
    target = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=s),
                          state, shardings)
    calls, on_disk, restores = [], [], []
    for repeat in range(IO_REPEATS + 1):  # the first of each is a warm-up
        run = f"{root}/transformer-{repeat}"
        writer = CheckpointWriter(run, keep=1)
        begun = time.perf_counter()
        writer.save(1, state, meta)
        called = time.perf_counter()
        writer.close()
        written = time.perf_counter()
        begun_restore = time.perf_counter()
        jax.block_until_ready(restore_state(latest_checkpoint(run), target))
        restored = time.perf_counter()
        if repeat:
            calls.append(called - begun)
            on_disk.append(written - begun)
            restores.append(restored - begun_restore)
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state)) / 2**20
    note = (f"transformer preset, {size:.1f} MiB of state (parameters, Adam moments), fsdp on data=8 restored "
            f"into dp-tp on data=4,model=2; median of {IO_REPEATS}; {machine()}")
    return [record("transformer checkpoint: save call (training waits)", statistics.median(calls) * 1e3, "ms",
                   note=note),
            record("transformer checkpoint: save until on disk", statistics.median(on_disk) * 1e3, "ms", note=note),
            record("transformer checkpoint: restore into another layout", statistics.median(restores) * 1e3, "ms",
                   note=note)]


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as root:
        return [_speed_ratio(root), *_transformer_io(root)]
