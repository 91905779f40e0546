"""FigureWidget: plotly's ``go.FigureWidget`` that draws whenever its view is made, in JupyterLab and in Voila.

plotly keeps a figure's traces and layout for the browser in two synced traits, ``_widget_data`` and
``_widget_layout``, but assigns them only when the widget is built or displayed on its own; every later
change (``add_traces``, ``trace.y = ...``, ``update_layout``) travels as a one-off message that the
browser applies to the copy it already has. A view that is made *after* those messages were sent starts
from the stale copy, and each later message then names traces it does not have ("trace index ( 0 ) is
not a number or is out of bounds" in the console), so the plot stays empty. That is what happens in
``workbench app``: Voila runs the notebook first and the page asks for every widget's state afterwards.
It happens in JupyterLab too when the page is reloaded, or a figure sits in a box shown later.

The fix is at the one place a late view reads from: :meth:`FigureWidget.get_state` answers with the figure
as it is now. Live updates are untouched (still one small message each).

Example:
    >>> figure = FigureWidget()
    >>> _ = figure.add_scatter(x=[1, 2], y=[3, 4])
    >>> len(figure.get_state()["_widget_data"])   # a view made now sees the trace
    1
"""

from __future__ import annotations

import copy
from typing import Any

import plotly.graph_objects as go

# The synced traits plotly only refreshes on construction and display, and where the figure really is.
_CURRENT = {"_widget_data": ("_data",), "_widget_layout": ("_layout_obj", "_props")}


class FigureWidget(go.FigureWidget):
    """A ``go.FigureWidget`` whose state, when a browser asks for it, is the figure as it is now."""

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict[str, Any]:
        state = super().get_state(key, drop_defaults)
        for name, attributes in _CURRENT.items():
            current: Any = self
            for attribute in attributes:  # absent while the widget opens, before plotly has built the figure
                current = getattr(current, attribute, None)
            if name in state and current is not None:
                to_json = self.trait_metadata(name, "to_json", self._trait_to_json)
                state[name] = to_json(copy.deepcopy(current), self)
        return state


def replace_figure(widget: go.FigureWidget, new: go.Figure) -> None:
    """Make ``widget`` show ``new`` (a ``go.Figure``) in place: the browser keeps the same view, no new widget.

    Layout keys the new figure lacks (e.g. the axes of a previous array's extra panels) are removed
    first, on both sides: assigning a layout only merges into the browser's copy.

    Example:
        >>> widget = FigureWidget()
        >>> replace_figure(widget, go.Figure(go.Bar(x=["a"], y=[1]), layout={"title": {"text": "bytes"}}))
        >>> widget.data[0].type, widget.layout.title.text
        ('bar', 'bytes')
    """
    new_keys = set(new.layout.to_plotly_json())
    stale = {key: None for key in widget.layout.to_plotly_json() if key not in new_keys}
    with widget.batch_update():
        widget.data = ()
        if stale:
            widget.plotly_relayout(stale)
        widget.add_traces(list(new.data))
        widget.layout = new.layout


__all__ = ["FigureWidget", "replace_figure"]
