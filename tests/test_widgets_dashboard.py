"""The training dashboard, driven headlessly through its methods and buttons on 8 simulated devices:
real training runs in the trainer's thread, and the assertions read the engine's state and the figures."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import workbench as wb
from widgets.common import Selection
from widgets.dashboard import UNTIL_STOPPED, TrainingDashboard
from widgets.live_plot import BoundedSeries, LivePlot, Throttle
from helpers import QUIET, SMALL_MODEL, dp_selection, errors, poll



def trainer_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "workbench-trainer" and t.is_alive())


def ys(figure, name: str) -> list[float]:
    trace = next(t for t in figure.data if t.name == name)
    return [] if trace.y is None else list(trace.y)


# --- live_plot: bounded series, throttle, in-place updates ----------------------------------------


def test_a_long_series_stays_bounded_in_order_and_ends_at_its_last_point():
    series = BoundedSeries(max_points=600)
    for step in range(1, 10_001):
        series.append(step, 1.0 / step)
        if step % 997 == 0:  # the bound holds at every moment, not just at the end
            assert len(series.arrays()[0]) <= 600
    xs, ys_ = series.arrays()
    assert 300 <= len(xs) <= 600 and len(xs) == len(ys_) == len(series)
    assert xs[0] == 1 and xs[-1] == 10_000 and ys_[-1] == pytest.approx(1e-4)
    assert np.all(np.diff(xs) > 0)
    gaps = np.diff(xs[:-1])
    assert gaps.min() == gaps.max()  # evenly thinned (the newest point may sit closer)
    assert series.count == 10_000


def test_every_length_keeps_its_last_point():
    series = BoundedSeries(max_points=7)
    for n in range(1, 200):
        series.append(n, float(n))
        xs, _ = series.arrays()
        assert len(xs) <= 7 and xs[-1] == n and np.all(np.diff(xs) > 0)
    series.clear()
    assert len(series) == 0 and series.arrays()[0].size == 0


def test_the_throttle_lets_one_redraw_through_per_interval_unless_forced():
    now = [0.0]
    throttle = Throttle(0.25, clock=lambda: now[0])
    ready = []
    for _ in range(100):  # 100 events within one second
        ready.append(throttle.ready())
        now[0] += 0.01
    assert sum(ready) == 4 and ready[0]
    assert throttle.ready(force=True) and not throttle.ready()
    throttle.reset()
    assert throttle.ready()


def test_a_live_plot_updates_its_traces_in_place():
    plot = LivePlot("loss", max_points=50)
    plot.add_trace("train", color="#0072b2")
    first = plot.figure.data[0]
    for step in range(1, 1001):
        plot.append("train", step, float(step))
        if step % 100 == 0:
            plot.redraw()
    assert plot.figure.data[0] is first and len(plot.figure.data) == 1  # never rebuilt
    assert len(first.x) <= 50 and first.x[-1] == 1000
    plot.clear()
    plot.redraw()
    assert len(plot.figure.data[0].x) == 0 and plot.figure.data[0] is first
    with pytest.raises(ValueError, match="exists already"):
        plot.add_trace("train", color="#000000")


# --- the dashboard --------------------------------------------------------------------------------


def test_start_pause_resume_and_stop_a_long_run(make_dashboard, tmp_path):
    dashboard = make_dashboard(dp_selection(steps=2000))
    name = dashboard.start()
    assert name and dashboard.trainer.status == "running" and dashboard.start_button.disabled
    assert poll(lambda: len(dashboard.loss_figure.data[0].x) > 0), dashboard.status.messages

    dashboard.pause_button.click()
    assert poll(lambda: dashboard.trainer.status == "paused", 10)
    assert dashboard.pause_button.description == "Resume"
    dashboard.pause_button.click()
    assert poll(lambda: dashboard.trainer.status == "running", 10)
    assert dashboard.pause_button.description == "Pause"

    dashboard.stop_button.click()
    summary = dashboard.wait(30)  # a bounded wait: the summary proves the run stopped (the 2,000 steps did not run)
    assert summary is not None
    assert dashboard.trainer.status == "stopped" and summary["steps"] < 2000
    assert trainer_threads() == 0 and not errors(dashboard)

    losses = ys(dashboard.loss_figure, "train loss")
    assert losses and all(math.isfinite(v) for v in losses)
    assert int(dashboard.loss_figure.data[0].x[-1]) == summary["steps"]  # the final flush is drawn
    assert dashboard.progress.value == summary["steps"]
    assert not dashboard.start_button.disabled and dashboard.stop_button.disabled
    assert dashboard.status.last[0] == "info" and "stopped" in dashboard.status.last[1]
    run = wb.load_run(name, tmp_path)
    assert run.status == "stopped" and run.series("loss")[0][-1] <= summary["steps"]


def test_a_complete_run_fills_every_figure(make_dashboard):
    dashboard = make_dashboard(dp_selection(steps=40, sync_every=10, eval_every=20))
    dashboard.start()
    summary = dashboard.wait(120)
    assert summary is not None and summary["steps"] == 40 and dashboard.trainer.status == "finished"
    assert not errors(dashboard) and dashboard.status.last[0] == "ok"

    assert ys(dashboard.loss_figure, "train loss") and len(ys(dashboard.loss_figure, "eval loss")) == 2
    throughput = ys(dashboard.throughput_figure, "examples/s")
    assert throughput and all(v > 0 for v in throughput)
    synced = ys(dashboard.grad_norm_figure, "synchronised")
    assert len(synced) == 4 and all(v > 0 for v in synced)  # steps 10, 20, 30, 40
    replicas = [t for t in dashboard.grad_norm_figure.data if t.name.startswith("replica ")]
    assert len(replicas) == 8
    for index, trace in enumerate(replicas):
        assert trace.name == f"replica {index}" and trace.line.color == wb.views.device_color(index)
        assert len(trace.y) == 4 and trace.visible is not False
    # The synchronised gradient is the mean of eight equal-weight local ones: no longer than the longest.
    assert max(t.y[-1] for t in replicas) >= synced[-1]
    assert ys(dashboard.divergence_figure, "replica divergence") == [0.0] * 4
    assert dashboard.progress.value == dashboard.progress.max == 40
    assert "40 / 40" in dashboard.progress_label.value


def test_until_stopped_trains_until_stop_and_says_so_instead_of_a_count(make_dashboard):
    dashboard = make_dashboard(dp_selection(steps=20))
    dashboard.until_stopped.value = True
    dashboard.start()
    assert dashboard.trainer.config.steps == UNTIL_STOPPED
    assert poll(lambda: dashboard._view.step >= 30)  # past the Steps option: it goes on
    dashboard._view.draw()
    assert "until stopped" in dashboard.progress_label.value and "ETA" not in dashboard.progress_label.value
    dashboard.stop()
    assert dashboard.wait(60) is not None and dashboard.trainer.status == "stopped"
    assert dashboard.status.last[1].startswith("stopped ")


def test_each_replica_is_drawn_in_the_colour_of_the_devices_it_holds(make_dashboard):
    selection = Selection(mesh="data=4,model=2", mode="dp-tp", model_options=dict(SMALL_MODEL),
                          options={**QUIET, "steps": 10, "sync_every": 5})
    dashboard = make_dashboard(selection)
    dashboard.start()
    assert dashboard.wait(120)["steps"] == 10 and not errors(dashboard)
    replicas = [t for t in dashboard.grad_norm_figure.data if t.name.startswith("replica ")]
    assert [t.name for t in replicas] == [f"replica {r} (devices {2 * r}, {2 * r + 1})" for r in range(4)]
    assert [t.line.color for t in replicas] == [wb.views.device_color(2 * r) for r in range(4)]  # replica 1: device 2's
    assert all(len(t.y) == 2 for t in replicas)  # steps 5 and 10


def test_the_plots_say_what_will_appear_until_they_have_points_and_sync_off_is_said(make_dashboard):
    dashboard = make_dashboard(dp_selection(steps=10))  # sync_every=0: the sync plots stay empty all run
    plots = dashboard._view.plots  # loss, throughput, gradient norms, divergence
    assert all(plot.empty and plot._frame.layout.display == "none" for plot in plots)  # no empty axes
    assert "appear here once a run starts" in dashboard._view.loss.placeholder.value
    dashboard.start()
    assert dashboard.wait(120)["steps"] == 10
    poll(lambda: not dashboard._view.loss.empty)
    dashboard._view.draw()
    loss = dashboard._view.loss
    assert loss._frame.layout.display is None and loss.placeholder.layout.display == "none"
    for plot in (dashboard._view.grad, dashboard._view.divergence):
        assert plot.empty and plot._frame.layout.display == "none"
        assert "off for this run (sync_every=0)" in plot.placeholder.value
    dashboard.reset()
    assert all(plot._frame.layout.display == "none" for plot in plots)  # cleared: no axes left without data


@pytest.mark.parametrize(
    ("options", "engine_says"),
    [({"batch": 60}, "global batch 60 does not split"), ({"lr": -1}, "lr=-1 must be a number > 0")],
)
def test_invalid_settings_are_shown_and_nothing_starts(make_dashboard, tmp_path, options, engine_says):
    selection = dp_selection(steps=20, **options)
    before = dict(selection.options)
    dashboard = make_dashboard(selection)
    threads = trainer_threads()
    dashboard.start_button.click()
    level, text = dashboard.status.last
    assert level == "error" and engine_says in text
    assert dashboard.trainer is None or dashboard.trainer.status == "idle"
    assert trainer_threads() == threads and not any(tmp_path.iterdir())  # no thread, no run folder
    assert selection.options == before  # the user's settings are kept to fix
    assert not dashboard.start_button.disabled and dashboard.stop_button.disabled


def test_a_pair_the_trainer_refuses_is_shown_and_start_and_check_refuse_it_with_its_message(make_dashboard, tmp_path):
    running = make_dashboard(dp_selection(steps=100_000))
    running.start()
    selection = Selection(mesh="data=8", mode="tp", model_options=dict(SMALL_MODEL), options={**QUIET, "steps": 20})
    dashboard = make_dashboard(selection)

    fit = wb.mesh_fit("tp", "data=8")
    shown = dashboard.verdict.fit  # the whole run's verdict: here, the mode against the mesh
    assert (shown.level, shown.message, shown.fixes) == ("error", fit.message, fit.fixes)
    assert dashboard.verdict.fix_labels == ["use mode dp", "use mesh model=8"]
    assert "✗" in dashboard.verdict.line.value  # shown next to Start before anything runs
    dashboard.start_button.click()
    assert dashboard.status.last == ("error", fit.message)
    with pytest.raises(wb.MeshError) as refused:  # the trainer's own refusal, word for word
        wb.Trainer(selection.train_config(), run_root=str(tmp_path / "direct")).start()
    assert str(refused.value) == fit.message
    assert dashboard.trainer is None and not dashboard.start_button.disabled
    assert running.trainer.status == "running"  # nothing was stopped for a run that cannot start
    dashboard.check_button.click()
    assert dashboard.status.last == ("error", fit.message) and dashboard.check_panel.value == ""

    dashboard.verdict.fix_buttons.children[1].click()  # use mesh model=8
    assert selection.mesh == "model=8" and dashboard.verdict.fit.level == "ok" and dashboard.verdict.fix_labels == []


def test_start_and_check_each_resolve_the_selection_once(make_dashboard, resolutions):
    dashboard = make_dashboard(dp_selection(steps=5))
    for _ in range(2):  # the first Start makes the trainer, the second sets the kept one's config
        resolutions.clear()
        dashboard.start()
        assert dashboard.wait(120)["steps"] == 5 and not errors(dashboard)
        assert len(resolutions) == 1  # for the verdict, the trainer and the run: the record is handed down
    resolutions.clear()
    dashboard.check()
    assert dashboard.status.last[0] == "ok" and len(resolutions) == 1


def test_starting_a_second_dashboard_stops_the_first(make_dashboard):
    first = make_dashboard(dp_selection(steps=100_000))
    first.start()
    assert poll(lambda: len(first.loss_figure.data[0].x) > 0), first.status.messages
    second = make_dashboard(dp_selection(steps=10))  # as a re-run notebook cell would make
    second.start()
    assert first.trainer.status == "stopped"  # stopped and joined before the new run started
    assert trainer_threads() <= 1
    assert first.status.last[0] == "warning" and "another dashboard" in first.status.last[1]
    assert second.wait(120)["steps"] == 10 and second.trainer.status == "finished"


def test_callback_errors_are_shown_not_raised(make_dashboard, tmp_path):
    broken = tmp_path / "broken-run"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    dashboard = make_dashboard(dp_selection(steps=10))  # lists the runs: the broken one is reported
    assert errors(dashboard) and "broken-run" in errors(dashboard)[-1]
    dashboard.refresh_button.click()  # a button's handler: shown again, not raised
    assert len(errors(dashboard)) == 2

    dashboard.pause_button.click()
    assert "no run to pause" in dashboard.status.last[1]

    # A malformed event reaching the trainer's subscriber is a bug: shown with its type, not raised.
    dashboard.on_event(wb.training.TrainEvent("sync", 10, {}, "run"))
    assert dashboard.status.last[0] == "error" and "KeyError" in dashboard.status.last[1]

    shown = len(errors(dashboard))
    broken.joinpath("config.json").unlink()
    dashboard.refresh_button.click()  # still usable
    assert len(errors(dashboard)) == shown and dashboard.runs_select.options == ()


@pytest.mark.parametrize(("mode", "faults", "verdict"), [("dp-shard-map", ["psum"], "problem"), ("dp", [], "ok")])
def test_the_check_button_shows_the_verdict_findings_and_ledger(make_dashboard, mode, faults, verdict):
    selection = Selection(mesh="data=4", mode=mode, model_options={"hidden": 32},
                          options={"batch": 32, "faults": faults})
    dashboard = make_dashboard(selection)
    dashboard.check_button.click()
    panel = dashboard.check_panel.value
    assert not errors(dashboard), dashboard.status.messages
    assert f"<b>{verdict}</b>" in panel and "all-reduce" in panel  # the verdict, and the ledger text
    if verdict == "problem":
        assert "psum" in panel and "grad-scale" in panel and "fix" in panel and "why" in panel
        assert dashboard.status.last[0] == "warning"
    else:
        assert "likely cause" not in panel and dashboard.status.last[0] == "ok"
    assert not dashboard.check_button.disabled


def test_previous_runs_are_overlaid_on_the_loss_figure(make_dashboard, tmp_path):
    dashboard = make_dashboard(dp_selection(steps=10))
    names = []
    for _ in range(2):
        names.append(dashboard.start())
        assert dashboard.wait(120)["steps"] == 10
    assert [value for _, value in dashboard.runs_select.options] == names  # listed as each run ended

    dashboard.runs_select.value = tuple(names)  # what selecting them in the box does
    overlays = {t.name: t for t in dashboard.loss_figure.data if t.name in names}
    assert set(overlays) == set(names)
    for name, trace in overlays.items():
        assert trace.line.dash == "dash" and trace.visible is not False
        assert list(trace.y) == pytest.approx(wb.load_run(name, tmp_path).series("loss")[1])
    traces = len(dashboard.loss_figure.data)

    dashboard.overlay_runs(names[:1])
    shown = [t.name for t in dashboard.loss_figure.data if t.visible is not False]
    assert names[0] in shown and names[1] not in shown
    assert len(dashboard.loss_figure.data) == traces  # hidden, not removed
    assert ys(dashboard.loss_figure, "train loss")  # the live run's curve is untouched


# --- watching a run written elsewhere ----------------------------------------------------------------


FOLLOW_FAST = {"poll_interval": 0.01}


@pytest.fixture
def attach(tmp_path):
    """TrainingDashboard.attach under tmp_path, each closed (its follower stopped) when the test ends."""
    made = []

    def make(run, **options) -> TrainingDashboard:
        dashboard = TrainingDashboard.attach(run, run_root=str(tmp_path), **{**FOLLOW_FAST, **options})
        made.append(dashboard)
        return dashboard

    yield make
    for dashboard in made:
        dashboard.close()
        assert dashboard.follower is None


def test_attach_to_a_finished_run_draws_its_loss_curve_and_says_how_it_ended(tmp_path, attach):
    trainer = wb.Trainer(dp_selection(steps=30, eval_every=10, sync_every=10).train_config(), run_root=str(tmp_path))
    trainer.run()
    run = wb.load_run(trainer.run_name, tmp_path)
    dashboard = attach(trainer.run_name)
    summary = dashboard.wait(30)
    assert summary["status"] == "finished" and dashboard.follower.status == "finished" and not errors(dashboard)
    assert dashboard.trainer is None  # it trained nothing itself

    steps, losses = run.series("loss")
    assert [int(x) for x in dashboard.loss_figure.data[0].x] == steps
    assert ys(dashboard.loss_figure, "train loss") == pytest.approx(losses)
    assert ys(dashboard.loss_figure, "eval loss") == pytest.approx(run.series("eval_loss")[1])
    assert ys(dashboard.grad_norm_figure, "synchronised") == pytest.approx(run.series("sync_synced_grad_norm")[1])
    assert dashboard.progress.value == dashboard.progress.max == 30
    level, text = dashboard.status.last
    assert level == "ok" and text.startswith(f"finished {trainer.run_name}: 30 steps") and str(run.path) in text
    assert not dashboard.start_button.disabled and dashboard.stop_button.disabled


def test_the_watch_button_follows_the_one_selected_run(make_dashboard, tmp_path):
    dashboard = make_dashboard(dp_selection(steps=10))
    names = [dashboard.start()]
    assert dashboard.wait(120)["steps"] == 10
    with wb.training.RunWriter(tmp_path, "from-the-cli", {"mode": "dp", "mesh": "data=8", "steps": 3}) as writer:
        for step, loss in ((1, 2.0), (2, 1.5), (3, 1.25)):
            writer.append({"step": step, "loss": loss})
    names.append(writer.name)
    dashboard.refresh_runs()

    dashboard.watch_button.click()
    assert dashboard.status.last == ("info", "select one run in the compare list to watch it")
    dashboard.runs_select.value = tuple(names)
    dashboard.watch_button.click()
    assert dashboard.status.last == ("info", "select one run in the compare list to watch it (2 are selected)")
    assert dashboard.follower is None

    dashboard.runs_select.value = ("from-the-cli",)
    dashboard.watch_button.click()
    assert dashboard.follower is not None and dashboard.follower.run_name == "from-the-cli"
    assert dashboard.wait(10)["status"] == "finished" and not errors(dashboard)
    assert ys(dashboard.loss_figure, "train loss") == [2.0, 1.5, 1.25]  # the watched run, not the dashboard's own
    assert dashboard.status.last[0] == "ok" and "finished from-the-cli: 3 steps" in dashboard.status.last[1]


def test_a_foreign_run_is_not_stopped_its_silence_and_failure_are_shown(tmp_path, attach):
    writer = wb.training.RunWriter(tmp_path, "on-another-host", {"mode": "fsdp", "mesh": "data=8", "steps": 100})
    writer.append({"step": 1, "loss": 2.0})
    dashboard = attach("on-another-host", silent_after=0.2)
    assert poll(lambda: ys(dashboard.loss_figure, "train loss") == [2.0], 10)
    assert not dashboard.stop_button.disabled and dashboard.pause_button.disabled

    dashboard.stop_button.click()
    level, text = dashboard.status.last
    assert level == "info" and text.startswith("run 'on-another-host' was not started here: stop it where it runs")
    assert dashboard.follower.following and not errors(dashboard)
    dashboard.pause()  # by hand: refused with where to pause it, never raised
    assert "cannot be paused from here" in dashboard.status.last[1]

    silent = ("warning", f"no new metrics for 0.2 s: the run may have died; its files are in {writer.path}")
    assert poll(lambda: silent in dashboard.status.messages, 10)
    writer.append({"step": 2, "loss": 1.0})
    assert poll(lambda: "metrics again, at step 2" in dashboard.status.last[1], 10)
    writer.finish("failed", steps=2, error="worker 1 exited with signal 9")
    assert dashboard.wait(10)["status"] == "failed"
    assert dashboard.status.last == ("error", "on-another-host failed at step 2: worker 1 exited with signal 9")


def test_stop_on_a_launched_run_calls_its_stopper(tmp_path, attach):
    writer = wb.training.RunWriter(tmp_path, "launched", {"mode": "dp", "mesh": "data=8", "steps": 100})
    stops = []

    def stop_every_process():
        stops.append(True)
        writer.finish("stopped", steps=0)  # what a launcher's workers do when told to stop
        # The worst order, forced: the end is seen before Stop returns. Its message must still be the last.
        assert dashboard.follower.wait(10)["status"] == "stopped"

    dashboard = attach("launched", stopper=stop_every_process)
    assert poll(lambda: dashboard.follower.history, 10)
    dashboard.stop()
    assert stops == [True] and dashboard.wait(10)["status"] == "stopped"
    assert dashboard.status.last[0] == "info" and dashboard.status.last[1].startswith("stopped launched")


def test_start_while_watching_stops_watching_not_the_watched_run(make_dashboard, tmp_path):
    writer = wb.training.RunWriter(tmp_path, "still-going", {"mode": "dp", "mesh": "data=8", "steps": 100})
    writer.append({"step": 1, "loss": 9.0})
    dashboard = make_dashboard(dp_selection(steps=10))
    follower = dashboard.watch("still-going", **FOLLOW_FAST)
    assert poll(lambda: ys(dashboard.loss_figure, "train loss") == [9.0], 10)

    dashboard.start()
    assert dashboard.follower is None and not follower.following
    assert dashboard.wait(120)["steps"] == 10 and dashboard.trainer.status == "finished"
    assert 9.0 not in ys(dashboard.loss_figure, "train loss")  # the plots show the dashboard's own run
    writer.append({"step": 2, "loss": 8.0})  # the watched run was left going
    writer.finish("finished", steps=2)
    assert wb.load_run("still-going", tmp_path).status == "finished"


@pytest.mark.e2e  # worker processes that train: the e2e tier
def test_a_run_across_two_processes_is_shown_live_and_stop_ends_every_process(make_dashboard):
    dashboard = make_dashboard(dp_selection(steps=100_000, processes=2))
    dashboard.start()
    trainer = dashboard.trainer
    assert poll(lambda: len(ys(dashboard.loss_figure, "train loss")) >= 2, timeout=120), dashboard.status.messages
    with pytest.raises(wb.WorkbenchError):  # shown in the status, not raised: pause is refused across processes
        trainer.pause()
    dashboard.pause()
    assert "cannot pause" in errors(dashboard)[-1]
    dashboard.stop()
    assert poll(lambda: trainer.status == "stopped", timeout=60), trainer.status
    summary = trainer.wait(10)
    assert summary is not None and trainer._group.exit_codes == [0, 0]
    assert summary["steps"] % QUIET["log_every"] == 0  # every process stopped after the same logging step
    assert wb.load_run(trainer.run_path).config["processes"] == 2
    assert dashboard.start_button.disabled is False  # idle again: the end event reached the dashboard

    # The same trainer then trains in this process: Stop reaches this run, not the processes that have ended.
    dashboard.start(processes=1)
    assert poll(lambda: trainer.status == "running" and trainer._group is None, timeout=30)
    dashboard.stop()
    assert poll(lambda: trainer.status == "stopped", timeout=20), trainer.status


# --- checkpoints: the option, Save, and Resume run (also onto another layout) ----------------------------


def test_the_checkpoint_option_is_checked_by_the_engine_and_kept_in_the_selection():
    from widgets.mode_selector import ModeSelector

    selector = ModeSelector(dp_selection())
    selector.checkpoint_every.value = 5
    assert selector.selection.options["checkpoint_every"] == 5
    assert selector.selection.train_config().checkpoint_every == 5
    selector.processes.value = 2  # a run across processes saves too: every process its shards
    config = selector.selection.train_config()
    assert (config.processes, config.checkpoint_every) == (2, 5)


def test_save_writes_the_running_state_and_resume_continues_it_onto_another_layout(make_dashboard, tmp_path):
    selection = dp_selection(steps=100_000)
    dashboard = make_dashboard(selection)
    dashboard.save()
    assert dashboard.status.last == ("info", "no run to save: press Start (or Resume run) first")
    name = dashboard.start()
    assert poll(lambda: dashboard._view.step >= 5)
    dashboard.save_button.click()
    assert poll(lambda: dashboard.status.last[0] == "ok" and "saved" in dashboard.status.last[1])
    dashboard.stop()
    dashboard.wait(60)
    saved = wb.checkpoint_steps(tmp_path / name)
    assert len(saved) == 1 and f"step {saved[0]:,} saved" in " ".join(text for _, text in dashboard.status.messages)

    selection.mode = "fsdp"  # the dashboard's layout now differs from the checkpoint's
    before = dict(selection.options)
    dashboard.refresh_runs()
    dashboard.runs_select.value = (name,)
    dashboard.resume_run_button.click()
    assert not errors(dashboard), dashboard.status.messages
    assert dashboard.trainer.config.mode == "fsdp" and dashboard.trainer.config.steps == 100_000
    assert "dp on data=8 -&gt; fsdp on data=8" in dashboard.layout_panel.value
    assert poll(lambda: dashboard._view.step > saved[0] + 5)
    dashboard.stop()
    summary = dashboard.wait(60)
    assert summary["resumed_from_step"] == saved[0] and wb.load_run(name, tmp_path).config["mode"] == "fsdp"
    steps = ys(dashboard.loss_figure, "train loss")
    assert len(steps) > 2  # the curve up to the checkpoint, then the resumed run's
    assert selection.options == before and selection.mode == "fsdp"


def test_resume_refuses_a_run_without_checkpoint_and_needs_one_selected(make_dashboard, tmp_path):
    dashboard = make_dashboard(dp_selection(steps=10))
    dashboard.start()
    dashboard.wait(60)
    dashboard.resume_selected()
    assert dashboard.status.last == ("info", "select one run in the compare list to resume it")
    dashboard.runs_select.value = (dashboard.trainer.run_name,)
    dashboard.resume_run_button.click()
    level, text = dashboard.status.last
    assert level == "error" and "has no complete checkpoint" in text and "--checkpoint-every K" in text
    assert dashboard.trainer.status == "finished" and not dashboard.start_button.disabled
