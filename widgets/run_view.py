"""RunView: what the training dashboard shows of the run it follows: a progress bar and four live figures.

The figures: the train and eval loss (past runs' loss overlaid, dashed: :mod:`widgets.run_list`), examples per
second, each replica's gradient norm beside the synchronised one, and how far the replicas drift apart. A run's
events (:meth:`RunView.record`, called in the training thread) only append to bounded series
(:mod:`widgets.live_plot`); the figures and the progress are redrawn at most every ``redraw_interval`` seconds, each
figure in one message, and at once for the events worth it (start, compiled, paused, resumed, end). What the
interval held back is drawn by a timer once it has passed, so the last points before a lull are shown too.

Example:
    >>> view = RunView(StatusArea(), running=lambda: False)
    >>> view.record(wb.training.TrainEvent("metrics", 10, {"loss": 2.0}, "run"))
    >>> view.loss.trace("train").y.tolist(), view.progress_label.value
    ([2.0], 'step 10 / 0')
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Sequence

import ipywidgets as widgets

import workbench as wb

from .common import StatusArea, guarded
from .live_plot import MAX_POINTS, LivePlot, Throttle

DEFAULT_SYNC_EVERY = wb.TrainConfig().sync_every
UNTIL_STOPPED = 10**9  # the steps of a run trained "until stopped": more than anyone waits for
REDRAW_INTERVAL_S = 0.25  # a few redraws per second: smooth to the eye, nothing to training

TRAIN_COLOR = wb.views.OKABE_ITO[4]  # blue
EVAL_COLOR = wb.views.OKABE_ITO[5]  # vermillion: tells apart from blue for every kind of colour vision
THROUGHPUT_COLOR = wb.views.OKABE_ITO[2]  # bluish green
SYNCED_COLOR = "#000000"  # Okabe-Ito black: the one line the replica colours (device colours) never use
DIVERGENCE_COLOR = wb.views.OKABE_ITO[6]  # reddish purple
# Past runs: dashed and translucent, so they stay behind the live run (no blue or vermillion: those are it).
OVERLAY_COLORS = tuple(wb.views.OKABE_ITO[index] for index in (7, 0, 1, 2, 6))

_DRAW_NOW = ("start", "compiled", "paused", "resumed", "end")  # events worth a redraw whatever the throttle


class RunView:
    """The progress bar and the four live figures of the run a dashboard shows, fed by that run's events.

    Args:
        status: where an error in a late redraw (drawn from a timer's thread) is shown.
        running: whether the run shown is going (the dashboard's own, or a watched one): the progress then
            says the time left.
        sync_every: the sync diagnostics' schedule, said in their figures while they are empty.
        redraw_interval: the least time between two redraws during a run, in seconds.
        max_points: the most points each plotted curve keeps (older ones are thinned out).

    Attributes:
        loss, throughput, grad, divergence: each figure's :class:`~widgets.live_plot.LivePlot`.
        figures: the four figures, two by two (what the dashboard lays out).
        progress, progress_label: the progress bar and its line (step of total, steps per second, time left).
        step, total, steps_per_s: what the progress shows (``total`` is :data:`UNTIL_STOPPED` for a run trained
            until stopped).
    """

    def __init__(self, status: StatusArea, running: Callable[[], bool], *, sync_every: int = DEFAULT_SYNC_EVERY,
                 redraw_interval: float = REDRAW_INTERVAL_S, max_points: int = MAX_POINTS):
        self._running = running
        self._throttle = Throttle(redraw_interval)
        self._late_draw: threading.Timer | None = None
        self._draw_late = guarded(status)(self._redraw_late)
        self.step = 0
        self.total = 0
        self.steps_per_s: float | None = None
        self._replicas = 0  # replica traces shown in the gradient-norm figure
        self._replica_devices: list[list[int]] | None = None  # the devices each replica holds, as last drawn
        self._overlays = 0  # overlay traces in the loss figure (shown or hidden, never removed)
        self.loss = LivePlot("loss", y_title="loss", max_points=max_points,
                             placeholder="the train loss, and the held-out loss at each evaluation, appear here "
                                         "once a run starts (Start), or a past run is chosen in the compare list")
        self.loss.add_trace("train", label="train loss", color=TRAIN_COLOR)
        self.loss.add_trace("eval", label="eval loss", color=EVAL_COLOR, markers=True)
        self.loss.figure.add_class("wb-loss-figure")
        self.throughput = LivePlot("throughput", y_title="examples/s", max_points=max_points,
                                   placeholder="examples per second appear here from the first logged step")
        self.throughput.add_trace("examples/s", color=THROUGHPUT_COLOR)
        self.grad = LivePlot("gradient norms per replica", y_title="L2 norm", max_points=max_points)
        self.grad.add_trace("synced", label="synchronised", color=SYNCED_COLOR, width=3, markers=True)
        self.divergence = LivePlot("replica divergence (0 in sync)", y_title="max |Δ parameter|",
                                   max_points=max_points)
        self.divergence.add_trace("divergence", label="replica divergence", color=DIVERGENCE_COLOR, markers=True)
        self.describe_sync(sync_every)
        self.figures = widgets.GridBox(
            [plot.widget for plot in self.plots],
            layout=widgets.Layout(width="100%", grid_template_columns="repeat(2, minmax(0, 1fr))", grid_gap="4px"),
        )
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="40%"))
        self.progress_label = widgets.HTML(value="no run yet", layout=widgets.Layout(width="60%"))

    @property
    def plots(self) -> tuple[LivePlot, LivePlot, LivePlot, LivePlot]:
        """The four figures' plots: loss, throughput, gradient norms, divergence."""
        return self.loss, self.throughput, self.grad, self.divergence

    def describe_sync(self, sync_every: int) -> None:
        """Say in the sync plots, while they are empty, when their points come (or that they are off)."""
        if sync_every:
            when = (f"measured every {sync_every:,} steps (the sync_every option), from step {sync_every:,}; "
                    "modes on one device have one replica and none")
        else:
            when = "off for this run (sync_every=0): set the sync_every option to a number of steps to measure them"
        self.grad.set_placeholder(f"each replica's gradient norm against the synchronised one, {when}")
        self.divergence.set_placeholder(f"how far the replicas' parameters drift apart (0 when in sync), {when}")

    # --- the kernel's side: a new run, a reset, a resumed run's past, past runs ----------------------------

    def restart(self, total: int, sync_every: int | None = None) -> None:
        """Empty the live curves for a run of ``total`` steps (0: not known yet), whose sync diagnostics come
        every ``sync_every`` steps (None: say it when the run starts)."""
        self.total = total
        if sync_every is not None:
            self.describe_sync(sync_every)
        self._clear()

    def reset(self) -> None:
        """Empty the live curves and the progress: no run shown."""
        self._clear()
        self.total = 0
        self.progress_label.value = "no run yet"

    def add_train_loss(self, steps: Sequence[int], losses: Sequence[float], until: int) -> None:
        """Add a run's logged train loss up to step ``until`` (a resumed run's curve, up to its checkpoint); drawn
        at the next redraw."""
        for step, loss in zip(steps, losses, strict=True):
            if step <= until:
                self.loss.append("train", step, loss)

    def show_overlays(self, curves: Sequence[tuple[str, Sequence[int], Sequence[float]]]) -> None:
        """Overlay ``(run name, steps, losses)`` curves, dashed, on the loss figure, in place of the previous ones
        (their traces are hidden, never removed), and redraw it."""
        for index in range(self._overlays, len(curves)):  # the overlay traces only ever grow
            self.loss.add_trace(f"overlay {index}", color=OVERLAY_COLORS[index % len(OVERLAY_COLORS)],
                                dash="dash", width=1.5, opacity=0.6)
        self._overlays = max(self._overlays, len(curves))
        for index in range(self._overlays):
            trace = f"overlay {index}"
            if index < len(curves):
                name, steps, losses = curves[index]
                self.loss.replace(trace, steps, losses)
                self.loss.style(trace, name=name, visible=True)
            else:
                self.loss.clear([trace])
                self.loss.style(trace, visible=False)
        self.loss.redraw()

    # --- the run's side (its thread) --------------------------------------------------------------------

    def record(self, event: wb.training.TrainEvent) -> None:
        """Add what ``event`` carries to the curves and the progress; redraw now if due, else soon."""
        kind, step, data = event.kind, event.step, event.data
        if kind == "start":
            self.total, self.step = data.get("steps") or 0, 0
            if data.get("sync_every") is not None:  # a watched run's own schedule, said in the empty sync plots
                self.describe_sync(data["sync_every"])
        elif kind == "metrics":
            self.step = step
            self.loss.append("train", step, data["loss"])
            if "examples_per_s" in data:
                self.throughput.append("examples/s", step, data["examples_per_s"])
                self.steps_per_s = 1.0 / data["step_time_s"] if data.get("step_time_s") else None
        elif kind == "eval" and "eval_loss" in data:
            self.loss.append("eval", step, data["eval_loss"])
        elif kind == "sync":
            norms = data["per_replica_grad_norms"]
            self._show_replicas(len(norms), data.get("replica_devices"))
            for replica, norm in enumerate(norms):
                self.grad.append(f"replica {replica}", step, norm)
            self.grad.append("synced", step, data["synced_grad_norm"])
            self.divergence.append("divergence", step, data["replica_divergence"])
        elif kind == "end":
            self.step = step
        if self._throttle.ready(force=kind in _DRAW_NOW):
            self.draw()
        else:
            self._draw_soon()

    def draw(self) -> None:
        """Redraw the figures (only the traces that changed) and the progress."""
        for plot in self.plots:
            plot.redraw()
        self._draw_progress()

    def cancel_redraw(self) -> None:
        """Cancel a redraw still waiting for its interval (the dashboard is closing)."""
        if self._late_draw is not None:
            self._late_draw.cancel()

    def _draw_soon(self) -> None:
        """Draw what a throttled event left undrawn once the interval has passed: the last points before a
        lull in the events (a run that logs rarely, a watched run between two looks at its files) are shown."""
        if self._late_draw is None or not self._late_draw.is_alive():
            self._late_draw = threading.Timer(self._throttle.interval, self._draw_late)
            self._late_draw.daemon = True
            self._late_draw.start()

    def _redraw_late(self) -> None:
        self._throttle.ready(force=True)  # restart the interval: this counts as a redraw
        self.draw()

    def _draw_progress(self) -> None:
        total = max(self.total, 1)
        self.progress.max = total
        self.progress.value = min(self.step, total)
        if self.total >= UNTIL_STOPPED:  # no end to count down to: the bar shows nothing, the label says why
            self.progress.max, self.progress.value = 1, 0
            rate = f" · {self.steps_per_s:,.1f} steps/s" if self.steps_per_s else ""
            self.progress_label.value = html.escape(f"step {self.step:,} · until stopped{rate}")
            return
        text = f"step {self.step:,} / {self.total:,}"
        if self.steps_per_s and self._running():
            remaining = max(self.total - self.step, 0) / self.steps_per_s
            minutes, seconds = divmod(round(remaining), 60)
            text += f" · {self.steps_per_s:,.1f} steps/s · ETA {minutes}:{seconds:02d}"
        elif self.steps_per_s:
            text += f" · {self.steps_per_s:,.1f} steps/s"
        self.progress_label.value = html.escape(text)

    def _clear(self) -> None:
        """Empty the live traces (not the compared runs'); the figures and traces themselves stay."""
        self.step, self.steps_per_s = 0, None
        for plot in self.plots:
            plot.clear([name for name in plot.names if not name.startswith("overlay ")])
        self._throttle.reset()
        self.draw()

    def _show_replicas(self, count: int, devices: list[list[int]] | None = None) -> None:
        """One trace per replica, in the colour of the first device it holds (its index's colour when the replicas
        are shards of one device) and named with its devices when it holds several; made once, hidden when a run
        has fewer."""
        if (count, devices) == (self._replicas, self._replica_devices):
            return
        for replica in range(count):
            name = f"replica {replica}"
            if not self.grad.has_trace(name):
                self.grad.add_trace(name, color=wb.views.device_color(replica), width=1.5)
            held = devices[replica] if devices else [replica]
            label = name if len(held) == 1 else f"{name} (devices {', '.join(map(str, held))})"
            self.grad.style(name, name=label, line={"color": wb.views.device_color(held[0])})
        for name in self.grad.names:
            if name.startswith("replica "):
                self.grad.style(name, visible=int(name.split()[1]) < count)
        self._replicas, self._replica_devices = count, devices


__all__ = ["RunView"]
