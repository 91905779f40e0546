"""Workbench: every widget in one, sharing one selection. ``Workbench()`` is the notebooks' entry point.

Tabs follow the order a user thinks in: the mesh, the model and mode, the specs, the layout of every
array, then training, and last "which layout?" (the recommender), whose answer sets the others. All tabs read
and write one :class:`~widgets.common.Selection`, so changing the mesh in the first tab changes what the
inspector draws, and choosing ``fsdp`` shows FSDP's layout.

Example:
    >>> wb_widget = Workbench(model="mlp", mesh="data=4,model=2", mode="dp-tp")
    >>> wb_widget.selection.mode
    'dp-tp'
"""

from __future__ import annotations

import ipywidgets as widgets

from .common import Selection
from .dashboard import TrainingDashboard
from .inspector import ShardingInspector
from .mesh_picker import MeshPicker
from .mode_selector import ModeSelector
from .recommend_panel import RecommendPanel
from .spec_editor import SpecEditor

TAB_TITLES = ("1 · Mesh", "2 · Model & mode", "3 · Specs", "4 · Inspect", "5 · Train", "6 · Recommend")


class Workbench(widgets.VBox):
    """The mesh picker, mode selector, spec editor, sharding inspector, training dashboard and recommender, as tabs.

    Args:
        model, mesh, mode: where to start (any registered model, mesh text, parallel mode); the mesh defaults to
            every device this machine has, over ``data``.
        run_root: where training runs are written (``runs/`` by default).
        selection: share an existing selection instead (e.g. with another widget).
    """

    def __init__(self, model: str = "mlp", mesh: str | None = None, mode: str = "dp", *, run_root: str = "runs",
                 selection: Selection | None = None, **kwargs):
        chosen = {"model": model, "mode": mode, **({"mesh": str(mesh)} if mesh is not None else {})}
        self.selection = selection or Selection(**chosen)
        self.mesh_picker = MeshPicker(self.selection)
        self.mode_selector = ModeSelector(self.selection)
        self.spec_editor = SpecEditor(self.selection)
        self.inspector = ShardingInspector(self.selection)
        self.dashboard = TrainingDashboard(self.selection, run_root=run_root)
        self.recommender = RecommendPanel(self.selection)
        self.tabs = widgets.Tab(children=[self.mesh_picker, self.mode_selector, self.spec_editor, self.inspector,
                                          self.dashboard, self.recommender])
        self.tabs.titles = TAB_TITLES
        header = widgets.HTML("<b>Sharding Workbench</b> — pick a mesh and a mode, see where every array lives, "
                              "then train and check gradient synchronisation; or ask which layout (Recommend).")
        super().__init__([header, self.tabs], layout=widgets.Layout(width="100%"), **kwargs)

    def close(self) -> None:
        """Stop any training, verification or recommendation this workbench started, then close its widgets."""
        self.recommender.close()
        self.dashboard.close()
        self.inspector.close()
        super().close()
