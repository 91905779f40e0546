"""Text formatting shared by every layer: byte counts, shapes, durations, and aligned text tables.

This module imports only the standard library, so any part of the workbench (layout, training, analysis,
views, the CLI) can format numbers and tables without depending on the views or on JAX.

Example:
    >>> print("\\n".join(align_columns(["array", "bytes"], [["w", format_bytes(2048)], ["b", format_bytes(64)]],
    ...                                right=[1])))
    array    bytes
    -----  -------
    w      2.0 KiB
    b         64 B
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
COLUMN_GAP = "  "


def format_bytes(n: int) -> str:
    """Bytes in binary units: ``B`` below 1 KiB, else one decimal.

    Example:
        >>> format_bytes(512), format_bytes(2048), format_bytes(3 * 2**30 // 2)
        ('512 B', '2.0 KiB', '1.5 GiB')
    """
    value = float(n)
    for unit in BYTE_UNITS:
        if abs(value) < 1024 or unit == BYTE_UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_bytes_exact(n: int) -> str:
    """Human units plus the exact count, e.g. ``2.0 KiB (2,048 B)``; bytes alone below 1 KiB.

    Example:
        >>> format_bytes_exact(2048)
        '2.0 KiB (2,048 B)'
    """
    human = format_bytes(n)
    return human if human.endswith(" B") else f"{human} ({n:,} B)"


def format_shape(shape: Sequence[int]) -> str:
    """An array shape as ``[4, 16, 8]``; a scalar is ``[]``.

    Example:
        >>> format_shape((4, 16, 8)), format_shape(())
        ('[4, 16, 8]', '[]')
    """
    return "[" + ", ".join(str(s) for s in shape) + "]"


def format_seconds(seconds: float) -> str:
    """A duration with three significant digits: ``12.3 ms``, ``4.56 s``, ``789 us``.

    Example:
        >>> format_seconds(0.0123), format_seconds(4.56), format_seconds(7.89e-4)
        ('12.3 ms', '4.56 s', '789 us')
    """
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s")


def format_bandwidth(bytes_per_second: float | None) -> str:
    """A transfer rate in decimal units (as network links are quoted), three significant digits; ``-`` when unknown.

    Example:
        >>> format_bandwidth(37_678_658), format_bandwidth(2.1e11), format_bandwidth(None)
        ('37.7 MB/s', '210 GB/s', '-')
    """
    if bytes_per_second is None:
        return "-"
    value = float(bytes_per_second)
    for unit in RATE_UNITS:
        if abs(value) < 999.5 or unit == RATE_UNITS[-1]:
            return f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def align_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    """A text table as lines: the header, a rule of dashes, then one line per row, in padded columns.

    Columns are two spaces apart; those whose positions are in ``right`` are right-aligned (numbers, so
    their digits line up), the others left-aligned. Trailing spaces are stripped. Every table the
    workbench prints goes through here, so they all look alike.

    Raises ``ValueError`` when a row has a different number of cells from ``headers``, or a position in
    ``right`` is not a column.

    Example:
        >>> for line in align_columns(["kind", "count"], [["all-reduce", "12"], ["all-gather", "3"]], right=[1]):
        ...     print(line)
        kind        count
        ----------  -----
        all-reduce     12
        all-gather      3
    """
    right = set(right)
    for number, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(
                f"row {number} has {len(row)} cells {list(row)!r} but there are {len(headers)} headers "
                f"{list(headers)!r}: give every row one cell per header"
            )
    outside = sorted(p for p in right if not 0 <= p < len(headers))
    if outside:
        raise ValueError(
            f"right-aligned column(s) {outside} do not exist: the {len(headers)} columns are numbered 0 to "
            f"{len(headers) - 1}"
        )
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return COLUMN_GAP.join(padded).rstrip()

    return [line(headers), COLUMN_GAP.join("-" * w for w in widths), *(line(r) for r in rows)]


__all__ = ["align_columns", "format_bandwidth", "format_bytes", "format_bytes_exact", "format_seconds", "format_shape"]
