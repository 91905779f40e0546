"""The ``workbench`` command line.

``workbench devices`` shows what JAX sees; ``workbench inspect`` prints an array's layout on any mesh;
``workbench train`` trains a model in a parallel mode; ``workbench runs`` lists and compares past runs;
``workbench check`` checks a mode against the one-device reference; ``workbench plan`` plans a layout and
``workbench recommend`` chooses one;
``workbench lab`` starts JupyterLab on the notebooks and ``workbench app`` serves the widgets alone;
``workbench cache`` shows (or ``--clear``s) JAX's compilation cache.
Bad input prints one line on stderr and exits with status 2, never a traceback; a training run that
fails exits with status 1 and the reason.

Example:
    $ workbench inspect --mesh data=2,model=4 --shape 8,16,32 --spec 'data, None, model' --json
    $ workbench train --model mlp --data digits --mesh data=8 --mode dp --steps 300 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
from collections.abc import Sequence

import jax

from ..compile_cache import clear_compilation_cache, compilation_cache_info
from ..devices import describe_devices
from ..errors import WorkbenchError
from ..formatting import format_bytes
from ..layout.array_layout import layout_array
from ..layout.shapes import parse_shape
from ..training.config import TrainConfig
from ..training.run_reports import DEFAULT_COLUMNS, choose_columns, compare_runs, compare_table
from ..training.runs import list_runs
from ..views.jax_picture import capture_visualize_sharding
from ..views.text import layout_table, tiling_picture
from .check import add_check_parser, add_inject_option, check_command
from .exit_codes import EXIT_BAD_INPUT, EXIT_OK
from .options import add_setup_options
from .plan import add_plan_parser, plan_command
from .profile import add_profile_parser, profile_command
from .recommend import add_recommend_parser, recommend_command
from .serve import add_server_parsers, app_command, lab_command
from .train import train_command

TABLE_WIDTH = 120  # `workbench runs` fits its default table in this many characters


class UsageError(Exception):
    """Bad command-line arguments (argparse's own errors are routed here)."""


class _Parser(argparse.ArgumentParser):
    # argparse prints usage plus a message and exits; we want one line and status 2 from main().
    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="See and check how JAX arrays are laid out on device meshes.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    devices = commands.add_parser("devices", help="what JAX sees: backend and devices")
    devices.add_argument("--json", action="store_true", help="print one JSON object")

    inspect = commands.add_parser(
        "inspect",
        help="an array's per-device layout on a mesh of any size",
        description="Print which device holds which slice of an array. Meshes of any size work: "
        "nothing is allocated. Device ids are row-major mesh positions (JAX's ids on a CPU mesh).",
    )
    inspect.add_argument("--mesh", required=True, help="axes as name=size, e.g. data=2,model=4")
    inspect.add_argument("--shape", required=True, help="array shape, e.g. 8,16,32 ('' for a 0-D array)")
    inspect.add_argument("--spec", default="", help="partition spec, e.g. 'data, None, model' (default: replicated)")
    inspect.add_argument("--dtype", default="float32", help="element type (default float32), e.g. bfloat16")
    inspect.add_argument("--json", action="store_true", help="print exactly one JSON object")
    inspect.add_argument("--all-devices", action="store_true", help="list every device even on large meshes")
    _add_train_parser(commands)
    add_plan_parser(commands)
    add_recommend_parser(commands)
    add_check_parser(commands)
    add_server_parsers(commands)
    add_profile_parser(commands)
    cache = commands.add_parser(
        "cache",
        help="JAX's compilation cache: where it is and what it holds; --clear empties it",
        description="import workbench switches JAX's persistent compilation cache on, so a second process "
        "reaches its first training step sooner. WORKBENCH_COMPILATION_CACHE=/folder moves it, =off switches it off.",
    )
    cache.add_argument("--clear", action="store_true",
                       help="delete every cached program (the folder and other files stay)")
    cache.add_argument("--json", action="store_true", help="print one JSON object")
    runs = commands.add_parser(
        "runs",
        help="list past training runs and compare their final figures",
        description=f"One line per run. The default table shows the most telling columns that fit in "
        f"{TABLE_WIDTH} characters; --columns picks others (the names are the JSON keys), "
        "--all-columns shows every one.",
    )
    runs.add_argument("--run-dir", default="runs", help="where runs are written (default: runs)")
    runs.add_argument("--json", action="store_true", help="print one JSON object")
    shown = runs.add_mutually_exclusive_group()
    shown.add_argument("--columns", help="columns to show, in order, e.g. name,mode,loss,eval_accuracy")
    shown.add_argument("--all-columns", action="store_true", help="every column (wider than most terminals)")
    return parser


def _add_train_parser(commands) -> None:
    # The fields' own defaults, without building a config: a config's default mesh starts JAX's backend, which
    # --join must leave to jax.distributed.initialize.
    defaults = types.SimpleNamespace(**{field.name: field.default for field in dataclasses.fields(TrainConfig)
                                        if field.default is not dataclasses.MISSING})
    train = commands.add_parser(
        "train",
        help="train a model in a parallel mode; metrics are written to runs/<name>/ as it goes",
        description="Train on simulated or real devices. Every parallel mode computes the same update as "
        "'single' on the same global batches. With --json, exactly one JSON object is printed at the end.",
    )
    add_setup_options(train, model=defaults.model, mesh=None, mode=defaults.mode, optimizer=defaults.optimizer,
                      precision=defaults.precision, remat=defaults.remat,
                      helps={"mesh": "e.g. data=8, model=2, data=4,model=2 (default: every device here, over data)"})
    train.add_argument("--data", default=defaults.data,
                       help=f"regression, digits, text or tokens (default {defaults.data})")
    train.add_argument("--steps", type=int, default=defaults.steps, help=f"default {defaults.steps}")
    train.add_argument("--batch", type=int, default=defaults.batch,
                       help=f"global batch size (default {defaults.batch})")
    train.add_argument("--lr", type=float, default=defaults.lr, help=f"learning rate (default {defaults.lr})")
    train.add_argument("--accum", type=int, default=defaults.accum, help="microbatches per step (default 1)")
    train.add_argument("--seed", type=int, default=defaults.seed, help="default 0")
    train.add_argument("--model-options", default="", help="overrides, e.g. 'd_model=64,n_layers=1'")
    train.add_argument("--data-options", default="", help="e.g. 'seq_len=32' or 'image=true'")
    train.add_argument("--log-every", type=int, default=defaults.log_every, help="steps between metric reads")
    train.add_argument("--eval-every", type=int, default=defaults.eval_every,
                       help="steps between evals (0: at the end)")
    train.add_argument("--sync-every", type=int, default=defaults.sync_every,
                       help="steps between gradient-sync diagnostics (0: never)")
    add_inject_option(train)
    train.add_argument("--drop-remainder", action="store_true", help="drop partial batches instead of masking")
    train.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every,
                       help="steps between checkpoints in runs/<name>/checkpoints/ (default 0: none)")
    train.add_argument("--keep-checkpoints", type=int, default=defaults.keep_checkpoints,
                       help=f"how many of the newest checkpoints to keep (default {defaults.keep_checkpoints})")
    train.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue the run in RUN_DIR from its latest checkpoint; --mode, --mesh, --steps and the "
                            "logging options given here change it, the model, data and optimizer stay the run's")
    train.add_argument("--profile", type=int, default=None, metavar="N",
                       help="profile N steps with JAX's profiler once the steps are compiled, into "
                            "runs/<name>/profile/, "
                            "and print where time and memory went (workbench profile RUN prints it again)")
    train.add_argument("--name", default=None, help="run name (default: model-mode-time)")
    train.add_argument("--run-dir", default="runs", help="where runs are written (default: runs)")
    train.add_argument("--json", action="store_true", help="print exactly one JSON object at the end")
    train.add_argument("--processes", type=int, default=1,
                       help="train across this many processes on jax.distributed, each with mesh size / N simulated "
                            "devices and its own rows of every batch (default 1: this process)")
    train.add_argument("--port", type=int, default=None,
                       help="the coordinator's port on 127.0.0.1 (default: a free one)")
    train.add_argument("--join", default=None, metavar="HOST:PORT",
                       help="on real hosts: be one of --processes processes, whose process 0 listens at HOST:PORT "
                            "('auto': JAX detects the cluster, e.g. SLURM); needs --name, the same on every host")
    train.add_argument("--process-id", type=int, default=None,
                       help="with --join: this process's index (0 writes the run)")


