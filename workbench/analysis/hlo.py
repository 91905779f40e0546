"""Reading optimised HLO text: the collective instructions a compiled program runs, and its loops.

:func:`collective_ops` lists every collective instruction of a program (``compiled.as_text()``) as a
:class:`CollectiveOp`: its kind, bytes per device per occurrence (the whole array: the gathered result of
an all-gather, the operand before scattering of the others), the mesh axes its device groups span, and how
many times it runs per execution (loop trip counts multiplied). :func:`loop_trip_counts` gives the trip
counts of the program's loops. The communication ledger (:mod:`.ledger`), the compiler's step record
(:mod:`.compiled_step`) and the profiled timeline (:mod:`.timeline`) all read HLO through this module. How
collectives are counted and device groups read: docs/design/communication-ledger.md.

Example:
    >>> line = "%ar = f32[64,128]{1,0} all-reduce(%g), replica_groups={{0,2},{1,3}}, to_apply=%add"
    >>> [(op.kind, op.bytes, op.axes) for op in collective_ops(line, "data=2,model=2")]
    [('all-reduce', 32768, ('data',))]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import WorkbenchError
from ..layout.mesh import parse_mesh
from .collectives import COLLECTIVE_KINDS, CountedCollective

# opcode as printed -> (kind, is an async start)
_OPCODES = {**{k: (k, False) for k in COLLECTIVE_KINDS}, **{f"{k}-start": (k, True) for k in COLLECTIVE_KINDS}}

_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?(?P<name>[^\s(=]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=(]+)\s*=\s*(?P<rest>.+)$")
_ARRAY = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,<=\s]*)\]")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CALLEES = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_CALLEE_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_NP_NAMES = {"pred": "bool", "bf16": "bfloat16"}
_PREFIXES = {"f": "float", "s": "int", "u": "uint", "c": "complex"}


def _closing(text: str, start: int) -> int:
    """Index just past the bracket that closes the one opening at ``text[start]``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for i in range(start, len(text)):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside any bracket (tuple elements, operands)."""
    parts, depth, current = [], 0, []
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return [re.sub(r"/\*.*?\*/", "", p).strip() for p in parts]


def _tuple_elements(shape_text: str) -> list[str]:
    """The top-level elements of a tuple shape; a plain array shape is its own single element."""
    shape_text = shape_text.strip()
    if shape_text.startswith("("):
        return _split_top(shape_text[1 : _closing(shape_text, 0) - 1])
    return [shape_text]


def _arrays(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array ``(dtype, dims)`` in a (possibly nested tuple) shape, in order; layouts ignored."""
    without_layouts = re.sub(r"\{[^{}]*\}", "", shape_text)
    out = []
    for match in _ARRAY.finditer(without_layouts):
        dims = tuple(int(d.replace("<=", "")) for d in match["dims"].split(",") if d.strip())
        out.append((match["dtype"], dims))
    return out


def element_bits(hlo_dtype: str) -> int:
    """Bits per element of an HLO element type (``f32`` 32, ``bf16`` 16, ``pred`` 8, ``s4`` 4, ``f8e4m3fn`` 8).

    Example:
        >>> element_bits("bf16"), element_bits("pred"), element_bits("c64")
        (16, 8, 64)
    """
    if hlo_dtype == "pred":
        return 8
    if hlo_dtype in ("token", "opaque"):
        return 0
    match = re.match(r"^(?:bf|[fsuc])(\d+)", hlo_dtype)
    if not match:
        raise WorkbenchError(
            f"HLO element type {hlo_dtype!r} is not one the ledger knows (f32, bf16, s8, pred, ...): "
            "extend workbench.analysis.hlo.element_bits with its size"
        )
    return int(match[1])


def numpy_dtype_name(hlo_dtype: str) -> str:
    """The NumPy/JAX name of an HLO element type: ``f32`` -> ``float32``, ``bf16`` -> ``bfloat16``.

    Example:
        >>> numpy_dtype_name("f32"), numpy_dtype_name("pred"), numpy_dtype_name("f8e4m3fn")
        ('float32', 'bool', 'float8_e4m3fn')
    """
    if hlo_dtype in _NP_NAMES:
        return _NP_NAMES[hlo_dtype]
    match = re.match(r"^([fsuc])(\d+)(.*)$", hlo_dtype)
    if not match:
        return hlo_dtype
    name = _PREFIXES[match[1]] + match[2]
    return f"{name}_{match[3]}" if match[3] else name


