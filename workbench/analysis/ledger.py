"""The communication ledger: every collective a compiled step runs, read from its optimised HLO.

:func:`collectives_from_hlo` lists a compiled program's collectives as :class:`Collective` rows (bytes per
device per occurrence, count per step), :func:`ledger_for_mode` compiles a mode's step into a
:class:`CommLedger` with the compiler's memory estimate, :func:`theoretical_collectives` and
:func:`compare_with_theory` say what the mode needs in theory, and :func:`ledger_table` prints it.

A row's ``bytes`` is per device, per occurrence, the size of the whole array the collective works on: the
gathered result of an all-gather, the operand (before scattering) of the others. Why, how collectives are
counted and how device groups are read from the HLO: docs/design/communication-ledger.md.

Example (``mode``: the mlp's dp mode on data=8, ``state`` and ``batch`` what it trains on):
    >>> ledger = ledger_for_mode(mode, mode.place_state(state), mode.place_batch(batch))
    >>> print(ledger_table(ledger))
    kind        count      bytes      total  dtype    axes  shapes
    ----------  -----  ---------  ---------  -------  ----  ------------------------------------------------
    all-reduce      1  102.0 KiB  102.0 KiB  float32  data  [128], [128, 64], [128], [128, 128], [10], [10,…
    all-reduce      1        4 B        4 B  float32  data  []
    total per device per step: 102.0 KiB in 2 collectives
    compiler estimate (XLA memory analysis), bytes per device: arguments ..., outputs ..., temporaries ...
    layout engine prediction: parameters + optimizer state, bytes per device: 306.1 KiB
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..formatting import align_columns, format_bytes, format_shape
from ..training.modes import mode_class
from ..training.profiling import memory_figures as memory_figures  # the trainer's profiles read it too
from .collectives import COLLECTIVE_KINDS, CountedCollective, bytes_by_kind
from .hlo import collective_ops

MEMORY_LABEL = "compiler estimate (XLA memory analysis), bytes per device"
PREDICTION_LABEL = "layout engine prediction: parameters + optimizer state, bytes per device"


@dataclasses.dataclass(frozen=True)
class Collective(CountedCollective):
    """One kind of collective in a compiled step, with how often it runs.

    Attributes:
        kind: ``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"``, ``"all-to-all"`` or
            ``"collective-permute"``.
        bytes: per device, per occurrence: the whole array's size (see the module docstring).
        axes: the mesh axes each group of devices spans, e.g. ``("data",)``; ``()`` for a group of one.
        count: occurrences per step (loop iterations included).
        dtype: the element type, e.g. ``"float32"``; ``"bfloat16+float32"`` for a mixed tuple.
        shapes: the shape of every array in it (a tuple-shaped collective has several).
        group_size: devices per group (for a collective-permute, the devices that send).

    Example:
        >>> Collective("all-reduce", 4096, ("data",), 1, "float32", ((32, 32),), 8).to_json()["bytes"]
        4096
    """

    kind: str
    bytes: int
    axes: tuple[str, ...]
    count: int
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    group_size: int = 1

    def to_json(self) -> dict:
        """Plain JSON values."""
        return {
            "kind": self.kind, "bytes": self.bytes, "axes": list(self.axes), "count": self.count,
            "dtype": self.dtype, "shapes": [list(s) for s in self.shapes], "group_size": self.group_size,
        }


@dataclasses.dataclass(frozen=True)
class CommLedger:
    """The collectives of one compiled step, with the memory figures that go with them.

    Attributes:
        collectives: :class:`Collective` rows, by kind then bytes (largest first).
        memory: the compiler's estimate per device (:data:`MEMORY_LABEL`): ``argument_bytes``,
            ``output_bytes``, ``alias_bytes``, ``temp_bytes``, ``generated_code_bytes``; None if unknown.
        predicted_bytes_per_device: the layout engine's figure for the state (:data:`PREDICTION_LABEL`);
            None if unknown.
        mode: the mode's name, when the ledger came from :func:`ledger_for_mode`.

    Example:
        >>> CommLedger([Collective("all-gather", 512, ("data",), 3, "float32", ((128,),), 8)]).total_bytes
        1536
    """

    collectives: list[Collective]
    memory: dict | None = None
    predicted_bytes_per_device: int | None = None
    mode: str | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes per device per step over every collective (``sum(bytes * count)``)."""
        return sum(c.total_bytes for c in self.collectives)

    def bytes_by_kind(self) -> dict[str, int]:
        """kind -> bytes per device per step, for the kinds present, in
        :data:`~workbench.analysis.collectives.COLLECTIVE_KINDS` order.

        Example:
            >>> CommLedger([Collective("all-reduce", 8, ("data",), 2, "float32", ((2,),))]).bytes_by_kind()
            {'all-reduce': 16}
        """
        return bytes_by_kind(self.collectives)

    def to_json(self) -> dict:
        """Everything as JSON-ready values, each estimate with its label."""
        return {
            "mode": self.mode,
            "collectives": [c.to_json() for c in self.collectives],
            "total_bytes": self.total_bytes,
            "bytes_by_kind": self.bytes_by_kind(),
            "memory": None if self.memory is None else {"label": MEMORY_LABEL, **self.memory},
            "predicted": None if self.predicted_bytes_per_device is None
            else {"label": PREDICTION_LABEL, "bytes_per_device": self.predicted_bytes_per_device},
        }