def _cmd_devices(args) -> int:
    report = describe_devices()
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    print(f"JAX {report['jax_version']}, backend {report['backend']}: {report['count']} device(s) ({report['setup']})")
    for device in report["devices"]:
        print(f"  {device['id']:>4}  {device['platform']:<6} {device['kind']}")
    return EXIT_OK


def _picture(layout) -> str | None:
    """JAX's own picture when the mesh fits the local devices, ours otherwise; None above 2-D."""
    if len(layout.shape) > 2:
        return None
    if 1 <= len(layout.shape) and layout.mesh.size <= len(jax.devices()):
        try:
            return capture_visualize_sharding(layout).text.rstrip()
        except WorkbenchError:
            pass
    return tiling_picture(layout)


def _cmd_inspect(args) -> int:
    layout = layout_array(parse_shape(args.shape), args.mesh, args.spec, dtype=args.dtype)
    if args.json:
        print(json.dumps(layout.to_json()))
        return EXIT_OK
    print(layout_table(layout, max_devices=None if args.all_devices else 16))
    picture = _picture(layout)
    print()
    print(picture or f"(no terminal picture for a {len(layout.shape)}-D array: layout_figure() draws any rank)")
    return EXIT_OK


def _cmd_train(args) -> int:
    return train_command(args)


