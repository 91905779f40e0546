"""Partition specs: parse text into ``PartitionSpec`` without ``eval``, format it back, and validate it
against a mesh and an array shape.

Accepted text (Python's tuple rules, read by a small parser):

* ``data, None`` / ``('data', None)`` / ``P('data', None)`` / ``PartitionSpec("data", None)``
* ``(data, model), None``: several mesh axes on one dimension (``data`` major, ``model`` minor)
* ``''`` or ``P()``: fully replicated
* ``None``, ``none``, ``null`` and ``-`` all mean "not sharded on this dimension".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from jax.sharding import PartitionSpec

from ..errors import SpecError
from .mesh import parse_mesh

NONE_WORDS = frozenset({"None", "none", "null", "-"})
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<open>[(\[]) | (?P<close>[)\]]) | (?P<comma>,) |
        (?P<quoted>'[^']*'|"[^"]*") | (?P<word>[A-Za-z_][A-Za-z0-9_]*|-)
    )""",
    re.VERBOSE,
)

Entry = None | str | tuple[str, ...]


class _Group(list):
    """A parenthesised group while parsing; ``had_comma`` distinguishes ``(a)`` from ``(a,)``."""

    had_comma = False


def _tokens(text: str) -> list[tuple[str, str, int]]:
    tokens, pos = [], 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if not match or match.lastgroup is None:  # (each alternative of _TOKEN is a named group)
            bad = stripped[pos:].lstrip()[:10]
            raise SpecError(
                f"cannot read partition spec {text!r} at {bad!r}: write axis names and None separated "
                "by commas, e.g. 'data, None' or '(data, model), None'"
            )
        kind = match.lastgroup
        tokens.append((kind, match.group(kind), match.start(kind)))
        pos = match.end()
    return tokens


def _parse_group(tokens, index, text, closing) -> tuple[_Group, int]:
    """Items up to the closing bracket (or the end when closing is None)."""
    items = _Group()
    expect_item = True
    while index < len(tokens):
        kind, value, _ = tokens[index]
        if kind == "close":
            if closing is None:
                raise SpecError(f"partition spec {text!r} has an unmatched {value!r}: "
                                "remove it or add its opening bracket")
            return items, index + 1
        if kind == "comma":
            if expect_item:
                raise SpecError(f"partition spec {text!r} has an empty entry (two commas?): "
                                "write None for an unsharded dimension")
            items.had_comma = True
            expect_item = True
            index += 1
            continue
        if not expect_item:
            raise SpecError(f"partition spec {text!r} needs a comma before {value!r}")
        if kind == "open":
            inner, index = _parse_group(tokens, index + 1, text, value)
            items.append(inner)
        else:
            if kind == "word" and value in {"P", "PartitionSpec"}:
                raise SpecError(f"partition spec {text!r} uses {value} inside a spec: "
                                "write P(...) only around the whole spec")
            items.append(value[1:-1] if kind == "quoted" else value)
            index += 1
        expect_item = False
    if closing is not None:
        raise SpecError(f"partition spec {text!r} is missing a closing bracket: add ')'")
    return items, index


def _simplify(item):
    """Python's rule: brackets without a comma only group, ``(a)`` is ``a``."""
    if isinstance(item, _Group) and not item.had_comma and len(item) == 1:
        return _simplify(item[0])
    return item


def _entry(item, text: str) -> Entry:
    item = _simplify(item)
    if isinstance(item, _Group):
        names = []
        for inner in item:
            inner = _simplify(inner)
            if isinstance(inner, _Group):
                raise SpecError(f"partition spec {text!r} nests brackets too deeply: "
                                "one level groups mesh axes, e.g. (data, model)")
            if inner in NONE_WORDS:
                raise SpecError(f"partition spec {text!r} puts None inside an axis group: "
                                "write None on its own for an unsharded dimension")
            names.append(inner)
        if not names:
            return None
        return names[0] if len(names) == 1 else tuple(names)
    if item in NONE_WORDS:
        return None
    return item