def collectives_from_hlo(hlo_text: str, mesh: Any = None) -> list[Collective]:
    """Every collective in optimised HLO text, grouped by (kind, axes, bytes, dtype, shapes) with counts.

    Args:
        hlo_text: ``compiled.as_text()`` of a step (or any HLO module text, or a few instruction lines).
        mesh: the mesh the program was compiled for (a ``jax.sharding.Mesh`` or any mesh description
            :func:`~workbench.layout.mesh.parse_mesh` reads), to name the axes each collective spans; None
            leaves ``axes`` empty.

    Returns rows ordered by kind (:data:`~workbench.analysis.collectives.COLLECTIVE_KINDS` order), then bytes,
    largest first. ``-done`` halves of async pairs are not counted; loops multiply counts by their known trip count.

    Example:
        >>> line = "%ar = f32[64,128]{1,0} all-reduce(%g), replica_groups={{0,2},{1,3}}, to_apply=%add"
        >>> [(c.kind, c.bytes, c.axes, c.count) for c in collectives_from_hlo(line, "data=2,model=2")]
        [('all-reduce', 32768, ('data',), 1)]
    """
    counts: dict[tuple, int] = {}
    for op in collective_ops(hlo_text, mesh):
        key = (op.kind, op.axes, op.bytes, op.dtype, op.shapes, op.group_size)
        counts[key] = counts.get(key, 0) + op.count
    rows = [Collective(k, b, axes, n, dtype, shp, size) for (k, axes, b, dtype, shp, size), n in counts.items()]
    return sorted(rows, key=lambda c: (COLLECTIVE_KINDS.index(c.kind), -c.bytes, c.axes, c.shapes))


# --- from a mode ---------------------------------------------------------------------------------------


def _predicted_state_bytes(mode: Any, state: Any) -> int | None:
    """The layout engine's bytes per device for the mode's state (exported first: pmap stacks copies)."""
    state_layout = getattr(mode, "state_layout", None)
    if state_layout is None:
        return None
    plain = jax.eval_shape(mode.export_state, state)  # shapes only: nothing is copied
    return int(state_layout(plain).bytes_per_device)


def ledger_for_mode(mode: Any, state: Any, batch: Any, diagnostics: bool = False) -> CommLedger:
    """The ledger of ``mode``'s compiled step on a placed state and batch (``mode.place_state`` /
    ``mode.place_batch``), with the compiler's memory estimate and the layout engine's state prediction.

    Compiling does not run the step; a mode whose step is several programs (``simulated``) raises the
    mode's WorkbenchError. ``diagnostics=True`` reads the logging-step variant instead.

    Example:
        >>> ledger = ledger_for_mode(mode, mode.place_state(state), mode.place_batch(batch))
        >>> ledger.bytes_by_kind()
        {'all-reduce': 104496}
    """
    compiled = mode.compile_step(state, batch, diagnostics=True) if diagnostics else mode.compile_step(state, batch)
    return CommLedger(
        collectives_from_hlo(compiled.as_text(), getattr(mode, "mesh", None)),
        memory=memory_figures(compiled),
        predicted_bytes_per_device=_predicted_state_bytes(mode, state),
        mode=getattr(mode, "name", None),
    )


# --- theory ----------------------------------------------------------------------------------------------


def float_param_bytes(params: Any) -> int:
    """Bytes of the floating-point leaves of a parameter tree: the gradient bytes a step reduces.

    Example:
        >>> import numpy as np
        >>> float_param_bytes({"w": np.zeros((4, 8), np.float32), "step": np.zeros((), np.int32)})
        128
    """
    total = 0
    for leaf in jax.tree.leaves(params):
        dtype = np.dtype(getattr(leaf, "dtype", np.float32))
        if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":
            total += math.prod(getattr(leaf, "shape", np.shape(leaf))) * dtype.itemsize
    return total


