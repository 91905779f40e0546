"""MeshPicker: choose a device mesh (axis names and sizes, axis types) and see its device grid.

Presets cover the usual shapes (1-D data, 2-D data x model, 3-D); each axis can be renamed and
resized, or the whole mesh typed as text (``data=64,model=8``). A mesh larger than this machine is
allowed: layouts, memory and communication are planned on an abstract mesh, and the picker says
plainly that training needs that many devices and how to get them. Invalid input is shown inline and
the last valid mesh is kept.

Example:
    >>> picker = MeshPicker()
    >>> picker.mesh_text.value = "data=4,model=2"  # what typing + Enter does
    >>> picker.selection.mesh
    'data=4,model=2'
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import jax

import workbench as wb

from .common import TOGGLE_STYLE, Selection, StatusArea, guarded

PRESETS = {
    "1-D: data": "data=8",
    "2-D: data x model": "data=4,model=2",
    "3-D: data x seq x model": "data=2,seq=2,model=2",
    "production: data=64 x model=8": "data=64,model=8",
}
MAX_GRID_CELLS = 256  # a 4,096-device mesh draws its first 256 devices, and says so


def device_grid_html(mesh: wb.MeshShape, max_cells: int = MAX_GRID_CELLS) -> str:
    """The mesh as a grid of device cells in each device's colour: rows are the first axis, columns
    the remaining axes flattened (row-major, as JAX numbers devices).

    Example:
        >>> "data=0" in device_grid_html(wb.parse_mesh("data=2,model=2"))
        True
    """
    rows = mesh.sizes[0]
    columns = mesh.size // rows
    shown_rows = max(1, min(rows, max_cells // max(columns, 1)))
    shown_columns = min(columns, max_cells)
    rest = mesh.names[1:]
    header = "".join(
        f"<th style='font-weight:normal;padding:0 4px'>{html.escape(_coords(rest, mesh.sizes[1:], c))}</th>"
        for c in range(shown_columns)
    ) if rest else "<th></th>"
    body = []
    for r in range(shown_rows):
        cells = []
        for c in range(shown_columns if rest else 1):
            device = r * columns + c
            color = wb.views.device_color(device)
            cells.append(
                f"<td title='device {device}' style='background:{color};color:{wb.views.text_color_for(color)};"
                f"text-align:center;min-width:2.2em;padding:2px 4px;border:1px solid white'>{device}</td>"
            )
        body.append(f"<tr><th style='font-weight:normal;padding:0 4px'>{mesh.names[0]}={r}</th>{''.join(cells)}</tr>")
    note = ""
    if shown_rows < rows or shown_columns < columns:
        note = f"<div><i>showing {shown_rows * shown_columns} of {mesh.size} devices</i></div>"
    return (f"<div style='overflow-x:auto'><table style='border-collapse:collapse;font-size:12px'>"
            f"<tr><th></th>{header}</tr>{''.join(body)}</table>{note}</div>")


def _coords(names, sizes, flat: int) -> str:
    parts = []
    for name, size in zip(reversed(names), reversed(sizes), strict=True):
        parts.append(f"{name}={flat % size}")
        flat //= size
    return ",".join(reversed(parts))


def devices_note(mesh: wb.MeshShape) -> tuple[str, str]:
    """(level, text): whether this mesh can train here, and how to get the devices when it cannot."""
    local = len(jax.devices())
    if mesh.size <= local:
        platform = jax.devices()[0].platform.upper()
        return "ok", f"{mesh.size} of this machine's {local} {platform} devices: layouts and training"
    return "warning", (
        f"planning only: this mesh has {mesh.size} devices and JAX here has {local}. Layouts, memory and "
        f"communication work on any size; training needs {mesh.size} devices: run on a host (or TPU slice) with "
        f"that many accelerators, or simulate them on CPU with WORKBENCH_CPU_DEVICES={mesh.size} set before "
        "workbench is imported (restart the kernel)."
    )


class MeshPicker(widgets.VBox):
    """Pick a mesh: presets, per-axis name and size, mesh text, axis types; the device grid below.

    Writes only valid meshes to ``selection.mesh`` (and ``selection.axis_types``).
    """

    def __init__(self, selection: Selection | None = None, **kwargs):
        self.selection = selection or Selection()
        self.status = StatusArea()
        self.preset = widgets.Dropdown(options=["custom", *PRESETS], value="custom", description="Preset")
        self.mesh_text = widgets.Text(value=self.selection.mesh, description="Mesh", continuous_update=False,
                                      placeholder="e.g. data=4,model=2")
        self.mesh_text.add_class("wb-mesh-text")
        self.axis_types = widgets.ToggleButtons(options=["auto", "explicit"], value=self.selection.axis_types,
                                                description="Axis types", style=TOGGLE_STYLE,
                                                tooltips=["the compiler chooses collectives (training)",
                                                          "sharding is part of each array's type"])
        self.axes_box = widgets.VBox()
        self.add_axis = widgets.Button(description="add axis", icon="plus", layout=widgets.Layout(width="auto"))
        self.grid = widgets.HTML()
        super().__init__(
            [widgets.HBox([self.preset, self.axis_types]), self.mesh_text, self.axes_box, self.add_axis,
             self.grid, self.status],
            **kwargs,
        )
        self.preset.observe(guarded(self.status)(self._on_preset), names="value")
        self.mesh_text.observe(guarded(self.status)(lambda change: self.apply(change["new"])), names="value")
        self.axis_types.observe(guarded(self.status)(self._on_axis_types), names="value")
        self.add_axis.on_click(guarded(self.status)(self._on_add_axis))
        self.selection.observe(guarded(self.status)(lambda change: self._render()), names="mesh")
        self._render()

    # --- actions (also the public API) --------------------------------------------------------------

    def apply(self, text: str) -> bool:
        """Use mesh ``text`` if valid (True); otherwise show the engine's message and keep the last mesh."""
        try:
            mesh = wb.parse_mesh(text)
        except wb.WorkbenchError as error:
            self.status.show(str(error), "error")
            return False
        self.selection.mesh = str(mesh)
        self._render()
        return True

    def set_axis(self, index: int, name: str | None = None, size: int | None = None) -> bool:
        """Rename and/or resize axis ``index`` (what editing its row does)."""
        mesh = self.selection.mesh_shape()
        names, sizes = list(mesh.names), list(mesh.sizes)
        names[index] = names[index] if name is None else name.strip()
        sizes[index] = sizes[index] if size is None else size
        return self.apply(",".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True)))

    def remove_axis(self, index: int) -> bool:
        mesh = self.selection.mesh_shape()
        if len(mesh.names) == 1:
            self.status.show("a mesh needs at least one axis: resize it instead", "error")
            return False
        parts = [f"{n}={s}" for i, (n, s) in enumerate(mesh.axes.items()) if i != index]
        return self.apply(",".join(parts))

    # --- callbacks ------------------------------------------------------------------------------------

    def _on_preset(self, change) -> None:
        if change["new"] in PRESETS:
            self.mesh_text.value = PRESETS[change["new"]]

    def _on_axis_types(self, change) -> None:
        self.selection.axis_types = change["new"]

    def _on_add_axis(self, _button) -> None:
        mesh = self.selection.mesh_shape()
        name = next(n for n in ("model", "seq", "expert", "pipe", "axis") if n not in mesh.names)
        self.apply(f"{mesh},{name}=2")

    def _render(self) -> None:
        mesh = self.selection.mesh_shape()
        if not _same_mesh(self.mesh_text.value, mesh):  # the user's own spelling of the same mesh stays
            self.mesh_text.value = str(mesh)
        self.preset.value = next((k for k, v in PRESETS.items() if v == str(mesh)), "custom")
        self.axes_box.children = [self._axis_row(i, n, s) for i, (n, s) in enumerate(mesh.axes.items())]
        self.grid.value = device_grid_html(mesh)
        self.status.show(*reversed(devices_note(mesh)))

    def _axis_row(self, index: int, name: str, size: int) -> widgets.HBox:
        name_box = widgets.Text(value=name, description=f"axis {index}", continuous_update=False,
                                layout=widgets.Layout(width="220px"))
        size_box = widgets.BoundedIntText(value=size, min=1, max=65536, description="size",
                                          layout=widgets.Layout(width="160px"))
        remove = widgets.Button(icon="trash", tooltip="remove this axis", layout=widgets.Layout(width="36px"))
        name_box.observe(guarded(self.status)(lambda c: self.set_axis(index, name=c["new"])), names="value")
        size_box.observe(guarded(self.status)(lambda c: self.set_axis(index, size=c["new"])), names="value")
        remove.on_click(guarded(self.status)(lambda _b: self.remove_axis(index)))
        return widgets.HBox([name_box, size_box, remove])


def _same_mesh(text: str, mesh: wb.MeshShape) -> bool:
    try:
        return wb.parse_mesh(text) == mesh
    except wb.WorkbenchError:
        return False
