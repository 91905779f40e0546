"""RecommendPanel: "Which layout?" for the selection's model, on a fleet the user names, in the background.

A click runs the engine's :func:`workbench.recommend` on a thread (the kernel stays free): every mode, mesh, remat
policy and microbatch count is priced, the best ``top`` are compiled for the target, and the answer is shown as a
table, :func:`workbench.views.recommendation_figure` (memory against step time, the verified ones marked, the chip's
memory as a line) and one line per family not chosen. Cancel sets the engine's ``stop`` event: the compiles are
killed within a fraction of a second. "Use this layout" writes the picked candidate's mesh, mode, remat,
microbatches and batch into the :class:`~widgets.common.Selection`, so the other tabs and the Verify panel show it;
"Export code" and "Export test" show :func:`workbench.analysis.layout_code` and
:func:`workbench.analysis.budget_test_code`.

CSS hooks: ``wb-recommend-panel``, ``wb-recommend``, ``wb-recommend-cancel``, ``wb-recommend-table``,
``wb-recommend-figure``, ``wb-recommend-use``, ``wb-recommend-export``.

Your own module: ``RecommendPanel(own=wb.analysis.OwnModel(make_model, loss_fn, example_batch, rules))`` weighs it
instead of the selection's model, compiles its top layouts the same way, and exports its code and budget test
(``imports`` names your builder and loss for the test where a test file cannot import them, e.g. a notebook's);
"Use this layout" is for registered models, which the other tabs show.

Example:
    >>> panel = RecommendPanel(Selection(model="mlp"))
    >>> panel.target.value, panel.top.value = "cpu", 1
    >>> panel.recommend(); panel.wait(120).chosen.mode  # doctest: +SKIP
    'tp'
"""

from __future__ import annotations

import html
import threading
from typing import Any

import ipywidgets as widgets
import jax

import workbench as wb

from .common import DEFAULTS, LABEL_WIDTH, Selection, StatusArea, guarded, html_table, level_html
from .figure_widget import FigureWidget, replace_figure

COMPILE_TIMEOUT_S = 300.0  # each compile the engine starts may take this long before its child is killed
DEFAULT_TOP = 3  # layouts compiled, as ``workbench recommend``'s default: the best few, each a child process
SHOWN_ROWS = 10  # the table's rows: the engine ranks every layout, a person reads the first few
UNITS = ("sequences", "tokens")
_STYLE = {"description_width": LABEL_WIDTH}


