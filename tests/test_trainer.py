"""The trainer: a background thread with events, control at step boundaries, runs on disk, failures
that end the run and not the kernel, and a compiled step reused when nothing it depends on changed."""

from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import workbench as wb
from workbench.training.runs import list_runs, load_run
from workbench.training.config import TrainConfig
from workbench.training.trainer import Trainer, TrainerBusyError
from helpers import TwoLayer, my_loss  # a user's own module and loss

SMALL = dict(model="mlp", data="digits", mode="dp", mesh="data=8", batch=64, model_options={"hidden": 16})


def small_trainer(tmp_path, **changes) -> Trainer:
    config = TrainConfig(**{**SMALL, "steps": 30, "log_every": 10, "eval_every": 0, **changes})
    return Trainer(config, run_root=tmp_path)


def test_a_background_run_streams_events_and_writes_the_run(tmp_path):
    trainer = small_trainer(tmp_path, steps=40, eval_every=20)
    events = []
    trainer.subscribe(events.append)
    name = trainer.start()
    assert trainer.status in ("running", "finished")  # start returned without waiting for the run
    summary = trainer.wait(timeout=120)
    assert trainer.status == "finished" and summary["steps"] == 40
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[1] == "compiled" and kinds[-1] == "end"
    assert [e.step for e in events if e.kind == "metrics"] == [1, 10, 20, 30, 40]
    assert [e.step for e in events if e.kind == "eval"] == [20, 40]
    run = load_run(name, tmp_path)
    assert run.status == "finished" and run.config["mode"] == "dp" and run.config["param_count"] > 0
    steps, losses = run.series("loss")
    assert steps == [1, 10, 20, 30, 40] and losses[-1] < losses[0]
    assert run.summary["eval"]["accuracy"] == pytest.approx(summary["eval"]["accuracy"])
    for line in (run.path / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # strict JSON, one object per line


def test_metrics_are_read_only_at_logging_intervals(tmp_path, monkeypatch):
    trainer = small_trainer(tmp_path, steps=60, log_every=20, sync_every=0)
    reads = []
    real_device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: reads.append(1) or real_device_get(tree))
    trainer.run()
    assert len(reads) == 5  # step 1 (compile time), 20, 40, 60 and the final eval: not one per step


