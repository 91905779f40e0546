"""How the training dashboard's Check shows a reference check (:func:`workbench.run_check`): the verdict, the key
figures, each finding with its likely cause, why and fix, and the compiled step's communication ledger.

Example:
    >>> report = wb.run_check("dp", mesh="data=4")
    >>> check_html(report, ledger_text_of(report, "dp"))
    '<div ...>reference check: <b>ok</b> ...'
"""

from __future__ import annotations

import html

import workbench as wb

from .common import LEVEL_STYLES


def ledger_text_of(report: wb.analysis.CheckReport | wb.analysis.ProcessCheckReport, mode: str) -> str:
    """The ledger of the step ``report`` checked (compiled once, for that step), as text; or why mode ``mode`` has
    none."""
    return (wb.analysis.ledger_table(report.ledger) if report.ledger
            else getattr(report, "ledger_text", None)) or (
        f"no ledger: mode {mode!r} runs several programs per step, so there is no single compiled step")


def check_html(report: wb.analysis.CheckReport | wb.analysis.ProcessCheckReport, ledger_text: str = "") -> str:
    """The check panel's HTML: the verdict, the key figures, each finding in full, and the ledger.

    Example:
        >>> check_html(wb.run_check("dp", mesh="data=4"))
        '<div ...>reference check: <b>ok</b> ...'
    """
    ok = report.verdict == "ok"
    color = LEVEL_STYLES["ok" if ok else "error"][0]
    mesh = str(wb.parse_mesh(report.mesh))
    esc = html.escape
    parts = [
        f'<div style="color:{color}">reference check: <b>{esc(report.verdict)}</b> — {esc(report.mode)} on '
        f"{esc(mesh)}, {report.steps} steps against 'single'</div>",
        '<ul style="margin:4px 0">'
        f"<li>gradient scale {report.grad_scale:.6f} (1 expected)</li>"
        f"<li>largest parameter difference {report.max_param_diff:.3g} (the reference moves parameters up to "
        f"{report.reference_step:.3g} per step)</li>"
        f"<li>replica divergence {report.replica_divergence:.3g} (0 expected)</li></ul>",
    ]
    for finding in report.problems:
        causes = ", ".join(finding.causes) if finding.causes else "no known fault"
        parts.append(
            f'<div style="border-left:3px solid {color};padding-left:8px;margin:6px 0">'
            f"<b>{esc(finding.name)}</b>: {esc(finding.message)}<br>"
            f"<b>likely cause</b>: {esc(causes)}<br>"
            f"<b>why</b>: {esc(finding.explanation)}<br>"
            f"<b>fix</b>: {esc(finding.fix)}</div>"
        )
    if ledger_text:
        parts.append("<details open><summary>communication per step (the compiled training step)</summary>"
                     f'<pre style="font-size:11px;overflow-x:auto">{esc(ledger_text)}</pre></details>')
    return "\n".join(parts)


__all__ = ["check_html", "ledger_text_of"]
