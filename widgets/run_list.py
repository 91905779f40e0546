"""RunList: the training dashboard's compare list: the runs written under ``run_root``, whose loss curves it
overlays on the live loss figure, and the one selected to watch or resume.

Every run the trainer writes (the dashboard's, the CLI's, other processes') is a folder under ``run_root``, so the
list is read back from disk (:func:`workbench.list_runs`): closing the dashboard or a crashed kernel loses nothing.
Resuming one (the dashboard's Resume run) continues it under the dashboard's mode and mesh: :func:`resume_changes`
says what that changes of its saved config, and :func:`layout_change_html` shows the layout before and after.

Example:
    >>> runs = RunList("runs", StatusArea(), overlay=print)
    >>> runs.refresh(); runs.select.options  # the runs in runs/
    (('mlp-dp (finished)', 'mlp-dp'), ('mlp-fsdp (finished)', 'mlp-fsdp'))
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ipywidgets as widgets

import workbench as wb

from .common import StatusArea, shown

Curve = tuple[str, Sequence[int], Sequence[float]]  # a run's name, its logged steps and its loss at each


class RunList:
    """The compare list and its Refresh button: every run in ``run_root``, the ones selected overlaid.

    Args:
        run_root: where the runs are.
        status: where errors and notes are shown (a run with no loss logged yet, a broken run folder).
        overlay: draws the selected runs' loss curves (:data:`Curve` each, in the order selected), replacing the
            ones drawn before.

    Attributes:
        select: the compare list (its value: the names of the runs selected).
        refresh_button: lists the runs again (the dashboard wires it).

    Like the dashboard's, :meth:`refresh` and :meth:`overlay` never raise: an error is shown in ``status``.
    """

    def __init__(self, run_root: str, status: StatusArea, overlay: Callable[[list[Curve]], None]):
        self.run_root = run_root
        self.status = status
        self._overlay = overlay
        self._refreshing = False
        self.select = widgets.SelectMultiple(options=[], rows=4, description="compare",
                                             layout=widgets.Layout(width="100%"))
        self.refresh_button = widgets.Button(description="Refresh runs", icon="refresh",
                                             tooltip=f"list the runs in {run_root!r}")
        self.select.observe(self._on_selected, names="value")

    @shown
    def refresh(self) -> None:
        """List the runs in ``run_root`` (keeping the ones selected)."""
        runs = wb.list_runs(self.run_root)
        names = {run.name for run in runs}
        keep = tuple(name for name in self.select.value if name in names)
        self._refreshing = True  # new options reset the value: that is not the user deselecting
        try:
            self.select.options = [(f"{run.name} ({run.status})", run.name) for run in runs]
            self.select.value = keep
        finally:
            self._refreshing = False

    @shown
    def overlay(self, names: Iterable[str]) -> None:
        """Select these runs and overlay their loss curves (what selecting them in the list does)."""
        names = tuple(names)
        known = {value for _, value in self.select.options}
        if any(name not in known for name in names):
            self.refresh()
            known = {value for _, value in self.select.options}
        missing = [name for name in names if name not in known]
        if missing:
            raise wb.RunError(f"no run {', '.join(map(repr, missing))} in {self.run_root!r}: choose from the "
                              "compare list")
        if names == tuple(self.select.value):
            self._draw(names)
        else:
            self.select.value = names  # the observer draws them

    def one_selected(self, verb: str) -> str | None:
        """The one run selected, or None with a message saying to select one to ``verb``."""
        chosen = self.select.value
        if len(chosen) == 1:
            return chosen[0]
        many = f" ({len(chosen)} are selected)" if chosen else ""
        self.status.show(f"select one run in the compare list to {verb} it{many}", "info")
        return None

    def _on_selected(self, change: dict) -> None:
        if not self._refreshing:
            self._draw(change["new"])

    @shown
    def _draw(self, names: Iterable[str]) -> None:
        curves: list[Curve] = []
        skipped = []
        for name in names:
            run = wb.load_run(name, self.run_root)
            try:
                steps, losses = run.series("loss")
            except wb.RunError:
                skipped.append(name)  # e.g. a run that has not logged yet
                continue
            curves.append((name, steps, losses))
        self._overlay(curves)
        if skipped:
            self.status.show(f"no loss logged yet in {', '.join(skipped)}", "warning")


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
    """The layout panel: each leaf's spec and per-device shard shape in the checkpoint ``info`` and in ``config``'s
    mode."""
    change = wb.checkpoint_layout_change(info, config)
    return ("<details open><summary>layout before and after the restore</summary>"
            f'<pre style="font-size:11px;overflow-x:auto">{html.escape(wb.layout_change_text(change))}</pre></details>')


__all__ = ["RunList", "layout_change_html", "resume_changes"]
