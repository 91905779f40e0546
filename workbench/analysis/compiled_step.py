"""The compiler's own account of one training step: memory per device, FLOPs, and its collectives with
the model code that caused each, as a plain record.

:func:`read_compiled_step` reads a ``jax.stages.Compiled`` (``memory_analysis()``, ``cost_analysis()``,
``as_text()``) into a :class:`CompiledStep`, JSON-able both ways so a child process can hand it back
(:mod:`workbench.analysis.verification` compiles the step there). Its peak per device is arguments +
outputs - aliased + temporaries for every compiler, as MaxText counts it; on a real H200 that sum was within
0.1% of the GPU allocator's measured peak. The compilers' own ``peak_memory_in_bytes`` is kept beside it but
not used: XLA:CPU's is arguments + outputs, its temporaries left out, and libtpu's can be below its own
temporaries (4.1 MiB against 17.2 MiB for the small mlp on v5p:8x8x8).

Example:
    >>> from workbench.training.config import TrainConfig
    >>> from workbench.training.step import build_abstract_step
    >>> step = build_abstract_step(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64))
    >>> report = read_compiled_step(step.compile(), step.mode.mesh, step.layers)
    >>> print(report.collectives_text())  # the code column: the lines of the model each collective comes from
      kind        axes  group  count  bytes each  layer ...
      ...
      all-reduce  data      8      1   102.0 KiB  hidden1 +2 more (7 arrays)  ...
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from ..formatting import align_columns, format_bytes
from ..layout.mesh import parse_mesh
from ..training.layer_scopes import layer_of
from .hlo_sources import SourceTables, op_source
from .collectives import COLLECTIVE_KINDS, CountedCollective, bytes_by_kind
from .compile_target import parse_target
from .gpu_memory_budget import gpu_memory_budget
from .gpu_target import gpu_chip
from .hlo import collective_ops, loop_trip_counts
from .ledger import memory_figures

PEAK_FORMULA = "arguments + outputs - aliased + temporaries"


@dataclasses.dataclass(frozen=True)
class CompiledCollective(CountedCollective):
    """Collectives of one kind, size and group that the same model code caused.

    Attributes:
        kind, bytes, axes, group_size, dtype: as in :class:`~workbench.analysis.ledger.Collective`
            (``bytes`` per device per occurrence, the whole array's size).
        count: occurrences per step.
        layers: the model's layer paths whose ops it carries (``blocks/3/mlp/down``); a collective the
            compiler combined from several carries several; empty when in no layer (the loss, the mode).
        sources: ``file:line`` of the code that asked for it (the innermost frame outside JAX/Flax/Optax).
        arrays: how many arrays one occurrence carries (a combined collective carries many).
    """

    kind: str
    bytes: int
    axes: tuple[str, ...]
    group_size: int
    count: int
    dtype: str
    layers: tuple[str, ...]
    sources: tuple[str, ...]
    arrays: int = 1

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "axes": list(self.axes), "layers": list(self.layers),
                "sources": list(self.sources), "total_bytes": self.total_bytes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompiledCollective:
        names = {f.name for f in dataclasses.fields(cls)}
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """One step as the compiler built it, per device. Build it with :func:`read_compiled_step`.

    Attributes:
        target: what it was compiled for: ``"cpu"`` or ``"tpu:v5p:8x8x8"``.
        device_kind: the devices' kind, e.g. ``"cpu"`` or ``"TPU v5"``.
        mesh: the mesh it was compiled for, e.g. ``"data=64,model=8"``.
        argument_bytes, output_bytes, alias_bytes, temp_bytes, generated_code_bytes: the compiler's memory
            analysis (``alias_bytes``: outputs that reuse donated arguments' buffers).
        compiler_peak_bytes: the compiler's own peak, where it reports one (else None; see the module docstring).
        flops: FLOPs of the step on one device (``cost_analysis()``), None if not reported.
        compile_seconds: the compile itself (``lower(...).compile()``).
        build_seconds: tracing the model and laying out the step before that.
        collectives: :class:`CompiledCollective` rows, by kind then total bytes.
        peak_rss_bytes: the compiling process's peak resident memory, when measured there.
        loop_trips: trip counts of the program's loops that run more than once (scanned layers): XLA's
            cost analysis counts each loop body once, so ``flops`` then undercounts.
        as_written_temp_bytes: for XLA:GPU, where the compile's temporaries reached its memory budget (it may have
            computed values again to fit: :mod:`.gpu_memory_budget`), those of the same step compiled again with the
            budget lifted: the step as written; else None.
        reported_temp_bytes, hbm_block_bytes, on_chip_bytes: for libtpu (else None), the temporaries its memory
            analysis reports, the block its buffer assignment keeps for them in HBM and the one in on-chip VMEM, apart
            from HBM (:mod:`.tpu_buffers`); ``temp_bytes`` is the HBM block (the memory analysis is an estimate).
    """

    target: str
    device_kind: str
    mesh: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    compiler_peak_bytes: int | None
    flops: float | None
    compile_seconds: float
    build_seconds: float
    collectives: tuple[CompiledCollective, ...]
    peak_rss_bytes: int | None = None
    loop_trips: tuple[int, ...] = ()
    as_written_temp_bytes: int | None = None
    reported_temp_bytes: int | None = None
    hbm_block_bytes: int | None = None
    on_chip_bytes: int | None = None

    @property
    def devices(self) -> int:
        return parse_mesh(self.mesh).size

    @property
    def xla_gpu_budget(self) -> int | None:
        """For a compile for GPUs (``gpu:<chip>:<count>``, made without one), XLA:GPU's budget for its temporaries in
        that compile (:mod:`.gpu_memory_budget`); None for another target."""
        target = parse_target(self.target)
        if target.kind != "gpu" or target.generation is None:
            return None
        io_bytes = self.argument_bytes + self.output_bytes - self.alias_bytes
        return gpu_memory_budget(gpu_chip(target.generation).memory_bytes, io_bytes).without_gpu

    @property
    def summed_peak_bytes(self) -> int:
        """:data:`PEAK_FORMULA`: what MaxText reports as a compiled step's memory per device."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def peak_bytes(self) -> int:
        """Per device, :data:`PEAK_FORMULA`, for every compiler alike (see the module docstring for why not
        the compilers' own ``peak_memory_in_bytes``)."""
        return self.summed_peak_bytes

    @property
    def peak_source(self) -> str:
        """How :attr:`peak_bytes` was counted, and the compiler's own figure where it reports another."""
        own = self.compiler_peak_bytes
        if not own or own == self.summed_peak_bytes:
            return PEAK_FORMULA
        return (f"{PEAK_FORMULA}; the compiler's own peak_memory_in_bytes, {format_bytes(own)}, "
                f"{'leaves out part of its temporaries' if own < self.temp_bytes else 'counts otherwise'}: not used")

    def bytes_by_kind(self) -> dict[str, int]:
        """Collective kind -> bytes per device per step, in :data:`~.collectives.COLLECTIVE_KINDS` order."""
        return bytes_by_kind(self.collectives)

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "collectives"}
        return {**fields, "devices": self.devices, "peak_bytes": self.peak_bytes, "peak_source": self.peak_source,
                "summed_peak_bytes": self.summed_peak_bytes,
                "collectives": [c.to_json() for c in self.collectives], "bytes_by_kind": self.bytes_by_kind()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompiledStep:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["collectives"] = tuple(CompiledCollective.from_json(c) for c in data.get("collectives", ()))
        fields["loop_trips"] = tuple(data.get("loop_trips", ()))
        return cls(**fields)

    def collectives_text(self, limit: int = 24) -> str:
        """The collectives as a table, one row per kind, size, axes and layer pattern (layer numbers
        folded: ``blocks/*/mlp/down``), with the code that caused them; at most ``limit`` rows."""
        rows: dict[tuple, list] = {}
        for c in self.collectives:
            layers = sorted({re.sub(r"/\d+(?=/|$)", "/*", layer) for layer in c.layers})
            where = _layers_words(layers, c.arrays)
            key = (c.kind, ",".join(c.axes) or "-", c.group_size, c.bytes, where, ", ".join(c.sources[:2]))
            rows.setdefault(key, [0])[0] += c.count
        if not rows:
            return "  none: each device computes alone"
        ordered = sorted(rows.items(), key=lambda item: (COLLECTIVE_KINDS.index(item[0][0]), -item[0][3] * item[1][0]))
        table = [[kind, axes, str(group), f"{count[0]:,}", format_bytes(nbytes), where, source]
                 for (kind, axes, group, nbytes, where, source), count in ordered[:limit]]
        lines = ["  " + line for line in align_columns(
            ["kind", "axes", "group", "count", "bytes each", "layer", "code"], table, right=range(2, 5))]
        if len(ordered) > limit:
            lines.append(f"  ... {len(ordered) - limit} more rows (to_json() has every one)")
        return "\n".join(lines)


def _layers_words(layers: list[str], arrays: int) -> str:
    if not layers:
        return "-"
    shown = layers[0] if len(layers) == 1 else f"{layers[0]} +{len(layers) - 1} more"
    return f"{shown} ({arrays} arrays)" if arrays > 1 else shown


def _cost(compiled: Any) -> float | None:
    """FLOPs from ``cost_analysis()`` (a dict, or a list of one dict on older JAX); None if absent."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning nothing
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops is not None and flops >= 0 else None


def _compiler_peak(compiled: Any) -> int | None:
    stats = compiled.memory_analysis()
    peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0) if stats is not None else 0
    return peak or None


def compiled_collectives(hlo_text: str, mesh: Any, layers: Iterable[str] = ()) -> tuple[CompiledCollective, ...]:
    """The collectives of optimised HLO text, each with the layers and code its metadata names.

    Example:
        >>> line = ('%ar = f32[8]{0} all-reduce(%g), replica_groups={{0,1}}, to_apply=%add, '
        ...         'metadata={op_name="jit(f)/jvp(blocks/0)/mlp/down/dot_general" source_file="/m.py" source_line=3}')
        >>> row = compiled_collectives(line, "data=2", ["blocks/0", "blocks/0/mlp/down"])[0]
        >>> row.kind, row.axes, row.layers, row.sources
        ('all-reduce', ('data',), ('blocks/0/mlp/down',), ('/m.py:3',))
    """
    known = tuple(layers)
    tables = SourceTables.parse(hlo_text)
    counts: dict[tuple, int] = {}
    for op in collective_ops(hlo_text, mesh):
        sources = [op_source(metadata, tables) for metadata in op.metadata]
        found_layers = tuple(dict.fromkeys(layer for s in sources if (layer := layer_of(s.op_name, known))))
        locations = tuple(dict.fromkeys(s.location for s in sources if s.location))
        key = (op.kind, op.bytes, op.axes, op.group_size, op.dtype, found_layers, locations, len(op.shapes))
        counts[key] = counts.get(key, 0) + op.count
    rows = [CompiledCollective(kind, nbytes, axes, group, count, dtype, found, where, arrays)
            for (kind, nbytes, axes, group, dtype, found, where, arrays), count in counts.items()]
    return tuple(sorted(rows, key=lambda c: (COLLECTIVE_KINDS.index(c.kind), -c.total_bytes, c.layers)))


def read_compiled_step(compiled: Any, mesh: Any, layers: Iterable[str] = (), *, target: str = "cpu",
                       compile_seconds: float = 0.0, build_seconds: float = 0.0,
                       peak_rss_bytes: int | None = None) -> CompiledStep:
    """A :class:`CompiledStep` from a compiled step (``mode.compile_step(...)``) and the mesh it was built for.

    ``layers`` are the model's submodule paths (:func:`~workbench.training.layer_scopes.module_paths`),
    for naming the layer behind each collective.
    """
    memory = memory_figures(compiled) or dict.fromkeys(
        ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes"), 0)
    first = next(iter(mesh.devices.flat), None) if hasattr(mesh, "devices") else None
    kind = getattr(first, "device_kind", None) or getattr(first, "platform", "unknown")
    hlo_text = compiled.as_text()
    return CompiledStep(
        target=target, device_kind=str(kind), mesh=str(parse_mesh(mesh)), **memory,
        compiler_peak_bytes=_compiler_peak(compiled), flops=_cost(compiled), compile_seconds=float(compile_seconds),
        build_seconds=float(build_seconds), collectives=compiled_collectives(hlo_text, mesh, layers),
        peak_rss_bytes=peak_rss_bytes, loop_trips=tuple(loop_trip_counts(hlo_text)),
    )


__all__ = ["PEAK_FORMULA", "CompiledCollective", "CompiledStep", "compiled_collectives", "read_compiled_step"]
