"""Live plots that cost training nothing: bounded, downsampled series and throttled redraws.

A plotly ``FigureWidget`` has no append: assigning ``trace.y`` resends the whole array to the browser.
Plotting every logged point of a long run would make each redraw slower than the last, so:

* :class:`BoundedSeries` keeps at most ``max_points`` points of a growing series (every k-th point,
  plus the newest), so a 10,000-step run redraws as fast as a 100-step one;
* :class:`Throttle` says when a redraw is due (a few per second at most);
* :class:`LivePlot` owns one ``FigureWidget`` and its named traces, and redraws only the traces that
  changed, all in one ``batch_update`` (one message), always updating the existing traces in place. Until a
  trace has a point, its :attr:`LivePlot.widget` shows a line saying what will appear there, not empty axes.

Appending is cheap and may happen in the training thread; a lock makes appends, redraws and clears from
different threads (the trainer's and the kernel's) safe.

Example:
    >>> plot = LivePlot("loss", y_title="loss")
    >>> plot.add_trace("train", color="#0072b2")
    >>> for step in range(1, 10_001):
    ...     plot.append("train", step, 1.0 / step)
    >>> plot.redraw()
    >>> len(plot.figure.data[0].x) <= 600, int(plot.figure.data[0].x[-1])
    (True, 10000)
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from .figure_widget import FigureWidget

MAX_POINTS = 600  # per trace: enough for a smooth curve at any plot width, small enough to resend often
FIGURE_HEIGHT = 260
# plotly's toolbar, trimmed to what a live curve needs and shown on hover only, so it never covers a title.
TOOLBAR = {"displaylogo": False, "displayModeBar": "hover",
           "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "toggleSpikelines",
                                      "hoverClosestCartesian", "hoverCompareCartesian"]}
PLACEHOLDER_STYLE = ("border:1px dashed #bbb;border-radius:4px;padding:12px;margin:4px 0;color:#555;"
                     "min-height:3em")


class BoundedSeries:
    """A growing (x, y) series kept to at most ``max_points`` points: every k-th point, plus the last.

    When the kept points fill up, every other one is dropped and k doubles. Memory and the cost of
    drawing stay bounded however long the run, an append is O(1) amortised, the kept points stay
    evenly spread and in the order appended, and the newest point is always shown.

    Example:
        >>> series = BoundedSeries(max_points=100)
        >>> for step in range(10_000):
        ...     series.append(step, float(step))
        >>> xs, ys = series.arrays()
        >>> len(xs) <= 100, int(xs[-1])
        (True, 9999)
    """

    def __init__(self, max_points: int = MAX_POINTS):
        if max_points < 3:
            raise ValueError(f"max_points={max_points} is too small to draw a curve: use at least 3, e.g. 600")
        self.max_points = max_points
        self.clear()

    def clear(self) -> None:
        self._x: list[float] = []
        self._y: list[float] = []
        self._stride = 1  # keep appended point n when n % stride == 0
        self._count = 0
        self._last: tuple[float, float] | None = None

    def __len__(self) -> int:
        """How many points :meth:`arrays` returns."""
        return len(self._x) + (1 if self._extra_last() is not None else 0)

    @property
    def count(self) -> int:
        """How many points were appended in all."""
        return self._count

    def append(self, x: float, y: float) -> None:
        if self._count % self._stride == 0:
            self._x.append(x)
            self._y.append(y)
            if len(self._x) >= self.max_points:  # one slot stays free for the newest point
                # Kept points are appended points 0, s, 2s, ...; keeping every other leaves 0, 2s, 4s, ...
                self._x, self._y = self._x[::2], self._y[::2]
                self._stride *= 2
        self._count += 1
        self._last = (x, y)

    def extend(self, xs: Any, ys: Any) -> None:
        for x, y in zip(xs, ys, strict=False):
            self.append(x, y)

    def _extra_last(self) -> tuple[float, float] | None:
        """The newest point when it is kept apart (it did not fall on the stride), else None."""
        return self._last if self._last is not None and (self._count - 1) % self._stride != 0 else None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept points as arrays ``(x, y)`` (y as floats), in the order appended, newest point last."""
        xs, ys = list(self._x), list(self._y)
        extra = self._extra_last()
        if extra is not None:
            xs.append(extra[0])
            ys.append(extra[1])
        return np.asarray(xs), np.asarray(ys, dtype=float)


