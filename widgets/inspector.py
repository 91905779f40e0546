"""The sharding inspector: every array of a training step, where each slice lives, and what it weighs.

For the :class:`~widgets.common.Selection`'s model, mesh and mode it shows, from the engine's
:class:`workbench.analysis.ModelLayout`:

* a per-leaf table (path, shape, spec, shard shape, bytes per device, replication, why) of the
  parameters, the optimizer state or one batch, with the selected array highlighted;
* the selected array's device-grid figure (:func:`workbench.layout_figure`, any rank);
* JAX's own ``visualize_array_sharding`` picture for 1-D and 2-D arrays on meshes that fit this machine,
  otherwise a note saying why and the workbench's text picture, so something is always shown;
* bytes per device as predicted by the layout engine and, on request, the compiler's estimate;
* "Verify with the compiler" (:class:`~widgets.verify_panel.VerifyPanel`): the real step compiled in the
  background for the mesh, however large, its figures beside the plan's;
* one device's slice of every array, after a click on a device in the figure (or :meth:`show_device`).

Layouts are computed on an abstract mesh, so a mesh far larger than this machine works for planning;
the inspector then says plainly how many devices training would need. Above the layout, the verdict
(:class:`~widgets.mesh_verdict.MeshVerdict`) says whether the mode trains on the mesh, with one-click
fixes; for a pair the trainer refuses there is no layout of the selection, and the last valid one stays
below, marked as another selection's.

Example:
    >>> selection = Selection(mesh="data=4,model=2", mode="dp-tp")
    >>> inspector = ShardingInspector(selection)        # display(inspector) in a notebook
    >>> inspector.select("params", "hidden1/kernel")
    >>> inspector.model_layout.params.leaf("hidden1/kernel").layout.spec
    P(None, 'model')
    >>> selection.mode = "dp"                            # the inspector redraws itself
    >>> inspector.show_device(3)                         # device 3's slice of every array
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import ipywidgets as widgets
import jax
import plotly.graph_objects as go

import workbench as wb

from .common import LEVEL_STYLES, Quiet, Selection, StatusArea, guarded, html_table
from .figure_widget import FigureWidget, replace_figure
from .mesh_verdict import MeshVerdict
from .verify_panel import VerifyPanel

TREES = (("parameters", "params"), ("optimizer state", "opt_state"), ("batch", "batch"))
# Every Selection trait that changes a layout (axis_types does not: layouts are abstract).
WATCHED_TRAITS = ["mesh", "model", "mode", "rules", "model_options", "options"]
COMPILER_MARKER = "#000000"  # black diamonds: distinct from every device colour in the palette
DEVICE_HINT = "<i>Click a device in the figure to list its slice of every array.</i>"


def tree_table_html(tree: wb.layout.TreeLayout, selected: str | None = None) -> str:
    """One row per leaf of ``tree`` (escaped), the ``selected`` path highlighted.

    Example:
        >>> "P(None, 'data')" in tree_table_html(wb.model_layout("mlp", "data=8", "fsdp").params)
        True
    """
    headers = ["path", "shape", "dtype", "spec", "shard shape", "bytes/device", "replication", "why"]
    rows, highlight = [], None
    for number, leaf in enumerate(tree.leaves):
        if leaf.path == selected:
            highlight = number
        layout = leaf.layout
        cells = [leaf.path, wb.formatting.format_shape(layout.shape), layout.dtype,
                 wb.layout.format_spec(layout.spec, "code"), wb.formatting.format_shape(layout.shard_shape),
                 wb.format_bytes(layout.bytes_per_device), str(layout.replication), leaf.reason]
        rows.append([html.escape(cell, quote=False) for cell in cells])  # element text: quotes may stay
    total = f"<div>total: {html.escape(wb.formatting.format_bytes_exact(tree.bytes_per_device))} per device</div>"
    return html_table(headers, rows, highlight) + total


def device_slices_html(layout: wb.analysis.ModelLayout, position: int) -> str:
    """Device ``position``'s slice of every array of ``layout`` as an HTML table, with its colour."""
    rows = layout.device_slices(position)
    piece = _any_leaf(layout).layout.device_slice(position)
    color = wb.views.device_color(piece.device_id)
    swatch = (f'<span style="background:{color};color:{wb.views.text_color_for(color)};padding:0 6px">'
              f"device {piece.device_id}</span>")
    total = sum(row["bytes"] for row in rows)
    header = (f"<div>{swatch} ({html.escape(wb.views.format_coords(piece.coords))}) holds {len(rows)} arrays, "
              f"{html.escape(wb.formatting.format_bytes_exact(total))}</div>")
    cells = [[html.escape(str(value)) for value in (row["tree"], row["path"], wb.formatting.format_shape(row["shape"]),
                                                     wb.views.format_index(row["index"]),
                                                     wb.format_bytes(row["bytes"]))]
             for row in rows]
    return header + html_table(["tree", "path", "shape", "index (its slice)", "bytes"], cells)