def _cmd_profile(args) -> int:
    return profile_command(args)


def _cmd_plan(args) -> int:
    return plan_command(args)


def _cmd_recommend(args) -> int:
    return recommend_command(args)


def _cmd_check(args) -> int:
    return check_command(args)


def _column_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError(f"--columns {text!r} names no column: give names separated by commas, e.g. name,mode,loss")
    return names


def _cmd_runs(args) -> int:
    runs = list_runs(args.run_dir)
    rows = compare_runs(runs) if runs else []
    if args.columns is not None:
        columns = choose_columns(rows, _column_names(args.columns)) if rows else None
    elif args.all_columns or args.json:
        columns = None
    else:
        columns = choose_columns(rows, DEFAULT_COLUMNS, max_width=TABLE_WIDTH, skip_missing=True)
    if args.json:
        shown = rows if columns is None else [{c: row[c] for c in columns} for row in rows]
        print(json.dumps({"run_dir": args.run_dir, "runs": shown}))
    elif not runs:
        print(f"no runs in {args.run_dir}/ yet: 'workbench train' writes one there")
    else:
        print(compare_table(runs, columns=columns))
        hidden = len(rows[0]) - len(columns) if columns is not None else 0
        if hidden and args.columns is None:
            print(f"({hidden} more columns: --all-columns shows every one, --columns name,loss,... picks them)")
    return EXIT_OK


def _cmd_cache(args) -> int:
    freed = clear_compilation_cache() if args.clear else None
    info = compilation_cache_info()
    if args.json:
        print(json.dumps({**info, **({"freed_bytes": freed} if args.clear else {})}))
        return EXIT_OK
    state = "on" if info["enabled"] else "off"
    print(f"compilation cache {state}: {info['path'] or '(no folder)'} ({info['reason']})")
    if info["path"]:
        print(f"  {info['entries']} compiled programs, {format_bytes(info['bytes'])}")
    if freed is not None:  # --clear
        print(f"  cleared: {format_bytes(freed)} freed")
    return EXIT_OK


def _cmd_lab(args) -> int:
    return lab_command(args)


def _cmd_app(args) -> int:
    return app_command(args)


COMMANDS = {"devices": _cmd_devices, "inspect": _cmd_inspect, "train": _cmd_train, "runs": _cmd_runs, "plan": _cmd_plan,
            "recommend": _cmd_recommend, "check": _cmd_check, "lab": _cmd_lab, "app": _cmd_app, "cache": _cmd_cache,
            "profile": _cmd_profile}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failed run, 2 bad input)."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, WorkbenchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def entry_point() -> None:
    """The console script: exit with main()'s status."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`workbench inspect ... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_OK
    sys.exit(status)


if __name__ == "__main__":
    entry_point()
