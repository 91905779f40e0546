"""The ipywidgets UI over :mod:`workbench`'s public API (mesh picker, mode selector and its verdict, spec
editor, inspector, dashboard, recommender).

Widgets only present what the engine computes: anything a widget does, a script or the CLI can do too.
``Workbench()`` composes them all and is the notebooks' one-line entry point.

Example:
    >>> from widgets import Workbench
    >>> app = Workbench(model="mlp", mesh="data=8", mode="fsdp")
    >>> app  # in a notebook: the tabs, Mesh to Train  # doctest: +SKIP
"""

from __future__ import annotations

import importlib

import workbench as _workbench  # noqa: F401  (simulated devices are configured before JAX starts)

_EXPORTS = {
    "Selection": "common", "StatusArea": "common", "guarded": "common", "TrainingDashboard": "dashboard",
    "ShardingInspector": "inspector", "MeshPicker": "mesh_picker", "MeshVerdict": "mesh_verdict",
    "ModeSelector": "mode_selector", "ProfilePanel": "profile_panel", "RecommendPanel": "recommend_panel",
    "SpecEditor": "spec_editor", "VerifyPanel": "verify_panel",
    "Workbench": "workbench_widget",
}


def __getattr__(name: str):
    # Imported on first use: a notebook that needs only the mesh picker does not load plotly's figures.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'widgets' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = [
    "MeshPicker", "MeshVerdict", "ModeSelector", "ProfilePanel", "RecommendPanel", "Selection", "ShardingInspector",
    "SpecEditor", "StatusArea", "TrainingDashboard", "VerifyPanel", "Workbench", "guarded",
]
