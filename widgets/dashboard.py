"""The training dashboard: start, pause and stop a run, watch it live, check the mode, compare past runs.

Training runs in the :class:`workbench.Trainer`'s background thread, so the kernel stays free to handle
the buttons: Stop and Pause act at the next step boundary. :class:`TrainingDashboard` coordinates three parts:

* :class:`~widgets.run_view.RunView`: the progress bar and the live figures. The dashboard's subscriber, called
  by the training thread, hands it each event; it only appends to bounded series, and redraws at most every
  ``redraw_interval`` seconds (and once more when the run pauses or ends), each figure in one message.
* :class:`~widgets.run_list.RunList`: the "compare" list. Every run is written to ``run_root`` by the trainer as
  it goes, so closing or resetting the dashboard, or a crashed kernel, loses nothing; the list overlays any of
  those runs' loss curves, and Resume run continues the one selected from its latest checkpoint, under the
  dashboard's mode and mesh (the state is read straight into the new layout, shown before and after).
* :class:`~widgets.profile_panel.ProfilePanel`, under the plots: N steady steps of the running run in JAX's
  profiler (each device's timeline, time and bandwidth tables, memory predicted, compiled and live).

Watch (or :meth:`TrainingDashboard.attach`) follows a run written elsewhere (the CLI, other processes, a shared
folder) through :class:`workbench.training.RunFollower`, with the same plots. Above the progress bar, the verdict
of the Model & mode and Inspect tabs says whether the mode trains on the mesh (with its one-click fixes); Start and
Check refuse a pair the trainer refuses, with the trainer's message, before anything is stopped or cleared. Each
action resolves the selection's config once (:meth:`~widgets.common.Selection.resolved_config`) and hands the
record down to the verdict, the trainer and the check. Save writes the running run's state now
(:meth:`workbench.Trainer.save_checkpoint`, also every K steps with the "Checkpoint every" option).

One training run at a time across dashboards: starting a run stops any other dashboard's run first, so
re-running a notebook cell never leaves a second training thread behind.

Example:
    >>> selection = Selection(mesh="data=8", mode="dp", options={"steps": 50, "batch": 64})
    >>> dashboard = TrainingDashboard(selection, run_root="runs")
    >>> dashboard  # in a notebook: the buttons, the progress bar and the plots  # doctest: +SKIP
    >>> name = dashboard.start(); dashboard.wait(120)["steps"]
    50
    >>> watching = TrainingDashboard.attach("mlp-fsdp", run_root="runs")  # follows it
    >>> watching.wait(60)["status"]
    'finished'
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets

import workbench as wb

from .check_report import check_html, ledger_text_of
from .common import Selection, StatusArea, shown
from .live_plot import MAX_POINTS
from .mesh_verdict import MeshVerdict
from .profile_panel import ProfilePanel
from .run_list import RunList, layout_change_html, resume_changes
from .run_view import DEFAULT_SYNC_EVERY, REDRAW_INTERVAL_S, UNTIL_STOPPED, RunView

STOP_TIMEOUT_S = 10.0  # how long Reset/close/another dashboard's Start wait for a run to stop
_FOLLOWED_LIVE = ("running", "silent")  # a followed run's statuses before it ends

# Every open dashboard, so that a Start stops the others' runs (a re-run cell makes a new dashboard
# while the old one's thread may still be training). Weak: a dashboard closed and dropped goes away.
_DASHBOARDS: weakref.WeakSet[TrainingDashboard] = weakref.WeakSet()


class TrainingDashboard(widgets.VBox):
    """Buttons, progress and live plots for training the :class:`~widgets.common.Selection`'s choices.

    Args:
        selection: the mesh, model, mode and training options (``selection.options``: ``steps``,
            ``batch``, ``lr``, ``log_every``, ``sync_every``, ``faults``...); a default one if None.
        run_root: where runs are written and read back for comparison.
        redraw_interval: the least time between two redraws during a run, in seconds.
        max_points: the most points each plotted curve keeps (older ones are thinned out).

    Every control is also a method, for scripts and tests: :meth:`start`, :meth:`pause`,
    :meth:`resume`, :meth:`stop`, :meth:`reset`, :meth:`check`, :meth:`save`, :meth:`resume_run`,
    :meth:`resume_selected`, :meth:`overlay_runs`, :meth:`watch`, :meth:`watch_selected`. They never raise: an
    error (e.g. an invalid option) is shown in :attr:`status`, and the settings are kept.

    Example:
        >>> dashboard = TrainingDashboard(Selection(mesh="data=8", options={"steps": 50}), run_root="runs")
        >>> name = dashboard.start(); dashboard.wait(60)["steps"]
        50
        >>> bool(dashboard.loss_figure.data[0].y[-1] < dashboard.loss_figure.data[0].y[0])
        True
    """

    def __init__(self, selection: Selection | None = None, run_root: str = "runs", *,
                 redraw_interval: float = REDRAW_INTERVAL_S, max_points: int = MAX_POINTS):
        self.selection = selection if selection is not None else Selection()
        self._status = StatusArea()
        self._trainer: wb.Trainer | None = None  # the dashboard's own runs
        self._follower: wb.training.RunFollower | None = None  # a run it watches instead (attach, watch)
        self._silent = False  # the watched run went silent: say so when its metrics come back
        self._pause_requested = False
        self._view = RunView(self._status, self._running,
                             sync_every=self.selection.options.get("sync_every", DEFAULT_SYNC_EVERY),
                             redraw_interval=redraw_interval, max_points=max_points)
        self._runs = RunList(run_root, self._status, self._view.show_overlays)
        self.progress, self.progress_label = self._view.progress, self._view.progress_label
        self.runs_select, self.refresh_button = self._runs.select, self._runs.refresh_button
        self._build_controls()
        super().__init__(children=self._arrange(), layout=widgets.Layout(width="100%"))
        self._wire()
        self._set_buttons("idle")
        _DASHBOARDS.add(self)
        self.refresh_runs()

    # --- building the dashboard (called once, by __init__) ---------------------------------------------

    def _build_controls(self) -> None:
        """The buttons and the panels under the plots (not yet wired)."""
        self.start_button = widgets.Button(description="Start", icon="play", button_style="primary",
                                           tooltip="train the selection in the background")
        self.pause_button = widgets.Button(description="Pause", icon="pause", tooltip="pause/resume at the next step")
        self.stop_button = widgets.Button(description="Stop", icon="stop",
                                          tooltip="stop at the next step (kept on disk)")
        self.reset_button = widgets.Button(description="Reset", icon="undo", tooltip="stop and clear the plots")
        self.check_button = widgets.Button(description="Check", icon="check",
                                           tooltip="compare the mode's update with the one-device reference")
        self.until_stopped = widgets.Checkbox(value=False, description="until stopped", indent=False,
                                              layout=widgets.Layout(width="auto"),
                                              tooltip="train until Stop, whatever the Steps option says")
        self.until_stopped.add_class("wb-until-stopped")
        self.start_button.add_class("wb-start")
        self.stop_button.add_class("wb-stop")
        self.check_button.add_class("wb-check")
        self.watch_button = widgets.Button(description="Watch", icon="eye",
                                           tooltip="follow the selected run's files as they grow (any process)")
        self.watch_button.add_class("wb-watch")
        self.save_button = widgets.Button(description="Save", icon="save",
                                          tooltip="save the run's state at the next step (runs/<name>/checkpoints/)")
        self.resume_run_button = widgets.Button(
            description="Resume run", icon="history",
            tooltip="continue the selected run from its latest checkpoint, with this mode and mesh")
        self.check_panel = widgets.HTML(value="", layout=widgets.Layout(width="100%"))
        self.check_panel.add_class("wb-check-panel")
        self.layout_panel = widgets.HTML(value="", layout=widgets.Layout(width="100%"))
        self.verdict = MeshVerdict(self.selection, status=self._status)
        self.profile_panel = ProfilePanel(lambda: self._trainer)

    def _arrange(self) -> list[widgets.Widget]:
        """The dashboard's rows, top to bottom: controls, verdict, progress, status, figures, compare, check."""
        return [
            widgets.HBox([self.start_button, self.until_stopped, self.pause_button, self.stop_button,
                          self.reset_button, self.check_button, self.save_button]),
            self.verdict,
            widgets.HBox([self.progress, self.progress_label], layout=widgets.Layout(width="100%")),
            self._status,
            self._view.figures,
            self.profile_panel,
            widgets.HBox([self.runs_select, widgets.VBox([self.refresh_button, self.watch_button,
                                                          self.resume_run_button])],
                         layout=widgets.Layout(width="100%")),
            self.layout_panel,
            self.check_panel,
        ]

    def _wire(self) -> None:
        """Each control calls its public method (which shows its own errors)."""
        self.start_button.on_click(lambda _: self.start())
        self.pause_button.on_click(lambda _: self.toggle_pause())
        self.stop_button.on_click(lambda _: self.stop())
        self.reset_button.on_click(lambda _: self.reset())
        self.check_button.on_click(lambda _: self.check())
        self.save_button.on_click(lambda _: self.save())
        self.resume_run_button.on_click(lambda _: self.resume_selected())
        self.refresh_button.on_click(lambda _: self.refresh_runs())
        self.watch_button.on_click(lambda _: self.watch_selected())

    # --- what scripts and tests read ---------------------------------------------------------------

    @property
    def status(self) -> StatusArea:
        """The status line: every message shown, newest last, in ``status.messages``."""
        return self._status

    @property
    def run_root(self) -> str:
        """Where runs are written and read back for comparison."""
        return self._runs.run_root

    @run_root.setter
    def run_root(self, run_root: str) -> None:
        self._runs.run_root = run_root

    @property
    def trainer(self) -> wb.Trainer | None:
        """The dashboard's trainer (kept between runs, so a compiled step is reused), or None before Start."""
        return self._trainer

    @property
    def follower(self) -> wb.training.RunFollower | None:
        """The run this dashboard watches (:meth:`watch`, :meth:`attach`), or None when it shows its own."""
        return self._follower

    @property
    def loss_figure(self):
        """Train loss, eval loss, then the compared runs' loss (dashed)."""
        return self._view.loss.figure

    @property
    def throughput_figure(self):
        return self._view.throughput.figure

    @property
    def grad_norm_figure(self):
        """The synchronised gradient norm, then one trace per replica in its device's colour."""
        return self._view.grad.figure

    @property
    def divergence_figure(self):
        return self._view.divergence.figure

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until the run shown (its own, or the watched one) ends, or ``timeout`` seconds pass;
        the run's summary, or None. A watched run whose folder never appeared raises its RunError."""
        source = self._source()
        return source.wait(timeout) if source is not None else None

    # --- watching a run written elsewhere ------------------------------------------------------------

    @classmethod
    def attach(cls, run: Any, run_root: str = "runs", *, selection: Selection | None = None,
               redraw_interval: float = REDRAW_INTERVAL_S, max_points: int = MAX_POINTS,
               **follow_options: Any) -> TrainingDashboard:
        """A dashboard that follows ``run`` (a name under ``run_root``, or a run folder) as its files grow.

        ``follow_options`` go to :class:`workbench.training.RunFollower`: ``stopper`` (what Stop calls),
        ``poll_interval``, ``silent_after``, ``appear_timeout``.

        Example:
            >>> dashboard = TrainingDashboard.attach("mlp-fsdp", silent_after=60)
            >>> dashboard.wait(600)["status"]
            'finished'
        """
        dashboard = cls(selection, run_root=run_root, redraw_interval=redraw_interval, max_points=max_points)
        dashboard.watch(run, **follow_options)
        return dashboard

    @shown
    def watch(self, run: Any, **follow_options: Any) -> wb.training.RunFollower | None:
        """Follow ``run`` in this dashboard (as :meth:`attach`); Start goes back to the dashboard's own runs.

        Refused while this dashboard's own run is active. Returns the follower.
        """
        self._refuse_while_training("Stop it before watching another run")
        follower = wb.training.RunFollower(run, self.run_root, **follow_options)  # bad input stops here
        self._stop_watching()
        self._follower = follower
        self._view.restart(0)
        self._pause_requested = False
        self._set_buttons("watching")
        self._status.show(f"watching {follower.run_name} in {follower.run_path}", "info")
        # Events of a follower this dashboard has let go of are stale: dropped.
        follower.subscribe(lambda event: self.on_event(event) if self._follower is follower else None)
        return follower.start()

    @shown
    def watch_selected(self) -> wb.training.RunFollower | None:
        """Watch the one run selected in the compare list: what the Watch button does."""
        chosen = self._runs.one_selected("watch")
        return self.watch(chosen) if chosen else None

    # --- controls ----------------------------------------------------------------------------------

    @shown
    def start(self, **overrides: Any) -> str | None:
        """Start training the selection (``overrides`` replace options, e.g. ``steps=50``); the run's name.

        Invalid settings are shown in the status and nothing starts; the selection is left as it was.
        """
        self._refuse_while_training("Stop it first")
        if self.until_stopped.value and "steps" not in overrides:
            overrides["steps"] = UNTIL_STOPPED
        resolved = self._trainable(**overrides)  # bad input stops here, before anything changes
        config = resolved.config
        self._stop_watching()  # the watched run goes on: only this dashboard stops following it
        self._stop_other_dashboards()
        trainer = self._trainer_for(resolved)
        self._view.restart(config.steps, config.sync_every)
        self._pause_requested = False
        self._set_buttons("running")
        # Shown before the thread starts: the thread's own messages (compiled, finished) must come after it.
        length = "until stopped" if config.steps >= UNTIL_STOPPED else f"{config.steps:,} steps"
        self._status.show(f"starting {config.mode} on {config.mesh}, {length}", "info")
        return self._start(trainer)

    @shown
    def save(self) -> None:
        """Save the running run's state at its next step boundary (what the Save button does)."""
        follower = self._watched()
        if follower is not None:
            raise wb.WorkbenchError(f"{follower.run_name} runs elsewhere: save it where it runs (its "
                                    "--checkpoint-every option)")
        trainer = self._active_trainer()
        if trainer is None:
            self._status.show("no run to save: press Start (or Resume run) first", "info")
            return
        self._status.show("saving at the next step", "info")  # first: the saved event may beat the return
        trainer.save_checkpoint()  # refused, with why, for a run across processes

    @shown
    def resume_selected(self) -> str | None:
        """Resume the one run selected in the compare list: what the Resume run button does."""
        chosen = self._runs.one_selected("resume")
        return self.resume_run(chosen) if chosen else None

    @shown
    def resume_run(self, name: str) -> str | None:
        """Continue run ``name`` (under ``run_root``) from its latest checkpoint, live in this dashboard, with
        this dashboard's mode and mesh (its model, data and optimizer are the run's own). A run that reached
        its steps goes on for the Steps option's count more. Returns the run's name.

        Refused, with why, for a run with no complete checkpoint, a run of your own model, or while a run is
        active; the selection is left as it was.
        """
        self._refuse_while_training("Stop it first")
        info = wb.latest_checkpoint(wb.load_run(name, self.run_root).path)  # no checkpoint: says how to save one
        changes = resume_changes(info.config, self._trainable().config, info.step)
        trainer = wb.Trainer.resuming(info.run_path, **changes)  # a foreign or custom-model run stops here
        self._stop_watching()
        self._stop_other_dashboards()
        self._trainer = trainer
        trainer.subscribe(self._on_trainer_event)
        self._view.restart(trainer.config.steps, trainer.config.sync_every)
        steps, losses = wb.load_run(name, self.run_root).series("loss")
        self._view.add_train_loss(steps, losses, until=info.step)  # the curve so far, up to the checkpoint
        self._pause_requested = False
        self._set_buttons("running")
        moved = {key: value for key, value in changes.items() if key in ("mode", "mesh")}
        self.layout_panel.value = ""
        if moved:
            self.layout_panel.value = layout_change_html(info, trainer.config)
        onto = f" onto {trainer.config.mode} on {trainer.config.mesh}" if moved else ""
        self._status.show(f"resuming {name} from step {info.step:,}{onto}, to step {trainer.config.steps:,}", "info")
        return self._start(trainer)

    @shown
    def pause(self) -> None:
        """Pause the run at the next step boundary."""
        follower = self._watched()
        if follower is not None:
            follower.pause()  # refused, with where to pause it
        trainer = self._active_trainer()
        if trainer is None:
            raise wb.WorkbenchError("no run to pause: press Start first")
        self._status.show("pausing at the next step", "info")  # first: the "paused" event may beat the return
        trainer.pause()  # a refusal replaces the line above with its message
        self._pause_requested = True
        self._set_buttons("paused")

    @shown
    def resume(self) -> None:
        """Resume a paused run."""
        follower = self._watched()
        if follower is not None:
            follower.resume()
        trainer = self._active_trainer()
        if trainer is None:
            raise wb.WorkbenchError("no run to resume: press Start first")
        trainer.resume()
        self._pause_requested = False
        self._set_buttons("running")
        self._status.show("resumed", "info")

    def toggle_pause(self) -> None:
        """What the Pause/Resume button does."""
        if self._pause_requested:
            self.resume()
        else:
            self.pause()

    @shown
    def stop(self) -> None:
        """Stop the run at the next step boundary (its data so far stays on disk). A watched run stops
        through its launcher (every process); one started elsewhere is not stopped, and the status says where
        to stop it."""
        # "stopping" shows before the run is asked: its end may arrive (in another thread) before the
        # request returns, and the end's message must be the last word.
        follower = self._watched()
        if follower is not None:
            self._status.show(f"stopping {follower.run_name}; its end follows", "info")
            try:
                follower.stop()
            except wb.WorkbenchError as error:
                self._status.show(str(error), "info")
            return
        trainer = self._active_trainer()
        if trainer is None:
            self._status.show("no run to stop", "info")
            return
        self._status.show("stopping at the next step", "info")
        trainer.stop()

    @shown
    def reset(self) -> None:
        """Stop any run (or stop watching one), then clear the live plots and the progress (runs on disk are
        kept)."""
        self._stop_watching()
        self._stop_training()
        self._view.reset()
        self._pause_requested = False
        self._set_buttons("idle")
        self._status.show("plots cleared (runs on disk are kept)", "info")

    @shown
    def check(self) -> wb.analysis.CheckReport | wb.analysis.ProcessCheckReport | None:
        """Run the reference check of the selection's mode, mesh, model and faults, and show the verdict,
        each finding, and the compiled step's communication ledger in the check panel."""
        resolved = self._trainable()
        config = resolved.config
        across = f" across {config.processes} processes" if config.processes > 1 else ""
        self._status.show(f"checking {config.mode} on {config.mesh}{across} against 'single'...", "info")
        self.check_button.disabled = True
        try:  # the config Start trains, built the same way: bf16, accumulation and options included
            report = wb.run_check(resolved)
        finally:
            self.check_button.disabled = False
        self.check_panel.value = check_html(report, ledger_text_of(report, config.mode))
        if report.verdict == "ok":
            self._status.show(f"reference check: ok ({config.mode} on {config.mesh})", "ok")
        else:
            names = ", ".join(p.name for p in report.problems)
            self._status.show(f"reference check: problem ({names}); details below", "warning")
        return report

    @shown
    def refresh_runs(self) -> None:
        """List the runs in ``run_root`` in the compare box (keeping the ones selected)."""
        self._runs.refresh()

    @shown
    def overlay_runs(self, names: Iterable[str]) -> None:
        """Overlay these runs' loss curves (dashed) on the loss figure; what selecting them does."""
        self._runs.overlay(names)

    def close(self) -> None:
        """Stop this dashboard's run (waiting briefly) or stop watching one, and close its widgets."""
        self._stop_watching()
        self._stop_training()
        self._view.cancel_redraw()
        _DASHBOARDS.discard(self)
        for child in self.children:
            _close_tree(child)
        super().close()

    # --- the training thread's side ----------------------------------------------------------------

    @shown
    def on_event(self, event: wb.training.TrainEvent) -> None:
        """The subscriber to the trainer or the watched run (called in its thread): record the event, redraw
        if due, and say in the status what the event means."""
        self._view.record(event)
        kind, step, data = event.kind, event.step, event.data
        if kind == "compiled" and data.get("compile_s") is not None:
            self._status.show(f"compiled in {data['compile_s']:.1f} s; training", "info")
        elif kind == "compiled":  # a watched run still going: its compile time is written at its end
            self._status.show(f"{event.run}: training, first metrics at step {step:,}", "info")
        elif kind == "silent":
            self._silent = True
            self._status.show(f"no new metrics for {data['silent_after']:g} s: the run may have died; its files "
                              f"are in {data['run_dir']}", "warning")
        elif kind == "metrics" and self._silent:
            self._silent = False
            self._status.show(f"{event.run}: metrics again, at step {step:,}", "info")
        elif kind == "paused":
            self._status.show(f"paused at step {step:,}", "info")
        elif kind == "checkpoint" and data.get("requested"):
            done = "was already saved" if data.get("already") else "saved (written in the background)"
            self._status.show(f"step {step:,} {done}: {data['path']}", "ok")
        elif kind == "end":
            self._finish(step, data)
        elif kind == "profile":
            self.profile_panel.show_capture(data)  # read in the panel's thread: this is the training thread

    def _finish(self, step: int, summary: dict[str, Any]) -> None:
        source = self._source()
        if source is None:  # an end comes from the trainer or the watched run: one of them is there
            raise RuntimeError(f"the end of a run at step {step:,} reached a dashboard that neither trains nor "
                               "watches one")
        status = source.status
        self._pause_requested = False
        self._set_buttons("idle")
        name, where = summary.get("run") or source.run_name, source.run_path
        if status == "failed":
            self._status.show(f"{name} failed at step {step:,}: {summary.get('error')}", "error")
        elif status == "stopped":
            self._status.show(f"stopped {name} at step {step:,}; saved in {where}", "info")
        else:
            facts = [f"{step:,} steps"]
            if summary.get("final_loss") is not None:
                facts.append(f"loss {summary['final_loss']:.4g}")
            accuracy = (summary.get("eval") or {}).get("accuracy")
            if accuracy is not None:
                facts.append(f"eval accuracy {accuracy:.3f}")
            if summary.get("examples_per_s"):
                facts.append(f"{summary['examples_per_s']:,.0f} examples/s")
            self._status.show(f"finished {name}: {', '.join(facts)}; saved in {where}", "ok")
        self.refresh_runs()  # the run just written joins the compare list

    # --- helpers ----------------------------------------------------------------------------------

    def _active_trainer(self) -> wb.Trainer | None:
        """The dashboard's own trainer while a run holds it (running or paused), else None."""
        trainer = self._trainer
        return trainer if trainer is not None and trainer.is_active else None

    def _watched(self) -> wb.training.RunFollower | None:
        """The watched run's follower while it follows a run that has not ended, else None."""
        follower = self._follower
        live = follower is not None and follower.following and follower.status in _FOLLOWED_LIVE
        return follower if live else None

    def _running(self) -> bool:
        """Whether the run shown is going: the dashboard's own, or a watched one that has not ended."""
        return self._active_trainer() is not None or self._watched() is not None

    def _source(self) -> wb.Trainer | wb.training.RunFollower | None:
        """What the plots show: the watched run, else the dashboard's own."""
        return self._follower if self._follower is not None else self._trainer

    def _refuse_while_training(self, then: str) -> None:
        """A TrainerBusyError while the dashboard's own run is active; ``then`` says what to do first."""
        trainer = self._active_trainer()
        if trainer is not None:
            raise wb.training.TrainerBusyError(f"run {trainer.run_name!r} is {trainer.status}: {then}")

    def _stop_watching(self) -> None:
        """Stop following the watched run (the run itself goes on); the dashboard shows its own runs again."""
        if self._follower is not None:
            follower, self._follower = self._follower, None  # first: its last events are dropped from here on
            follower.close()
        self._silent = False

    def _stop_training(self) -> bool:
        """Stop the dashboard's own run, if one is active, and wait up to STOP_TIMEOUT_S for it to end; False if
        it has not ended by then (it stops at its next step)."""
        trainer = self._active_trainer()
        if trainer is None:
            return True
        trainer.stop()
        return trainer.wait(STOP_TIMEOUT_S) is not None

    def _trainable(self, **overrides: Any) -> wb.training.ResolvedConfig:
        """The selection's config, resolved once for the action that asks (which hands the record down); a
        WorkbenchError with the verdict's message when it does not train here (the verdict above shows the same,
        with fixes)."""
        resolved = self.selection.resolved_config(**overrides)
        verdict = wb.training_verdict(resolved)
        if not verdict.trains:
            raise wb.WorkbenchError(verdict.message)
        return resolved

    def _trainer_for(self, resolved: wb.training.ResolvedConfig) -> wb.Trainer:
        """The dashboard's one trainer, set to ``resolved``: kept between runs so its compiled steps are reused."""
        if self._trainer is None:
            self._trainer = wb.Trainer(resolved, run_root=self.run_root)
            self._trainer.subscribe(self._on_trainer_event)
        else:
            self._trainer.config = resolved  # taken as it is: no second resolution
        return self._trainer

    def _start(self, trainer: wb.Trainer) -> str:
        """Start ``trainer``'s run (it checks the mode/mesh/batch combination before its thread starts); the
        buttons go back to idle if it refuses."""
        try:
            return trainer.start()
        except Exception:
            self._set_buttons("idle")
            raise

    def _on_trainer_event(self, event: wb.training.TrainEvent) -> None:
        if self._follower is None:  # while a run is watched, the trainer's last events are stale
            self.on_event(event)

    def _stop_other_dashboards(self) -> None:
        """Stop every other dashboard's active run (one training run at a time), saying so in both."""
        for other in list(_DASHBOARDS):
            trainer = other._active_trainer()
            if other is self or trainer is None:
                continue
            if not other._stop_training():
                self._status.show(f"the run {trainer.run_name!r} of another dashboard has not stopped "
                                  f"after {STOP_TIMEOUT_S:.0f} s; it stops at its next step", "warning")
            other._status.show("stopped: a run was started in another dashboard (one run at a time)", "warning")

    def _set_buttons(self, state: str) -> None:
        """``idle``, ``running``/``paused`` (the dashboard's own run) or ``watching`` (a followed run)."""
        own_run = state in wb.Trainer.ACTIVE_STATUSES
        self.start_button.disabled = own_run
        self.watch_button.disabled = own_run
        self.resume_run_button.disabled = own_run
        self.profile_panel.set_active(own_run)
        self.save_button.disabled = not own_run
        self.pause_button.disabled = not own_run  # a watched run is paused where it runs
        self.stop_button.disabled = state == "idle"
        self.pause_button.description, self.pause_button.icon = (
            ("Resume", "play") if state == "paused" else ("Pause", "pause"))


def _close_tree(widget: Any) -> None:
    """Close a widget and every widget inside it (a closed box leaves its children open)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


__all__ = ["TrainingDashboard", "check_html", "layout_change_html", "resume_changes"]
