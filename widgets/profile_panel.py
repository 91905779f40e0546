"""ProfilePanel: "Profile N steps" of the running run, then its timeline, tables and memory, inline.

A click asks the trainer for a profile (:meth:`workbench.Trainer.profile` with ``wait=False``) and returns
at once; the training loop takes it at its next steady step. When the trainer's ``profile`` event arrives
(:meth:`ProfilePanel.show_capture`, called by the dashboard's subscriber), a background thread reads it with
:func:`workbench.read_profile` (up to a second: never on the training thread) and shows, each drawn by the
engine's views: the timeline of one profiled step (a dropdown picks which), the step and collective tables,
the memory figure with its flags, and where the full trace is. A refused profile (no run, one being taken,
across processes), a failed capture or an unreadable trace is shown in the panel's status line, with the
folder of the raw files; the last result stays.

CSS hooks: ``wb-profile-panel``, ``wb-profile`` (the button), ``wb-profile-steps``, ``wb-profile-timeline``,
``wb-profile-memory``.

Example:
    >>> panel = ProfilePanel(lambda: trainer)  # the dashboard composes one and hands it the profile events:
    >>> unsubscribe = trainer.subscribe(lambda event: event.kind == "profile" and panel.show_capture(event.data))
    >>> name = trainer.start(steps=1000); panel.set_active(True)
    >>> request = panel.profile()  # what a click on panel.profile_button does: returns at once
    >>> capture = request.result(60); trainer.stop(); summary = trainer.wait(); trainer.status
    'stopped'
    >>> len(panel.wait(30).timeline.steps)
    5
    >>> unsubscribe()
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

import workbench as wb

from .common import Quiet, StatusArea, guarded, level_html
from .figure_widget import FigureWidget, replace_figure

DEFAULT_STEPS = 5
MAX_STEPS = 100  # the engine's limit: a few steady steps show the pattern


def _pre(text: str) -> str:
    return f'<pre style="font-size:11px;overflow-x:auto;margin:4px 0">{html.escape(text)}</pre>'


def flags_html(memory: Any) -> str:
    """The memory comparison's flags as a list (or that live matches the prediction), and why a figure is missing.

    Example:
        >>> flags_html(wb.analysis.MemoryComparison((), ("device 0: 1.2 MiB live, +40% ...",)))
        '<ul style="margin:4px 0"><li><span style="color:#E69F00">⚠ device 0: 1.2 MiB live, +40% ...</span></li></ul>'
    """
    items = [level_html(flag, "warning") for flag in memory.flags]
    items += [level_html(note, "info") for note in wb.views.missing_figures(memory)]
    if not items:
        return level_html("live bytes match the prediction on every device", "ok")
    return '<ul style="margin:4px 0">' + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


class ProfilePanel(widgets.VBox):
    """The Profile control (steps, button), its status line, and the last profile read.

    Args:
        trainer: returns the trainer to profile (the dashboard's current one), or None before any run.

    Attributes:
        steps: how many steady steps to profile (1-100).
        profile_button: asks for the profile; enabled while a run is active (:meth:`set_active`).
        status: refusals, progress and errors (:class:`~widgets.common.StatusArea`).
        step_picker: which profiled step the timeline shows (training step numbers).
        timeline, memory: the figures (:class:`~widgets.figure_widget.FigureWidget`, made on the first result);
            tables, memory_text, flags, how_to_open: HTML.
        report: the :class:`workbench.analysis.ProfileReport` shown, None before one.
    """

    def __init__(self, trainer: Callable[[], Any], **kwargs: Any):
        self._trainer = trainer
        self.report: Any = None
        self._reader: threading.Thread | None = None
        self._quiet = Quiet()
        self.status = StatusArea()
        self.steps = widgets.BoundedIntText(value=DEFAULT_STEPS, min=1, max=MAX_STEPS, description="steps",
                                            layout=widgets.Layout(width="150px"))
        self.steps.add_class("wb-profile-steps")
        self.profile_button = widgets.Button(
            description="Profile", icon="clock-o", disabled=True,
            tooltip="profile the running run's next steady steps with JAX's profiler: per-device timeline and memory")
        self.profile_button.add_class("wb-profile")
        self.step_picker = widgets.Dropdown(description="step", layout=widgets.Layout(width="220px"))
        self.timeline: FigureWidget | None = None
        self.memory: FigureWidget | None = None
        self.tables, self.flags, self.memory_text, self.how_to_open = (widgets.HTML() for _ in range(4))
        self._timeline_box = widgets.VBox(layout=widgets.Layout(width="100%"))
        self._result = widgets.VBox(layout=widgets.Layout(width="100%"))
        self.profile_button.on_click(guarded(self.status)(lambda _: self.profile()))
        self.step_picker.observe(guarded(self.status)(self._on_step_picked), names="value")
        super().__init__([widgets.HBox([self.steps, self.profile_button]), self.status, self._result], **kwargs)
        self.add_class("wb-profile-panel")

    # --- the kernel's side ------------------------------------------------------------------------------

    def set_active(self, active: bool) -> None:
        """Enable Profile while a run of this kernel is active (the dashboard calls it as its buttons change)."""
        self.profile_button.disabled = not active

    def profile(self, steps: int | None = None) -> Any:
        """Ask the trainer for a profile of ``steps`` (default: the steps box) steady steps; returns at once with
        the :class:`workbench.training.ProfileRequest`. Raises the engine's ProfileError when it refuses (the button
        shows it in :attr:`status`)."""
        steps = self.steps.value if steps is None else steps
        trainer = self._trainer()
        if trainer is None:
            raise wb.training.ProfileError("no run to profile: press Start, then Profile while it trains")
        # Shown before asking: the profile event may come back (on the training thread) before the call returns,
        # and its line must be the last word. A refusal replaces this line with its message.
        self.status.show(f"profiling {steps} steps of {trainer.run_name} at the next steady step…", "info")
        return trainer.profile(steps, wait=False)  # its profile event brings the result, or why none was taken

    def wait(self, timeout: float | None = None) -> Any:
        """Wait (at most ``timeout`` seconds) for the profile being read to be shown; returns :attr:`report`.
        For scripts and tests: in a notebook the panel updates itself."""
        reader = self._reader
        if reader is not None:
            reader.join(timeout)
        return self.report

    # --- the background side ----------------------------------------------------------------------------

    def show_capture(self, capture: dict[str, Any]) -> None:
        """Read and show a capture (a ``profile`` event's data: run, folder, steps, error) in a background
        thread: called by the dashboard's subscriber on the training thread, which must not wait for it."""
        self._reader = threading.Thread(target=guarded(self.status)(self._read), args=(capture,),
                                        name="workbench-profile-reader", daemon=True)
        self._reader.start()

    def _read(self, capture: dict[str, Any]) -> None:
        folder = capture["folder"]
        if capture.get("error") and not capture.get("steps"):
            where = f"; any raw files are in {folder}" if folder else ""
            self.status.show(f"no profile was taken: {capture['error']}{where}", "error")
            return
        self.status.show(f"reading the profile of {capture['steps']} steps in {folder}…", "info")
        report = wb.read_profile(folder)
        self._show(report)
        if report.capture_error:
            self.status.show(f"the capture failed: {report.capture_error}; the raw files are in {report.folder}",
                             "error")
        elif report.timeline is None:
            self.status.show(f"the trace could not be read: {report.timeline_error}; memory is shown, the raw files "
                             f"are in {report.folder}", "error")
        else:
            note = "".join(f" ({text})" for text in (capture.get("note"), *report.notes) if text)
            self.status.show(f"profiled training steps {report.first_step} to {report.first_step + report.steps - 1}"
                             f" of {report.run}{note}", "ok")

    def _show(self, report: Any) -> None:
        """Draw ``report``: everything is computed first, then the widgets change."""
        memory_figure = wb.memory_figure(report.memory)
        timeline = report.timeline
        timeline_figure = wb.timeline_figure(timeline, 0) if timeline is not None else None
        timeline_widget, memory_widget = self._result_figures()
        self.report = report
        if timeline is not None and timeline_figure is not None:  # one exists exactly when the other does
            replace_figure(timeline_widget, timeline_figure)
            with self._quiet():  # a new profile shows its first step: already drawn above
                self.step_picker.options = [(f"step {timeline.first_step + i}", i) for i in range(len(timeline.steps))]
                self.step_picker.value = 0
            self.tables.value = _pre(wb.views.timeline_table(timeline))
        else:
            self.tables.value = level_html(f"no timeline: {report.timeline_error}", "error")
        self._timeline_box.layout.display = None if timeline is not None else "none"
        replace_figure(memory_widget, memory_figure)
        self.flags.value = flags_html(report.memory)
        self.memory_text.value = ("<details><summary>memory per device, as a table</summary>"
                                  f"{_pre(wb.views.memory_table(report.memory))}</details>")
        self.how_to_open.value = f'<div style="font-size:12px">{html.escape(report.how_to_open())}</div>'

    def _result_figures(self) -> tuple[FigureWidget, FigureWidget]:
        """The timeline and memory figures, made on the first result: a dashboard that never profiles stays light."""
        if self.timeline is None or self.memory is None:
            self.timeline, self.memory = FigureWidget(), FigureWidget()
            self.timeline.add_class("wb-profile-timeline")
            self.memory.add_class("wb-profile-memory")
            self._timeline_box.children = [self.step_picker, self.timeline]
            self._result.children = [self._timeline_box, self.tables, self.memory, self.flags, self.memory_text,
                                     self.how_to_open]
        return self.timeline, self.memory

    def _on_step_picked(self, change: dict) -> None:
        if (self._quiet or self.timeline is None or self.report is None or self.report.timeline is None
                or change["new"] is None):
            return
        replace_figure(self.timeline, wb.timeline_figure(self.report.timeline, change["new"]))


__all__ = ["ProfilePanel", "flags_html"]