def _any_leaf(layout: wb.analysis.ModelLayout) -> wb.layout.LeafLayout:
    """A leaf of the layout: every leaf shares the mesh, so any one gives device ids and coordinates."""
    return next(leaf for tree in layout.trees().values() for leaf in tree.leaves)


def memory_figure_for(layout: wb.analysis.ModelLayout, compiler_memory: dict | None = None) -> go.Figure:
    """Bytes per device predicted by the layout engine, stacked by tree; with the compiler's estimate of
    the step's arguments (same quantity: state + batch) as black diamonds when given.

    Example:
        >>> [trace.name for trace in memory_figure_for(wb.model_layout("mlp", "data=8", "dp")).data]
        ['params', 'opt_state', 'batch']
    """
    predicted = sum(layout.bytes_per_device().values())
    figure = wb.memory_bar_figure(
        layout.combined(), depth=1,
        title=f"bytes per device, predicted by the layout engine: {wb.formatting.format_bytes_exact(predicted)}",
    )
    if compiler_memory is not None:
        labels = list(figure.data[0].x)
        arguments = compiler_memory["argument_bytes"]
        details = ", ".join(f"{key} {wb.format_bytes(value)}" for key, value in compiler_memory.items())
        figure.add_trace(go.Scatter(
            x=labels, y=[arguments] * len(labels), name="compiler estimate (XLA): step arguments",
            mode="markers", marker=dict(symbol="diamond", size=9, color=COMPILER_MARKER),
            hovertemplate=f"compiler estimate per device: {html.escape(details)}<extra></extra>",
        ))
        figure.update_layout(showlegend=True, title=(
            f"bytes per device: predicted {wb.format_bytes(predicted)}; "
            f"compiler estimate of the step's arguments {wb.format_bytes(arguments)}"))
    figure.update_layout(height=340, margin=dict(t=60, b=40))
    return figure


def leaf_title(tree: str, leaf: wb.layout.LeafLayout) -> str:
    """The device-grid figure's title: which array, then its layout in one line."""
    layout = leaf.layout
    return (f"<b>{html.escape(tree)}/{html.escape(leaf.path)}</b>: {html.escape(wb.views.describe_array(layout))}<br>"
            f"<sup>shard {wb.formatting.format_shape(layout.shard_shape)}, "
            f"{wb.format_bytes(layout.bytes_per_device)} per device, "
            f"replication {layout.replication}</sup>")


def jax_picture_html(layout: wb.layout.ArrayLayout) -> str:
    """JAX's ``visualize_array_sharding`` picture where JAX can draw it; otherwise why not, and our text
    picture (any mesh size) or, for 3-D+ arrays, our text table, so something is always shown."""
    rank, local = len(layout.shape), jax.device_count()
    if rank not in (1, 2):
        note = (f"JAX's visualize_array_sharding draws only 1-D and 2-D arrays; this one is {rank}-D "
                "(the figure above draws every rank). The workbench's text view:")
    elif layout.num_devices > local:
        note = (f"JAX's visualize_array_sharding needs real devices: this mesh has {layout.num_devices:,}, "
                f"this machine {local}. The workbench's text picture:")
    else:
        try:
            picture = wb.capture_visualize_sharding(layout)
            return "<div><b>jax.debug.visualize_array_sharding</b></div>" + picture.html
        except wb.WorkbenchError as error:  # JAX could not draw it: say why, then draw it ourselves
            note = f"{error}. The workbench's text picture:"
    text = wb.tiling_picture(layout) if rank <= 2 else wb.layout_table(layout)
    return f"<div><i>{html.escape(note)}</i></div><pre style=\"margin:0\">{html.escape(text)}</pre>"