class RecommendPanel(widgets.VBox):
    """The fleet and batch inputs, Recommend and Cancel, the answer, and "Use this layout".

    Args:
        selection: the :class:`~widgets.common.Selection` whose model is weighed and which "Use this layout" sets.
        timeout: seconds each compile may take (default :data:`COMPILE_TIMEOUT_S`).
        own: your own module with its loss, example batch and rules (an :class:`workbench.analysis.OwnModel`),
            weighed instead of the selection's model.
        imports: where the exported budget test imports your builder and loss from (see
            :func:`workbench.analysis.budget_test_code`).

    Attributes:
        target, batch, unit, seq_len, top, verify: the inputs (``cpu``, ``gpu:h100:512``, ``tpu:v5p:8x8x8``).
        recommend_button, cancel_button, use_button, code_button, test_button: the actions.
        progress: the engine's progress lines; status: errors and notes; table, families: HTML; figure: plotly.
        pick: which candidate "Use this layout" and the exports take (the chosen one first).
        export: the exported code or pytest file (a Textarea).
        recommendation: the :class:`workbench.analysis.Recommendation` shown, None before one.
    """

    def __init__(self, selection: Selection | None = None, *, timeout: float = COMPILE_TIMEOUT_S,
                 own: wb.analysis.OwnModel | None = None, imports: dict[str, str] | None = None, **kwargs: Any):
        self.selection = selection if selection is not None else Selection()
        self.timeout = timeout
        self.own, self.imports = own, imports
        self.recommendation: wb.analysis.Recommendation | None = None
        self._caption = ""  # what the answer shown was asked, above its table
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._lines: list[str] = []
        self.status = StatusArea()
        self.target = widgets.Text(value="cpu", description="fleet", style=_STYLE,
                                   placeholder="cpu, gpu:h100:512 or tpu:v5p:8x8x8")
        self.batch = widgets.IntText(value=self.selection.options.get("batch", DEFAULTS.batch),
                                     description="global batch", style=_STYLE)
        self.unit = widgets.ToggleButtons(options=UNITS, value="sequences", style={"button_width": "90px"})
        self.seq_len = widgets.IntText(value=0, description="seq len", style=_STYLE,
                                       tooltip="tokens per sequence; 0: the model's own")
        self.top = widgets.BoundedIntText(value=DEFAULT_TOP, min=0, max=10,
                                          description="compile top", style=_STYLE)
        self.verify = widgets.Checkbox(value=True, description="verify with the target's compiler", indent=False)
        self.recommend_button = widgets.Button(description="Recommend", button_style="primary", icon="search")
        self.recommend_button.add_class("wb-recommend")
        self.cancel_button = widgets.Button(description="Cancel", icon="stop", disabled=True)
        self.cancel_button.add_class("wb-recommend-cancel")
        self.progress = widgets.HTML()
        self.table = widgets.HTML()
        self.table.add_class("wb-recommend-table")
        self.figure = FigureWidget()
        self.figure.add_class("wb-recommend-figure")
        self._figure_frame = widgets.Box([self.figure], layout=widgets.Layout(display="none", width="100%"))
        self.families = widgets.HTML()
        self.stale = widgets.HTML()
        self.stale.add_class("wb-recommend-stale")
        self._asked: tuple | None = None  # what the answer shown was asked for (see _asked_key)
        self.pick = widgets.Dropdown(options=[], description="layout", style=_STYLE,
                                     layout=widgets.Layout(width="420px"))
        self.use_button = widgets.Button(description="Use this layout", icon="check", disabled=True)
        self.use_button.add_class("wb-recommend-use")
        self.code_button = widgets.Button(description="Export code", icon="code", disabled=True)
        self.test_button = widgets.Button(description="Export test", icon="file", disabled=True)
        self.export = widgets.Textarea(layout=widgets.Layout(width="100%", height="220px", display="none"))
        self.export.add_class("wb-recommend-export")

        self.recommend_button.on_click(guarded(self.status)(self.recommend))
        self.cancel_button.on_click(guarded(self.status)(self.cancel))
        self.use_button.on_click(guarded(self.status)(self.use_layout))
        self.code_button.on_click(guarded(self.status)(self.export_code))
        self.test_button.on_click(guarded(self.status)(self.export_test))
        weighed = "the selected model" if own is None else html.escape(own.described)
        intro = widgets.HTML(f"<b>Which layout?</b> Every mode, mesh, remat policy and microbatch count for {weighed} "
                             "on the fleet, ranked by predicted step time; the best few compiled for the target. "
                             + ("Pick one and use it in the other tabs." if own is None else
                                "Pick one and export it as code or as a budget test."))
        super().__init__([
            intro, widgets.HBox([self.target, self.top, self.verify]),
            widgets.HBox([self.batch, self.unit, self.seq_len]),
            widgets.HBox([self.recommend_button, self.cancel_button]), self.progress, self.status, self.stale,
            self.table,
            self._figure_frame, self.families,
            widgets.HBox([self.pick, self.use_button, self.code_button, self.test_button]), self.export,
        ], **kwargs)
        self.add_class("wb-recommend-panel")
        self.selection.observe(guarded(self.status)(self._mark_stale), names=["model", "model_options", "options"])
        self.pick.observe(lambda change: self._draw_table(change["new"]), names="value")

    # --- public actions ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a recommendation started here is still going."""
        return self._worker is not None and self._worker.is_alive()

    def recommend(self, _button: Any = None) -> None:
        """Start recommending a layout for the selection's model on :attr:`target`; returns at once.

        The inputs are read now (the batch must be positive); the engine's own bad-input errors (an unknown
        target, a batch no mesh splits, a model that fits nothing) arrive in :attr:`status` when it refuses,
        and the last answer stays.
        """
        if self.running:
            raise wb.WorkbenchError("a recommendation is already running: wait for it, or Cancel it first")
        if self.batch.value <= 0:
            raise wb.WorkbenchError(f"the global batch must be a positive number of {self.unit.value}, "
                                    f"not {self.batch.value}")
        seq_len = self.seq_len.value or None
        by_tokens = self.unit.value == "tokens"
        if by_tokens and seq_len is None:
            raise wb.WorkbenchError("a batch in tokens needs a seq len: tokens per step = sequences x seq len")
        own = self.own
        request = {
            "model": self.selection.model if own is None else own.model, "target": self.target.value.strip() or "cpu",
            "global_batch": None if by_tokens else self.batch.value,
            "global_batch_tokens": self.batch.value if by_tokens else None, "seq_len": seq_len,
            "model_options": dict(self.selection.model_options) or None,
            "optimizer": self.selection.options.get("optimizer", DEFAULTS.optimizer),
            "precision": self.selection.options.get("precision", DEFAULTS.precision),
            "top": self.top.value, "verify": self.verify.value, "timeout": self.timeout,
        }
        if own is not None:  # your module (or a registered one with your rules): its own inputs, no preset options
            request.update(loss=own.loss, example_batch=own.example_batch, rules=own.rules,
                           model_options=None if own.module is not None else request["model_options"])
        self._stop = threading.Event()
        self._lines = []
        asked = self._asked_key()
        self.recommend_button.disabled, self.cancel_button.disabled = True, False
        weighed = request["model"] if own is None else own.described
        self.status.show(f"weighing layouts of {weighed} on {request['target']}; the kernel stays free")
        self._worker = threading.Thread(target=self._run, args=(request, self._stop, asked), daemon=True,
                                        name="workbench-recommend-panel")
        self._worker.start()

    def cancel(self, _button: Any = None) -> None:
        """Stop the running recommendation: the engine stops between layouts and kills its compiles."""
        if self.running:
            self._stop.set()

    def wait(self, timeout: float | None = None) -> wb.analysis.Recommendation | None:
        """Wait (at most ``timeout`` seconds) for the running recommendation; returns :attr:`recommendation`.

        For scripts and tests: in a notebook the panel updates itself.
        """
        if self._worker is not None:
            self._worker.join(timeout)
        return self.recommendation

    def picked(self) -> wb.analysis.Candidate:
        """The candidate :attr:`pick` names (the chosen one unless the user picked another)."""
        if self.recommendation is None:
            raise wb.WorkbenchError("no recommendation yet: click Recommend first")
        return self.recommendation.candidates[self.pick.value or 0]

    def use_layout(self, _button: Any = None) -> None:
        """Write the picked candidate's mode, mesh, remat, microbatches and batch into the selection.

        A mesh larger than this machine's devices is kept (the Verify panel compiles it on an abstract mesh),
        and the status says that training it needs the fleet.
        """
        candidate = self.picked()
        if self.own is not None:
            raise wb.WorkbenchError(f"the other tabs show registered models, not {self.own.described}: export "
                                    "this layout as code (Export code) or as a budget test (Export test)")
        settings = wb.analysis.layout_settings(candidate)
        selection = self.selection
        with selection.hold_trait_notifications():
            selection.model = settings["model"]
            selection.model_options = settings["model_options"]
            selection.use_mode(settings["mode"])
            selection.mesh = settings["mesh"]
            selection.options = {**selection.options, **{name: settings[name] for name in
                                                         ("batch", "accum", "remat", "optimizer", "precision")}}
        said = (f"using {candidate.mode} on {candidate.mesh}, remat {candidate.remat}, {candidate.accum} "
                f"microbatch{'es' if candidate.accum > 1 else ''}, batch {settings['batch']:,}")
        needed, here = candidate.mesh.size, jax.device_count()
        if needed > here:
            self.status.show(f"{said}: the Mesh, Model & mode and Specs tabs and the Verify panel show it "
                             f"(compiled on an abstract mesh); training it needs {needed:,} devices, this "
                             f"machine has {here}", "warning")
        else:
            self.status.show(f"{said}: every tab shows it, and Train trains it here", "ok")

    def export_code(self, _button: Any = None) -> None:
        """Show the picked layout as a script snippet (mesh, rules, remat, microbatches)."""
        self._show_export(wb.analysis.layout_code(self.picked()))

    def export_test(self, _button: Any = None) -> None:
        """Show the picked layout's budget test: a pytest file for the user's CI (a verified layout only)."""
        answer = self.recommendation
        self._show_export(wb.analysis.budget_test_code(self.picked(), own=answer.own if answer else None,
                                                       imports=self.imports))

    def close(self) -> None:
        """Stop a running recommendation (its compiles are killed), then close the panel."""
        self.cancel()
        self.wait(10)
        super().close()

    # --- the background side ----------------------------------------------------------------------------

    def _run(self, request: dict[str, Any], stop: threading.Event, asked: tuple) -> None:
        """Run the engine on this thread; show its answer, or why there is none (the last answer kept)."""
        try:
            answer = wb.recommend(**request, on_progress=self._progress, stop=stop)
        except wb.WorkbenchError as error:
            cancelled = stop.is_set()
            self.status.show("cancelled: the compiles were stopped; the last answer stays" if cancelled
                             else str(error), "warning" if cancelled else "error")
            return
        except Exception as error:  # noqa: BLE001 - shown, never lost: JupyterLab would hide it
            self.status.show(f"{type(error).__name__}: {error}", "error")
            return
        finally:
            self.recommend_button.disabled, self.cancel_button.disabled = False, True
            self.progress.value = ""
        self._asked = asked
        self._show(answer)
        self._mark_stale()

    def _asked_key(self) -> tuple:
        """What a recommendation depends on in the selection: the model, its options, optimizer and precision (a
        mode, mesh or batch set by "Use this layout" is the answer, not the question)."""
        if self.own is not None:  # your module is the question, whatever the selection shows
            return ("own",)
        options = self.selection.options
        return (self.selection.model, repr(sorted(dict(self.selection.model_options).items())),
                options.get("optimizer", DEFAULTS.optimizer), options.get("precision", DEFAULTS.precision))

    @property
    def is_stale(self) -> bool:
        """Whether an answer is shown and the selection's model, options, optimizer or precision changed since."""
        return self.recommendation is not None and self._asked != self._asked_key()

    def _mark_stale(self, _change: Any = None) -> None:
        if not self.is_stale:
            self.stale.value = ""
            return
        answer = self.recommendation
        assert answer is not None
        self.stale.value = level_html(f"Stale: the answer below is for {answer.model}, {answer.optimizer}, "
                                      f"{answer.precision}; the selected model or its settings changed since. "
                                      "Recommend again to update it.", "warning")

    def _progress(self, text: str) -> None:
        self._lines.append(text)
        self.progress.value = "<br>".join(f"⏳ {html.escape(line)}" for line in self._lines[-4:])

    def _show(self, answer: wb.analysis.Recommendation) -> None:
        best = answer.chosen
        figure = wb.views.recommendation_figure(answer)
        self.recommendation = answer
        # The caption says what was asked: the selection may change after the answer, the answer does not.
        tokens = f" x {answer.seq_len:,} tokens" if answer.seq_len else ""
        caption = (f"{answer.model} on {answer.target} ({answer.devices:,} chips), batch {answer.global_batch:,}"
                   f"{tokens}, {answer.optimizer}, {answer.precision}: {answer.analysed} layouts analysed, "
                   f"{len(answer.candidates)} fit")
        self._caption = f"<b>{html.escape(caption)}</b>"
        self._draw_table(0)
        replace_figure(self.figure, figure)
        self._figure_frame.layout.display = None
        lines = [level_html(f"{family.mode} ({family.verdict}): {family.reason}", "info") for family in answer.rejected]
        lines += [level_html(line, "warning") for line in answer.refusals]  # the compiler's no outranks the plan's yes
        if answer.verification_note:
            lines.append(level_html(answer.verification_note, "warning"))
        self.families.value = "<br>".join(lines)
        self.pick.options = [(f"{c.rank}. {c.mode} on {c.mesh}, remat {c.remat}, x{c.accum}"
                              f"{' (verified)' if c.verified else ''}", i) for i, c in enumerate(answer.candidates)]
        self.pick.value = 0
        self.code_button.disabled = self.test_button.disabled = False
        self.use_button.disabled = self.own is not None  # the other tabs show registered models
        self.status.show(f"use {best.mode} on {best.mesh}, remat {best.remat}, {best.accum} microbatch(es): "
                         f"{wb.formatting.format_seconds(best.step_s)} a step, {best.bound} "
                         f"({'verified by the compiler' if best.verified else 'unverified'})", "ok")

    def _draw_table(self, picked: int | None) -> None:
        """The answer's table, the picked candidate's row marked (the first: the recommendation)."""
        if self.recommendation is None:
            return
        headers, rows = self.recommendation.table_cells(SHOWN_ROWS)
        cells = [[html.escape(cell) for cell in row] for row in rows]
        table = html_table([html.escape(h) for h in headers], cells, picked, right=wb.analysis.TABLE_FIGURES)
        self.table.value = f'{self._caption}<div style="overflow-x:auto">{table}</div>'

    def _show_export(self, text: str) -> None:
        self.export.value = text
        self.export.layout.display = None