class Throttle:
    """Says when a redraw is due: at most once per ``interval`` seconds, unless forced.

    Example:
        >>> throttle = Throttle(0.25, clock=iter([0.0, 0.1, 0.3, 0.31]).__next__)
        >>> [throttle.ready(), throttle.ready(), throttle.ready(), throttle.ready(force=True)]
        [True, False, True, True]
    """

    def __init__(self, interval: float = 0.25, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._last: float | None = None

    def ready(self, force: bool = False) -> bool:
        """True (and the clock restarts) when ``interval`` has passed since the last True, or ``force``."""
        now = self.clock()
        if force or self._last is None or now - self._last >= self.interval:
            self._last = now
            return True
        return False

    def reset(self) -> None:
        """The next :meth:`ready` is True."""
        self._last = None


class LivePlot:
    """A ``FigureWidget`` whose named traces are fed from :class:`BoundedSeries` and redrawn together.

    Traces are added once (:meth:`add_trace`) and afterwards only their ``x``/``y`` arrays and style
    change: a figure is never rebuilt, so the browser keeps its zoom and legend choices.

    Example:
        >>> plot = LivePlot("throughput", y_title="examples/s")
        >>> plot.add_trace("train", color="#009e73")
        >>> plot.append("train", 10, 2500.0)
        >>> plot.redraw()
        >>> plot.figure.data[0].y.tolist()
        [2500.0]
    """

    def __init__(self, title: str, *, x_title: str = "step", y_title: str = "", height: int = FIGURE_HEIGHT,
                 max_points: int = MAX_POINTS, placeholder: str = ""):
        self.max_points = max_points
        self.title = title
        self.figure = FigureWidget(layout=go.Layout(
            title={"text": title, "font": {"size": 14}, "x": 0.0, "xanchor": "left", "xref": "paper"},
            height=height, autosize=True,
            margin={"l": 55, "r": 10, "t": 35, "b": 40}, template="plotly_white",
            xaxis={"title": {"text": x_title}}, yaxis={"title": {"text": y_title}},
            legend={"orientation": "h", "y": -0.25, "font": {"size": 10}},
        ))
        self.figure._config = {**self.figure._config, **TOOLBAR}  # a short toolbar, on hover, clear of the title
        self.placeholder = widgets.HTML()
        self.placeholder.add_class("wb-plot-placeholder")
        self._frame = widgets.Box([self.figure], layout=widgets.Layout(width="100%"))
        #: What a layout shows: the figure once it has points, else a line saying what will be drawn there.
        self.widget = widgets.VBox([self.placeholder, self._frame], layout=widgets.Layout(width="100%", min_width="0"))
        self.set_placeholder(placeholder or "drawn here once a run logs it")
        self._frame.layout.display = "none"  # empty until a trace has a point: the placeholder says what comes
        self._series: dict[str, BoundedSeries] = {}
        self._index: dict[str, int] = {}
        self._dirty: set[str] = set()
        # The training thread appends and redraws while the kernel's thread may clear or restyle.
        self._lock = threading.RLock()

    @property
    def names(self) -> list[str]:
        """The trace names, in the order added."""
        return list(self._index)

    def has_trace(self, name: str) -> bool:
        return name in self._index

    def trace(self, name: str) -> Any:
        """The plotly trace called ``name`` (read its ``x``/``y`` to see what is drawn)."""
        return self.figure.data[self._index[name]]

    def series(self, name: str) -> BoundedSeries:
        return self._series[name]

    def add_trace(self, name: str, *, color: str, label: str | None = None, dash: str | None = None,
                  width: float = 2, opacity: float = 1.0, markers: bool = False, visible: bool = True) -> None:
        """Add an empty line trace called ``name`` (shown as ``label`` in the legend)."""
        with self._lock:
            if name in self._index:
                raise ValueError(f"trace {name!r} exists already: give each trace its own name")
            self.figure.add_scatter(
                x=[], y=[], name=label or name, mode="lines+markers" if markers else "lines",
                line={"color": color, "dash": dash, "width": width}, marker={"size": 5}, opacity=opacity,
                visible=visible,
            )
            self._index[name] = len(self.figure.data) - 1
            self._series[name] = BoundedSeries(self.max_points)

    def append(self, name: str, x: float, y: float) -> None:
        """Add a point to trace ``name``'s series; it is drawn at the next :meth:`redraw`."""
        with self._lock:
            self._series[name].append(x, y)
            self._dirty.add(name)

    def replace(self, name: str, xs: Any, ys: Any) -> None:
        """Set trace ``name``'s whole series (downsampled like appended points)."""
        with self._lock:
            series = self._series[name]
            series.clear()
            series.extend(xs, ys)
            self._dirty.add(name)

    def style(self, trace: str, /, **properties: Any) -> None:
        """Change trace ``trace``'s plotly properties (``name=`` its legend label, ``visible=``...) in place."""
        with self._lock:
            self.trace(trace).update(**properties)

    def clear(self, names: Any = None) -> None:
        """Empty the given traces (all by default); drawn empty at the next :meth:`redraw`."""
        with self._lock:
            for name in self._index if names is None else names:
                self._series[name].clear()
                self._dirty.add(name)

    def set_placeholder(self, text: str) -> None:
        """What the plot says while it has no point to draw (e.g. why a diagnostic is off)."""
        self.placeholder.value = (f'<div style="{PLACEHOLDER_STYLE}"><b>{html.escape(self.title)}</b>: '
                                  f"{html.escape(text)}</div>")

    @property
    def empty(self) -> bool:
        """Whether no trace holds a point (the placeholder is shown instead of the figure)."""
        return not any(len(series) for series in self._series.values())

    def redraw(self) -> None:
        """Send the traces that changed since the last redraw, in one message; show the figure once it has points."""
        with self._lock:
            if self._dirty:
                with self.figure.batch_update():
                    for name in self._dirty:
                        xs, ys = self._series[name].arrays()
                        trace = self.figure.data[self._index[name]]
                        trace.x, trace.y = xs, ys
                self._dirty.clear()
            empty = self.empty
            self._frame.layout.display = "none" if empty else None
            self.placeholder.layout.display = None if empty else "none"
