"""The reference check across processes: the mode trains on each process's own rows, the one-device
reference on the whole batches, and process 0's report comes back as a :class:`ProcessCheckReport`.

:func:`~workbench.analysis.reference_check.run_check` calls :func:`check_across_processes` for a config with
``processes`` >= 2; the processes are :class:`~workbench.training.process_group.ProcessGroup` workers.

Example:
    >>> config = TrainConfig(mode="dp", processes=2, faults=("same-shard",))  # doctest: +SKIP
    >>> check_across_processes(config).problems[-1].causes  # doctest: +SKIP
    ('same-shard',)
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from typing import Any

from ..training.config import TrainConfig
from ..training.process_group import CHECK_FILE, ProcessGroup, ProcessGroupError
from .findings import Finding

CHECK_TIMEOUT_S = 300.0
_REPORT_FIGURES = ("verdict", "mode", "mesh", "steps", "grad_scale", "max_param_diff", "reference_step",
                   "replica_divergence", "fault_residuals")


@dataclasses.dataclass(frozen=True)
class ProcessCheckReport:
    """The reference check of a configuration across processes, as process 0 measured it: ``data`` is its
    :meth:`~workbench.analysis.CheckReport.to_json` object (with ``"text"``, its
    :meth:`~workbench.analysis.CheckReport.to_text`)."""

    data: dict
    ledger = None  # the compiled step's collectives are in data["collectives"] (see ledger_text)

    def __getattr__(self, name: str) -> Any:  # the figures CheckReport has as attributes, read from its JSON
        if name in _REPORT_FIGURES:
            return self.data[name]
        raise AttributeError(name)

    @property
    def ledger_text(self) -> str:
        """The compiled step's collectives, one per line, as process 0 compiled them."""
        return "\n".join(f"{c['kind']:<15} over {','.join(c['axes']) or '-':<10} {c['bytes']:>12,} B x {c['count']}  "
                         f"{c['dtype']}" for c in self.data["collectives"])

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(Finding(p["name"], tuple(p["causes"]), p["message"], p["explanation"], p["fix"])
                     for p in self.data["problems"])

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.data.items() if key != "text"}

    def to_text(self) -> str:
        return self.data["text"]


def check_across_processes(config: TrainConfig, *, steps: int | None = None,
                           timeout: float = CHECK_TIMEOUT_S) -> ProcessCheckReport:
    """The reference check of ``config`` (``processes`` >= 2) run by that many processes on this machine: the
    mode trains on every process's own rows, the one-device reference on the whole batches.

    Raises:
        ProcessGroupError: the processes failed (which one, and its last output) or took over ``timeout`` s.

    Example:
        >>> config = TrainConfig(mode="dp", processes=2, faults=("same-shard",))  # doctest: +SKIP
        >>> check_across_processes(config).problems[-1].causes  # doctest: +SKIP
        ('same-shard',)
    """
    with tempfile.TemporaryDirectory(prefix="workbench-check-") as root:
        group = ProcessGroup(config, root, "check", task="check", check_steps=steps)
        try:
            ended = group.wait(timeout)
        finally:
            group.close()
        if ended is None:
            raise ProcessGroupError(f"the check across {config.processes} processes took longer than {timeout:g} s and "
                                    "was stopped: check a smaller model, or give a longer timeout")
        report = group.path / CHECK_FILE
        if not report.is_file():
            raise ProcessGroupError(f"the check across {config.processes} processes failed: "
                                    f"{group.failure or 'no report was written'}")
        return ProcessCheckReport(json.loads(report.read_text()))


__all__ = ["CHECK_TIMEOUT_S", "ProcessCheckReport", "check_across_processes"]
