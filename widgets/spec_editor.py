"""SpecEditor: write partition specs, for one array or for a whole model as a rule table.

* **One array**: its shape and dtype, then for each dimension the mesh axes it is split over (several
  allowed, in order) or the same spec as text (``data, None, model``). The layout is recomputed on
  every valid change; an invalid spec shows the engine's message inline and the last valid spec stays.
* **A model**: the rule table (``regex => spec`` per line, first match wins) applied to the model's
  parameters, with which leaves each rule matched. "Use the mode's rules" restores the standard specs
  of the selected parallel mode.

Example:
    >>> editor = SpecEditor()
    >>> editor.set_spec_text("data, None")
    True
    >>> editor.layout.shard_shape
    (1, 16, 32)
"""

from __future__ import annotations

import html

import ipywidgets as widgets

import workbench as wb

from .common import Selection, StatusArea, guarded

DEFAULT_SHAPE = "8, 16, 32"


class SpecEditor(widgets.VBox):
    """Edit one array's spec (per-dimension axes or text) and the model's rule table."""

    def __init__(self, selection: Selection | None = None, shape: str = DEFAULT_SHAPE, spec: str = "data", **kwargs):
        self.selection = selection or Selection()
        self.status = StatusArea()
        self.rules_status = StatusArea()
        self.shape_text = widgets.Text(value=shape, description="Shape", continuous_update=False)
        self.dtype = widgets.Dropdown(options=["float32", "bfloat16", "float16", "int32", "int8"], value="float32",
                                      description="dtype", layout=widgets.Layout(width="200px"))
        self.spec_text = widgets.Text(value=spec, description="Spec", continuous_update=False,
                                      placeholder="e.g. data, None, model  (('data','model') for two axes)")
        self.spec_text.add_class("wb-spec-text")
        self.dims_box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.result = widgets.HTML()
        self.rules_text = widgets.Textarea(rows=6, layout=widgets.Layout(width="100%"),
                                           placeholder="regex => spec, one per line; e.g. kernel$ => None, data")
        self.apply_rules_button = widgets.Button(description="Apply rules", button_style="primary")
        self.mode_rules_button = widgets.Button(description="Use the mode's rules", layout=widgets.Layout(width="auto"))
        self.matches = widgets.HTML()
        self.layout_value: wb.layout.ArrayLayout | None = None
        super().__init__([
            widgets.HTML("<b>One array</b>"), widgets.HBox([self.shape_text, self.dtype]), self.spec_text,
            self.dims_box, self.result, self.status,
            widgets.HTML("<b>Model rule table</b> (first matching rule wins; "
                         "paths look like <code>hidden1/kernel</code>)"),
            self.rules_text, widgets.HBox([self.apply_rules_button, self.mode_rules_button]), self.matches,
            self.rules_status,
        ], **kwargs)
        guard, rules_guard = guarded(self.status), guarded(self.rules_status)
        self.spec_text.observe(guard(lambda c: self.set_spec_text(c["new"])), names="value")
        self.shape_text.observe(guard(lambda c: self._relayout()), names="value")
        self.dtype.observe(guard(lambda c: self._relayout()), names="value")
        self.apply_rules_button.on_click(rules_guard(lambda _b: self.apply_rules(self.rules_text.value)))
        self.mode_rules_button.on_click(rules_guard(lambda _b: self.use_mode_rules()))
        self.selection.observe(guard(lambda c: self._relayout()), names="mesh")
        self.selection.observe(rules_guard(lambda c: self._show_rules()), names=["mesh", "mode", "model", "rules"])
        self._spec = wb.parse_spec(spec)
        guard(self._relayout)()
        rules_guard(self._show_rules)()  # a selection nothing runs (tp on data=8) says why here too, never raises

    @property
    def layout(self) -> wb.layout.ArrayLayout | None:
        """The array's current (last valid) layout."""
        return self.layout_value

    # --- one array ------------------------------------------------------------------------------------

    def set_spec_text(self, text: str) -> bool:
        """Use spec ``text`` if it is valid for the shape and mesh (True); else show why, keep the last."""
        try:
            spec = wb.parse_spec(text)
            self._layout_for(spec)
        except wb.WorkbenchError as error:
            self.status.show(str(error), "error")
            return False
        self._spec = spec
        self._relayout()
        return True

    def set_dimension(self, dim: int, axes: list[str] | tuple[str, ...]) -> bool:
        """Split dimension ``dim`` over ``axes`` (in order; empty: not split). What a dimension's picker does."""
        entries = list(wb.layout.spec_to_json(self._spec)) + [None] * (len(self._shape()) - len(self._spec))
        entries[dim] = None if not axes else (axes[0] if len(axes) == 1 else list(axes))
        while entries and entries[-1] is None:
            entries.pop()  # trailing None entries say nothing
        return self.set_spec_text(wb.layout.format_spec(wb.layout.spec_from_json(entries)))

    def _shape(self) -> tuple[int, ...]:
        return wb.layout.parse_shape(self.shape_text.value)

    def _layout_for(self, spec) -> wb.layout.ArrayLayout:
        return wb.layout_array(self._shape(), self.selection.mesh, spec, dtype=self.dtype.value)

    def _relayout(self) -> None:
        try:
            layout = self._layout_for(self._spec)
        except wb.WorkbenchError as error:  # e.g. the new mesh lacks an axis of the spec
            self.status.show(f"{error} (the spec is kept: edit it, or change the shape or mesh)", "error")
            return
        self.layout_value = layout
        text = wb.layout.format_spec(self._spec)
        if self.spec_text.value != text and not _same_spec(self.spec_text.value, self._spec):
            self.spec_text.value = text
        self._render_dims(layout)
        table = html.escape(wb.layout_table(layout, max_devices=8))
        self.result.value = f"<pre style='font-size:12px;line-height:1.25'>{table}</pre>"
        self.status.show(
            f"{wb.layout.format_spec(layout.spec)}: each device holds {list(layout.shard_shape)}, "
            f"{wb.format_bytes(layout.bytes_per_device)}; each shard is held by {layout.replication} device(s)", "ok"
        )

    def _render_dims(self, layout: wb.layout.ArrayLayout) -> None:
        axes = list(self.selection.mesh_shape().names)
        entries = wb.layout.spec_to_json(layout.spec)
        pickers = []
        for dim, size in enumerate(layout.shape):
            entry = entries[dim] if dim < len(entries) else None
            chosen = [] if entry is None else ([entry] if isinstance(entry, str) else list(entry))
            picker = widgets.TagsInput(value=chosen, allowed_tags=axes, allow_duplicates=False,
                                       layout=widgets.Layout(width="auto"))
            picker.observe(guarded(self.status)(lambda c, d=dim: self.set_dimension(d, c["new"])), names="value")
            pickers.append(widgets.VBox([widgets.HTML(f"dim {dim} ({size})"), picker],
                                        layout=widgets.Layout(margin="0 8px 0 0")))
        self.dims_box.children = pickers

    # --- the model's rule table -----------------------------------------------------------------------

    def apply_rules(self, text: str) -> bool:
        """Parse ``regex => spec`` lines and lay the model out with them (True); else show why, keep the last."""
        try:
            table = wb.layout.RuleTable.parse(text)
            rules = [(rule.pattern, wb.layout.format_spec(rule.spec)) for rule in table.rules]
            candidate = Selection(**{k: getattr(self.selection, k) for k in ("mesh", "model", "model_options",
                                                                             "mode", "options")}, rules=rules)
            candidate.model_layout(batch=candidate.smallest_batch())  # raises for a rule that does not fit a leaf
        except wb.WorkbenchError as error:
            self.rules_status.show(str(error), "error")
            return False
        self.selection.rules = rules
        return True

    def use_mode_rules(self) -> None:
        """Drop custom rules: the selected mode's standard specs apply again."""
        self.selection.rules = []
        self._show_rules()

    def _show_rules(self) -> None:
        # The rule table is the parameters' business: laid out with a batch the mode always splits, it is shown
        # even while the Global batch option does not split (the verdict in the other tabs says so).
        layout = self.selection.model_layout(batch=self.selection.smallest_batch())
        if not self.selection.rules:
            self.rules_text.value = layout.rules.to_text()
        rows = []
        for rule, paths in zip(layout.rules.rules, layout.rule_matches(), strict=True):
            matched = (", ".join(paths) if paths
                       else "<span style='color:#D55E00'>matched nothing: check the regex</span>")
            if paths:
                matched = html.escape(matched)
            rows.append(f"<tr><td><code>{html.escape(str(rule))}</code></td><td>{matched}</td></tr>")
        origin = "custom rules" if self.selection.rules else f"the standard specs of mode {self.selection.mode!r}"
        self.matches.value = ("<table style='font-size:12px'><tr><th align='left'>rule</th><th align='left'>"
                              f"leaves it matched</th></tr>{''.join(rows)}</table>")
        # ✓ only where the selection trains here: the rules are valid on a 4,096-device mesh, the run is not.
        level = "ok" if self.selection.verdict().level == "ok" else "info"
        self.rules_status.show(f"{self.selection.model} on {self.selection.mesh}: {origin}", level)


def _same_spec(text: str, spec) -> bool:
    try:
        return wb.parse_spec(text) == spec
    except wb.WorkbenchError:
        return False
