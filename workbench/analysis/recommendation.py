"""The records of a layout recommendation (:func:`~.recommender.recommend` builds them): each :class:`Candidate`
(a mode on a mesh, remat, microbatches, its plan, predicted step time and what bounds it, memory both ways,
bytes per collective, whether the target's compiler verified it and where it disagrees), each family's
:class:`FamilyVerdict`, and the :class:`Recommendation` with its table as text and JSON.

:func:`layout_settings` turns a candidate into the settings a :class:`~workbench.TrainConfig` (or a widget) takes.

Example:
    >>> rec = recommend("mlp", "cpu", 64, verify=False)
    >>> settings = layout_settings(rec.chosen)
    >>> sorted(settings)[:4], settings["batch"]
    (['accum', 'batch', 'mesh', 'mode'], 64)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..formatting import align_columns, format_bytes, format_seconds
from .collectives import COLLECTIVE_KINDS
from .layout_search import LayoutChoice
from .step_time import OVERLAP_MODEL, StepTime
from .training_plan import TrainingPlan

if TYPE_CHECKING:
    from .exported_step import OwnModel

TABLE_FIGURES = (0, 4, 5, 6, 7, 8, 9, 10)  # the columns of Recommendation.table_cells that hold figures


@dataclasses.dataclass(frozen=True, eq=False)
class Candidate:
    """One layout weighed for a recommendation.

    Attributes:
        choice: the mode, mesh, remat policy and microbatches (:class:`~.layout_search.LayoutChoice`).
        plan: its :class:`~.training_plan.TrainingPlan` (memory simulated from the traced step when shortlisted,
            the formulas alone otherwise: ``memory_source``); ``plan.compiled`` holds the compiler's figures.
        time: the predicted step time and its parts, from the plan (:class:`~.step_time.StepTime`).
        model_flops: FLOPs per device per step that train the model (recomputation left out), for the MFU.
        compiled_time: the step time with the collectives the compiler placed, each priced on its own mesh axes;
            None unverified.
        verification: how it was verified, or why not, in words.
        disagreements: where the compiler and the plan disagree (a step that does not fit after all, a
            collective the plan does not price, bytes far from the planned, a changed rank).
        rank: 1 for the best; 0 for a layout that does not fit.
        refused: why the target's compiler refused to compile it, too large for a chip (libtpu checks while it
            compiles): then it does not fit, whatever the plan says; empty otherwise.
    """

    choice: LayoutChoice
    plan: TrainingPlan
    time: StepTime
    model_flops: float
    compiled_time: StepTime | None = None
    verification: str = "not verified"
    disagreements: tuple[str, ...] = ()
    rank: int = 0
    refused: str = ""

    @property
    def mode(self) -> str:
        return self.choice.mode

    @property
    def mesh(self) -> Any:
        return self.choice.mesh

    @property
    def remat(self) -> str:
        return self.choice.remat

    @property
    def accum(self) -> int:
        """Microbatches per step (gradient accumulation)."""
        return self.choice.accum

    @property
    def verified(self) -> bool:
        return self.plan.compiled is not None

    @property
    def step_s(self) -> float:
        """Predicted seconds per step: on the compiler's collectives where verified, else the plan's."""
        return (self.compiled_time or self.time).step_s

    @property
    def bound(self) -> str:
        """What the step waits on, in words (compute, or a named collective on a named link)."""
        return (self.compiled_time or self.time).bound

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Tokens (examples, for a model without sequences) each chip trains per second."""
        per_step = self.plan.global_batch * (self.plan.seq_len or 1)
        return per_step / self.plan.mesh.size / self.step_s

    @property
    def mfu(self) -> float:
        """Estimated model FLOPs utilisation: the FLOPs that train the model over the chip's peak for the step."""
        return self.model_flops / (self.step_s * self.plan.hardware.peak_flops)

    @property
    def analytic_peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def memory_source(self) -> str:
        """``"simulated"`` (the traced step's buffers) or ``"formulas"`` (the plan's analytic transients)."""
        return "simulated" if self.plan.memory is not None else "formulas"

    @property
    def compiler_peak_bytes(self) -> int | None:
        return None if self.plan.compiled is None else self.plan.compiled.peak_bytes

    @property
    def peak_bytes(self) -> int:
        """The peak per device to believe: the compiler's where verified, else the plan's."""
        compiled = self.compiler_peak_bytes
        return self.analytic_peak_bytes if compiled is None else compiled

    @property
    def headroom_bytes(self) -> int:
        """Device memory left at the peak (negative: it does not fit)."""
        return self.plan.device_memory - self.peak_bytes

    @property
    def fits(self) -> bool:
        return not self.refused and self.headroom_bytes >= 0

    @property
    def over_gpu_budget(self) -> bool:
        """Whether the step's simulated temporaries are over XLA:GPU's budget on the GPU (:mod:`.gpu_memory_budget`):
        the compiler will compute values again to fit, time the plan does not count. False where not simulated
        for XLA:GPU."""
        budget, memory = self.plan.gpu_budget, self.plan.memory
        return budget is not None and memory is not None and memory.temp_bytes > budget.on_gpu

    def analytic_bytes_by_collective(self) -> dict[str, int]:
        """Collective kind -> bytes per device per step, as planned."""
        totals: dict[str, int] = {}
        for collective in self.plan.collectives:
            totals[collective.kind] = totals.get(collective.kind, 0) + collective.total_bytes
        return {kind: totals[kind] for kind in COLLECTIVE_KINDS if kind in totals}

    def compiler_bytes_by_collective(self) -> dict[str, int] | None:
        """Collective kind -> bytes per device per step, as compiled; None unverified."""
        return None if self.plan.compiled is None else self.plan.compiled.bytes_by_kind()

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "mode": self.mode, "mesh": self.mesh.axes, "mesh_text": str(self.mesh),
            "remat": self.remat, "accum": self.accum, "global_batch": self.plan.global_batch,
            "step_s": self.step_s, "time": self.time.to_json(),
            "compiled_time": None if self.compiled_time is None else self.compiled_time.to_json(),
            "bound": self.bound, "tokens_per_s_per_chip": self.tokens_per_s_per_chip, "mfu": self.mfu,
            "analytic_peak_bytes": self.analytic_peak_bytes, "memory_source": self.memory_source,
            "compiler_peak_bytes": self.compiler_peak_bytes, "headroom_bytes": self.headroom_bytes,
            "device_memory": self.plan.device_memory, "fits": self.fits, "over_gpu_budget": self.over_gpu_budget,
            "analytic_bytes_by_collective": self.analytic_bytes_by_collective(),
            "compiler_bytes_by_collective": self.compiler_bytes_by_collective(),
            "verified": self.verified, "verification": self.verification, "refused": self.refused or None,
            "disagreements": list(self.disagreements), "settings": layout_settings(self),
        }


