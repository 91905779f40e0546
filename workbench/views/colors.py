"""One colour per device, the same in every view: the table, the plotly figures and JAX's own picture.

The palette is colour-blind safe. It starts with Okabe and Ito's eight colours, with their black
swapped for a mid grey so that device labels stay readable on it, and goes on with Paul Tol's "muted"
scheme (without its pale grey, which Tol reserves for missing data) for meshes of more than eight
devices. Beyond that the palette cycles: device ``n`` and device ``n + len(PALETTE)`` share a colour,
and every view also prints the device id, so no device is ever identified by colour alone. In the plotly
figures a block held by several devices gets none of their colours but a neutral :data:`SHARED_COLORS`.
"""

from __future__ import annotations

# Okabe & Ito (2008), "Color Universal Design"; black (#000000) replaced by mid grey, moved last so
# device 0 gets a colour rather than grey.
OKABE_ITO = (
    "#e69f00",  # orange
    "#56b4e9",  # sky blue
    "#009e73",  # bluish green
    "#f0e442",  # yellow
    "#0072b2",  # blue
    "#d55e00",  # vermillion
    "#cc79a7",  # reddish purple
    "#8c8c8c",  # mid grey (for Okabe-Ito's black)
)

# Paul Tol, "Colour Schemes" (SRON/EPS/TN/09-002), muted scheme without its pale grey.
TOL_MUTED = (
    "#cc6677",  # rose
    "#332288",  # indigo
    "#ddcc77",  # sand
    "#117733",  # green
    "#88ccee",  # cyan
    "#882255",  # wine
    "#44aa99",  # teal
    "#999933",  # olive
    "#aa4499",  # purple
)

PALETTE: tuple[str, ...] = OKABE_ITO + TOL_MUTED

# A block held by several devices is drawn in a neutral grey, never in a holder's colour: in a device's
# colour it would read as that device's shard, and in its holders' colours as stripes, i.e. as more blocks.
# Two light greys, unlike every colour of PALETTE, alternate so neighbouring shared blocks stay apart.
SHARED_COLORS: tuple[str, str] = ("#e4e4e4", "#c8c8c8")


def palette_index(device_id: int) -> int:
    """The position of a device's colour in :data:`PALETTE` (ids cycle through it).

    Example:
        >>> palette_index(0), palette_index(len(PALETTE))
        (0, 0)
    """
    return int(device_id) % len(PALETTE)


def device_color(device_id: int) -> str:
    """The colour of a device, as ``"#rrggbb"``: stable for an id across every view and array.

    Example:
        >>> device_color(0), device_color(7)
        ('#e69f00', '#8c8c8c')
    """
    return PALETTE[palette_index(device_id)]


def hex_to_rgb(color: str) -> tuple[int, int, int]:
    """``"#rrggbb"`` as 0-255 integers.

    Example:
        >>> hex_to_rgb("#e69f00")
        (230, 159, 0)
    """
    text = color.lstrip("#")
    if len(text) != 6:
        raise ValueError(f"colour {color!r} is not in #rrggbb form: write e.g. '#e69f00'")
    return int(text[0:2], 16), int(text[2:4], 16), int(text[4:6], 16)


def _relative_luminance(color: str) -> float:
    """WCAG 2 relative luminance, 0 (black) to 1 (white)."""

    def linear(channel: int) -> float:
        value = channel / 255
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4

    red, green, blue = (linear(c) for c in hex_to_rgb(color))
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def text_color_for(background: str) -> str:
    """Black or white, whichever contrasts more with ``background`` (by the WCAG contrast ratio).

    Example:
        >>> text_color_for("#f0e442"), text_color_for("#332288")
        ('#000000', '#ffffff')
    """
    luminance = _relative_luminance(background)
    contrast_with_black = (luminance + 0.05) / 0.05
    contrast_with_white = 1.05 / (luminance + 0.05)
    return "#000000" if contrast_with_black >= contrast_with_white else "#ffffff"


# The profiler timeline: compute in a neutral grey, so every collective kind stands out in its own colour.
COMPUTE_COLOR = "#c8c8c8"
COLLECTIVE_COLORS = {
    "all-reduce": OKABE_ITO[5],  # vermillion
    "all-gather": OKABE_ITO[4],  # blue
    "reduce-scatter": OKABE_ITO[2],  # bluish green
    "all-to-all": OKABE_ITO[6],  # reddish purple
    "collective-permute": OKABE_ITO[0],  # orange
}


def op_kind_color(kind: str) -> str:
    """The colour of an op kind in the profiler timeline: grey for ``"compute"``, one colour per collective kind.

    Example:
        >>> op_kind_color("compute"), op_kind_color("all-reduce")
        ('#c8c8c8', '#d55e00')
    """
    if kind == "compute":
        return COMPUTE_COLOR
    return COLLECTIVE_COLORS.get(kind, TOL_MUTED[1])  # a kind added later: indigo, unlike the others
