"""MeshVerdict: whether the selection trains on this machine, said as soon as anything is chosen, with a
button for each fix.

The engine gives the verdict (:func:`workbench.training_verdict`): ✓ the mode trains on the mesh here; ⚠ it
trains, but devices along axes the mode does not use hold identical copies and repeat the work; ℹ plan and
verify only (the mesh has more devices than this machine, or the batch needs more memory than it has); ✗
nothing runs it (a mode the mesh cannot carry, a batch that does not split, an unknown fault), in the
trainer's own words. Each fix (another mode, mesh or batch) is one click and goes to the selection, so every
tab follows. The Model & mode, Inspect and Train tabs all show one, and Start, Check and Verify refuse
exactly what it refuses.

Example:
    >>> verdict = MeshVerdict(Selection(mesh="data=4,model=2", mode="dp"))
    >>> verdict.fit.level, verdict.fix_labels
    ('warning', ['use mode dp-tp', 'use mesh data=8'])
    >>> verdict.apply(verdict.fit.fixes[0]); verdict.fit.level
    'ok'
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

import workbench as wb

from .common import Selection, StatusArea, guarded, level_html

LEVELS = ("ok", "warning", "plan", "error")
# Everything the verdict depends on: the mode and mesh, and the options (batch, accumulation, faults...).
JUDGED = ["mesh", "mode", "model", "model_options", "options"]


class MeshVerdict(widgets.VBox):
    """One line (✓, ⚠, ℹ or ✗ and the engine's message) and one button per fix, kept up to date.

    Args:
        selection: the :class:`~widgets.common.Selection` judged (its ``mode`` and ``mesh``).
        status: where an error from a fix button is shown (the hosting widget's status area); by
            default the verdict shows one of its own under the buttons.

    CSS hooks: the box has ``wb-verdict`` and ``wb-verdict-<level>``; each fix button has ``wb-fix``.
    """

    def __init__(self, selection: Selection | None = None, status: StatusArea | None = None, **kwargs: Any):
        self.selection = selection if selection is not None else Selection()
        own_status = status is None
        self.status = StatusArea() if own_status else status
        self.fit: wb.analysis.TrainingVerdict | None = None
        self.line = widgets.HTML()
        self.fix_buttons = widgets.HBox()
        super().__init__([self.line, self.fix_buttons, *([self.status] if own_status else [])], **kwargs)
        self.add_class("wb-verdict")
        guard = guarded(self.status)
        self._on_fix = guard(self.apply)
        self.selection.observe(guard(self._render), names=JUDGED)
        self._render()

    @property
    def fix_labels(self) -> list[str]:
        """The labels of the fix buttons shown, in order."""
        return [button.description for button in self.fix_buttons.children]

    def apply(self, fix: wb.training.MeshFix) -> None:
        """Apply ``fix`` to the selection (what its button does); the verdict redraws itself."""
        self.selection.apply_fix(fix)

    def _render(self, _change: Any = None) -> None:
        fit = self.selection.verdict()
        self.line.value = "<br>".join(level_html(text, level) for text, level in
                                      [(fit.message, fit.level), *((note, "warning") for note in fit.notes)])
        for level in LEVELS:
            self.remove_class(f"wb-verdict-{level}")
        self.add_class(f"wb-verdict-{fit.level}")
        # New buttons each time: a button's fix never changes, so a click can only apply what it says.
        old = self.fix_buttons.children
        self.fix_buttons.children = [self._button(fix) for fix in fit.fixes]
        for button in old:
            button.close()
        self.fit = fit

    def _button(self, fix: wb.training.MeshFix) -> widgets.Button:
        what = "mode" if fix.mode else "mesh" if fix.mesh else "global batch"
        button = widgets.Button(description=fix.label, icon="wrench", layout=widgets.Layout(width="auto"),
                                tooltip=f"set the {what} to {fix.mode or fix.mesh or fix.batch}")
        button.add_class("wb-fix")
        button.on_click(lambda _button: self._on_fix(fix))  # each button applies the fix it was made for
        return button


__all__ = ["MeshVerdict"]