@pytest.mark.slow
def test_long_logging_intervals_and_long_evaluations_do_not_deadlock_the_cpu_collectives(tmp_path):
    """Before the queue was bounded, 100 unsynchronised dp steps on 8 simulated devices hung for 40 s and
    then aborted the process in XLA's rendezvous. Run in a child, so a regression fails here, not pytest."""
    import subprocess
    import sys

    code = (
        "import json, sys, workbench as wb\n"
        "data = wb.load_dataset('digits')\n"
        "model = wb.training.model_config_for_data('mlp', data).build(seed=0)\n"
        "config = wb.TrainConfig(mode='dp', mesh='data=8', batch=64, steps=300, log_every=300, eval_every=0,\n"
        "                        sync_every=0)\n"
        "trainer = wb.Trainer(config, run_root=sys.argv[1], model=model,\n"
        "                     batches=lambda seed: data.batches(64, seed=seed),\n"
        "                     eval_batches=[next(data.eval_batches(64))] * 250)\n"
        "summary = trainer.run()\n"
        "print(json.dumps({'status': trainer.status, 'steps': summary['steps'], 'eval': summary['eval']}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "finished" and report["steps"] == 300  # 300 steps between reads
    assert report["eval"]["accuracy"] > 0.5  # 250 evaluation batches, each independent of the others


def test_the_in_flight_queue_waits_for_the_oldest_beyond_its_limit():
    from workbench.training.in_flight import InFlight

    queue = InFlight(limit=3)
    outputs = [jnp.arange(4.0) * i for i in range(5)]
    for output in outputs:
        queue.add(output)
    assert len(queue) == 3 and all(o.is_ready() for o in outputs[:2])
    queue.clear()
    assert len(queue) == 0


def test_sync_diagnostics_keep_their_own_schedule(tmp_path):
    trainer = small_trainer(tmp_path, steps=30, log_every=20, sync_every=15)
    events = []
    trainer.subscribe(events.append)
    trainer.run()
    assert [e.step for e in events if e.kind == "sync"] == [15, 30]  # not only where a logging step falls


def test_second_start_while_running_is_refused(tmp_path):
    trainer = small_trainer(tmp_path)
    release = threading.Event()
    trainer.subscribe(lambda event: event.kind == "compiled" and release.wait(30))
    trainer.start()
    with pytest.raises(TrainerBusyError, match="one run at a time"):
        trainer.start()
    with pytest.raises(TrainerBusyError):
        trainer.configure(lr=0.1)
    release.set()
    assert trainer.wait(120)["steps"] == 30


def test_pause_resume_and_stop_act_at_step_boundaries(tmp_path):
    trainer = small_trainer(tmp_path, steps=100_000)
    paused = threading.Event()
    trainer.subscribe(lambda event: event.kind == "paused" and paused.set())
    trainer.subscribe(lambda event: event.kind == "metrics" and event.step >= 10 and trainer.pause())
    trainer.start()
    assert paused.wait(120)
    assert trainer.status == "paused"
    held = trainer.history[-1].step
    time.sleep(0.3)
    assert trainer.history[-1].kind == "paused" and trainer.history[-1].step == held  # nothing ran
    trainer.stop()
    summary = trainer.wait(60)
    assert trainer.status == "stopped" and summary["steps"] == held
    assert load_run(trainer.run_name, tmp_path).status == "stopped"


def test_resume_continues_the_same_run(tmp_path):
    trainer = small_trainer(tmp_path, steps=40)
    paused = threading.Event()
    trainer.subscribe(lambda event: event.kind == "paused" and paused.set())
    trainer.subscribe(lambda event: event.kind == "compiled" and trainer.pause())
    trainer.start()
    assert paused.wait(120)
    trainer.resume()
    assert trainer.wait(120)["steps"] == 40
    assert [e.kind for e in trainer.history].count("resumed") == 1


class NaNAtStep:
    """Regression batches whose third batch holds a NaN input: the gradient goes NaN at step 3."""

    def __init__(self, bad_step: int = 3):
        self.bad_step = bad_step

    def __call__(self, seed):
        dataset = wb.load_dataset("regression")
        for step, batch in enumerate(dataset.batches(64, seed=seed), start=1):
            if step == self.bad_step:
                batch = {**batch, "x": batch["x"].copy()}
                batch["x"][5, 0] = np.nan
            yield batch


@pytest.mark.parametrize(
    "bad_step,named",
    [
        (5, "first non-finite: gradient of 'linear/bias'"),  # a logging step computes gradient norms
        (3, "first non-finite: parameter of 'linear/bias' (read after step 5)"),  # an ordinary step
    ],
)
def test_a_nan_ends_the_run_naming_the_step_and_the_first_non_finite_leaf(tmp_path, bad_step, named):
    trainer = Trainer(
        TrainConfig(model="linear", data="regression", mode="dp", batch=64, steps=20, log_every=5, eval_every=0,
                    model_options={"in_features": 8}),
        run_root=tmp_path, batches=NaNAtStep(bad_step),
    )
    summary = trainer.run()
    assert trainer.status == "failed"
    assert summary["error"].startswith(f"step {bad_step}: loss is nan; {named}")
    assert trainer.history[-1].kind == "end" and f"step {bad_step}" in trainer.history[-1].data["error"]
    assert load_run(trainer.run_name, tmp_path).summary["status"] == "failed"
    # the kernel lives on: the same trainer runs again (two steps: before the NaN batch)
    assert trainer.run(steps=2)["steps"] == 2 and trainer.status == "finished"


def test_an_exception_in_a_step_fails_the_run_with_its_message(tmp_path):
    def broken_loss(model, batch):
        raise ValueError("the loss is broken")

    model = wb.training.build_model("linear", in_features=8)
    batches = lambda seed: wb.load_dataset("regression").batches(64, seed=seed)  # noqa: E731
    trainer = Trainer(TrainConfig(mode="single", batch=64, steps=5), run_root=tmp_path, model=model,
                      loss=broken_loss, batches=batches)
    summary = trainer.run()
    assert trainer.status == "failed" and summary["error"] == "ValueError: the loss is broken"


def test_a_new_learning_rate_or_seed_reuses_the_compiled_step(tmp_path):
    trainer = small_trainer(tmp_path, steps=5)
    trainer.run()
    first = trainer.run_name
    trainer.configure(lr=3e-3, seed=1)
    second_summary = trainer.run()
    assert trainer.compiled_modes == 1
    mode = next(iter(trainer._modes.values()))
    cache_sizes = [step._cache_size() for step in mode._steps.values()]
    assert cache_sizes and all(size == 1 for size in cache_sizes)  # compiled once for both runs
    assert load_run(first, tmp_path).config["lr"] == 1e-3 and second_summary["steps"] == 5
    trainer.configure(batch=128)  # a new shape: a new step
    trainer.run()
    assert trainer.compiled_modes == 2


@pytest.mark.parametrize("name", wb.training.OPTIMIZERS)
def test_optimizers_hold_only_the_learning_rate_and_match_optax_exactly(name):
    import optax

    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones(4)}
    reference_tx = {"sgd": optax.sgd, "adam": optax.adam, "adamw": optax.adamw}[name](3e-3)
    ours, theirs = params, params
    tx = wb.training.make_optimizer(name, 3e-3)
    state, reference_state = tx.init(params), reference_tx.init(params)
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    for i in range(4):
        grads = jax.tree.map(lambda x, i=i: jnp.sin(x * (i + 1.5)), ours)
        updates, state = step(ours, state, grads)
        reference_updates, reference_state = reference_tx.update(grads, reference_state, theirs)
        ours, theirs = optax.apply_updates(ours, updates), optax.apply_updates(theirs, reference_updates)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_array_equal(a, b)  # the same floats, not merely close
    scalars = [leaf for leaf in jax.tree.leaves(state) if not np.shape(leaf)]
    assert float(state.learning_rate) == pytest.approx(3e-3)
    assert len(scalars) == {"sgd": 1, "adam": 2, "adamw": 2}[name]  # the rate, and adam's own count
    faster = state._replace(learning_rate=jnp.float32(6e-3))  # a new rate is a new value, not a new program
    doubled, _ = step(ours, faster, grads)
    np.testing.assert_allclose(doubled["w"], 2 * step(ours, state, grads)[0]["w"], rtol=1e-6)
    assert step._cache_size() == 1


