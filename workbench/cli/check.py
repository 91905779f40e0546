"""``workbench check``: is a data-parallel step right? A few steps against ``single``, from the command line.

Runs the reference check (:mod:`workbench.analysis.reference_check`): the chosen mode and the one-device
reference on the same global batches, the gradient scale, parameter differences per step, replica
divergence, the gradient-sync diagnostics and the compiled step's collectives. ``--inject`` switches on
teaching faults (:mod:`workbench.training.modes.faults`) to watch the check catch them.

Exit status: 0 when the verdict is ok, 1 when a problem was found, 2 for bad input (one line on
stderr). With ``--json`` stdout holds exactly one JSON object (:meth:`CheckReport.to_json`).

Example:
    $ workbench check --model mlp --mesh data=4 --mode dp-shard-map --inject psum --json
    {"mode": "dp-shard-map", "mesh": {"data": 4}, "verdict": "problem", "problems": [{"name": "grad-scale", ...
"""

from __future__ import annotations

import json

from ..analysis.reference_check import MIN_STEPS, run_check
from ..training.models import parse_model_options
from ..training.modes import FAULTS
from .exit_codes import EXIT_FAILED, EXIT_OK
from .options import add_setup_options


def add_inject_option(parser) -> None:
    """``--inject FAULT`` (repeatable, or comma-separated); read it as ``",".join(args.inject)``."""
    parser.add_argument("--inject", action="append", default=[], metavar="FAULT",
                        help=f"switch on a teaching fault (repeat or comma-separate): {', '.join(FAULTS)}")


def add_check_parser(commands) -> None:
    """Add the ``check`` subcommand and its options to ``commands`` (argparse subparsers)."""
    check = commands.add_parser(
        "check",
        help="check a parallel mode against the one-device reference; --inject a teaching fault to see it caught",
        description="Run a few steps of a parallel mode next to 'single' on the same batches and report the gradient "
        "scale, parameter differences, replica divergence and the collectives, with a verdict and, for each "
        "problem, the likely causes, why, and the fix. Exit 0 ok, 1 problem, 2 bad input.",
    )
    add_setup_options(check, model="mlp", mesh="data=4", mode="dp", optimizer="adam",
                      helps={"mesh": "e.g. data=4 (default)", "optimizer": "default adam (has state to lose)"})
    check.add_argument("--data", default=None, help="default: the model's own (digits for mlp, text for transformer)")
    add_inject_option(check)
    check.add_argument("--steps", type=int, default=MIN_STEPS, help=f"steps compared (at least {MIN_STEPS}; default)")
    check.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    check.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    check.add_argument("--model-options", default="", help="overrides, e.g. 'd_model=32,n_layers=1'")
    check.add_argument("--seed", type=int, default=0, help="default 0")
    check.add_argument("--processes", type=int, default=1,
                       help="check across this many processes on jax.distributed (default 1: this one)")
    check.add_argument("--json", action="store_true", help="print exactly one JSON object")


def check_command(args) -> int:
    """Run ``workbench check``; WorkbenchError propagates to ``cli.main`` (one line, status 2)."""
    report = run_check(
        args.mode, model=args.model, mesh=args.mesh, faults=",".join(args.inject), steps=args.steps, batch=args.batch,
        lr=args.lr, optimizer=args.optimizer, remat=args.remat, data=args.data, seed=args.seed,
        processes=args.processes,
        model_options=parse_model_options(args.model_options, args.model),
    )
    print(json.dumps(report.to_json()) if args.json else report.to_text())
    return EXIT_OK if report.verdict == "ok" else EXIT_FAILED
