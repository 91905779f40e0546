"""What a reference check finds: a :class:`Finding` per problem, named for its symptom, with its likely causes.

The check in one process (:mod:`.reference_check`) makes them; the check across processes
(:mod:`.process_check`) reads them back from process 0's report.

Example:
    >>> finding = Finding("grad-scale", ("psum",), "4x the mean gradient", "summed, not averaged", "use pmean")
    >>> finding.to_json()["causes"]
    ['psum']
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem: its symptom's name, the faults the evidence points to, and what to do.

    Attributes:
        name: ``"grad-scale"``, ``"replica-divergence"`` or ``"update-mismatch"``.
        causes: fault names (:data:`~workbench.training.modes.faults.FAULTS`), most likely first; empty when no
            known fault reproduces what was measured.
        message: what was measured, in one or two sentences.
        explanation: why it happens, for the most likely cause.
        fix: how to fix it, for the most likely cause.
    """

    name: str
    causes: tuple[str, ...]
    message: str
    explanation: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "causes": list(self.causes), "message": self.message,
                "explanation": self.explanation, "fix": self.fix}


__all__ = ["Finding"]