def test_a_bad_setting_raises_before_a_run_folder_is_written(tmp_path):
    trainer = small_trainer(tmp_path, mode="tp")
    with pytest.raises(wb.MeshError, match="needs a mesh axis 'model'"):
        trainer.start()
    assert trainer.status == "idle" and list_runs(tmp_path) == []
    with pytest.raises(wb.WorkbenchError, match="model 'mlp' trains on classification data"):
        small_trainer(tmp_path, data="text").start()
    with pytest.raises(wb.WorkbenchError, match="lr=-1"):
        small_trainer(tmp_path, lr=-1)


def test_a_failing_subscriber_is_dropped_and_the_run_goes_on(tmp_path):
    trainer = small_trainer(tmp_path, steps=20)

    def broken(event):
        raise RuntimeError("plot failed")

    trainer.subscribe(broken)
    assert trainer.run()["steps"] == 20
    assert trainer.status == "finished" and "plot failed" in trainer.subscriber_errors[0]


def test_your_own_module_loss_and_batches(tmp_path):
    dataset = wb.load_dataset("regression")
    model = TwoLayer(nnx.Rngs(0))
    before = np.asarray(model.a.kernel[...]).copy()
    trainer = Trainer(
        TrainConfig(mode="fsdp", batch=64, steps=60, lr=1e-2, log_every=20), run_root=tmp_path, model=model,
        loss=my_loss, batches=lambda seed: dataset.batches(64, seed=seed, drop_remainder=True),
        eval_batches=lambda: dataset.eval_batches(64),
    )
    summary = trainer.run()
    assert trainer.status == "finished" and summary["model"] == "custom:TwoLayer"
    first_loss = next(event.data["loss"] for event in trainer.history if event.kind == "metrics")
    assert summary["eval"]["loss"] < 0.5 * first_loss
    np.testing.assert_array_equal(np.asarray(model.a.kernel[...]), before)  # the given module is not changed
    trainer.run(steps=1)
    assert load_run(trainer.run_name, tmp_path).config["model"] == "custom:TwoLayer"


def test_runs_are_listed_in_order_and_reloaded(tmp_path):
    trainer = small_trainer(tmp_path, steps=10)
    names = [trainer.run(name=f"run-{i}")["run"] for i in range(2)]
    assert [run.name for run in list_runs(tmp_path)] == names
    assert load_run(names[1], tmp_path).final["step"] == 10
