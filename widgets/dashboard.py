"""The training dashboard: start, pause and stop a run, watch it live, check the mode, compare past runs.

Training runs in the :class:`workbench.Trainer`'s background thread, so the kernel stays free to handle
the buttons: Stop and Pause act at the next step boundary. The dashboard's subscriber, called by the
training thread, only appends to bounded series (:mod:`widgets.live_plot`); the figures are redrawn at
most every ``redraw_interval`` seconds (and once more when the run pauses or ends), each in one message.
Every run is written to ``run_root`` by the trainer as it goes, so closing or resetting the dashboard, or
a crashed kernel, loses nothing; the "compare" list overlays any of those runs' loss curves. Watch (or
:meth:`TrainingDashboard.attach`) follows a run written elsewhere (the CLI, other processes, a shared
folder) through :class:`workbench.training.RunFollower`, with the same plots.

Above the progress bar, the same verdict as in the Model & mode and Inspect tabs says whether the
mode trains on the mesh (with its one-click fixes); Start and Check refuse a pair the trainer refuses,
with the trainer's message, before anything is stopped or cleared.

Save writes the running run's state now (:meth:`workbench.Trainer.save_checkpoint`, also every K steps with
the "Checkpoint every" option); Resume continues the run selected in the compare list from its latest
checkpoint, under the dashboard's mode and mesh when they differ (the state is read straight into the new
layout, and the layout before and after is shown below the plots).

Profile (:mod:`widgets.profile_panel`, under the plots) profiles N steady steps of the running run with JAX's
profiler and shows each device's timeline, the time and bandwidth tables and memory predicted, compiled and
live; it is enabled while a run of this dashboard trains.

One training run at a time across dashboards: starting a run stops any other dashboard's run first, so
re-running a notebook cell never leaves a second training thread behind.

Example:
    >>> selection = Selection(mesh="data=8", mode="dp", options={"steps": 300, "batch": 64})
    >>> dashboard = TrainingDashboard(selection, run_root="runs")
    >>> dashboard  # in a notebook: the buttons, the progress bar and the plots  # doctest: +SKIP
    >>> dashboard.start(); dashboard.wait(120)["steps"]  # doctest: +SKIP
    300
    >>> TrainingDashboard.attach("mlp-dp-20250101-120000", run_root="runs")  # follows it  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import html
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as widgets

import workbench as wb

from .common import LEVEL_STYLES, Selection, StatusArea, guarded
from .live_plot import MAX_POINTS, LivePlot, Throttle
from .mesh_verdict import MeshVerdict
from .profile_panel import ProfilePanel

DEFAULT_SYNC_EVERY = wb.TrainConfig().sync_every
UNTIL_STOPPED = 10**9  # the steps of a run trained "until stopped": more than anyone waits for
REDRAW_INTERVAL_S = 0.25  # a few redraws per second: smooth to the eye, nothing to training
STOP_TIMEOUT_S = 10.0  # how long Reset/close/another dashboard's Start wait for a run to stop

TRAIN_COLOR = wb.views.OKABE_ITO[4]  # blue
EVAL_COLOR = wb.views.OKABE_ITO[5]  # vermillion: tells apart from blue for every kind of colour vision
THROUGHPUT_COLOR = wb.views.OKABE_ITO[2]  # bluish green
SYNCED_COLOR = "#000000"  # Okabe-Ito black: the one line the replica colours (device colours) never use
DIVERGENCE_COLOR = wb.views.OKABE_ITO[6]  # reddish purple
# Past runs: dashed and translucent, so they stay behind the live run (no blue or vermillion: those are it).
OVERLAY_COLORS = tuple(wb.views.OKABE_ITO[index] for index in (7, 0, 1, 2, 6))

_DRAW_NOW = ("start", "compiled", "paused", "resumed", "end")  # events worth a redraw whatever the throttle
_FOLLOWED_LIVE = ("running", "silent")  # a followed run's statuses before it ends

# Every open dashboard, so that a Start stops the others' runs (a re-run cell makes a new dashboard
# while the old one's thread may still be training). Weak: a dashboard closed and dropped goes away.
_DASHBOARDS: weakref.WeakSet = weakref.WeakSet()


def _shown(method: Callable) -> Callable:
    """Run a public method so that any error shows in the dashboard's status instead of being raised
    (JupyterLab would hide an exception raised in a widget callback)."""

    @functools.wraps(method)
    def wrapper(self: TrainingDashboard, *args: Any, **kwargs: Any) -> Any:
        return guarded(self._status)(method)(self, *args, **kwargs)

    return wrapper


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
        >>> dashboard = TrainingDashboard(Selection(mesh="data=8", options={"steps": 100}), run_root="runs")
        >>> dashboard.start(); dashboard.wait(60)["steps"]  # doctest: +SKIP
        100
        >>> dashboard.loss_figure.data[0].y[-1] < dashboard.loss_figure.data[0].y[0]  # doctest: +SKIP
        True
    """

    def __init__(self, selection: Selection | None = None, run_root: str = "runs", *,
                 redraw_interval: float = REDRAW_INTERVAL_S, max_points: int = MAX_POINTS):
        self.selection = selection if selection is not None else Selection()
        self.run_root = run_root
        self._status = StatusArea()
        self._init_run_state(redraw_interval)
        self._build_plots(max_points)
        self._build_controls()
        super().__init__(children=self._arrange(), layout=widgets.Layout(width="100%"))
        self._wire()
        self._set_buttons("idle")
        _DASHBOARDS.add(self)
        self.refresh_runs()

    # --- building the dashboard (called once, by __init__) ---------------------------------------------

    def _init_run_state(self, redraw_interval: float) -> None:
        """What the dashboard knows about the current run, before any run."""
        self._trainer: wb.Trainer | None = None  # the dashboard's own runs
        self._follower: wb.training.RunFollower | None = None  # a run it watches instead (attach, watch)
        self._silent = False  # the watched run went silent: say so when its metrics come back
        self._throttle = Throttle(redraw_interval)
        self._late_draw: threading.Timer | None = None
        self._pause_requested = False
        self._step = 0
        self._total = 0
        self._steps_per_s: float | None = None
        self._replicas = 0  # replica traces shown in the gradient-norm figure
        self._replica_devices: list[list[int]] | None = None  # the devices each replica holds, as last drawn
        self._overlays = 0  # overlay traces in the loss figure (shown or hidden, never removed)
        self._refreshing = False

    def _build_plots(self, max_points: int) -> None:
        """The four live figures, each with the traces every run has (replicas and overlays come later)."""
        self._loss = LivePlot("loss", y_title="loss", max_points=max_points,
                              placeholder="the train loss, and the held-out loss at each evaluation, appear here "
                                          "once a run starts (Start), or a past run is chosen in the compare list")
        self._loss.add_trace("train", label="train loss", color=TRAIN_COLOR)
        self._loss.add_trace("eval", label="eval loss", color=EVAL_COLOR, markers=True)
        self._throughput = LivePlot("throughput", y_title="examples/s", max_points=max_points,
                                    placeholder="examples per second appear here from the first logged step")
        self._throughput.add_trace("examples/s", color=THROUGHPUT_COLOR)
        self._grad = LivePlot("gradient norms per replica", y_title="L2 norm", max_points=max_points)
        self._grad.add_trace("synced", label="synchronised", color=SYNCED_COLOR, width=3, markers=True)
        self._divergence = LivePlot("replica divergence (0 in sync)", y_title="max |Δ parameter|",
                                    max_points=max_points)
        self._divergence.add_trace("divergence", label="replica divergence", color=DIVERGENCE_COLOR, markers=True)
        self._plots = (self._loss, self._throughput, self._grad, self._divergence)
        self._loss.figure.add_class("wb-loss-figure")
        self._describe_sync(self.selection.options.get("sync_every", DEFAULT_SYNC_EVERY))

    def _describe_sync(self, sync_every: int) -> None:
        """Say in the sync plots, while they are empty, when their points come (or that they are off)."""
        if sync_every:
            when = (f"measured every {sync_every:,} steps (the sync_every option), from step {sync_every:,}; "
                    "modes on one device have one replica and none")
        else:
            when = "off for this run (sync_every=0): set the sync_every option to a number of steps to measure them"
        self._grad.set_placeholder(f"each replica's gradient norm against the synchronised one, {when}")
        self._divergence.set_placeholder(f"how far the replicas' parameters drift apart (0 when in sync), {when}")

    def _build_controls(self) -> None:
        """The buttons, the progress bar, the compare list and the check panel (not yet wired)."""
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
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="40%"))
        self.progress_label = widgets.HTML(value="no run yet", layout=widgets.Layout(width="60%"))
        self.runs_select = widgets.SelectMultiple(options=[], rows=4, description="compare",
                                                  layout=widgets.Layout(width="100%"))
        self.refresh_button = widgets.Button(description="Refresh runs", icon="refresh",
                                             tooltip=f"list the runs in {self.run_root!r}")
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
        figures = widgets.GridBox(
            [plot.widget for plot in self._plots],
            layout=widgets.Layout(width="100%", grid_template_columns="repeat(2, minmax(0, 1fr))", grid_gap="4px"),
        )
        return [
            widgets.HBox([self.start_button, self.until_stopped, self.pause_button, self.stop_button,
                          self.reset_button, self.check_button, self.save_button]),
            self.verdict,
            widgets.HBox([self.progress, self.progress_label], layout=widgets.Layout(width="100%")),
            self._status,
            figures,
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
        self.runs_select.observe(self._on_runs_selected, names="value")

    # --- what scripts and tests read ---------------------------------------------------------------

    @property
    def status(self) -> StatusArea:
        """The status line: every message shown, newest last, in ``status.messages``."""
        return self._status

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
        return self._loss.figure

    @property
    def throughput_figure(self):
        return self._throughput.figure

    @property
    def grad_norm_figure(self):
        """The synchronised gradient norm, then one trace per replica in its device's colour."""
        return self._grad.figure

    @property
    def divergence_figure(self):
        return self._divergence.figure

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
            >>> dashboard = TrainingDashboard.attach("mlp-fsdp-20250101-120000", silent_after=60)  # doctest: +SKIP
            >>> dashboard.wait(600)["status"]  # doctest: +SKIP
            'finished'
        """
        dashboard = cls(selection, run_root=run_root, redraw_interval=redraw_interval, max_points=max_points)
        dashboard.watch(run, **follow_options)
        return dashboard

    @_shown
    def watch(self, run: Any, **follow_options: Any) -> wb.training.RunFollower | None:
        """Follow ``run`` in this dashboard (as :meth:`attach`); Start goes back to the dashboard's own runs.

        Refused while this dashboard's own run is active. Returns the follower.
        """
        if self._active():
            raise wb.training.TrainerBusyError(f"run {self._trainer.run_name!r} is {self._trainer.status}: "
                                               "Stop it before watching another run")
        follower = wb.training.RunFollower(run, self.run_root, **follow_options)  # bad input stops here
        self._stop_watching()
        self._follower = follower
        self._total = 0
        self._clear_live()
        self._pause_requested = False
        self._set_buttons("watching")
        self._status.show(f"watching {follower.run_name} in {follower.run_path}", "info")
        # Events of a follower this dashboard has let go of are stale: dropped.
        follower.subscribe(lambda event: self.on_event(event) if self._follower is follower else None)
        return follower.start()

    @_shown
    def watch_selected(self) -> wb.training.RunFollower | None:
        """Watch the one run selected in the compare list: what the Watch button does."""
        chosen = self._one_selected("watch")
        return self.watch(chosen) if chosen else None

    # --- controls ----------------------------------------------------------------------------------

    @_shown
    def start(self, **overrides: Any) -> str | None:
        """Start training the selection (``overrides`` replace options, e.g. ``steps=50``); the run's name.

        Invalid settings are shown in the status and nothing starts; the selection is left as it was.
        """
        if self._active():
            raise wb.training.TrainerBusyError(f"run {self._trainer.run_name!r} is {self._trainer.status}: "
                                               "Stop it first")
        if self.until_stopped.value and "steps" not in overrides:
            overrides["steps"] = UNTIL_STOPPED
        config = self._trainable_config(**overrides)  # bad input stops here, before anything changes
        self._stop_watching()  # the watched run goes on: only this dashboard stops following it
        self._stop_other_dashboards()
        trainer = self._trainer_for(config)
        self._total = config.steps
        self._describe_sync(config.sync_every)
        self._clear_live()
        self._pause_requested = False
        self._set_buttons("running")
        # Shown before the thread starts: the thread's own messages (compiled, finished) must come after it.
        length = "until stopped" if config.steps >= UNTIL_STOPPED else f"{config.steps:,} steps"
        self._status.show(f"starting {config.mode} on {config.mesh}, {length}", "info")
        try:
            return trainer.start()  # checks the mode/mesh/batch combination before the thread starts
        except Exception:
            self._set_buttons("idle")
            raise

    @_shown
    def save(self) -> None:
        """Save the running run's state at its next step boundary (what the Save button does)."""
        if self._watching():
            raise wb.WorkbenchError(f"{self._follower.run_name} runs elsewhere: save it where it runs (its "
                                    "--checkpoint-every option)")
        if not self._active():
            self._status.show("no run to save: press Start (or Resume run) first", "info")
            return
        self._status.show("saving at the next step", "info")  # first: the saved event may beat the return
        self._trainer.save_checkpoint()  # refused, with why, for a run across processes

    @_shown
    def resume_selected(self) -> str | None:
        """Resume the one run selected in the compare list: what the Resume run button does."""
        chosen = self._one_selected("resume")
        return self.resume_run(chosen) if chosen else None

    def _one_selected(self, verb: str) -> str | None:
        """The one run selected in the compare list, or None with a message saying to select one to ``verb``."""
        chosen = self.runs_select.value
        if len(chosen) == 1:
            return chosen[0]
        many = f" ({len(chosen)} are selected)" if chosen else ""
        self._status.show(f"select one run in the compare list to {verb} it{many}", "info")
        return None

    @_shown
    def resume_run(self, name: str) -> str | None:
        """Continue run ``name`` (under ``run_root``) from its latest checkpoint, live in this dashboard, with
        this dashboard's mode and mesh (its model, data and optimizer are the run's own). A run that reached
        its steps goes on for the Steps option's count more. Returns the run's name.

        Refused, with why, for a run with no complete checkpoint, a run of your own model, or while a run is
        active; the selection is left as it was.
        """
        if self._active():
            raise wb.training.TrainerBusyError(f"run {self._trainer.run_name!r} is {self._trainer.status}: "
                                               "Stop it first")
        info = wb.latest_checkpoint(wb.load_run(name, self.run_root).path)  # no checkpoint: says how to save one
        changes = resume_changes(info.config, self._trainable_config(), info.step)
        trainer = wb.Trainer.resuming(info.run_path, **changes)  # a foreign or custom-model run stops here
        self._stop_watching()
        self._stop_other_dashboards()
        self._trainer = trainer
        trainer.subscribe(self._on_trainer_event)
        self._total = trainer.config.steps
        self._describe_sync(trainer.config.sync_every)
        self._clear_live()
        steps, losses = wb.load_run(name, self.run_root).series("loss")
        for step, loss in zip(steps, losses, strict=True):  # the curve so far, up to the checkpoint
            if step <= info.step:
                self._loss.append("train", step, loss)
        self._pause_requested = False
        self._set_buttons("running")
        moved = {key: value for key, value in changes.items() if key in ("mode", "mesh")}
        self.layout_panel.value = ""
        if moved:
            self.layout_panel.value = layout_change_html(info, trainer.config)
        onto = f" onto {trainer.config.mode} on {trainer.config.mesh}" if moved else ""
        self._status.show(f"resuming {name} from step {info.step:,}{onto}, to step {trainer.config.steps:,}", "info")
        try:
            return trainer.start()
        except Exception:
            self._set_buttons("idle")
            raise

    @_shown
    def pause(self) -> None:
        """Pause the run at the next step boundary."""
        if self._watching():
            self._follower.pause()  # refused, with where to pause it
        if not self._active():
            raise wb.WorkbenchError("no run to pause: press Start first")
        self._status.show("pausing at the next step", "info")  # first: the "paused" event may beat the return
        self._trainer.pause()  # a refusal replaces the line above with its message
        self._pause_requested = True
        self._set_buttons("paused")

    @_shown
    def resume(self) -> None:
        """Resume a paused run."""
        if self._watching():
            self._follower.resume()
        if not self._active():
            raise wb.WorkbenchError("no run to resume: press Start first")
        self._trainer.resume()
        self._pause_requested = False
        self._set_buttons("running")
        self._status.show("resumed", "info")

    def toggle_pause(self) -> None:
        """What the Pause/Resume button does."""
        if self._pause_requested:
            self.resume()
        else:
            self.pause()

    @_shown
    def stop(self) -> None:
        """Stop the run at the next step boundary (its data so far stays on disk). A watched run stops
        through its launcher (every process); one started elsewhere is not stopped, and the status says where
        to stop it."""
        # "stopping" shows before the run is asked: its end may arrive (in another thread) before the
        # request returns, and the end's message must be the last word.
        if self._watching():
            follower = self._follower
            self._status.show(f"stopping {follower.run_name}; its end follows", "info")
            try:
                follower.stop()
            except wb.WorkbenchError as error:
                self._status.show(str(error), "info")
            return
        if not self._active():
            self._status.show("no run to stop", "info")
            return
        self._status.show("stopping at the next step", "info")
        self._trainer.stop()

    @_shown
    def reset(self) -> None:
        """Stop any run (or stop watching one), then clear the live plots and the progress (runs on disk are
        kept)."""
        self._stop_watching()
        if self._active():
            self._trainer.stop()
            self._trainer.wait(STOP_TIMEOUT_S)
        self._clear_live()
        self._total = 0
        self._pause_requested = False
        self._set_buttons("idle")
        self.progress_label.value = "no run yet"
        self._status.show("plots cleared (runs on disk are kept)", "info")

    @_shown
    def check(self) -> wb.analysis.CheckReport | None:
        """Run the reference check of the selection's mode, mesh, model and faults, and show the verdict,
        each finding, and the compiled step's communication ledger in the check panel."""
        config = self._trainable_config()
        across = f" across {config.processes} processes" if config.processes > 1 else ""
        self._status.show(f"checking {config.mode} on {config.mesh}{across} against 'single'...", "info")
        self.check_button.disabled = True
        try:  # the config Start trains, built the same way: bf16, accumulation and options included
            report = wb.run_check(config)
        finally:
            self.check_button.disabled = False
        # The report's own ledger: compiled once, for the step it checked.
        ledger_text = (wb.analysis.ledger_table(report.ledger) if report.ledger
                       else getattr(report, "ledger_text", None)) or (
            f"no ledger: mode {config.mode!r} runs several programs per step, so there is no single compiled step")
        self.check_panel.value = check_html(report, ledger_text)
        if report.verdict == "ok":
            self._status.show(f"reference check: ok ({config.mode} on {config.mesh})", "ok")
        else:
            names = ", ".join(p.name for p in report.problems)
            self._status.show(f"reference check: problem ({names}); details below", "warning")
        return report

    @_shown
    def refresh_runs(self) -> None:
        """List the runs in ``run_root`` in the compare box (keeping the ones selected)."""
        runs = wb.list_runs(self.run_root)
        names = {run.name for run in runs}
        keep = tuple(name for name in self.runs_select.value if name in names)
        self._refreshing = True  # new options reset the value: that is not the user deselecting
        try:
            self.runs_select.options = [(f"{run.name} ({run.status})", run.name) for run in runs]
            self.runs_select.value = keep
        finally:
            self._refreshing = False

    @_shown
    def overlay_runs(self, names: Iterable[str]) -> None:
        """Overlay these runs' loss curves (dashed) on the loss figure; what selecting them does."""
        names = tuple(names)
        known = {value for _, value in self.runs_select.options}
        if any(name not in known for name in names):
            self.refresh_runs()
            known = {value for _, value in self.runs_select.options}
        missing = [name for name in names if name not in known]
        if missing:
            raise wb.RunError(f"no run {', '.join(map(repr, missing))} in {self.run_root!r}: choose from the "
                              "compare list")
        if names == tuple(self.runs_select.value):
            self._draw_overlays(names)
        else:
            self.runs_select.value = names  # the observer draws them

    def close(self) -> None:
        """Stop this dashboard's run (waiting briefly) or stop watching one, and close its widgets."""
        self._stop_watching()
        if self._active():
            self._trainer.stop()
            self._trainer.wait(STOP_TIMEOUT_S)
        if self._late_draw is not None:
            self._late_draw.cancel()
        _DASHBOARDS.discard(self)
        for child in self.children:
            _close_tree(child)
        super().close()

    # --- the training thread's side ----------------------------------------------------------------

    @_shown
    def on_event(self, event: wb.training.TrainEvent) -> None:
        """The subscriber to the trainer or the watched run (called in its thread): record the event, redraw
        if due."""
        kind, step, data = event.kind, event.step, event.data
        if kind == "start":
            self._total, self._step = data.get("steps") or 0, 0
            if data.get("sync_every") is not None:  # a watched run's own schedule, said in the empty sync plots
                self._describe_sync(data["sync_every"])
        elif kind == "metrics":
            self._step = step
            self._loss.append("train", step, data["loss"])
            if "examples_per_s" in data:
                self._throughput.append("examples/s", step, data["examples_per_s"])
                self._steps_per_s = 1.0 / data["step_time_s"] if data.get("step_time_s") else None
        elif kind == "eval" and "eval_loss" in data:
            self._loss.append("eval", step, data["eval_loss"])
        elif kind == "sync":
            norms = data["per_replica_grad_norms"]
            self._show_replicas(len(norms), data.get("replica_devices"))
            for replica, norm in enumerate(norms):
                self._grad.append(f"replica {replica}", step, norm)
            self._grad.append("synced", step, data["synced_grad_norm"])
            self._divergence.append("divergence", step, data["replica_divergence"])
        elif kind == "end":
            self._step = step
        if self._throttle.ready(force=kind in _DRAW_NOW):
            self._draw()
        else:
            self._draw_soon()
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

    def _draw_soon(self) -> None:
        """Draw what a throttled event left undrawn once the interval has passed: the last points before a
        lull in the events (a run that logs rarely, a watched run between two looks at its files) are shown."""
        if self._late_draw is None or not self._late_draw.is_alive():
            self._late_draw = threading.Timer(self._throttle.interval, self._draw_late)
            self._late_draw.daemon = True
            self._late_draw.start()

    @_shown
    def _draw_late(self) -> None:
        self._throttle.ready(force=True)  # restart the interval: this counts as a redraw
        self._draw()

    def _draw(self) -> None:
        for plot in self._plots:
            plot.redraw()
        self._draw_progress()

    def _draw_progress(self) -> None:
        total = max(self._total, 1)
        self.progress.max = total
        self.progress.value = min(self._step, total)
        if self._total >= UNTIL_STOPPED:  # no end to count down to: the bar shows nothing, the label says why
            self.progress.max, self.progress.value = 1, 0
            rate = f" · {self._steps_per_s:,.1f} steps/s" if self._steps_per_s else ""
            self.progress_label.value = html.escape(f"step {self._step:,} · until stopped{rate}")
            return
        text = f"step {self._step:,} / {self._total:,}"
        if self._steps_per_s and (self._active() or self._watching()):
            remaining = max(self._total - self._step, 0) / self._steps_per_s
            minutes, seconds = divmod(round(remaining), 60)
            text += f" · {self._steps_per_s:,.1f} steps/s · ETA {minutes}:{seconds:02d}"
        elif self._steps_per_s:
            text += f" · {self._steps_per_s:,.1f} steps/s"
        self.progress_label.value = html.escape(text)

    def _finish(self, step: int, summary: dict[str, Any]) -> None:
        source = self._source()
        status = source.status if source is not None else "finished"
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

    def _active(self) -> bool:
        """Whether the dashboard's own run is going."""
        return self._trainer is not None and self._trainer.is_active

    def _watching(self) -> bool:
        """Whether a watched run is being followed and has not ended."""
        return self._follower is not None and self._follower.following and self._follower.status in _FOLLOWED_LIVE

    def _source(self) -> wb.Trainer | wb.training.RunFollower | None:
        """What the plots show: the watched run, else the dashboard's own."""
        return self._follower if self._follower is not None else self._trainer

    def _stop_watching(self) -> None:
        """Stop following the watched run (the run itself goes on); the dashboard shows its own runs again."""
        if self._follower is not None:
            follower, self._follower = self._follower, None  # first: its last events are dropped from here on
            follower.close()
        self._silent = False

    def _trainable_config(self, **overrides: Any) -> wb.TrainConfig:
        """The selection's checked config; a MeshError with the verdict's message when it does not train here
        (the verdict above shows the same, with fixes)."""
        config = self.selection.train_config(**overrides)
        verdict = wb.training_verdict(config)
        if not verdict.trains:
            raise wb.WorkbenchError(verdict.message)
        return config

    def _trainer_for(self, config: wb.TrainConfig) -> wb.Trainer:
        """The dashboard's one trainer, set to ``config``: kept between runs so its compiled steps are reused."""
        if self._trainer is None:
            self._trainer = wb.Trainer(config, run_root=self.run_root)
            self._trainer.subscribe(self._on_trainer_event)
        else:
            self._trainer.configure(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        return self._trainer

    def _on_trainer_event(self, event: wb.training.TrainEvent) -> None:
        if self._follower is None:  # while a run is watched, the trainer's last events are stale
            self.on_event(event)

    def _stop_other_dashboards(self) -> None:
        for other in list(_DASHBOARDS):
            if other is self or not other._active():
                continue
            other._trainer.stop()
            if other._trainer.wait(STOP_TIMEOUT_S) is None:
                self._status.show(f"the run {other._trainer.run_name!r} of another dashboard has not stopped "
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

    def _clear_live(self) -> None:
        """Empty the live traces (not the compared runs'); the figures and traces themselves stay."""
        self._step, self._steps_per_s = 0, None
        for plot in self._plots:
            plot.clear([name for name in plot.names if not name.startswith("overlay ")])
        self._throttle.reset()
        self._draw()

    def _show_replicas(self, count: int, devices: list[list[int]] | None = None) -> None:
        """One trace per replica, in the colour of the first device it holds (its index's colour when the replicas
        are shards of one device) and named with its devices when it holds several; made once, hidden when a run
        has fewer."""
        if (count, devices) == (self._replicas, self._replica_devices):
            return
        for replica in range(count):
            name = f"replica {replica}"
            if not self._grad.has_trace(name):
                self._grad.add_trace(name, color=wb.views.device_color(replica), width=1.5)
            held = devices[replica] if devices else [replica]
            label = name if len(held) == 1 else f"{name} (devices {', '.join(map(str, held))})"
            self._grad.style(name, name=label, line={"color": wb.views.device_color(held[0])})
        for name in self._grad.names:
            if name.startswith("replica "):
                self._grad.style(name, visible=int(name.split()[1]) < count)
        self._replicas, self._replica_devices = count, devices

    def _on_runs_selected(self, change: dict) -> None:
        if not self._refreshing:
            self._draw_overlays(change["new"])

    @_shown
    def _draw_overlays(self, names: Iterable[str]) -> None:
        shown, skipped = [], []
        for name in names:
            run = wb.load_run(name, self.run_root)
            try:
                steps, losses = run.series("loss")
            except wb.RunError:
                skipped.append(name)  # e.g. a run that has not logged yet
                continue
            shown.append((name, steps, losses))
        for index in range(self._overlays, len(shown)):  # the overlay traces only ever grow
            self._loss.add_trace(f"overlay {index}", color=OVERLAY_COLORS[index % len(OVERLAY_COLORS)],
                                 dash="dash", width=1.5, opacity=0.6)
        self._overlays = max(self._overlays, len(shown))
        for index in range(self._overlays):
            trace = f"overlay {index}"
            if index < len(shown):
                name, steps, losses = shown[index]
                self._loss.replace(trace, steps, losses)
                self._loss.style(trace, name=name, visible=True)
            else:
                self._loss.clear([trace])
                self._loss.style(trace, visible=False)
        self._loss.redraw()
        if skipped:
            self._status.show(f"no loss logged yet in {', '.join(skipped)}", "warning")


def resume_changes(saved: dict[str, Any], wanted: wb.TrainConfig, step: int) -> dict[str, Any]:
    """What a resumed run changes of its saved config ``saved``: the mode and mesh of ``wanted`` (the
    dashboard's), and, for a run already at its last step, ``wanted.steps`` more steps.

    Example:
        >>> resume_changes({"mode": "fsdp", "mesh": "data=8", "steps": 40},
        ...                wb.TrainConfig(mode="dp", mesh="data=8"), 20)
        {'mode': 'dp'}
    """
    changes = {key: getattr(wanted, key) for key in ("mode", "mesh") if saved.get(key) != getattr(wanted, key)}
    if saved.get("steps", 0) <= step:
        changes["steps"] = step + wanted.steps
    return changes


def layout_change_html(info: Any, config: wb.TrainConfig) -> str:
    """The layout panel: each leaf's spec and per-device shard shape in the checkpoint and in ``config``'s mode."""
    change = wb.checkpoint_layout_change(info, config)
    return ("<details open><summary>layout before and after the restore</summary>"
            f'<pre style="font-size:11px;overflow-x:auto">{html.escape(wb.layout_change_text(change))}</pre></details>')


def _close_tree(widget: Any) -> None:
    """Close a widget and every widget inside it (a closed box leaves its children open)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


def check_html(report: wb.analysis.CheckReport, ledger_text: str = "") -> str:
    """The check panel's HTML: the verdict, the key figures, each finding in full, and the ledger.

    Example:
        >>> check_html(wb.run_check("dp", mesh="data=4"))  # doctest: +SKIP
        '<div ...>reference check: <b>ok</b> ...'
    """
    ok = report.verdict == "ok"
    color = LEVEL_STYLES["ok" if ok else "error"][0]
    mesh = str(wb.parse_mesh(report.mesh))
    esc = html.escape
    parts = [
        f'<div style="color:{color}">reference check: <b>{esc(report.verdict)}</b> — {esc(report.mode)} on '
        f"{esc(mesh)}, {report.steps} steps against 'single'</div>",
        '<ul style="margin:4px 0">'
        f"<li>gradient scale {report.grad_scale:.6f} (1 expected)</li>"
        f"<li>largest parameter difference {report.max_param_diff:.3g} (the reference moves parameters up to "
        f"{report.reference_step:.3g} per step)</li>"
        f"<li>replica divergence {report.replica_divergence:.3g} (0 expected)</li></ul>",
    ]
    for finding in report.problems:
        causes = ", ".join(finding.causes) if finding.causes else "no known fault"
        parts.append(
            f'<div style="border-left:3px solid {color};padding-left:8px;margin:6px 0">'
            f"<b>{esc(finding.name)}</b>: {esc(finding.message)}<br>"
            f"<b>likely cause</b>: {esc(causes)}<br>"
            f"<b>why</b>: {esc(finding.explanation)}<br>"
            f"<b>fix</b>: {esc(finding.fix)}</div>"
        )
    if ledger_text:
        parts.append("<details open><summary>communication per step (the compiled training step)</summary>"
                     f'<pre style="font-size:11px;overflow-x:auto">{esc(ledger_text)}</pre></details>')
    return "\n".join(parts)


__all__ = ["TrainingDashboard", "check_html", "layout_change_html", "resume_changes"]
