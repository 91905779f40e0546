"""The ``workbench`` command line.

``workbench devices`` shows what JAX sees; ``workbench inspect`` prints an array's layout on any mesh.
Bad input prints one line on stderr and exits with status 2, never a traceback.

Example:
    $ workbench inspect --mesh data=2,model=4 --shape 8,16,32 --spec 'data, None, model' --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


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
    return parser


def _cmd_devices(args) -> int:
    from .devices import describe_devices

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
    import jax

    from .errors import WorkbenchError
    from .view_jax import capture_visualize_sharding
    from .view_text import tiling_picture

    if len(layout.shape) > 2:
        return None
    if 1 <= len(layout.shape) and layout.mesh.size <= len(jax.devices()):
        try:
            return capture_visualize_sharding(layout).text.rstrip()
        except WorkbenchError:
            pass
    return tiling_picture(layout)


def _cmd_inspect(args) -> int:
    from .layout import layout_array
    from .shapes import parse_shape
    from .view_text import layout_table

    layout = layout_array(parse_shape(args.shape), args.mesh, args.spec, dtype=args.dtype)
    if args.json:
        print(json.dumps(layout.to_json()))
        return EXIT_OK
    print(layout_table(layout, max_devices=None if args.all_devices else 16))
    picture = _picture(layout)
    print()
    print(picture or f"(no terminal picture for a {len(layout.shape)}-D array: layout_figure() draws any rank)")
    return EXIT_OK


COMMANDS = {"devices": _cmd_devices, "inspect": _cmd_inspect}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failed run, 2 bad input)."""
    from .errors import WorkbenchError

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
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_OK
    sys.exit(status)


if __name__ == "__main__":
    entry_point()
