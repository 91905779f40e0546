"""JAX's own sharding picture (``jax.debug.visualize_sharding``), captured as text and HTML.

JAX draws the picture with ``rich`` and prints it: it creates its own ``rich.console.Console`` and
returns nothing. Redirecting ``sys.stdout`` is not enough to capture it, because inside Jupyter rich
skips stdout and displays HTML straight into the notebook, and outside a terminal it drops the colours.
So, for the duration of the call (under a lock), :func:`capture_visualize_sharding` swaps
``rich.console.Console`` for a subclass that writes colour codes into our buffer whatever the
environment; stdout is redirected into the same buffer too, in case a JAX version prints directly. The
ANSI text is then turned into HTML with ``rich.text.Text.from_ansi`` and a recording console.

Colours: JAX colours tiles by position (and needs matplotlib for that). We pass it a colour map that
gives each tile the :func:`~workbench.views.colors.device_color` of the lowest device id holding it, so its
picture matches every other view. JAX only draws 1-D and 2-D arrays on real devices: a layout on an
abstract mesh is placed on the first ``n`` local devices when there are enough; otherwise use
:func:`~workbench.views.text.tiling_picture` or :func:`~workbench.views.figures.layout_figure`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding

from .colors import device_color, hex_to_rgb, text_color_for
from ..errors import WorkbenchError
from ..layout.array_layout import ArrayLayout
from ..layout.mesh import build_mesh

# Swapping rich's Console is process-wide: one capture at a time.
_CAPTURE_LOCK = threading.Lock()

_HTML_FRAGMENT = (
    '<pre style="font-family:Menlo,\'DejaVu Sans Mono\',Consolas,\'Courier New\',monospace;'
    'line-height:1.15;margin:0"><code style="font-family:inherit">{code}</code></pre>'
)


@dataclasses.dataclass(frozen=True)
class JaxPicture:
    """JAX's sharding picture: ``text`` (plain, with box lines), ``html`` (coloured, inline styles),
    and ``ansi`` (the coloured picture as terminal text, e.g. to ``print`` in a terminal). Shows itself
    as HTML in a notebook."""

    text: str
    html: str
    ansi: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.text


class _DeviceColorMap:
    """A JAX colour map that ignores its argument and returns the next tile's colour.

    JAX asks for one colour per tile, in row-major tile order; we hand out the holders' device colours
    in that order. Components are offset by half a step so that JAX's ``int(c * 255)`` gives back the
    exact byte.
    """

    def __init__(self, colors: Sequence[str]):
        self._colors = list(colors)
        self._calls = 0

    def __call__(self, _position: float) -> tuple[float, float, float, float]:
        color = self._colors[self._calls % len(self._colors)]
        self._calls += 1
        red, green, blue = ((c + 0.5) / 255 for c in hex_to_rgb(color))
        return red, green, blue, 1.0


def _tile_colors(shape: tuple[int, ...], sharding: Any) -> list[str]:
    """The colour of each of JAX's tiles, in its row-major order: the lowest holder's device colour.

    Read from the sharding JAX draws (not from our layout maths) so it matches JAX's tiles exactly,
    for any sharding, including ones the workbench did not make.
    """
    holders: dict[tuple[int, ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        starts = tuple(s.start or 0 for s in index)
        holders.setdefault(starts, []).append(device.id)
    return [device_color(min(holders[starts])) for starts in sorted(holders)]


def _check_rank(shape: tuple[int, ...]) -> None:
    if len(shape) in (1, 2):
        return
    alternative = (
        "workbench.views.text.tiling_picture or workbench.views.figures.layout_figure"
        if not shape
        else "workbench.views.figures.layout_figure (small multiples) or workbench.views.text.layout_table"
    )
    raise WorkbenchError(
        f"JAX's visualize_sharding draws only 1-D and 2-D arrays, but this one has shape {shape} "
        f"({len(shape)}-D): use {alternative}"
    )


def _sharding_for_layout(layout: ArrayLayout):
    """A concrete ``NamedSharding`` for a layout: its own devices, or the first local ones if abstract."""
    local = jax.devices()
    if layout.concrete:
        by_id = {device.id: device for device in local}
        missing = [i for i in layout.device_ids if i not in by_id]
        if missing:
            raise WorkbenchError(
                f"the layout's devices {missing[:8]} are not among JAX's devices: draw it with "
                "workbench.views.text.tiling_picture or workbench.views.figures.layout_figure instead"
            )
        devices = [by_id[i] for i in layout.device_ids]
    else:
        if layout.num_devices > len(local):
            raise WorkbenchError(
                f"mesh {layout.mesh} has {layout.num_devices:,} devices but JAX has {len(local)} "
                f"({local[0].platform}), and JAX's picture needs real devices: use "
                "workbench.views.text.tiling_picture or workbench.views.figures.layout_figure, which draw "
                "abstract meshes of any size"
            )
        devices = local[: layout.num_devices]
    return NamedSharding(build_mesh(layout.mesh, devices=devices), layout.spec)


def _shape_and_sharding(layout_or_array: Any) -> tuple[tuple[int, ...], Any]:
    if isinstance(layout_or_array, ArrayLayout):
        _check_rank(layout_or_array.shape)
        return layout_or_array.shape, _sharding_for_layout(layout_or_array)
    shape = tuple(int(s) for s in getattr(layout_or_array, "shape", ()))
    sharding = getattr(layout_or_array, "sharding", None)
    if sharding is None:
        raise WorkbenchError(
            f"cannot draw a {type(layout_or_array).__name__}: give an ArrayLayout, a jax.Array, or a "
            "jax.ShapeDtypeStruct with a sharding"
        )
    _check_rank(shape)
    return shape, sharding


@contextlib.contextmanager
def _rich_output_into(buffer: io.StringIO) -> Iterator[None]:
    """Inside the block, every rich Console writes colour codes into ``buffer`` (never to a notebook)."""
    import rich.console

    original = rich.console.Console

    class _CapturingConsole(original):  # a subclass, so isinstance checks inside rich still hold
        def __init__(self, *args, **kwargs):
            kwargs.update(
                file=buffer, force_terminal=True, force_jupyter=False, color_system="truecolor", no_color=False
            )
            super().__init__(*args, **kwargs)

    with _CAPTURE_LOCK:
        rich.console.Console = _CapturingConsole
        try:
            with contextlib.redirect_stdout(buffer):
                yield
        finally:
            rich.console.Console = original


def _plain_text(ansi: str) -> str:
    """ANSI text without its escape codes and trailing blanks."""
    from rich.text import Text

    lines = [line.rstrip() for line in Text.from_ansi(ansi).plain.splitlines()]
    return "\n".join(lines).strip("\n") + "\n"


def _with_readable_labels(ansi: str):
    """JAX's coloured picture as rich ``Text``, each tile's label in our black-or-white for its colour.

    JAX picks label colours with its own brightness threshold, which puts white on our orange; the
    workbench uses one contrast rule (:func:`~workbench.views.colors.text_color_for`) in every view.
    """
    from rich.style import Style
    from rich.text import Span, Text

    text = Text.from_ansi(ansi)
    spans = []
    for span in text.spans:
        style = span.style if isinstance(span.style, Style) else Style.parse(span.style)
        if style.bgcolor is not None:
            background = style.bgcolor.get_truecolor().hex
            style = style + Style(color=text_color_for(background))
        spans.append(Span(span.start, span.end, style))
    text.spans = spans
    return text


def _ansi_and_html(ansi: str, width: int) -> tuple[str, str]:
    """The picture re-rendered with readable labels, as ANSI and as an HTML fragment with inline styles."""
    from rich.console import Console

    out = io.StringIO()
    recorder = Console(
        record=True, file=out, width=width, force_terminal=True, force_jupyter=False, color_system="truecolor"
    )
    recorder.print(_with_readable_labels(ansi), soft_wrap=True)
    return out.getvalue(), recorder.export_html(inline_styles=True, code_format=_HTML_FRAGMENT)


def capture_visualize_sharding(
    layout_or_array: Any, *, max_width: int = 80, min_width: int = 9, scale: float = 1.0
) -> JaxPicture:
    """JAX's own ``visualize_sharding`` picture of a layout or an array, as text and HTML.

    Allocates nothing: JAX is given the shape and the sharding only. Tiles are labelled by JAX
    (``CPU 0``, ``TPU 4,5``) and coloured with each tile's lowest device id's
    :func:`~workbench.views.colors.device_color`.

    Args:
        layout_or_array: an :class:`~workbench.layout.array_layout.ArrayLayout` (an abstract mesh is placed on the
            first local devices), a ``jax.Array``, or a ``jax.ShapeDtypeStruct`` with a sharding.
        max_width, min_width, scale: passed to ``jax.debug.visualize_sharding``.

    Raises :class:`~workbench.errors.WorkbenchError` for 0-D and 3-D+ arrays, and for meshes with
    more devices than JAX has; the message names the view to use instead.

    Example:
        >>> picture = capture_visualize_sharding(layout_array((8, 16), "data=2,model=4", "data, model"))
        >>> "CPU 5" in picture.text
        True
    """
    shape, sharding = _shape_and_sharding(layout_or_array)
    options: dict[str, Any] = dict(max_width=max_width, min_width=min_width, scale=scale)
    colored, plain = io.StringIO(), io.StringIO()
    with _rich_output_into(colored):
        color_map = _DeviceColorMap(_tile_colors(shape, sharding))
        jax.debug.visualize_sharding(shape, sharding, color_map=color_map, **options)
    # Without colour JAX draws box lines between tiles: the readable plain-text form.
    with _rich_output_into(plain):
        jax.debug.visualize_sharding(shape, sharding, use_color=False, **options)
    ansi, html = _ansi_and_html(colored.getvalue().rstrip(), max_width)
    return JaxPicture(text=_plain_text(plain.getvalue()), html=html, ansi=ansi)