@dataclasses.dataclass
class _LeafView:
    """Everything drawn for one selected array, computed before any widget changes (so an error keeps
    the last good view)."""

    tree: str
    path: str
    paths: list[str]  # every array of the tree, for the array picker
    table: str
    figure: go.Figure
    picture: str


class ShardingInspector(widgets.VBox):
    """Every array of a training step on the selection's mesh: table, device grid, JAX's picture, memory.

    Redraws when the selection's mesh, model, mode, rules, model options or training options change; an
    error (e.g. a rule whose spec does not fit) is shown in :attr:`status` and the last good view stays.

    Attributes:
        selection: the :class:`~widgets.common.Selection` observed.
        model_layout: the current :class:`workbench.analysis.ModelLayout` (None before the first
            valid one). Not called ``layout``: ipywidgets reserves that name for the CSS layout.
        tree_picker, leaf_picker: which tree, and which of its arrays, is selected.
        table: the selected tree's per-leaf table (HTML).
        figure: the selected array's device grid (a ``go.FigureWidget``, updated in place).
        jax_picture: JAX's own picture, or a note and the workbench's text picture (HTML).
        memory_figure: bytes per device (a ``go.FigureWidget``); ``compile_button`` adds the compiler's
            estimate (``ledger`` keeps the :class:`workbench.analysis.CommLedger`) for a mesh this machine has.
        verification: "Verify with the compiler" for any mesh up to 2,048 devices, in the background
            (:class:`~widgets.verify_panel.VerifyPanel`).
        device_panel: one device's slice of every array (HTML), from a click or :meth:`show_device`.
        verdict: whether the selection trains here, with a button per fix
            (:class:`~widgets.mesh_verdict.MeshVerdict`).
        showing_selection: whether the layout shown is the selection's (False after a selection nothing
            runs: the last valid layout stays, marked as such).
        status: errors and notes (:class:`~widgets.common.StatusArea`).

    Example:
        >>> inspector = ShardingInspector(Selection(mesh="data=64,model=8", model="transformer", mode="dp-tp"))
        >>> inspector.verdict.fit.level, inspector.status.last[1]
        ('plan', 'transformer laid out on data=64,model=8 for dp-tp (abstract: nothing allocated)')
    """

    def __init__(self, selection: Selection | None = None, **kwargs: Any):
        self.selection = selection if selection is not None else Selection()
        self.model_layout: wb.analysis.ModelLayout | None = None
        self.ledger = None
        self.device_position: int | None = None
        self.showing_selection = False
        self.status = StatusArea()
        self.summary = widgets.HTML()
        self.verdict = MeshVerdict(self.selection, status=self.status)
        self.tree_picker = widgets.ToggleButtons(options=TREES, value="params", description="tree",
                                                 style={"button_width": "120px"})
        self.leaf_picker = widgets.Dropdown(description="array", layout=widgets.Layout(width="460px"))
        self.table = widgets.HTML()
        self.figure = FigureWidget()
        self.figure.add_class("wb-inspector-figure")
        self.jax_picture = widgets.HTML()
        self.memory_figure = FigureWidget()
        self.compile_button = widgets.Button(
            description="Compiler estimate",
            tooltip="compile one training step here and show XLA's memory estimate next to the prediction",
        )
        self.device_panel = widgets.HTML(DEVICE_HINT)
        self.verification = VerifyPanel(self.selection)
        self._quiet = Quiet()  # on while the pickers are changed from code, so their observers stay still

        # Every callback is guarded: JupyterLab would hide its errors.
        self.refresh = guarded(self.status)(self._refresh)
        self._on_tree = guarded(self.status)(self._tree_changed)
        self._on_leaf = guarded(self.status)(self._leaf_changed)
        self._on_click = guarded(self.status)(self._figure_clicked)
        self._on_compile = guarded(self.status)(self.compiler_estimate)
        self.tree_picker.observe(self._on_tree, names="value")
        self.leaf_picker.observe(self._on_leaf, names="value")
        self.compile_button.on_click(self._on_compile)
        self.selection.observe(self.refresh, names=WATCHED_TRAITS)

        table_box = widgets.Box([self.table], layout=widgets.Layout(max_height="320px", overflow="auto"))
        super().__init__([
            self.summary, self.verdict, self.status, widgets.HBox([self.tree_picker, self.leaf_picker]), table_box,
            self.figure, self.jax_picture, self.memory_figure, self.compile_button, self.device_panel,
            self.verification,
        ], **kwargs)
        self.refresh()

    # --- public actions ---------------------------------------------------------------------------

    def select(self, tree: str, path: str) -> None:
        """Select array ``path`` of ``tree`` (``"params"``, ``"opt_state"`` or ``"batch"``) and draw it.

        Raises KeyError (listing some paths) for a path the tree does not have.
        """
        self._apply(self._leaf_view(self._shown_layout("select"), tree, path))

    def show_device(self, position: int) -> None:
        """List the device at mesh ``position`` (row-major; its id on abstract meshes) and its slice of
        every array in :attr:`device_panel`. The figure's click handler calls this."""
        self.device_panel.value = device_slices_html(self._shown_layout("show"), position)
        self.device_position = position

    def close(self) -> None:
        """Cancel a running verification, then close the inspector."""
        self.verification.close()
        super().close()

    def compiler_estimate(self, _button: Any = None) -> None:
        """Compile one training step of the selection here and add XLA's memory estimate to the memory
        figure. The engine refuses (shown in :attr:`status`) meshes larger than this machine and modes
        with no single compiled step."""
        layout = self._shown_layout("estimate")
        self.status.show("compiling one training step for the compiler's estimate…", "info")
        ledger = wb.ledger_for_config(self.selection.resolved_config())  # resolved once, here
        if ledger.memory is None:
            self.status.show("the compiler gave no memory estimate on this backend", "warning")
            return
        self.ledger = ledger
        replace_figure(self.memory_figure, memory_figure_for(layout, ledger.memory))
        note = "; it compiled the mode's standard specs, not your rules" if self.selection.rules else ""
        self.status.show(
            f"compiler estimate per device: arguments {wb.format_bytes(ledger.memory['argument_bytes'])}, "
            f"temporaries {wb.format_bytes(ledger.memory['temp_bytes'])}{note}", "ok")

    def _shown_layout(self, action: str) -> wb.analysis.ModelLayout:
        """The layout shown, or a WorkbenchError saying there is nothing to ``action`` before a valid one."""
        if self.model_layout is None:
            raise wb.WorkbenchError(f"nothing to {action}: the selection has no valid layout yet (see the status)")
        return self.model_layout

    # --- drawing ------------------------------------------------------------------------------------

    def _refresh(self, _change: Any = None) -> None:
        """Lay out the selection again and redraw everything, keeping the selected array if it still exists."""
        verdict = self.selection.verdict()
        if not verdict.plans:  # nothing runs the selection: no layout of it, whatever a planner would draw
            self._show_refused(verdict)
            return
        layout = self.selection.model_layout()  # raises for an invalid layout: nothing has changed yet
        trees, tree, path = layout.trees(), self.tree_picker.value, self.leaf_picker.value
        tree = tree if tree in trees and trees[tree].leaves else "params"
        paths = [leaf.path for leaf in trees[tree].leaves]
        path = path if path in paths else paths[0]
        view = self._leaf_view(layout, tree, path)
        memory = memory_figure_for(layout)
        # Everything is computed: now change the widgets.
        self.model_layout, self.ledger = layout, None  # an old compiler estimate belongs to the old layout
        self._apply(view)
        replace_figure(self.memory_figure, memory)
        if self.device_position is not None and self.device_position < layout.mesh.size:
            self.show_device(self.device_position)
        else:
            self.device_position = None
            self.device_panel.value = DEVICE_HINT
        self.summary.value = self._summary_html(layout)
        self.showing_selection = True
        self._show_device_note(layout)

    def _show_refused(self, verdict: wb.analysis.TrainingVerdict) -> None:
        """Keep the last valid layout below, marked as not the selection's; the verdict above says why, once."""
        self.showing_selection = False
        self.status.clear()
        color = LEVEL_STYLES["error"][0]
        if self.model_layout is None:
            note = "No layout: the trainer refuses this mode on this mesh. Use a fix above."
            self.summary.value = f'<div class="wb-stale" style="color:{color}">{html.escape(note)}</div>'
            return
        shown = self.model_layout
        note = (f"Not this selection: below is the last valid layout (mode {shown.mode} on mesh {shown.mesh}); "
                f"mode {self.selection.mode} on mesh {self.selection.mesh} cannot run as it is. Use a fix above.")
        self.summary.value = (f'<div class="wb-stale" style="color:{color}"><b>{html.escape(note)}</b></div>'
                              + self._summary_html(shown))

    def _leaf_view(self, layout: wb.analysis.ModelLayout, tree: str, path: str) -> _LeafView:
        leaves = layout.trees()[tree]
        leaf = leaves.leaf(path)
        return _LeafView(
            tree, path, [leaf.path for leaf in leaves.leaves], tree_table_html(leaves, path),
            wb.layout_figure(leaf.layout, title=leaf_title(tree, leaf)), jax_picture_html(leaf.layout),
        )

    def _apply(self, view: _LeafView) -> None:
        with self._quiet():
            self.tree_picker.value = view.tree
            self.leaf_picker.options = view.paths
            self.leaf_picker.value = view.path
        self.table.value = view.table
        replace_figure(self.figure, view.figure)
        for trace in self.figure.data:  # new traces: a click on any device cell lists that device
            if trace.type == "heatmap":
                trace.on_click(self._on_click)
        self.jax_picture.value = view.picture

    def _summary_html(self, layout: wb.analysis.ModelLayout) -> str:
        sizes = layout.bytes_per_device()
        parts = " + ".join(f"{name} {wb.format_bytes(n)}" for name, n in sizes.items())
        text = (f"<b>{html.escape(layout.model)}</b>, mode <b>{html.escape(layout.mode)}</b> on mesh "
                f"<b>{html.escape(str(layout.mesh))}</b> ({layout.mesh.size:,} devices): {html.escape(parts)} = "
                f"{html.escape(wb.format_bytes(sum(sizes.values())))} per device")
        return text

    def _show_device_note(self, layout: wb.analysis.ModelLayout) -> None:
        # The verdict above says whether it trains here; this line says only that the layout is drawn.
        abstract = " (abstract: nothing allocated)" if layout.mesh.size > jax.device_count() else ""
        self.status.show(f"{layout.model} laid out on {layout.mesh} for {layout.mode}{abstract}", "info")

    # --- callbacks ------------------------------------------------------------------------------------

    def _tree_changed(self, change: dict) -> None:
        if self._quiet or self.model_layout is None:
            return
        leaves = self.model_layout.trees()[change["new"]].leaves
        if not leaves:  # e.g. plain SGD keeps no optimizer state: stay on the tree shown
            with self._quiet():
                self.tree_picker.value = change["old"]
            self.status.show(f"{change['new']} has no arrays for optimizer {self.model_layout.optimizer}", "info")
            return
        self.select(change["new"], leaves[0].path)

    def _leaf_changed(self, change: dict) -> None:
        tree = self.tree_picker.value
        if self._quiet or self.model_layout is None or tree is None or change["new"] is None:
            return
        self.select(tree, change["new"])

    def _figure_clicked(self, trace: Any, points: Any, _state: Any) -> None:
        """A heatmap click: plotly gives ``[row, column]`` per cell; the cell's customdata is the device id."""
        for index in points.point_inds:
            if isinstance(index, (list, tuple)) and len(index) == 2:
                device_id = int(trace.customdata[index[0]][index[1]])
                self.show_device(_any_leaf(self._shown_layout("show")).layout.slice_of_device(device_id).position)
                return