def theoretical_collectives(mode_name: str, param_bytes: int) -> list[dict]:
    """What ``mode_name`` must communicate per step, per device, in theory: its declared collectives
    (:attr:`~workbench.training.modes.base.ParallelMode.collectives`), sized from the parameter bytes.

    ``param_bytes`` is the bytes of the floating-point parameters (:func:`float_param_bytes`). Entries
    are ``{"kind", "bytes", "axes", "carries", "what"}``; ``bytes`` is None where the figure depends on
    more than the parameters (activations, or the leaves a split leaves whole).

    Example:
        >>> theoretical_collectives("fsdp", 1000)[0]["kind"], theoretical_collectives("single", 1000)
        ('all-gather', [])
    """
    return [need.to_json(param_bytes) for need in mode_class(mode_name).collectives]


def compare_with_theory(ledger: CommLedger, mode_name: str, param_bytes: int) -> dict[str, dict]:
    """Per kind, the ledger's bytes per step against :func:`theoretical_collectives`.

    Returns ``{kind: {"measured": int, "theory": int | None, "ratio": float | None}}`` for every kind
    measured or expected. ``theory`` is None where it is not modelled, 0 where the mode needs none of that
    kind; ``ratio`` (measured / theory) is None in both cases.

    Example:
        >>> ledger = ledger_for_mode(mode, mode.place_state(state), mode.place_batch(batch))
        >>> round(compare_with_theory(ledger, "dp", float_param_bytes(state.params))["all-reduce"]["ratio"], 4)
        1.0001
    """
    theory: dict[str, int | None] = {}
    for entry in theoretical_collectives(mode_name, param_bytes):
        before = theory.get(entry["kind"], 0)
        theory[entry["kind"]] = None if before is None or entry["bytes"] is None else before + entry["bytes"]
    measured = ledger.bytes_by_kind()
    out = {}
    for kind in COLLECTIVE_KINDS:
        if kind not in measured and kind not in theory:
            continue
        expected = theory.get(kind, 0)
        got = measured.get(kind, 0)
        out[kind] = {"measured": got, "theory": expected, "ratio": got / expected if expected else None}
    return out


# --- text ------------------------------------------------------------------------------------------------


def _shapes_text(shapes: Sequence[tuple[int, ...]], limit: int = 48) -> str:
    text = ", ".join(format_shape(s) for s in shapes)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ledger_table(ledger: CommLedger) -> str:
    """The ledger as an aligned text table, a total, and the memory figures with their labels.

    One row per :class:`Collective`: ``bytes`` per occurrence, ``total`` per step (``bytes * count``),
    both per device.

    Example:
        >>> print(ledger_table(CommLedger([Collective("all-reduce", 2048, ("data",), 1, "float32", ((512,),), 8)])))
        kind        count    bytes    total  dtype    axes  shapes
        ----------  -----  -------  -------  -------  ----  ------
        all-reduce      1  2.0 KiB  2.0 KiB  float32  data  [512]
        total per device per step: 2.0 KiB in 1 collective
    """
    lines = []
    if ledger.collectives:
        rows = [
            [c.kind, str(c.count), format_bytes(c.bytes), format_bytes(c.total_bytes), c.dtype,
             ",".join(c.axes) or "-", _shapes_text(c.shapes)]
            for c in ledger.collectives
        ]
        lines += align_columns(["kind", "count", "bytes", "total", "dtype", "axes", "shapes"], rows, right=(1, 2, 3))
        count = sum(c.count for c in ledger.collectives)
        lines.append(
            f"total per device per step: {format_bytes(ledger.total_bytes)} in {count} collective{'s' * (count != 1)}"
        )
    else:
        lines.append("no collectives: each device computes alone")
    if ledger.memory is not None:
        m = ledger.memory
        lines.append(
            f"{MEMORY_LABEL}: arguments {format_bytes(m['argument_bytes'])}, "
            f"outputs {format_bytes(m['output_bytes'])}, "
            f"temporaries {format_bytes(m['temp_bytes'])}, generated code {format_bytes(m['generated_code_bytes'])}"
        )
    if ledger.predicted_bytes_per_device is not None:
        lines.append(f"{PREDICTION_LABEL}: {format_bytes(ledger.predicted_bytes_per_device)}")
    return "\n".join(lines)


__all__ = [
    "MEMORY_LABEL", "PREDICTION_LABEL", "Collective", "CommLedger", "collectives_from_hlo",
    "compare_with_theory", "float_param_bytes", "ledger_for_mode", "ledger_table", "memory_figures",
    "theoretical_collectives",
]
