"""What every widget shares: a status area that shows callback errors, and the user's selection.

JupyterLab hides exceptions raised in widget callbacks (they go to the browser console), so every
callback is wrapped with :func:`guarded`: an error is shown in the widget's :class:`StatusArea` in one
line, and the widget stays usable with the user's last valid state kept.

:class:`Selection` is the one place the workbench's choices live (mesh, model, mode, rules, training
options). Widgets observe it and write to it; nothing else is shared between them, so each widget also
works alone, and a script can drive a selection without any widget.

Example:
    >>> selection = Selection(mesh="data=4,model=2", mode="dp-tp")
    >>> selection.train_config(steps=20).mesh
    'data=4,model=2'
"""

from __future__ import annotations

import contextlib
import functools
import html
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import ipywidgets as widgets
import jax
import traitlets

import workbench as wb

# The widgets' defaults, for options the user has not set: the engine's, with runs long enough (about 10 s of
# the mlp on 8 simulated devices) to try Pause, Stop and Profile before they end.
DEFAULTS = wb.TrainConfig(steps=2_000)
KEPT_LAYOUTS = 4  # layouts a selection keeps: the inspector's and the spec editor's, before and after a change

LABEL_WIDTH = "130px"  # room for every control's label ("Checkpoint every") beside its box, none cut
# Toggle buttons as narrow as their words: ipywidgets' default width pushed a two-button toggle under its label.
TOGGLE_STYLE = {"button_width": "72px", "description_width": LABEL_WIDTH}

LEVEL_STYLES = {
    "info": ("#0072B2", "ℹ"),   # Okabe-Ito blue
    "ok": ("#009E73", "✓"),     # bluish green
    "warning": ("#E69F00", "⚠"),  # orange
    "plan": ("#0072B2", "ℹ"),   # plan and verify only: blue, like information, never a ✓
    "error": ("#D55E00", "✗"),  # vermillion: colour-blind safe against the green
}


HIGHLIGHT = "#fff1cc"  # a pale tint behind a selected row; the ▶ marker says it without colour too
_CELL = "padding:2px 8px;text-align:left;white-space:nowrap"
_TABLE_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"


def html_table(headers: list[str], rows: list[list[str]], highlight: int | None = None,
               right: tuple[int, ...] = ()) -> str:
    """An HTML table of already-escaped cells; row ``highlight`` gets a tint and a ▶ marker; the columns
    ``right`` are aligned right (figures).

    Example:
        >>> "<td" in html_table(["a"], [["1"]], highlight=0, right=(0,))
        True
    """
    def style(column: int) -> str:
        return _CELL.replace("text-align:left", "text-align:right") if column in right else _CELL

    head = "".join(f'<th style="{style(i - 1)};border-bottom:1px solid #888">{h}</th>'
                   for i, h in enumerate(["", *headers]))
    body = []
    for number, row in enumerate(rows):
        chosen = number == highlight
        tint = f' style="background:{HIGHLIGHT};font-weight:bold"' if chosen else ""
        marked = ["▶" if chosen else "", *row]
        cells = "".join(f'<td style="{style(i - 1)}">{cell}</td>' for i, cell in enumerate(marked))
        body.append(f"<tr{tint}>{cells}</tr>")
    return f'<table style="{_TABLE_STYLE}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def level_html(text: str, level: str) -> str:
    """``text`` (escaped) after its level's mark, in its level's colour: how every status and verdict looks.

    Example:
        >>> level_html("a < b", "warning")
        '<span style="color:#E69F00">⚠ a &lt; b</span>'
    """
    color, mark = LEVEL_STYLES[level]
    return f'<span style="color:{color}">{mark} {html.escape(text)}</span>'


class StatusArea(widgets.HTML):
    """One line of status under a widget; errors stay until the next action replaces them.

    ``messages`` keeps every (level, text) shown, newest last, so tests and users can read what happened.
    """

    def __init__(self, **kwargs: Any):
        super().__init__(value="", layout=widgets.Layout(min_height="1.6em"), **kwargs)
        self.add_class("wb-status")  # CSS hooks (wb-*) name the parts a user and the browser tests look for
        self.messages: list[tuple[str, str]] = []

    def show(self, text: str, level: str = "info") -> None:
        self.messages.append((level, text))
        self.value = level_html(text, level)

    def clear(self) -> None:
        self.value = ""

    @property
    def last(self) -> tuple[str, str] | None:
        """The last (level, text) shown, or None."""
        return self.messages[-1] if self.messages else None


