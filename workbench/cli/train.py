"""``workbench train``: the trainer on the command line, with a progress bar on a terminal.

Exit status: 0 when the run finished, 1 when it failed (the reason on stderr), 2 for bad input (one
line, before anything runs), 130 when stopped with Ctrl-C (the run is kept, status ``stopped``).
With ``--json`` stdout holds exactly one JSON object, at the end. ``--checkpoint-every K`` saves the state
every K steps; ``--resume runs/<name>`` continues a run from its latest checkpoint (another ``--mode`` or
``--mesh`` reads it into that layout). ``--profile N`` profiles N steps once compiled and prints where the
time and memory went (:mod:`workbench.cli.profile`).

Example:
    $ workbench train --model mlp --data digits --mesh data=8 --mode dp --steps 300 --json
    {"model": "mlp", "data": "digits", "mode": "dp", "mesh": {"data": 8}, "steps": 300, ...}
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, cast

from ..analysis.profile_report import read_profile
from ..distributed.worker import main as worker
from ..errors import WorkbenchError
from ..layout.mesh import parse_mesh
from ..training.config import TrainConfig
from ..training.data import parse_data_options
from ..training.models import parse_model_options
from ..training.profiling import ProfileError
from ..training.trainer import Trainer
from .exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from .profile import print_profile, profile_json


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN: non-finite numbers become null (the error says what went non-finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    return value


def _config_from_args(args):
    if args.mesh is None and getattr(args, "join", None) is not None:
        raise WorkbenchError("--join needs --mesh: the mesh over every process's devices, e.g. --mesh data=16 for two "
                             "hosts of 8")
    mesh = {} if args.mesh is None else {"mesh": args.mesh}  # default: every device here, over data
    return TrainConfig(
        model=args.model, data=args.data, mode=args.mode, **mesh, steps=args.steps, batch=args.batch,
        lr=args.lr, optimizer=args.optimizer, accum=args.accum, precision=args.precision, remat=args.remat,
        seed=args.seed,
        log_every=args.log_every, eval_every=args.eval_every, sync_every=args.sync_every,
        drop_remainder=args.drop_remainder, processes=args.processes,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
        # Comma-separated fault names: resolved() reads them into the tuple the field holds from then on.
        faults=cast(Any, ",".join(args.inject)),
        model_options=parse_model_options(args.model_options, args.model),
        data_options=parse_data_options(args.data, args.data_options),
    ).resolved()


class _ProgressBar:
    """A rich progress bar on stderr, fed by trainer events (only when stderr is a terminal)."""

    def __init__(self, steps: int, title: str):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(), console=Console(stderr=True), transient=False,
        )
        self.task = self.progress.add_task(title, total=steps, info="compiling...")
        self.progress.start()

    def __call__(self, event) -> None:
        if event.kind == "metrics":
            info = f"loss {event.data['loss']:.4f}"
            if "examples_per_s" in event.data:
                info += f"  {event.data['examples_per_s']:,.0f} ex/s"
            self.progress.update(self.task, completed=event.step, info=info)
        elif event.kind == "eval":
            self.progress.console.print(
                f"  step {event.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in event.data.items())
            )

    def close(self) -> None:
        self.progress.stop()


def _print_summary(summary: dict[str, Any]) -> None:
    evaluation = summary.get("eval") or {}
    print(f"{summary['status']}: {summary['model']} on {summary['data']}, mode {summary['mode']}, "
          f"mesh {parse_mesh(summary['mesh'])}, {summary['steps']} steps")
    if summary.get("final_loss") is not None:
        print(f"  final loss      {summary['final_loss']:.4f}")
    for key, value in evaluation.items():
        print(f"  eval {key:<10} {value:.4f}")
    if summary.get("examples_per_s"):
        print(f"  examples/s      {summary['examples_per_s']:,.0f}  (compile {summary['compile_s']:.2f} s)")
    print(f"  run dir         {summary['run_dir']}")


def _join(args, config) -> int:
    """Be one process of a run across real hosts (``--join``): the worker, in this process."""
    if not args.name:
        raise WorkbenchError("--join needs --name: every host writes the same run, so give it one name, e.g. --name "
                             f"{config.model}-{config.mode}-{config.processes}p")
    if args.join != "auto" and args.process_id is None:
        raise WorkbenchError("--join HOST:PORT needs --process-id (0 to N-1); with --join auto JAX detects it")
    argv = ["--coordinator", args.join, "--processes", str(config.processes), "--run-dir",
            str(Path(args.run_dir) / args.name), "--config", json.dumps(config.to_json())]
    if args.process_id is not None:
        argv += ["--process-id", str(args.process_id)]
    return worker(argv)


def _resuming_trainer(args, config):
    """The trainer continuing ``--resume RUN_DIR``: the options given differently from their defaults change
    the saved run's settings (a changed model, data or optimizer setting is refused with the reason)."""
    if args.join is not None or args.processes != 1 or args.name is not None:
        raise WorkbenchError("--resume continues a run in this process, in its own folder: drop --join, --processes "
                           "and --name")
    defaults = TrainConfig().to_json()
    changes = {field: value for field, value in config.to_json().items() if value != defaults[field]}
    if "faults" in changes:
        changes["faults"] = tuple(changes["faults"])
    return Trainer.resuming(args.resume, **changes)