def parse_spec(text: str | PartitionSpec | Sequence[Any] | None) -> PartitionSpec:
    """Read a partition spec from text (never with ``eval``), a ``PartitionSpec``, a list, or None.

    Raises :class:`SpecError` naming the unreadable part. Axis names are checked against a mesh by
    :func:`validate_spec`, not here.

    Example:
        >>> parse_spec("(data, model), None")
        P(('data', 'model'), None)
        >>> parse_spec("P('data', None)")
        P('data', None)
    """
    if text is None:
        return PartitionSpec()
    if isinstance(text, PartitionSpec):
        return text
    if not isinstance(text, str):
        return spec_from_json(list(text))
    tokens = _tokens(text)
    if not tokens:
        return PartitionSpec()
    # P(...) / PartitionSpec(...): the brackets hold the argument list.
    if tokens[0][0] == "word" and tokens[0][1] in {"P", "PartitionSpec"}:
        if len(tokens) < 2 or tokens[1][0] != "open" or tokens[1][1] != "(":
            raise SpecError(f"partition spec {text!r} has {tokens[0][1]} without '(': write e.g. P('data', None)")
        items, end = _parse_group(tokens, 2, text, "(")
        if end != len(tokens):
            raise SpecError(f"partition spec {text!r} has text after the closing ')': remove it")
        entries = list(items)
    else:
        items, _ = _parse_group(tokens, 0, text, None)
        entries = list(items)
        whole = _bracketed_whole_spec(items)
        if whole is not None:
            entries = list(whole)
    return PartitionSpec(*(_entry(item, text) for item in entries))


def _bracketed_whole_spec(items: _Group) -> _Group | None:
    """The group inside when text is a whole spec in brackets, ``(data, None)`` or ``()``, else None.

    Python reads ``(data, model)`` as a tuple of two entries, one per dimension, and ``(data, model),`` as
    one entry grouping two axes; the parser follows it.
    """
    if len(items) != 1 or items.had_comma:
        return None
    only = _simplify(items[0])
    if isinstance(only, _Group) and (only.had_comma or not only):
        return only
    return None


def _reads_as_bracketed_spec(text: str) -> bool:
    """Whether spec text is several entries in one pair of brackets, like ``(data, model)``."""
    tokens = _tokens(text)
    if not tokens or tokens[0][0] != "open":
        return False
    whole = _bracketed_whole_spec(_parse_group(tokens, 0, text, None)[0])
    return whole is not None and len(whole) > 1


def spec_entries(spec: PartitionSpec) -> tuple[Entry, ...]:
    """The spec's entries with one-axis groups ``('data',)`` read as ``'data'`` and ``()`` as None."""
    out = []
    for entry in tuple(spec):
        if isinstance(entry, (tuple, list)):
            entry = tuple(entry)
            entry = None if not entry else entry[0] if len(entry) == 1 else entry
        out.append(entry)
    return tuple(out)


def entry_axes(entry: Entry) -> tuple[str, ...]:
    """The mesh axes one spec entry shards over, major first."""
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    return (entry,)


def only_axes(spec: PartitionSpec, axes: set[str]) -> PartitionSpec:
    """``spec`` with only the mesh axes ``axes`` kept: what a shard_map manual over them takes.

    Example:
        >>> only_axes(PartitionSpec("data", "model"), {"data"})
        P('data', None)
    """
    return _filtered(spec, lambda axis: axis in axes)


def without_axes(spec: PartitionSpec, axes: set[str]) -> PartitionSpec:
    """``spec`` without the mesh axes ``axes``: how a leaf stays split over the others inside such a shard_map.

    Example:
        >>> without_axes(PartitionSpec("data", "model"), {"data"})
        P(None, 'model')
    """
    return _filtered(spec, lambda axis: axis not in axes)


def _filtered(spec: PartitionSpec, keep: Any) -> PartitionSpec:
    entries = [tuple(a for a in entry_axes(entry) if keep(a)) for entry in spec_entries(spec)]
    if not any(entries):
        return PartitionSpec()
    return PartitionSpec(*(None if not e else e[0] if len(e) == 1 else e for e in entries))


def format_spec(spec: PartitionSpec | str, style: str = "short") -> str:
    """Text for a spec that :func:`parse_spec` reads back to the same spec.

    ``style="short"`` gives ``data, None``; ``style="code"`` gives ``P('data', None)`` for pasting
    into Python.

    Example:
        >>> format_spec(PartitionSpec(("data", "model"), None))
        '(data, model), None'
        >>> format_spec(PartitionSpec("data"), style="code")
        "P('data')"
    """
    entries = spec_entries(parse_spec(spec))
    if style == "code":
        def code(entry):
            if entry is None:
                return "None"
            if isinstance(entry, tuple):
                return "(" + ", ".join(repr(a) for a in entry) + ")"
            return repr(entry)

        return "P(" + ", ".join(code(e) for e in entries) + ")"
    if style != "short":
        raise ValueError(f"format_spec style {style!r} is not 'short' or 'code'")
    if not entries:
        return "P()"
    parts = [
        "None" if e is None else "(" + ", ".join(map(str, e)) + ")" if isinstance(e, tuple) else str(e)
        for e in entries
    ]
    text = ", ".join(parts)
    # One grouped entry alone would read back as a whole spec in brackets: the comma keeps it one entry.
    return text + "," if len(parts) == 1 and isinstance(entries[0], tuple) else text