@dataclasses.dataclass(frozen=True)
class FamilyVerdict:
    """What became of one mode (a candidate family): ``verdict`` is ``"chosen"``, ``"slower"``, ``"does not fit"``
    or ``"no layout"`` (no mesh or batch split for it), and ``reason`` says why in one line."""

    mode: str
    verdict: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, eq=False)
class Recommendation:
    """Which layout to use for a model, a batch and a fleet. Build it with :func:`~.recommender.recommend`.

    Attributes:
        model, model_options, target, devices, global_batch, seq_len, optimizer, precision, utilisation: what
            was asked (``target`` as text: ``"gpu:h100:512"``; ``devices``: its chips).
        candidates: the layouts that fit, best first (verified ones ahead of the rest).
        unfit: the layouts analysed that do not fit (analytic or compiled peak above the chip's memory).
        families: one :class:`FamilyVerdict` per candidate mode.
        analysed: how many layouts were planned.
        verification_note: why nothing was compiled (``--no-verify``, a compiler not installed), else None.
        seconds: wall time of each stage (``analysis``, ``simulation``, ``verification``).
        own: your module, loss, example batch and rules as the compiles traced them (an
            :class:`~.exported_step.OwnModel`; None for a registered model's own layout): what
            :func:`~.layout_export.budget_test_code` needs to write your budget test.
    """

    model: str
    model_options: dict[str, Any]
    target: str
    devices: int
    global_batch: int
    seq_len: int | None
    optimizer: str
    precision: str
    utilisation: float
    candidates: tuple[Candidate, ...]
    unfit: tuple[Candidate, ...]
    families: tuple[FamilyVerdict, ...]
    analysed: int
    verification_note: str | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    own: OwnModel | None = None

    @property
    def chosen(self) -> Candidate:
        """The best layout: the first candidate."""
        return self.candidates[0]

    @property
    def verified(self) -> tuple[Candidate, ...]:
        return tuple(c for c in (*self.candidates, *self.unfit) if c.verified)

    @property
    def refusals(self) -> tuple[str, ...]:
        """One line per layout the target's compiler refused to compile, too large for a chip (it does not fit,
        whatever its plan said): ``"dp on data=4 x1: refused by the compiler: ..."``."""
        return tuple(f"{c.mode} on {c.mesh} x{c.accum}: {c.verification}" for c in self.unfit if c.refused)

    @property
    def rejected(self) -> tuple[FamilyVerdict, ...]:
        """The families not chosen, each with its line."""
        return tuple(f for f in self.families if f.verdict != "chosen")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "model_options": dict(self.model_options), "target": self.target,
            "devices": self.devices, "global_batch": self.global_batch, "seq_len": self.seq_len,
            "optimizer": self.optimizer, "precision": self.precision, "utilisation": self.utilisation,
            "hardware": self.chosen.plan.hardware.to_json(), "overlap_model": OVERLAP_MODEL,
            "analysed": self.analysed, "chosen": self.chosen.to_json(),
            "candidates": [c.to_json() for c in self.candidates], "unfit": [c.to_json() for c in self.unfit],
            "families": [f.to_json() for f in self.families], "verification_note": self.verification_note,
            "seconds": dict(self.seconds),
        }

    def table(self, limit: int = 10) -> str:
        """The candidates as a text table, best first, at most ``limit`` rows."""
        headers, rows = self.table_cells(limit)
        return "\n".join(align_columns(headers, rows, right=TABLE_FIGURES))

    def table_cells(self, limit: int = 10) -> tuple[list[str], list[list[str]]]:
        """The table's headers and rows of text cells, best first, at most ``limit`` rows (the widget's HTML
        table and :meth:`table` are both made from them; :data:`TABLE_FIGURES` are the columns of figures)."""
        headers = ["rank", "mode", "mesh", "remat", "micro", "peak plan", "compiler", "headroom", "step",
                   "tok/s/chip", "MFU", "collectives per step", "verified"]
        rows = [[str(c.rank), c.mode, str(c.mesh), c.remat, str(c.accum),
                 f"{format_bytes(c.analytic_peak_bytes)}{'' if c.memory_source == 'simulated' else '~'}",
                 "-" if c.compiler_peak_bytes is None else format_bytes(c.compiler_peak_bytes),
                 format_bytes(c.headroom_bytes) if c.headroom_bytes >= 0 else f"-{format_bytes(-c.headroom_bytes)}",
                 format_seconds(c.step_s), f"{c.tokens_per_s_per_chip:,.0f}", f"{c.mfu:.0%}",
                 _collective_words(c), "yes" if c.verified else "no"]
                for c in self.candidates[:limit]]
        return headers, rows

    def to_text(self, limit: int = 10) -> str:
        """The answer, the table, why each leading candidate is bound as it is, the families not chosen, the
        disagreements with the compiler, and what the figures assume."""
        best = self.chosen
        hw = best.plan.hardware
        tokens = f" x {self.seq_len:,} tokens" if self.seq_len else ""
        lines = [f"{self.model} on {self.target} ({self.devices:,} x {hw.name}), batch {self.global_batch:,}{tokens}, "
                 f"{self.optimizer}, {self.precision}: {self.analysed} layouts analysed, {len(self.candidates)} fit",
                 "",
                 f"use: {best.mode} on {best.mesh}, remat {best.remat}, {best.accum} microbatch"
                 f"{'es' if best.accum > 1 else ''}: {format_seconds(best.step_s)} a step, "
                 f"{best.tokens_per_s_per_chip:,.0f} tokens/s per chip, ~{best.mfu:.0%} MFU, "
                 f"{format_bytes(best.peak_bytes)} of {format_bytes(best.plan.device_memory)} per chip "
                 f"({'verified by the compiler' if best.verified else 'unverified'})",
                 "", self.table(limit), "",
                 "peak plan: ~ marks the formulas alone (not simulated); micro: microbatches per step", "",
                 "what bounds each"]
        lines += [f"  {c.rank}. {c.mode} on {c.mesh} x{c.accum}: {c.bound}" for c in self.candidates[:limit]]
        lines += ["", "families"] + [f"  {f.mode} ({f.verdict}): {f.reason}" for f in self.families]
        flagged = [c for c in (*self.candidates, *self.unfit) if c.disagreements]
        if flagged:
            lines += ["", "compiler and plan disagree"]
            lines += [f"  {c.mode} on {c.mesh} x{c.accum}: {d}" for c in flagged for d in c.disagreements]
        lines += ["", "verification"]
        if self.verification_note:
            lines.append(f"  {self.verification_note}")
        lines += [f"  {c.mode} on {c.mesh} x{c.accum}: {c.verification}" for c in self.verified]
        lines += [f"  {line}" for line in self.refusals]
        lines += ["", f"assumes: compute at {self.utilisation:.0%} of {hw.name}'s bf16 peak, recomputation included; "
                  f"{OVERLAP_MODEL}; each collective on the link level it crosses"]
        return "\n".join(lines)


def _collective_words(candidate: Candidate) -> str:
    figures = candidate.compiler_bytes_by_collective() or candidate.analytic_bytes_by_collective()
    short = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
             "collective-permute": "CP"}
    return " ".join(f"{short.get(kind, kind)} {format_bytes(n)}" for kind, n in figures.items() if n) or "none"


def layout_settings(candidate: Candidate) -> dict[str, Any]:
    """The settings that train ``candidate``'s layout, as :class:`~workbench.TrainConfig` names them (``mesh`` as
    text): what a widget applies to its Mesh, Model & mode and Verify panels. ``remat`` is a policy name.

    Example:
        >>> rec = recommend("mlp", "cpu", 64, verify=False)
        >>> layout_settings(rec.chosen)["mesh"] == str(rec.chosen.mesh)
        True
    """
    plan = candidate.plan
    return {"model": plan.model, "model_options": dict(plan.model_options), "mode": candidate.mode,
            "mesh": str(candidate.mesh), "remat": candidate.remat, "accum": candidate.accum,
            "batch": plan.global_batch, "optimizer": plan.optimizer, "precision": plan.precision}


__all__ = ["Candidate", "FamilyVerdict", "Recommendation", "layout_settings"]