P = ParamSpec("P")
R = TypeVar("R")


def guarded(status: StatusArea) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Decorate a widget callback: any exception is shown in ``status`` instead of vanishing.

    A :class:`workbench.WorkbenchError` is bad input and is shown as is; anything else is a bug and is
    shown with its type, so a user can report it.

    Example:
        >>> status = StatusArea()
        >>> @guarded(status)
        ... def on_click(_):
        ...     raise wb.MeshError("mesh 'data=0' ...")
        >>> on_click(None); status.last
        ('error', "mesh 'data=0' ...")
    """

    def decorate(callback: Callable[P, R]) -> Callable[P, R | None]:
        @functools.wraps(callback)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            try:
                return callback(*args, **kwargs)
            except wb.WorkbenchError as error:
                status.show(str(error), "error")
            except Exception as error:  # noqa: BLE001 - shown, never lost: JupyterLab would hide it
                status.show(f"{type(error).__name__}: {error}", "error")
            return None

        return wrapper

    return decorate


class ShowsStatus(Protocol):
    """A widget with a status area (what :func:`shown` shows its method's errors in)."""

    @property
    def status(self) -> StatusArea: ...


W = TypeVar("W", bound=ShowsStatus)


def shown(method: Callable[Concatenate[W, P], R]) -> Callable[Concatenate[W, P], R | None]:
    """Decorate a public method of a widget with a ``status``: any error is shown there instead of being raised, as
    :func:`guarded` does for a callback (JupyterLab would hide an exception raised in a widget callback).

    Example:
        >>> class Panel:
        ...     status = StatusArea()
        ...     @shown
        ...     def load(self, name):
        ...         raise wb.RunError(f"no run {name!r}")
        >>> Panel().load("x"), Panel.status.last
        (None, ('error', "no run 'x'"))
    """

    @functools.wraps(method)
    def wrapper(self: W, *args: P.args, **kwargs: P.kwargs) -> R | None:
        return guarded(self.status)(method)(self, *args, **kwargs)

    return wrapper


class Quiet:
    """True while a widget changes its own controls from code, so their observers can tell that from a
    user's change and stay still.

    Example:
        >>> quiet = Quiet()
        >>> with quiet():
        ...     bool(quiet)
        True
        >>> bool(quiet)
        False
    """

    def __init__(self) -> None:
        self._on = False

    def __bool__(self) -> bool:
        return self._on

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self._on = True
        try:
            yield
        finally:
            self._on = False


class Selection(traitlets.HasTraits):
    """The workbench's current choices, all plain values; every value here is valid (widgets check
    input with the engine before writing it). Mode, mesh and batch are each valid but need not go together:
    :meth:`verdict` says whether they train here, and :meth:`apply_fix` applies one of its fixes.

    Attributes:
        mesh: mesh text, e.g. ``"data=8"``; may be larger than the local devices (planning). Default: every
            device this machine has, over ``data``.
        axis_types: ``"auto"`` or ``"explicit"``.
        model, model_options: a registered model and overrides of its preset.
        mode: a parallel mode.
        rules: ``[(regex, spec text), ...]`` applied to the parameters; empty: the mode's standard rules.
        options: training options (:class:`workbench.TrainConfig` fields: optimizer, lr, batch, steps,
            accum, precision, faults, ...).
    """

    mesh = traitlets.Unicode()
    axis_types = traitlets.Unicode("auto")
    model = traitlets.Unicode("mlp")
    model_options = traitlets.Dict()
    mode = traitlets.Unicode("dp")
    rules = traitlets.List()
    options = traitlets.Dict()

    def __init__(self, **traits: Any):
        super().__init__(**traits)
        # The last few model layouts, by everything they depend on (see :meth:`model_layout`).
        self._layouts: dict[tuple, wb.analysis.ModelLayout] = {}

    @traitlets.default("mesh")
    def _every_local_device(self) -> str:
        # What this machine trains on: 8 simulated devices on a laptop, 2 for a student of a large class, 1 GPU.
        return f"data={jax.device_count()}"

    def mesh_shape(self) -> wb.MeshShape:
        return wb.parse_mesh(self.mesh)

    def verdict(self) -> wb.analysis.TrainingVerdict:
        """Whether the selection trains on this machine (:func:`workbench.training_verdict`): its mode on its
        mesh, its batch, this machine's devices and memory, with the fixes to offer.

        Example:
            >>> Selection(mesh="data=8", mode="tp").verdict().level
            'error'
        """
        return wb.training_verdict(self._config())

    def options_for_mode(self, name: str) -> dict[str, Any]:
        """The training options, less the teaching faults mode ``name`` cannot have."""
        supported = wb.training.mode_class(name).supported_faults
        return {**self.options, "faults": tuple(f for f in self.options.get("faults", ()) if f in supported)}

    def use_mode(self, name: str) -> None:
        """Switch to mode ``name``: its standard specs apply (custom rules are dropped), and faults it
        cannot have are dropped."""
        with self.hold_trait_notifications():
            self.options = self.options_for_mode(name)
            self.rules = []
            self.mode = name

    def apply_fix(self, fix: wb.training.MeshFix) -> None:
        """Apply one of :meth:`verdict`'s fixes: its mode (as :meth:`use_mode`), its mesh, its batch.

        Example:
            >>> selection = Selection(mesh="data=512", mode="dp")
            >>> selection.apply_fix(selection.verdict().fixes[0]); selection.options["batch"]
            512
        """
        with self.hold_trait_notifications():
            if fix.mode is not None:
                self.use_mode(fix.mode)
            if fix.mesh is not None:
                self.mesh = str(wb.parse_mesh(fix.mesh))
            if fix.batch is not None:
                self.options = {**self.options, "batch": fix.batch}

    def model_layout(self, batch: int | None = None) -> wb.analysis.ModelLayout:
        """The :class:`workbench.analysis.ModelLayout` of the current choices (one global batch of ``batch`` examples,
        default the Global batch option).

        The last few are kept: every widget showing the selection asks for one after each change, and a
        512-device transformer layout is worth computing once.
        """
        key = (self.model, self.mesh, self.mode, tuple(map(tuple, self.rules)),
               tuple(sorted(self.model_options.items())),
               self.options.get("optimizer", DEFAULTS.optimizer), batch or self.options.get("batch", DEFAULTS.batch))
        kept = self._layouts
        if key not in kept:
            kept[key] = wb.model_layout(
                self.model, self.mesh, self.mode, rules=self.rules or None, model_options=dict(self.model_options),
                optimizer=key[5], batch=key[6],
            )
            while len(kept) > KEPT_LAYOUTS:
                kept.pop(next(iter(kept)))
        return kept[key]

    def smallest_batch(self) -> int:
        """The smallest global batch the mode splits on the mesh (a layout of the parameters needs no more).

        Example:
            >>> Selection(mesh="data=4,model=2", mode="dp").smallest_batch()
            4
        """
        return wb.training.mode_class(self.mode).batch_parts(self.mesh_shape())

    def train_config(self, **overrides: Any) -> wb.TrainConfig:
        """A checked :class:`workbench.TrainConfig` for the current choices (WorkbenchError if invalid)."""
        return self.resolved_config(**overrides).config

    def resolved_config(self, **overrides: Any) -> wb.training.ResolvedConfig:
        """The current choices checked and resolved once (:meth:`workbench.TrainConfig.resolved`): the record an
        action hands down (the verdict, the trainer and the check take it as it is). WorkbenchError if invalid.

        Example:
            >>> Selection(mesh="data=4, model=2", mode="fsdp").resolved_config().mesh_shape.axes
            {'data': 4, 'model': 2}
        """
        return self._config(**overrides).resolved()

    def _config(self, **overrides: Any) -> wb.TrainConfig:
        fields = {"model": self.model, "data": wb.analysis.default_data(self.model), "mode": self.mode,
                  "mesh": self.mesh, "steps": DEFAULTS.steps, "model_options": dict(self.model_options),
                  **self.options, **overrides}
        return wb.TrainConfig(**fields)
