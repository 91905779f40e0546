"""A recommendation as a plotly figure: every layout weighed, memory per device against predicted step time.

:func:`recommendation_figure` draws a :class:`~workbench.analysis.recommendation.Recommendation`: one point per
layout, coloured by mode; the layouts the target's compiler verified are diamonds at the compiler's peak, the rest
circles at the plan's, the ones that do not fit crosses; the chosen one is ringed; the chip's memory is a dashed
line. Hover a point for its mesh, microbatches, what bounds it and any disagreement with the compiler.

Example:
    >>> rec = recommend("mlp", "cpu", 64, verify=False)
    >>> figure = recommendation_figure(rec)
    >>> sorted({trace.name for trace in figure.data})[:2]
    ['chosen', 'dp']
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..analysis.recommendation import Candidate, Recommendation
from ..formatting import format_bytes, format_seconds
from .colors import OKABE_ITO

GiB = 2**30
SYMBOLS = {"verified": "diamond", "unverified": "circle", "unfit": "x"}


def _hover(candidate: Candidate) -> str:
    lines = [f"<b>{candidate.mode} on {candidate.mesh}</b>, {candidate.accum} microbatch(es), remat {candidate.remat}",
             f"step {format_seconds(candidate.step_s)}, peak {format_bytes(candidate.peak_bytes)}"
             f" ({'compiler' if candidate.verified else 'plan'})", candidate.bound]
    lines += [f"compiler: {d}" for d in candidate.disagreements]
    return "<br>".join(lines)


def recommendation_figure(recommendation: Recommendation) -> go.Figure:
    """Memory per device against predicted step time for every layout ``recommendation`` weighed (see the module
    docstring)."""
    figure = go.Figure()
    everything = [*recommendation.candidates, *recommendation.unfit]
    modes = list(dict.fromkeys(c.mode for c in everything))
    for index, mode in enumerate(modes):
        for state, members in (("verified", [c for c in recommendation.candidates if c.mode == mode and c.verified]),
                               ("unverified", [c for c in recommendation.candidates
                                               if c.mode == mode and not c.verified]),
                               ("unfit", [c for c in recommendation.unfit if c.mode == mode])):
            if not members:
                continue
            figure.add_trace(go.Scatter(
                x=[c.step_s * 1e3 for c in members], y=[c.peak_bytes / GiB for c in members], mode="markers",
                name=mode, legendgroup=mode, showlegend=state != "unfit" or not any(
                    c.mode == mode for c in recommendation.candidates),
                marker={"color": OKABE_ITO[index % len(OKABE_ITO)], "symbol": SYMBOLS[state], "size": 11,
                        "line": {"width": 1, "color": "#333333"}},
                hovertext=[_hover(c) for c in members], hoverinfo="text",
            ))
    best = recommendation.chosen
    figure.add_trace(go.Scatter(x=[best.step_s * 1e3], y=[best.peak_bytes / GiB], mode="markers", name="chosen",
                                marker={"symbol": "circle-open", "size": 22, "color": "#000000", "line": {"width": 2}},
                                hovertext=[_hover(best)], hoverinfo="text"))
    memory = best.plan.device_memory / GiB
    figure.add_hline(y=memory, line_dash="dash", line_color="#666666",
                     annotation_text=f"{best.plan.hardware.name}: {format_bytes(best.plan.device_memory)} per chip")
    figure.update_layout(
        title=f"{recommendation.model} on {recommendation.target}: {recommendation.analysed} layouts "
              "(diamonds: verified by the compiler; crosses: do not fit)",
        xaxis_title="predicted step time (ms)", yaxis_title="peak memory per device (GiB)", template="plotly_white",
    )
    return figure


__all__ = ["recommendation_figure"]
