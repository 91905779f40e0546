"""``workbench plan``: plan a production training run on an abstract mesh, from the command line.

Prints what every device would hold (parameters, gradients, optimizer state, rough transients), whether
it fits the chip's memory, the collectives a step runs with their ring-model times, the compute time,
and the layout as a ``(regex, PartitionSpec)`` table to paste into a training script. Nothing is
allocated and no accelerator is needed: a 512-chip plan of a 1B-parameter model takes well under 2 s.

``--verify cpu`` (or ``--verify tpu:v5p:8x8x8`` with the ``tpu`` extra, ``--verify gpu:h100:512`` after
``make gpu-compile``) also compiles the real step for the mesh in a child process and prints the compiler's
figures beside the plan's (``compiler`` in the JSON).

With ``--json`` stdout holds exactly one JSON object (see :meth:`workbench.analysis.planning.TrainingPlan.to_json`).
Bad input, or a step that cannot be compiled, prints one line ``error: ...`` on stderr and exits with status 2. A step
the target's compiler refuses because it does not fit the chip prints the plan (unverified), then ``verify: ... does
not fit: ...`` on stderr, and exits with status 1.

Example:
    $ workbench plan --model transformer --config d_model=2048,n_layers=24,n_heads=16,vocab=32000 \\
          --mesh data=64,model=8 --mode fsdp --hardware tpu-v5e --json
    {"model": "transformer", ..., "mesh": {"data": 64, "model": 8}, "mode": "fsdp", "params": 1339674624, ...}
"""

from __future__ import annotations

import json
import pathlib
import sys

from ..analysis.compile_target import parse_target
from ..analysis.cost_model import DEFAULT_UTILISATION, HARDWARE_NAMES
from ..analysis.planning import plan_training
from ..analysis.verification import VerifySettings, planned_hardware
from ..errors import StepDoesNotFit, WorkbenchError
from ..layout.rules import RuleTable
from ..training.models import parse_model_options
from .exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from .options import REQUIRED, add_setup_options


def add_plan_parser(commands) -> None:
    """Add the ``plan`` subcommand and its options to ``commands`` (argparse subparsers)."""
    plan = commands.add_parser(
        "plan",
        help="plan a training run on an abstract mesh of any size: memory per device, collectives, step time",
        description="Lay out a model's parameters, gradients and optimizer state on an abstract mesh as a parallel "
        "mode would, without allocating anything, and estimate a step's communication (ring model) and compute. "
        "Prints the layout as a rule table of PartitionSpecs to paste into a training script.",
    )
    add_setup_options(plan, model="transformer", mesh=REQUIRED, mode=REQUIRED, optimizer="adamw", precision="bf16",
                      helps={"precision": "compute precision (default bf16)"})
    plan.add_argument("--config", default="",
                      help="model options, e.g. 'd_model=2048,n_layers=24,n_heads=16,vocab=32000'")
    plan.add_argument("--hardware", default=None,
                      help=f"one of {', '.join(HARDWARE_NAMES)} (default tpu-v5p, or the --verify topology's)")
    plan.add_argument("--device-memory", default=None,
                      help="memory per device, e.g. 16GiB, 80GB (default: the hardware's)")
    plan.add_argument("--batch", type=int, default=None,
                      help="global batch in examples/sequences (default 16 per data-parallel replica)")
    plan.add_argument("--batch-tokens", type=int, default=None,
                      help="the global batch in tokens instead (--batch = tokens / --seq-len), e.g. 1048576")
    plan.add_argument("--seq-len", type=int, default=None,
                      help="tokens per sequence (transformer; default its max_len)")
    plan.add_argument("--accum", type=int, default=1,
                      help="microbatches per step (gradient accumulation, as train --accum runs it; default 1)")
    plan.add_argument("--utilisation", type=float, default=DEFAULT_UTILISATION,
                      help=f"assumed fraction of peak FLOP/s reached, MFU (default {DEFAULT_UTILISATION})")
    plan.add_argument("--rules", default=None, metavar="FILE",
                      help="your own rule table instead of the mode's layout: a text file of 'regex => spec' lines")
    plan.add_argument("--verify", default=None, metavar="TARGET",
                      help="also compile the real step for the mesh and show the compiler's figures beside the plan's: "
                      "cpu (simulated devices, up to 2048), tpu:<generation>:<shape>, e.g. tpu:v5p:8x8x8 "
                      "(needs pip install -e '.[tpu]'), or gpu:<chip>:<count>, e.g. gpu:h100:512, compiled by XLA:GPU "
                      "without a GPU (needs make gpu-compile)")
    plan.add_argument("--json", action="store_true", help="print exactly one JSON object")


def _read_rules(path: str):
    try:
        text = pathlib.Path(path).read_text()
    except OSError as error:
        raise WorkbenchError(f"--rules {path!r}: {error.strerror}: give a text file of 'regex => spec' lines") from None
    return RuleTable.parse(text)


def plan_command(args) -> int:
    """Run ``workbench plan``; WorkbenchError propagates to ``cli.main`` (one line, status 2). A step the target's
    compiler refuses as too large for the chip prints the unverified plan and the refusal, status 1."""
    verify = None
    if args.verify is not None:  # progress on stderr when a person watches; stdout stays the plan alone
        verify = VerifySettings(args.verify, on_progress=_progress_line if sys.stderr.isatty() else None)
    options = parse_model_options(args.config, args.model)
    rules = _read_rules(args.rules) if args.rules else None

    def plan_with(verify_settings, hardware=args.hardware, compiler=None):
        return plan_training(
            args.model, options, args.mesh, args.mode, optimizer=args.optimizer, hardware=hardware,
            device_memory=args.device_memory, global_batch=args.batch, global_batch_tokens=args.batch_tokens,
            seq_len=args.seq_len, accum=args.accum, precision=args.precision, remat=args.remat,
            utilisation=args.utilisation, rules=rules, verify=verify_settings, compiler=compiler)

    refused = None
    try:
        plan = plan_with(verify)
    except StepDoesNotFit as error:  # the target's answer: the plan is still worth reading, beside it
        if verify is None:  # only a compile refuses a step
            raise
        refused = error
        # the same plan unverified: priced on the target's chip and simulated for its compiler, as the verified one is
        plan = plan_with(None, planned_hardware(args.hardware, verify), parse_target(verify.target).kind)
    except KeyboardInterrupt:  # the child compiling the step was stopped on the way out
        print("interrupted: the compile was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(json.dumps(plan.to_json()) if args.json else plan.to_text())
    if refused is not None:
        print(f"verify: {refused}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _progress_line(text: str) -> None:
    print(f"verify: {text}", file=sys.stderr, flush=True)