def spec_to_json(spec: PartitionSpec) -> list:
    """Spec as JSON: each entry null, an axis name, or a list of axis names.

    Example:
        >>> spec_to_json(PartitionSpec("data", None, ("x", "y")))
        ['data', None, ['x', 'y']]
    """
    return [list(e) if isinstance(e, tuple) else e for e in spec_entries(parse_spec(spec))]


def spec_from_json(entries: Sequence[Any]) -> PartitionSpec:
    """The inverse of :func:`spec_to_json`."""
    out = []
    for entry in entries:
        if entry is None or isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, (list, tuple)) and all(isinstance(a, str) for a in entry):
            out.append(tuple(entry) if len(entry) != 1 else entry[0])
        else:
            raise SpecError(f"spec entry {entry!r} is not null, an axis name or a list of axis names")
    return PartitionSpec(*out)


def validate_spec(spec: Any, mesh: Any, shape: Sequence[int] | None = None) -> PartitionSpec:
    """Check a spec against a mesh (and an array shape) and return it as a ``PartitionSpec``.

    Raises :class:`SpecError` for: an axis the mesh does not have, an axis used twice, more entries
    than the array has dimensions, a dimension not divisible by the product of its mesh axes. Each
    message names the dimension, its size, the axes and their product, and a fix.

    Example:
        >>> validate_spec("data, None", "data=4", (8, 3))
        P('data', None)
    """
    parsed = parse_spec(spec)
    mesh_shape = parse_mesh(mesh)
    entries = spec_entries(parsed)
    code = lambda: format_spec(parsed, style="code")  # noqa: E731  (only a message needs the text)
    used: dict[str, int] = {}
    for dim, entry in enumerate(entries):
        for axis in entry_axes(entry):
            if not isinstance(axis, str):
                raise SpecError(f"spec {code()} has {axis!r} where a mesh axis name belongs: use a name such as 'data'")
            if axis not in mesh_shape.names:
                raise SpecError(
                    f"spec {code()} names axis {axis!r}, which mesh {mesh_shape} does not have: "
                    f"use one of {', '.join(mesh_shape.names)} or None"
                )
            if axis in used:
                where = f"dimensions {used[axis]} and {dim}" if used[axis] != dim else f"dimension {dim} twice"
                raise SpecError(
                    f"spec {code()} uses mesh axis {axis!r} on {where}: an axis can shard only one "
                    "dimension, once; use it once and None elsewhere"
                )
            used[axis] = dim
    if shape is None:
        return parsed
    shape = tuple(shape)
    if len(entries) > len(shape):
        raise SpecError(_too_many_entries(spec, entries, mesh_shape, shape))
    for dim, entry in enumerate(entries):
        axes = entry_axes(entry)
        if not axes:
            continue
        parts = math.prod(mesh_shape.axis_size(a) for a in axes)
        size = shape[dim]
        if size % parts:
            padded = -(-size // parts) * parts
            if len(axes) == 1:
                what = f"mesh axis {axes[0]!r} ({parts})"
            else:
                sizes = ", ".join(f"{a!r}={mesh_shape.axis_size(a)}" for a in axes)
                what = f"mesh axes ({sizes}) (product {parts})"
            raise SpecError(
                f"dimension {dim} of size {size} is not divisible by {what}: pad it to {padded} "
                f"or use None for dimension {dim}"
            )
    return parsed


def _too_many_entries(spec: Any, entries: tuple[Entry, ...], mesh: Any, shape: tuple[int, ...]) -> str:
    """The message for a spec with more entries than the array has dimensions, with the likely fix.

    Text like ``(data, model)`` for a 1-D array was almost always meant as both axes on dimension 0,
    which Python (and :func:`parse_spec`) spells ``(data, model),``: say so when that spec fits.
    """
    extra = len(entries) - len(shape)
    drop = f"drop the last {extra} entr{'y' if extra == 1 else 'ies'}"
    problem = (
        f"spec {format_spec(parse_spec(spec), style='code')} has {len(entries)} entries but the array has "
        f"{len(shape)} dimension(s) (shape {shape})"
    )
    if not (isinstance(spec, str) and _reads_as_bracketed_spec(spec) and shape):
        return f"{problem}: {drop}"
    grouped = "(" + ", ".join(str(e) for e in entries) + "),"
    try:
        validate_spec(grouped, mesh, shape)
    except SpecError:
        grouped = None  # None or a nested group inside, or dimension 0 not divisible: grouping is no fix
    if grouped is None:
        return f"{problem}: {spec.strip()!r} is read as the whole spec, one entry per dimension; {drop}"
    return (
        f"{problem}: {spec.strip()!r} is read as the whole spec, one entry per dimension; to shard dimension 0 "
        f"over {' and '.join(repr(e) for e in entries)} together, write {grouped!r} (the trailing comma makes the "
        f"brackets one entry), or {drop}"
    )

