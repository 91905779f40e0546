"""``workbench lab`` and ``workbench app``: the local servers (see :mod:`workbench.servers`)."""

from __future__ import annotations

import argparse

from ..servers import Classroom, app_launch, lab_launch, run_server
from .exit_codes import EXIT_OK


def add_server_parsers(commands) -> None:
    """Add the ``lab`` and ``app`` subcommands to ``commands`` (argparse subparsers)."""
    lab = commands.add_parser(
        "lab",
        help="start JupyterLab on the project's notebooks (127.0.0.1, token on)",
        description="Start JupyterLab on the project's notebooks, listening on 127.0.0.1 only, with Jupyter's "
        "token authentication on ($JUPYTER_TOKEN if set, else a random token, printed in the URL).",
    )
    _add_port_options(lab, 8888)
    lab.add_argument("--notebook-dir", default=None, help="folder to serve (default: the project's notebooks/)")
    lab.add_argument("jupyter_options", nargs=argparse.REMAINDER,
                     help="after '--': further options for Jupyter, e.g. -- --LabApp.expose_app_in_browser=True")

    app = commands.add_parser(
        "app",
        help="serve the workbench's widgets as a web app for students (Voila; no code cells)",
        description="Serve the Workbench widget alone as a web page (Voila), on 127.0.0.1 with a token "
        "($JUPYTER_TOKEN if set, else a random one, printed in the URL). Runs are written under --run-dir.",
    )
    _add_port_options(app, 8866)
    app.add_argument("--no-token", action="store_true",
                     help="serve without a token (anyone who can reach the port on this machine can use it)")
    app.add_argument("--run-dir", default="runs", help="where training runs are written (default: runs)")
    app.add_argument("--devices", type=int, default=Classroom.devices,
                     help="simulated CPU devices per student (default 8; 4 or 2 fit more students in the same memory)")
    app.add_argument("--cull-idle", type=float, default=Classroom.cull_idle_minutes, metavar="MINUTES",
                     help="shut down a student's kernel this long after its page closed (default 60; 0: never)")
    app.add_argument("--preheat", type=int, default=Classroom.preheat, metavar="N",
                     help="kernels started ahead with the app computed, so pages open at once (default 0)")


def _add_port_options(parser, default_port: int) -> None:
    parser.add_argument("--port", type=int, default=default_port,
                        help=f"port on 127.0.0.1 (default {default_port}; 0: any free port)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser; just print the URL")


def _extra(options: list[str]) -> tuple[str, ...]:
    return tuple(options[1:] if options[:1] == ["--"] else options)


def lab_command(args) -> int:
    launch = lab_launch(args.port, not args.no_browser, args.notebook_dir, _extra(args.jupyter_options))
    run_server(launch, "Sharding Workbench: JupyterLab")
    return EXIT_OK  # not reached: run_server becomes the server


def app_command(args) -> int:
    launch = app_launch(args.port, not args.no_browser, args.no_token, args.run_dir,
                        classroom=Classroom(args.devices, args.cull_idle, args.preheat))
    run_server(launch, "Sharding Workbench app")
    return EXIT_OK