def _nbytes(arrays: Iterable[tuple[str, tuple[int, ...]]]) -> int:
    return sum(math.ceil(math.prod(dims) * element_bits(dtype) / 8) for dtype, dims in arrays)


@dataclasses.dataclass(frozen=True)
class _Op:
    """One HLO instruction: the parts read here."""

    computation: str
    name: str
    shape: str
    opcode: str
    operands: str
    attrs: str


def _parse_module(hlo_text: str) -> tuple[list[_Op], str | None, dict[str, int]]:
    """Instructions in order, the entry computation's name, and the module header's counts."""
    ops, entry, computation = [], None, "<top>"
    header: dict[str, int] = {}
    for line in hlo_text.splitlines():
        if line.startswith("HloModule"):
            for key in ("replica_count", "num_partitions"):
                found = re.search(rf"\b{key}=(\d+)", line)
                if found:
                    header[key] = int(found[1])
            continue
        head = _HEADER.match(line)
        if head and "=" not in line.split("(")[0]:
            computation = head["name"]
            if head.group(1):
                entry = computation
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        rest = match["rest"].lstrip()
        end = _closing(rest, 0) if rest.startswith("(") else len(rest.split()[0])
        shape, tail = rest[:end], rest[end:].lstrip()
        opcode = re.match(r"([a-z][\w\-]*)\(", tail)
        if not opcode:
            continue
        open_at = opcode.end() - 1
        close_at = _closing(tail, open_at)
        ops.append(_Op(computation, match["name"], shape, opcode[1], tail[open_at + 1 : close_at - 1], tail[close_at:]))
    return ops, entry, header


def _counted_loop_bounds(ops: Sequence[_Op]) -> dict[str, int]:
    """Loop conditions of the form ``i < N`` (N a constant), by computation name: ``lax.scan``'s loops
    count from 0, so N is the trip count. The TPU compiler's loops carry no ``known_trip_count``."""
    constants = {(op.computation, op.name): op.operands.strip() for op in ops if op.opcode == "constant"}
    bounds: dict[str, list[int]] = {}
    for op in ops:
        if op.opcode != "compare" or "direction=LT" not in op.attrs:
            continue
        for operand in _split_top(op.operands)[1:]:
            value = constants.get((op.computation, operand.rsplit("%", 1)[-1].split()[-1]), "")
            if value.lstrip("-").isdigit():
                bounds.setdefault(op.computation, []).append(int(value))
    return {name: found[0] for name, found in bounds.items() if len(found) == 1}


def _trip_count(op: _Op, bounds: dict[str, int]) -> int | None:
    """A while loop's trip count: the compiler's ``known_trip_count``, else its condition's bound."""
    known = _TRIP_COUNT.search(op.attrs)
    if known:
        return int(known[1])
    condition = re.search(r"\bcondition=%?([\w.\-]+)", op.attrs)
    return bounds.get(condition[1]) if condition else None


def loop_trip_counts(hlo_text: str) -> list[int]:
    """The trip counts of the while loops in optimised HLO text that run more than once (e.g. scanned
    layers), where the compiler or the loop's condition says.

    Example:
        >>> loop_trip_counts('%w = (s32[]) while(%t), condition=%c, body=%b, '
        ...                  'backend_config={"known_trip_count":{"n":"24"}}')
        [24]
    """
    ops, _, _ = _parse_module(hlo_text)
    bounds = _counted_loop_bounds(ops)
    return [n for op in ops if op.opcode == "while" and (n := _trip_count(op, bounds) or 0) > 1]


def _multipliers(ops: Sequence[_Op], entry: str | None) -> dict[str, int]:
    """How many times each computation runs per execution of the entry (while trip counts multiplied)."""
    callers: dict[str, list[tuple[str, int]]] = {}
    bounds = _counted_loop_bounds(ops)
    for op in ops:
        trips = _trip_count(op, bounds) if op.opcode == "while" else None
        for role, callee in _CALLEES.findall(op.attrs):
            factor = trips if (role == "body" and trips) else 1
            callers.setdefault(callee, []).append((op.computation, factor))
        for names in _CALLEE_LISTS.findall(op.attrs):
            for callee in re.findall(r"%?([\w.\-]+)", names):
                callers.setdefault(callee, []).append((op.computation, 1))
    memo: dict[str, int] = {}

    def times(name: str, seen: frozenset = frozenset()) -> int:
        if name == entry or name not in callers or name in seen:  # uncalled: a snippet, or the entry
            return 1
        if name not in memo:
            memo[name] = sum(times(caller, seen | {name}) * factor for caller, factor in callers[name])
        return memo[name]

    return {op.computation: times(op.computation) for op in ops}


