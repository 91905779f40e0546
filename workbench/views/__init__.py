"""Views of the engine's records: text tables, JAX's own picture, plotly figures, the device colours.

Every public name of the layer, re-exported from the module that owns it (``wb.views.layout_table``). The plotly
figures are imported on first use, so ``import workbench`` stays free of plotly. ``profile_text`` and
``comparison_figure`` are named like their modules: they are reached as ``wb.profile_text`` and
``wb.comparison_figure``, since re-exporting them here would hide their modules.
"""

import importlib

from .colors import OKABE_ITO as OKABE_ITO
from .colors import device_color as device_color
from .colors import text_color_for as text_color_for
from .jax_picture import JaxPicture as JaxPicture
from .jax_picture import capture_visualize_sharding as capture_visualize_sharding
from .profile_text import memory_table as memory_table
from .profile_text import missing_figures as missing_figures
from .profile_text import timeline_table as timeline_table
from .text import describe_array as describe_array
from .text import format_coords as format_coords
from .text import format_index as format_index
from .text import layout_table as layout_table
from .text import tiling_picture as tiling_picture
from .text import tree_table as tree_table

# Drawn with plotly, imported on first use: each figure and the module of this package that draws it. The top
# tier reads this table too (its figures are these five).
_FIGURES = {"layout_figure": "figures", "memory_bar_figure": "figures", "comparison_figure": "comparison_figure",
            "timeline_figure": "profile_figures", "memory_figure": "profile_figures",
            "recommendation_figure": "recommend_figure"}

__all__ = [
    # text views of layouts and of a profile
    "describe_array", "format_coords", "format_index", "layout_table", "tiling_picture", "tree_table",
    "memory_table", "missing_figures", "timeline_table",
    # JAX's own picture and the device colours every view shares
    "JaxPicture", "capture_visualize_sharding",
    "OKABE_ITO", "device_color", "text_color_for",
    # plotly figures, imported on first use (comparison_figure is not here: once its module is imported, that
    # module is this package's attribute of the same name)
    "layout_figure", "memory_bar_figure", "timeline_figure", "memory_figure", "recommendation_figure",
]


def __getattr__(name: str):
    """The plotly figure ``name``, importing its module on first use (PEP 562)."""
    if name in _FIGURES and name in __all__:
        return getattr(importlib.import_module(f".{_FIGURES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
