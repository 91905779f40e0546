"""``workbench recommend``: which layout (mode, mesh, remat, microbatches) to use for a model, a batch and a fleet,
with the best few compiled by the target's compiler.

Prints the answer, the table of candidates (memory per device by the plan and the compiler, headroom, step time,
tokens/s per chip, MFU, bytes per collective), what bounds each, one line per family not chosen, and where the
compiler disagrees with the plan. ``--export-code FILE`` writes the chosen layout as a script snippet,
``--export-test FILE`` as a pytest file for CI that holds the compiled step to its budget (see
:mod:`workbench.analysis.layout_export`).

With ``--json`` stdout holds exactly one JSON object (:meth:`workbench.analysis.Recommendation.to_json`). Bad input,
or no layout that splits the batch or fits, prints one line ``error: ...`` on stderr and exits with status 2.

Example:
    $ workbench recommend --model transformer --config d_model=2048,n_layers=24,n_heads=16,vocab=32000,max_len=2048 \\
          --target gpu:h100:512 --batch 1024 --seq-len 2048
"""

from __future__ import annotations

import json
import pathlib
import sys

from ..analysis.cost_model import DEFAULT_UTILISATION
from ..analysis.layout_export import budget_test_code, layout_code
from ..analysis.recommender import DEFAULT_TOP, VERIFY_TIMEOUT_S, recommend
from ..errors import WorkbenchError
from ..training.models import parse_model_options
from .exit_codes import EXIT_INTERRUPTED, EXIT_OK
from .options import LEFT_OUT, add_setup_options


def add_recommend_parser(commands) -> None:
    """Add the ``recommend`` subcommand and its options to ``commands`` (argparse subparsers)."""
    parser = commands.add_parser(
        "recommend",
        help="which layout to use: modes, meshes and microbatches ranked by step time, the best compiled",
        description="Weigh every parallel mode, mesh, remat policy and microbatch count the target's chips allow, "
        "rank them by predicted step time, and compile the best few with the target's compiler.",
    )
    add_setup_options(parser, model="transformer", optimizer="adamw", precision="bf16", remat=LEFT_OUT)
    parser.add_argument("--config", default="",
                        help="model options, e.g. 'd_model=2048,n_layers=24,n_heads=16,vocab=32000,max_len=2048'")
    parser.add_argument("--target", required=True,
                        help="the fleet and its compiler: gpu:<chip>:<count> (e.g. gpu:h100:512), "
                        "tpu:<generation>:<shape> (e.g. tpu:v5p:8x8x8) or cpu (simulated devices)")
    parser.add_argument("--devices", type=int, default=None, help="simulated devices for --target cpu (default 8)")
    parser.add_argument("--batch", type=int, default=None, help="global batch in sequences (examples)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="the global batch in tokens instead (with --seq-len), e.g. 1048576")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (transformer)")
    parser.add_argument("--utilisation", type=float, default=DEFAULT_UTILISATION,
                        help=f"assumed fraction of peak FLOP/s reached, MFU (default {DEFAULT_UTILISATION})")
    parser.add_argument("--device-memory", default=None, help="memory per chip, e.g. 16GiB (default: the chip's)")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP,
                        help=f"how many of the best layouts to compile (default {DEFAULT_TOP}); more replace "
                             "those the compiler turns down")
    parser.add_argument("--no-verify", action="store_true", help="rank on the plan alone: compile nothing")
    parser.add_argument("--timeout", type=float, default=VERIFY_TIMEOUT_S,
                        help=f"seconds each compile may take (default {VERIFY_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument("--export-code", default=None, metavar="FILE",
                        help="write the chosen layout as Python to paste into a training script")
    parser.add_argument("--export-test", default=None, metavar="FILE",
                        help="write a pytest file that holds the chosen layout's compiled step to its budget (+5%%)")


def recommend_command(args) -> int:
    """Run ``workbench recommend``; WorkbenchError propagates to ``cli.main`` (one line, status 2)."""
    progress = _progress_line if sys.stderr.isatty() else None
    try:
        rec = recommend(
            args.model, args.target, args.batch, seq_len=args.seq_len, global_batch_tokens=args.batch_tokens,
            model_options=parse_model_options(args.config, args.model), optimizer=args.optimizer,
            precision=args.precision, utilisation=args.utilisation, devices=args.devices,
            device_memory=args.device_memory, top=args.top, verify=not args.no_verify, timeout=args.timeout,
            on_progress=progress,
        )
    except KeyboardInterrupt:  # the children compiling were stopped on the way out
        print("interrupted: the compiles were stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.export_test:  # before anything is written: a layout without compiled figures is refused here
        _write(args.export_test, budget_test_code(rec.chosen), "--export-test")
    if args.export_code:
        _write(args.export_code, layout_code(rec.chosen), "--export-code")
    print(json.dumps(rec.to_json()) if args.json else rec.to_text())
    return EXIT_OK


def _write(path: str, text: str, option: str) -> None:
    try:
        pathlib.Path(path).write_text(text)
    except OSError as error:
        raise WorkbenchError(f"{option} {path!r}: {error.strerror}: give a file in a folder you can write") from None


def _progress_line(text: str) -> None:
    print(f"recommend: {text}", file=sys.stderr, flush=True)