def _attr(attrs: str, key: str) -> str | None:
    """The raw value of ``key=...`` in an attribute list, brackets balanced; None if absent."""
    match = re.search(rf"\b{key}=", attrs)
    if not match:
        return None
    start = match.end()
    if start < len(attrs) and attrs[start] in "{[(":
        end = _closing(attrs, start)
        if attrs[start] == "[":  # iota form: [2,4]<=[8]T(1,0)
            tail = re.match(r"<=\[[\d,]*\](?:T\([\d,]*\))?", attrs[end:])
            end += tail.end() if tail else 0
        return attrs[start:end]
    if attrs.startswith("mesh[", start) or attrs.startswith("maximal_mesh[", start):
        tail = re.match(r"(?:maximal_)?mesh\[[^\]]*\](?:,\s*device_ids=\((?:[^()]|\([^()]*\))*\))?\s*(?:\{[^}]*\})?",
                        attrs[start:])
        return tail.group(0) if tail else None
    return re.split(r"[,\s]", attrs[start:], maxsplit=1)[0]  # up to the next comma or space


def _iota(dims: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    array = np.arange(math.prod(dims)).reshape(dims)
    return array.transpose(perm) if perm else array


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _mesh_form_groups(text: str) -> list[list[int]]:
    """Expand ``mesh['a'=4,'b'=2], device_ids=(...) {'a'}`` to explicit groups, as XLA does."""
    if text.startswith("maximal_mesh"):
        return [_ints(text)[:1]]
    match = re.match(r"mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>.*)\))?\s*\{(?P<group>[^}]*)\}", text)
    if not match:
        raise WorkbenchError(f"cannot read the mesh-axes replica groups {text!r}: report this HLO form")
    axes = [(m[1], int(m[2])) for m in re.finditer(r"'?([^'=,\s]+)'?\s*=\s*(\d+)", match["axes"])]
    names, sizes = [a for a, _ in axes], [s for _, s in axes]
    ids = (match["ids"] or "").strip()
    if not ids:
        devices = np.arange(math.prod(sizes))
    elif ids.lstrip("<=").startswith("["):  # iota: [2,2,2]T(0,2,1)
        dims_text, _, perm_text = ids.lstrip("<=").partition("T")
        devices = _iota(_ints(dims_text), _ints(perm_text) or None).reshape(-1)
    else:
        devices = np.array(_ints(ids))
    devices = devices.reshape(sizes)
    # Each group axis, full or sub-axis ('b':(pre)size), becomes one dimension to aggregate over.
    refs: dict[int, list[tuple[int, int]]] = {}
    for ref in _split_top(match["group"]):
        sub = re.match(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?$", ref.strip())
        if not sub:
            raise WorkbenchError(f"cannot read the group axis {ref.strip()!r} of {text!r}: report this HLO form")
        index = names.index(sub[1])
        pre, size = (int(sub[2]), int(sub[3])) if sub[2] else (1, sizes[index])
        refs.setdefault(index, []).append((pre, size))
    reshape, grouped = [], []
    for index, full in enumerate(sizes):
        pieces, used = [], 1
        for pre, size in sorted(refs.get(index, [])):
            if pre != used:
                pieces.append((pre // used, False))
                used = pre
            pieces.append((size, True))
            used *= size
        if used != full:
            pieces.append((full // used, False))
        for size, is_grouped in pieces:
            if is_grouped:
                grouped.append(len(reshape))
            reshape.append(size)
    order = [d for d in range(len(reshape)) if d not in grouped] + grouped
    group_size = math.prod(reshape[d] for d in grouped)
    return devices.reshape(reshape).transpose(order).reshape(-1, group_size).tolist()


def _raw_groups(attrs: str) -> list[list[int]] | None:
    """The replica groups as printed, expanded to lists of ids; None when empty (all devices)."""
    text = _attr(attrs, "replica_groups")
    if text is None or text.strip("{} ") == "":
        return None
    if text.startswith(("mesh", "maximal_mesh")):
        return _mesh_form_groups(text)
    iota = re.match(r"(?:devices=)?\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if iota:
        shape = _ints(iota[1])
        return _iota(_ints(iota[2]), _ints(iota[3] or "") or None).reshape(shape[0], -1).tolist()
    return [_ints(group) for group in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]


def _permute_pairs(op: _Op) -> list[list[int]]:
    """A collective-permute's ``source_target_pairs`` that move data (a device sending to itself does not)."""
    text = _attr(op.attrs, "source_target_pairs") or ""
    pairs = [_ints(p) for p in re.findall(r"\{(\d+\s*,\s*\d+)\}", text)]
    return [p for p in pairs if p[0] != p[1]]


def _device_groups(op: _Op, kind: str, header: dict[str, int], mesh_size: int | None) -> list[list[int]]:
    """Groups of global device positions, following XLA's group modes.

    JAX's SPMD programs have one replica and flattened ids (``channel_id`` + ``use_global_device_ids``), where
    ids are device positions already; the other modes (cross-replica without ``channel_id``, cross-replica-
    and-partition, cross-partition for all-to-all) are expanded the way XLA defines them.
    """
    groups = _raw_groups(op.attrs)
    if not header:  # a snippet without a module header: ids are taken as global positions
        return groups or [list(range(mesh_size or 1))]
    replicas = header.get("replica_count", 1)
    partitions = header.get("num_partitions", 1)
    has_channel = _attr(op.attrs, "channel_id") is not None
    if has_channel and _attr(op.attrs, "use_global_device_ids") == "true":  # flattened: global already
        return groups or [list(range(replicas * partitions))]
    if not has_channel:  # cross-replica: each partition on its own
        groups = groups or [list(range(replicas))]
        return [[r * partitions + p for r in g] for p in range(partitions) for g in groups]
    if kind == "all-to-all":  # cross-partition: each replica on its own
        groups = groups or [list(range(partitions))]
        return [[r * partitions + p for p in g] for r in range(replicas) for g in groups]
    groups = groups or [list(range(replicas))]  # cross-replica-and-partition
    return [[r * partitions + p for r in g for p in range(partitions)] for g in groups]


def _axes_spanned(groups: Sequence[Sequence[int]], mesh: Any) -> tuple[str, ...]:
    """The mesh axes along which some group's devices differ (positions in ``mesh.devices.flat`` order)."""
    if mesh is None:
        return ()
    shape = parse_mesh(mesh)
    varying: set[int] = set()
    for group in groups:
        if not group:
            continue
        if max(group) >= shape.size:
            raise WorkbenchError(
                f"the HLO names device {max(group)} but mesh {shape} has {shape.size} devices: pass the mesh "
                "the step was compiled for (the mode's .mesh)"
            )
        coords = np.array(np.unravel_index(list(group), shape.sizes))
        varying.update(i for i in range(len(shape.sizes)) if len(set(coords[i])) > 1)
    return tuple(shape.names[i] for i in sorted(varying))


def _scaled(arrays, dimension: int | None, factor: int):
    """Arrays with ``dimension`` multiplied by ``factor``: a shard's shape -> the whole array's."""
    if dimension is None:
        return [(dtype, dims) for dtype, dims in arrays]
    return [(dtype, tuple(d * factor if i == dimension else d for i, d in enumerate(dims))) for dtype, dims in arrays]


def _operand_arrays(op: _Op, shapes: dict[str, str]) -> list | None:
    """The operands' arrays, from shapes printed inline or the defining instructions; None if unknown."""
    out = []
    for operand in _split_top(op.operands):
        inline = _arrays(operand.rsplit("%", 1)[0]) if "%" in operand else _arrays(operand)
        name = operand.rsplit("%", 1)[-1].split()[-1] if operand.strip() else ""
        found = inline or (_arrays(shapes[name]) if name in shapes else None)
        if not found:
            return None
        out.extend(found)
    return out


def _whole_arrays(op: _Op, kind: str, is_start: bool, group_size: int, shapes: dict[str, str]):
    """The arrays whose bytes are reported (see the module docstring)."""
    elements = _tuple_elements(op.shape)
    if kind == "all-reduce" and is_start and len(elements) == 2 and elements[0].startswith("("):
        return _arrays(elements[1])  # JAX 0.12's XLA:GPU: an all-reduce-start returns ((operands), results)
    if kind == "all-reduce" or (not is_start and kind in ("all-gather", "all-to-all", "collective-permute")):
        return _arrays(op.shape)  # the result is the whole array (or the same size as the operand)
    if kind == "all-gather":  # all-gather-start returns (operands, outputs): the outputs are gathered
        if len(elements) == 2 and elements[1].startswith("("):
            return _arrays(elements[1])
        return [a for e in elements[len(elements) // 2 :] for a in _arrays(e)]
    operands = _operand_arrays(op, shapes)
    if operands:
        return operands
    if kind == "reduce-scatter" and not is_start:  # the result is one shard: scale it back up
        dims = _ints(_attr(op.attrs, "dimensions") or "")
        return _scaled(_arrays(op.shape), dims[0] if dims else None, group_size)
    return _arrays(elements[0])  # other -start ops return (operands, outputs, context...)


@dataclasses.dataclass(frozen=True)
class CollectiveOp(CountedCollective):
    """One collective instruction of a compiled program, before grouping into the ledger's
    :class:`~workbench.analysis.ledger.Collective` rows.

    Attributes:
        name: the instruction's HLO name, e.g. ``"all-reduce.51"``.
        kind, bytes, axes, dtype, shapes, group_size: as in :class:`~workbench.analysis.ledger.Collective`.
        count: how often it runs per execution of the program, a step (loop trip counts multiplied).
        metadata: the raw ``metadata={...}`` text of each array it carries: a tuple-shaped collective
            the compiler combined from several has one per element (read from its ``get-tuple-element``
            users, which keep the original operations' metadata), any other has its own one.
    """

    name: str
    kind: str
    bytes: int
    axes: tuple[str, ...]
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    group_size: int
    count: int
    metadata: tuple[str, ...] = ()


def _element_metadata(ops: Sequence[_Op]) -> dict[str, dict[int, str]]:
    """collective name -> {tuple index: metadata text} from its ``get-tuple-element`` users."""
    out: dict[str, dict[int, str]] = {}
    for op in ops:
        if op.opcode != "get-tuple-element":
            continue
        index, metadata = _attr(op.attrs, "index"), _attr(op.attrs, "metadata")
        source = op.operands.rsplit("%", 1)[-1].split()[-1] if op.operands.strip() else ""
        if index is not None and index.isdigit() and metadata:
            out.setdefault(source, {})[int(index)] = metadata
    return out


def collective_ops(hlo_text: str, mesh: Any = None) -> list[CollectiveOp]:
    """Every collective instruction in optimised HLO text, in program order (the ledger groups them:
    :func:`~workbench.analysis.ledger.collectives_from_hlo`).

    Example:
        >>> line = "%ar = f32[64,128]{1,0} all-reduce(%g), replica_groups={{0,2},{1,3}}, to_apply=%add"
        >>> [(op.name, op.kind, op.axes, op.count) for op in collective_ops(line, "data=2,model=2")]
        [('ar', 'all-reduce', ('data',), 1)]
    """
    ops, entry, header = _parse_module(hlo_text)
    times = _multipliers(ops, entry)
    shapes = {op.name: op.shape for op in ops}
    elements = _element_metadata(ops)
    mesh_size = parse_mesh(mesh).size if mesh is not None else None
    found, channels = [], set()
    fusions = {callee for op in ops if op.opcode == "fusion"
               for callee in re.findall(r"\bcalls=%?([\w.\-]+)", op.attrs)}
    for op in ops:
        if op.opcode not in _OPCODES:
            continue
        kind, is_start = _OPCODES[op.opcode]
        # The TPU compiler splits an asynchronous collective over several fusions (a start and its
        # continuations), each holding a copy of the instruction (same kind, shape and channel_id): one
        # collective. Copies outside fusions are not merged: XLA:CPU peels a loop's first iteration into
        # a clone with the same channel, and instructions of one computation may share a channel.
        channel = _attr(op.attrs, "channel_id")
        if channel is not None and op.computation in fusions:
            if (channel, kind, op.shape) in channels:
                continue
            channels.add((channel, kind, op.shape))
        if kind == "collective-permute":  # each pair is a "group": the axes are those a pair crosses
            groups = _permute_pairs(op)
            group_size = len({device for pair in groups for device in pair}) or 1
        else:
            groups = _device_groups(op, kind, header, mesh_size)
            group_size = max(len(g) for g in groups)
        arrays = _whole_arrays(op, kind, is_start, group_size, shapes)
        dtype = "+".join(sorted({numpy_dtype_name(d) for d, _ in arrays})) or "none"
        per_element = elements.get(op.name, {})
        own = _attr(op.attrs, "metadata")
        metadata = tuple(per_element[i] for i in sorted(per_element)) if per_element else ((own,) if own else ())
        found.append(CollectiveOp(op.name, kind, _nbytes(arrays), _axes_spanned(groups, mesh), dtype,
                                  tuple(dims for _, dims in arrays), group_size, times.get(op.computation, 1),
                                  metadata))
    return found


__all__ = ["CollectiveOp", "collective_ops", "element_bits", "loop_trip_counts", "numpy_dtype_name"]
