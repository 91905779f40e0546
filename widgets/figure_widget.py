"""FigureWidget: plotly's ``go.FigureWidget`` that draws whenever its view is made, in JupyterLab and in Voila,
and whose 5 MB front end reaches the browser once per page, not once per figure.

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

plotly's FigureWidget is an anywidget, and anywidget sends a widget's front-end module (``_esm``) with every
instance: plotly's is 5 MB (plotly.js inside), and the browser evaluates it again for each figure. The workbench
has seven figures on the page (35 MB before anything draws), and the first Profile made two more: 4.5 of its
5.7 s from click to drawn. Here ``_esm`` is a small loader (:data:`LOADER`) instead: the first figure of a page
asks the kernel for plotly's module (an anywidget command, the bytes as one binary buffer), every figure shares
that one evaluated module, and plotly's own front end then runs unchanged.

Example:
    >>> figure = FigureWidget()
    >>> _ = figure.add_scatter(x=[1, 2], y=[3, 4])
    >>> len(figure.get_state()["_widget_data"])   # a view made now sees the trace
    1
"""

from __future__ import annotations

import copy
import functools
import pathlib
from typing import Any

import plotly
import plotly.graph_objects as go
from anywidget.experimental import command

# The synced traits plotly only refreshes on construction and display, and where the figure really is.
_CURRENT = {"_widget_data": ("_data",), "_widget_layout": ("_layout_obj", "_props")}


BUNDLE = pathlib.Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"  # plotly's own front end
RESPONSIVE = {"responsive": True}  # plotly's config: a figure follows its element's width (see LOADER)
BUNDLE_TIMEOUT_MS = 120_000  # a busy kernel (training on two cores) may take a while to answer

# The front end every FigureWidget sends. JupyterLab handles a kernel's messages one after another and waits
# for a widget's initialize, so initialize cannot wait for the kernel's answer (it would wait behind itself):
# it only asks, once per page, for plotly's module. Each figure's first render waits for the module, starts
# plotly's own model on it, asks the kernel to resend the figure as it is now (what changed meanwhile was not
# seen by plotly), and then lets plotly render.
LOADER = """
const KEY = Symbol.for("sharding-workbench.plotly-figure-widget");
const TIMEOUT = { signal: AbortSignal.timeout(%(timeout)d) };
function plotlyModule(experimental) {
  if (!globalThis[KEY]) {
    globalThis[KEY] = experimental.invoke("_send_bundle", {}, TIMEOUT).then(async ([, buffers]) => {
      const url = URL.createObjectURL(new Blob([buffers[0]], { type: "text/javascript" }));
      try { return await import(/* webpackIgnore: true */ url); } finally { URL.revokeObjectURL(url); }
    });
    globalThis[KEY].catch(() => { delete globalThis[KEY]; });  // a failed fetch is tried again by the next figure
  }
  return globalThis[KEY];
}
export default () => {
  let started;
  return {
    initialize(context) {
      const module = plotlyModule(context.experimental);
      started = (async () => {
        const figure = (await module).default();
        await figure.initialize(context);
        await context.experimental.invoke("_resend_figure", {}, TIMEOUT);
        return figure;
      })();
      started.catch((error) => console.error("[sharding-workbench] plotly figure:", error));
    },
    async render(context) {
      // plotly's view under anywidget sizes itself once, when drawn: a figure drawn in a hidden tab, or in
      // a notebook narrowed by its sidebar, kept plotly's 700 px default. Its responsive handler (config
      // "responsive") resizes it to its element, here whenever the element's size changes.
      const element = context.el;
      element.style.width = "100%%";  // the figure spans its container, and shrinks with it (a flex item
      element.style.minWidth = "0";  // would otherwise keep its drawing's width and overflow)
      const remove = (await started).render(context);
      let width = element.clientWidth;
      const observer = new ResizeObserver(() => {
        if (element.clientWidth !== width && element._responsiveChartHandler) {
          width = element.clientWidth;
          element._responsiveChartHandler();
        }
      });
      observer.observe(element);
      return () => { observer.disconnect(); if (typeof remove === "function") remove(); };
    },
  };
};
""" % {"timeout": BUNDLE_TIMEOUT_MS}  # noqa: UP031 - with str.format every brace of the JavaScript would double


@functools.cache
def _bundle_bytes() -> bytes:
    return BUNDLE.read_bytes()


class FigureWidget(go.FigureWidget):
    """A ``go.FigureWidget`` whose state, when a browser asks for it, is the figure as it is now, and whose
    front end is plotly's, fetched once per page (:data:`LOADER`)."""

    _esm = LOADER
    # Types for what plotly leaves unannotated, as an instance reads them. ``_config`` (a synced ``Dict`` trait):
    # ``__init__`` assigns it, and pyright would infer its type from that assignment, which reads it. ``data`` (a
    # property): pyright infers it from ``BaseFigure.__getitem__``, a union with the figure, iterated as its keys.
    _config: dict[str, Any]
    data: tuple[Any, ...]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._config = {**RESPONSIVE, **(self._config or {})}

    @command
    def _send_bundle(self, _message: Any, _buffers: list[bytes]) -> tuple[dict, list[bytes]]:
        """plotly's front-end module, for the loader of the first figure on a page."""
        return {"bytes": len(_bundle_bytes())}, [_bundle_bytes()]

    @command
    def _resend_figure(self, _message: Any, _buffers: list[bytes]) -> tuple[dict, list[bytes]]:
        """The figure as it is now, sent before the answer: plotly's model starts from it."""
        self.send_state(list(_CURRENT))
        return {}, []

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