def _profile_result(args, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"profile": ...}`` for ``--json`` when ``--profile`` was given (why not, when it was not taken)."""
    if args.profile is None:
        return {}
    if not profiles or profiles[-1].get("error"):
        return {"profile": {"error": profiles[-1]["error"] if profiles else "the run ended before the profile began"}}
    return {"profile": profile_json(read_profile(profiles[-1]["folder"]))}


def _print_profile(args, profiles: list[dict[str, Any]]) -> None:
    if args.profile is None:
        return
    if not profiles or profiles[-1].get("error"):
        why = profiles[-1]["error"] if profiles else "the run ended before the profile began"
        print(f"\nno profile: {why}")
        return
    print()
    print_profile(profiles[-1]["folder"])


def train_command(args) -> int:
    """Run ``workbench train`` from parsed arguments; returns the exit status."""
    resolved = _config_from_args(args)  # checked and resolved once: the trainer takes the record
    config = resolved.config
    if args.resume is not None:
        trainer = _resuming_trainer(args, config)
        config = trainer.config
    elif args.join is not None:
        if args.profile is not None:
            raise ProfileError("--profile with --join: a run across processes is not profiled; profile it in one "
                               "process on the same mesh (the same programs and collectives)")
        return _join(args, config)
    else:
        trainer = Trainer(resolved, run_root=args.run_dir, coordinator_port=args.port)
    bar = None
    if sys.stderr.isatty():
        bar = _ProgressBar(config.steps, f"{config.model} {config.mode}")
        trainer.subscribe(bar)
    profiles: list[dict[str, Any]] = []
    trainer.subscribe(lambda event: profiles.append(event.data) if event.kind == "profile" else None)
    trainer.start(name=args.name, profile=args.profile)  # bad input raises here, before the thread starts: exit 2
    try:
        summary = trainer.wait()
    except KeyboardInterrupt:
        trainer.stop()
        summary = trainer.wait()
    finally:
        if bar is not None:
            bar.close()
    if summary is None:  # processes that ended without their summary being read (see Trainer.run)
        print(f"error: run {trainer.run_name} ended without a summary that could be read: see {trainer.run_path}",
              file=sys.stderr)
        return EXIT_FAILED
    result = _finite_or_none({**summary, "status": trainer.status})
    if args.json:
        print(json.dumps({**result, **_profile_result(args, profiles)}))
    else:
        _print_summary(result)
        _print_profile(args, profiles)
    if trainer.status == "failed":
        print(f"error: run {summary['run']} failed: {summary['error']}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_INTERRUPTED if trainer.status == "stopped" else EXIT_OK
