"""VerifyPanel: "Verify with the compiler" for the selection's step, in the background, on any mesh up to 2,048 devices.

A click starts the engine's :func:`workbench.analysis.start_verification` of the selection's step (its model and
options, mode, mesh, batch, precision, accumulation, optimizer) for ``cpu``, a TPU topology or GPUs, and returns:
a background thread redraws the progress and elapsed seconds, Cancel kills the child at once, and the
outcome is the engine's comparison (table, :func:`workbench.comparison_figure`, collectives) or its error,
inline, the last result kept. A result whose selection has changed since is marked stale.

CSS hooks: ``wb-verify-panel`` (the whole), ``wb-verify`` (the button), ``wb-verify-target``,
``wb-verify-cancel``, ``wb-verify-progress``, ``wb-verify-table``, ``wb-verify-figure``, ``wb-verify-stale``.

Example:
    >>> panel = VerifyPanel(Selection(model="mlp", mesh="data=16", mode="fsdp", options={"batch": 64}))
    >>> panel.verify(); panel.running      # returns at once: the compile runs in a child process  # doctest: +SKIP
    True
    >>> panel.wait(300).comparison.row("arguments").ratio  # the plan's figure / the compiler's  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import html
import json
import threading
from typing import Any

import ipywidgets as widgets

import workbench as wb

from .common import LEVEL_STYLES, Selection, StatusArea, guarded, level_html
from .figure_widget import FigureWidget, replace_figure

DEFAULT_CHIP = "tpu-v5p"  # the planner's default preset: the chip whose memory the plan is judged against
TICK_S = 0.5  # how often the elapsed seconds are redrawn while compiling
WATCHED = ["mesh", "model", "mode", "rules", "model_options", "options"]
# The config fields the compiled step depends on (lr, steps, logging do not change it).
COMPILED_FIELDS = ("model", "model_options", "mode", "mesh", "batch", "accum", "precision", "optimizer", "faults",
                   "remat")
RATIO_BAND = (0.85, 1.15)  # ratios outside it are highlighted: the plan is off by more than 15%
NO_KEY = (None, None, None, None)  # what a shown result depends on, for a selection that has no valid config
_CELL = "padding:2px 8px;white-space:nowrap"
# The notes wrap within the panel: unwrapped, the table scrolled inside the output's own scroll area.
NOTE_STYLE = "color:#555;white-space:normal;min-width:18em"


def comparison_table_html(comparison: wb.analysis.PlanComparison) -> str:
    """The side-by-side rows as an HTML table: figure, analytic, compiler, ratio (outside 0.85-1.15 in
    orange), and what each side counts.

    Example:
        >>> "ratio" in comparison_table_html(plan.comparison)  # plan: a verified TrainingPlan
        True
    """
    warn = f"color:{LEVEL_STYLES['warning'][0]};font-weight:bold"
    head = "".join(f'<th style="{_CELL};text-align:{align};border-bottom:1px solid #888">{name}</th>' for name, align in
                   (("per device", "left"), ("analytic", "right"), ("compiler", "right"), ("ratio", "right"),
                    ("what each side counts", "left")))
    body = []
    for row in comparison.rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        off = row.ratio is not None and not RATIO_BAND[0] <= row.ratio <= RATIO_BAND[1]
        cells = [(row.figure, "left", ""), (_value(row.analytic, row.unit), "right", ""),
                 (_value(row.compiler, row.unit), "right", ""), (ratio, "right", warn if off else ""),
                 (row.note, "left", NOTE_STYLE)]
        body.append("<tr>" + "".join(f'<td style="{_CELL};text-align:{align};{style}">{html.escape(text)}</td>'
                                     for text, align, style in cells) + "</tr>")
    return (f'<table class="wb-verify-rows" style="border-collapse:collapse;font-family:monospace;font-size:12px">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _verified(plan: wb.analysis.TrainingPlan) -> tuple[wb.analysis.CompiledStep, wb.analysis.PlanComparison]:
    """A verified plan's compiled step and its comparison with the plan. The panel shows only verified plans: one
    that is not is a bug (ValueError)."""
    compiled, comparison = plan.compiled, plan.comparison
    if compiled is None or comparison is None:
        raise ValueError(f"the plan of {plan.model} on {plan.mesh} is not verified: attach its compiled step with "
                         "plan.with_compiled(compiled)")
    return compiled, comparison


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "not modelled"
    if unit == "s":
        return wb.formatting.format_seconds(value)
    return wb.format_bytes(int(value)) if unit == "bytes" else f"{value:.3g}"


class VerifyPanel(widgets.VBox):
    """The "Verify with the compiler" button, its target, progress, Cancel, and the result.

    Args:
        selection: the :class:`~widgets.common.Selection` whose step is compiled.
        timeout: seconds the whole compile may take before its child is stopped (default: the engine's).

    Attributes:
        target: ``cpu``, a TPU topology (``tpu:v5p:8x8x8``) or GPUs (``gpu:h100:512``); offers those with the
            mesh's device count.
        chip: the hardware preset whose memory the plan is judged against (a TPU target uses its own).
        verify_button, cancel_button: start; stop at once (the child process is killed).
        progress: the compile's latest message and elapsed seconds.
        status: errors and notes (:class:`~widgets.common.StatusArea`).
        stale: a banner when the result shown is for another selection.
        table: the side-by-side rows (HTML); figure: :func:`workbench.comparison_figure` (a FigureWidget);
        collectives: the compiler's collectives with their layers and code (HTML).
        job: the :class:`workbench.analysis.VerificationJob` of the latest click; plan: the verified
            :class:`workbench.analysis.TrainingPlan` shown (``plan.compiled``, ``plan.comparison``), None before
            one.
    """

    def __init__(self, selection: Selection | None = None, *, timeout: float | None = None, **kwargs: Any):
        self.selection = selection if selection is not None else Selection()
        self.timeout = timeout
        self.job: wb.analysis.VerificationJob | None = None
        self.plan: wb.analysis.TrainingPlan | None = None
        self._shown_key: tuple = NO_KEY  # what the result shown was asked for (see _selection_key)
        self._watcher: threading.Thread | None = None
        self._closing = threading.Event()
        self._cancelled = False
        self.status = StatusArea()
        self.target = widgets.Combobox(value="cpu", description="compile for", ensure_option=False,
                                       placeholder="cpu, or tpu:<generation>:<shape>",
                                       layout=widgets.Layout(width="300px"))
        self.target.add_class("wb-verify-target")
        self.chip = widgets.Dropdown(options=list(wb.analysis.HARDWARE), value=DEFAULT_CHIP, description="chip",
                                     layout=widgets.Layout(width="220px"))
        self.verify_button = widgets.Button(
            description="Verify with the compiler", button_style="primary", icon="check",
            layout=widgets.Layout(width="220px"),
            tooltip="compile the real step for this mesh in a child process (nothing allocated) and set the "
                    "compiler's memory and collectives beside the plan's")
        self.verify_button.add_class("wb-verify")
        self.cancel_button = widgets.Button(description="Cancel", icon="stop", disabled=True)
        self.cancel_button.add_class("wb-verify-cancel")
        self.readiness = widgets.HTML()  # what Verify would refuse for the selection and target, before a click
        self.readiness.add_class("wb-verify-readiness")
        self.progress = widgets.HTML()
        self.progress.add_class("wb-verify-progress")
        self.stale = widgets.HTML()
        self.stale.add_class("wb-verify-stale")
        self.table = widgets.HTML()
        self.table.add_class("wb-verify-table")
        self.figure = FigureWidget()
        self.figure.add_class("wb-verify-figure")
        # Hidden until a result: before one there is nothing to draw, and empty axes say nothing.
        self._figure_frame = widgets.Box([self.figure], layout=widgets.Layout(display="none", width="100%"))
        self.collectives = widgets.HTML()

        # Every callback is guarded: JupyterLab would hide its errors.
        self._on_verify = guarded(self.status)(self.verify)
        self._on_cancel = guarded(self.status)(self.cancel)
        self._on_change = guarded(self.status)(self._selection_changed)
        self.verify_button.on_click(self._on_verify)
        self.cancel_button.on_click(self._on_cancel)
        self.selection.observe(self._on_change, names=WATCHED)
        self.target.observe(self._on_change, names="value")
        self.chip.observe(self._on_change, names="value")
        self._offer_targets()
        self._judge()
        intro = widgets.HTML("<b>Verify with the compiler</b>: compile this step for the mesh (up to 2,048 simulated "
                             "devices, a TPU topology with the <code>tpu</code> extra, or NVIDIA GPUs, e.g. "
                             "<code>gpu:h100:512</code>, after <code>make gpu-compile</code>; no GPU needed), "
                             "nothing allocated, and set the compiler's figures beside the plan's.")
        super().__init__([intro, widgets.HBox([self.target, self.chip]),
                          widgets.HBox([self.verify_button, self.cancel_button]), self.readiness, self.progress,
                          self.status,
                          self.stale, self.table, self._figure_frame, self.collectives], **kwargs)
        self.add_class("wb-verify-panel")

    # --- public actions ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a compile started here is still going."""
        return self.job is not None and not self.job.done

    def verify(self, _button: Any = None) -> None:
        """Start compiling the selection's step for :attr:`target`; returns at once.

        Bad input (a target the mesh cannot compile for, more than 2,048 CPU devices, libtpu missing, a
        mode that is not one jit program) raises WorkbenchError here, before any process starts; the
        button shows it in :attr:`status`, and the last result stays.
        """
        if self.running:
            raise wb.WorkbenchError("a compile is already running: wait for it, or Cancel it first")
        resolved = self.selection.resolved_config()  # once: the key, the compile's check and the plan take it
        config = resolved.config
        target = self.target.value.strip() or "cpu"
        settings = wb.VerifySettings(target) if self.timeout is None else wb.VerifySettings(target, self.timeout)
        key = self._selection_key(config)
        job = wb.analysis.start_verification(resolved, settings.target, timeout=settings.timeout,
                                             on_progress=lambda _text: self._show_progress())
        self.job, self._cancelled = job, False
        self.verify_button.disabled, self.cancel_button.disabled = True, False
        self.status.show(f"compiling the {config.mode} step of {config.model} on {config.mesh} for {job.target} "
                         "in a child process; the kernel stays free", "info")
        self._show_progress()
        self._watcher = threading.Thread(target=guarded(self.status)(self._watch), args=(job, resolved, key),
                                         name="workbench-verify-panel", daemon=True)
        self._watcher.start()

    def cancel(self, _button: Any = None) -> None:
        """Stop the running compile now: its child process is killed and reaped. The last result stays."""
        job = self.job
        if job is None or job.done:  # nothing running (see running)
            return
        self._cancelled = True
        job.cancel()

    def wait(self, timeout: float | None = None) -> wb.analysis.TrainingPlan | None:
        """Wait (at most ``timeout`` seconds) until the latest compile's outcome is shown; returns :attr:`plan`.

        For scripts and tests: in a notebook the panel updates itself.
        """
        if self._watcher is not None:
            self._watcher.join(timeout)
        return self.plan

    @property
    def is_stale(self) -> bool:
        """Whether a result is shown and the selection (or target, or chip) has changed since it was asked for."""
        return self.plan is not None and self._selection_key() != self._shown_key

    def close(self) -> None:
        """Cancel a running compile, then close the panel."""
        self._closing.set()
        self.cancel()
        super().close()

    # --- the background side ----------------------------------------------------------------------------

    def _watch(self, job: wb.analysis.VerificationJob, resolved: wb.training.ResolvedConfig, key: tuple) -> None:
        """Plan the same step while the child compiles, tick the elapsed seconds, then show the outcome."""
        planned: wb.analysis.TrainingPlan | Exception
        try:
            planned = self._plan(resolved, job)
        except Exception as error:  # noqa: BLE001 - shown with the outcome; the compile goes on
            planned = error
        while not job.done and not self._closing.wait(TICK_S):
            self._show_progress()
        self._finish(job, planned, key)

    def _plan(self, resolved: wb.training.ResolvedConfig,
              job: wb.analysis.VerificationJob) -> wb.analysis.TrainingPlan:
        """The engine's analytic plan of the step ``job`` compiles (the mode's standard specs: what is compiled),
        on the mesh the click resolved (a record: not parsed again)."""
        config = resolved.config
        return wb.plan_training(
            config.model, dict(config.model_options), resolved.mesh_shape, config.mode, optimizer=config.optimizer,
            hardware=job.target.hardware or self.chip.value, global_batch=config.batch, accum=config.accum,
            precision=config.precision, compiler=job.target.kind, remat=config.remat,
        )

    def _finish(self, job: wb.analysis.VerificationJob, planned: wb.analysis.TrainingPlan | Exception,
                key: tuple) -> None:
        """Show ``job``'s outcome beside ``planned`` (the plan, or why there is none)."""
        if job is not self.job:  # a newer compile was started meanwhile: its own watcher shows it
            return
        self.verify_button.disabled, self.cancel_button.disabled = False, True
        try:
            compiled = job.result(timeout=0)
        except wb.WorkbenchError as error:
            self.progress.value = ""
            if self._cancelled:
                kept = "; the last result stays" if self.plan is not None else ""
                self.status.show(f"cancelled after {job.elapsed:.0f} s: the compiling process was stopped{kept}",
                                 "warning")
            else:
                self.status.show(str(error), "error")
            return
        if isinstance(planned, Exception):
            raise planned  # the compile worked but the plan did not: shown by the guard, the last result stays
        verified = planned.with_compiled(compiled)
        _, comparison = _verified(verified)
        figure = wb.comparison_figure(comparison, capacity_bytes=verified.device_memory)
        # Everything is computed: now change the widgets.
        self.plan, self._shown_key = verified, key
        self.table.value = comparison_table_html(comparison)
        replace_figure(self.figure, figure)
        self._figure_frame.layout.display = None
        listing = html.escape(compiled.collectives_text())
        self.collectives.value = ("<details><summary>collectives in the compiled step, with the layer and code "
                                  "each came from</summary>"
                                  f'<pre style="overflow-x:auto;max-width:100%">{listing}</pre></details>')
        self.progress.value = level_html(
            f"compiled for {compiled.target} ({compiled.device_kind}, {compiled.devices:,} devices) in "
            f"{wb.formatting.format_seconds(compiled.compile_seconds)}, {job.elapsed:.0f} s in all", "ok")
        fits = compiled.peak_bytes <= verified.device_memory
        self.status.show(self._verdict(verified, fits), "ok" if fits else "warning")
        self._mark_stale()

    def _verdict(self, plan: wb.analysis.TrainingPlan, fits: bool) -> str:
        compiled, comparison = _verified(plan)
        peak = comparison.row("peak")
        words = (f"compiler: peak {wb.format_bytes(compiled.peak_bytes)} per device, "
                 f"{'fits' if fits else 'does NOT fit'} {plan.hardware.name}'s {wb.format_bytes(plan.device_memory)}; "
                 f"the plan said {wb.format_bytes(plan.peak_bytes)}"
                 + (f" (plan / compiler {peak.ratio:.2f})" if peak.ratio is not None else ""))
        if comparison.recomputed_words:
            words += f"; {comparison.recomputed_words}"
        if compiled.peak_bytes < wb.analysis.PLAN_ACCURACY_FROM_BYTES and peak.ratio is not None:
            words += (f"; a step under {wb.format_bytes(wb.analysis.PLAN_ACCURACY_FROM_BYTES)} per device "
                      "is outside where the plan "
                      "holds ±15%: small buffers the compiler packs or drops dominate it")
        if self.selection.rules:
            words += "; it compiled the mode's standard specs, not your rules"
        accum = self.selection.options.get("accum", 1)
        if accum != 1:
            words += f"; the plan does not model accum={accum} (its activations are for the whole batch at once)"
        return words

    # --- drawing -----------------------------------------------------------------------------------------

    def _show_progress(self) -> None:
        """The running compile's latest message and its elapsed seconds (called from background threads)."""
        job = self.job
        if job is None or job.done:
            return
        said = job.progress
        text = said[-1] if said else "starting the compiling process"
        color = LEVEL_STYLES["info"][0]
        self.progress.value = f'<span style="color:{color}">⏳ {html.escape(text)} · {job.elapsed:.0f} s</span>'

    def _selection_key(self, config: wb.TrainConfig | None = None) -> tuple:
        """What the shown result depends on: the compiled fields of the config (``config``, where the caller
        resolved the selection already), the rules, target and chip (:data:`NO_KEY` for a selection that has no
        valid config)."""
        try:
            fields = (self.selection.train_config() if config is None else config).to_json()
        except wb.WorkbenchError:
            return NO_KEY
        compiled = {name: fields[name] for name in COMPILED_FIELDS}
        return (json.dumps(compiled, sort_keys=True, default=str), json.dumps(self.selection.rules, default=str),
                self.target.value.strip().lower() or "cpu", self.chip.value)

    def _selection_changed(self, _change: Any = None) -> None:
        self._offer_targets()
        self._judge()
        self._mark_stale()

    def _judge(self) -> None:
        """Say now what a click would refuse (the engine's own check, nothing started), and disable the button."""
        try:
            wb.analysis.validate_verifiable(self.selection.resolved_config(), self.target.value.strip() or "cpu")
        except wb.WorkbenchError as error:
            self.readiness.value = level_html(f"Verify refuses this: {error}", "error")
            self.verify_button.disabled = True
            return
        self.readiness.value = ""
        self.verify_button.disabled = self.running

    def _offer_targets(self) -> None:
        devices = self.selection.mesh_shape().size
        self.target.options = ("cpu", *wb.analysis.topologies_for(devices), *wb.analysis.gpu_targets_for(devices))

    def _mark_stale(self) -> None:
        plan = self.plan
        now = self._selection_key() if plan is not None else NO_KEY  # the selection as it is now, read once
        if plan is None or now == self._shown_key:
            self.stale.value = ""
            return
        compiled, _ = _verified(plan)
        changed = [what for what, before, after in zip(("the selection", "the rules", "the target", "the chip"),
                                                        self._shown_key, now, strict=True) if before != after]
        note = (f"Stale: the figures below are for {plan.model} in {plan.mode} on {plan.mesh}, batch "
                f"{plan.global_batch:,}, {plan.precision}, compiled for {compiled.target}, judged against "
                f"{plan.hardware.name}; {' and '.join(changed)} changed since. Verify again to update them.")
        self.stale.value = level_html(note, "warning")
