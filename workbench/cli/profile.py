"""``workbench profile RUN``: print a run's latest profile (``workbench train --profile N`` takes one).

The per-step and per-collective tables, memory per device predicted / compiled / live with its flags, and
where the full trace is and how to open it. ``--json`` prints one JSON object instead.

Example:
    $ workbench train --model mlp --mode dp --steps 200 --profile 5
    $ workbench profile runs/mlp-dp-20261123-101500
"""

from __future__ import annotations

import json
from typing import Any

from ..analysis.profile_report import read_profile
from ..views.profile_text import profile_text
from .exit_codes import EXIT_OK


def add_profile_parser(commands) -> None:
    profile = commands.add_parser(
        "profile",
        help="print a run's latest profile: time per step in compute and collectives, memory three ways",
        description="Reads runs/<name>/profile/ (written by workbench train --profile N, Trainer.profile or the "
        "dashboard's Profile button): the steps per device in compute and collectives, each collective's bandwidth, "
        "and memory per device predicted, compiled and live.",
    )
    profile.add_argument("run",
                         help="a run folder (its latest profile) or a profile folder (runs/<name>/profile/step-S)")
    profile.add_argument("--json", action="store_true", help="print one JSON object")


def profile_json(report: Any) -> dict[str, Any]:
    """The report as plain JSON: where it is, its step and collective summaries and memory."""
    timeline = report.timeline
    return {
        "run": report.run, "folder": str(report.folder), "first_step": report.first_step, "steps": report.steps,
        "perfetto_file": str(report.perfetto_file) if report.perfetto_file else None,
        "steps_timing": timeline.to_json()["steps"] if timeline else None,
        "collectives": timeline.to_json()["collectives"] if timeline else None,
        "timeline_error": report.timeline_error, "capture_error": report.capture_error,
        "memory": report.memory.to_json(),
    }


def print_profile(source: Any, as_json: bool = False) -> None:
    """Read a profile and print it (tables, or one JSON object)."""
    report = read_profile(source)
    print(json.dumps(profile_json(report)) if as_json else profile_text(report))


def profile_command(args) -> int:
    print_profile(args.run, args.json)
    return EXIT_OK
