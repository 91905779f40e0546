"""Starting the local web servers: JupyterLab on the notebooks, and the workbench as a standalone app.

Both listen on 127.0.0.1 only, with a token: ``$JUPYTER_TOKEN`` when it is set (so a script or test
knows it), else a fresh random one. :func:`lab_launch` and :func:`app_launch` only *describe* a
server (argv, environment, the URL to open); :func:`run_server` replaces the current process with it,
so Ctrl-C and signals reach Jupyter directly.

The app is Voila serving ``widgets/app.ipynb``: students open one URL and see the workbench's widgets,
never a code cell. A token is required there too unless the user asks for ``no_token`` explicitly.

Example:
    >>> launch = lab_launch(port=8888, open_browser=False)
    >>> launch.url
    'http://127.0.0.1:8888/lab?token=...'
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import secrets
import socket
import sys
import tempfile

from .errors import WorkbenchError

HOST = "127.0.0.1"  # loopback only: the kernels run arbitrary code for whoever reaches the port
APP_NOTEBOOK = "app.ipynb"  # in the widgets package
# The front-end extensions the app loads: Voila's own widget manager, built against the JupyterLab 4.2 that
# Voila bundles, and anywidget (plotly's figures). JupyterLab's widget manager, its mime renderers and Voila's
# preview button are built against JupyterLab 4.5-4.6 and are not needed in the app: loaded, they asked for
# @jupyterlab/services ^7.6.2 and got Voila's 7.2.5 (console warnings on every page).
APP_EXTENSIONS = ["@voila-dashboards/widgets-manager8", "@jupyter-widgets/jupyterlab-manager", "anywidget"]


@dataclasses.dataclass(frozen=True)
class Launch:
    """A server to start: the command, its environment additions, and the URL a browser should open."""

    argv: tuple[str, ...]
    env: dict[str, str]
    url: str
    port: int
    token: str | None


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def validated_port(port: int) -> int:
    """``port`` if it is free on 127.0.0.1 (0 picks a free one); WorkbenchError naming it otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise WorkbenchError(f"port {port!r} is not a TCP port: use a number from 1024 to 65535, or 0 for any free one")
    if port == 0:
        return free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            raise WorkbenchError(f"port {port} is in use on {HOST}: choose another with --port, or --port 0 "
                                 "for any free one") from None
    return port


def _token(required: bool) -> str | None:
    return _new_token() if required else None


def _new_token() -> str:
    return os.environ.get("JUPYTER_TOKEN") or secrets.token_urlsafe(24)


def project_notebooks() -> pathlib.Path:
    """The project's ``notebooks/`` next to the package (a source checkout), else the working directory."""
    candidate = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
    return candidate if candidate.is_dir() else pathlib.Path.cwd()


def _directory(path: str | os.PathLike | None) -> pathlib.Path:
    folder = pathlib.Path(path).expanduser().resolve() if path is not None else project_notebooks()
    if not folder.is_dir():
        raise WorkbenchError(f"notebook folder {str(folder)!r} does not exist: give an existing folder")
    return folder


def _as_root() -> list[str]:
    # Jupyter refuses to run as root (containers, CI machines) without this flag.
    return ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []


def lab_launch(port: int = 8888, open_browser: bool = True, notebook_dir: str | os.PathLike | None = None,
               extra: tuple[str, ...] = ()) -> Launch:
    """JupyterLab on ``notebook_dir`` (default: the project's notebooks), 127.0.0.1:``port``, token on.

    ``extra`` are further ``--Class.trait=value`` options for Jupyter (e.g. what a test needs).
    """
    port = validated_port(port)
    token = _new_token()
    folder = _directory(notebook_dir)
    argv = (sys.executable, "-m", "jupyterlab", f"--ServerApp.ip={HOST}", f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={folder}",
            *([] if open_browser else ["--no-browser"]), *_as_root(), *extra)
    # The token travels in the environment, not in argv, where any local user could read it with ps.
    return Launch(argv, {"JUPYTER_TOKEN": token}, f"http://{HOST}:{port}/lab?token={token}", port, token)


def app_notebook() -> pathlib.Path:
    """The notebook the app serves: the widgets package's ``app.ipynb``."""
    spec = importlib.util.find_spec("widgets")
    if spec is None or spec.origin is None:
        raise WorkbenchError("the widgets package is not installed: run 'make lab' (or pip install -e .) first")
    return pathlib.Path(spec.origin).parent / APP_NOTEBOOK


@dataclasses.dataclass(frozen=True)
class Classroom:
    """How ``workbench app`` serves a class from one machine: every student's page is a kernel of its own.

    Attributes:
        devices: simulated CPU devices per student kernel (8: every mode and mesh of the notebooks; 4 or 2
            hold more students in the same memory, see the README's sizing).
        cull_idle_minutes: a kernel whose page was closed and that has done nothing for this long is shut
            down, its memory given back (0: never). A connected page is never culled.
        preheat: kernels started, and the app's page computed in them, before anyone asks, so a student's
            page opens at once (each holds a kernel's memory while it waits).

    Example:
        >>> Classroom(devices=0)
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: devices=0 per student is not a count from 1 to 64: use e.g. --devices 4
    """

    devices: int = 8
    cull_idle_minutes: float = 60.0
    preheat: int = 0

    def __post_init__(self):
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or not 1 <= self.devices <= 64:
            raise WorkbenchError(f"devices={self.devices!r} per student is not a count from 1 to 64: use e.g. "
                                 "--devices 4")
        if not isinstance(self.cull_idle_minutes, (int, float)) or self.cull_idle_minutes < 0:
            raise WorkbenchError(f"cull_idle_minutes={self.cull_idle_minutes!r} is not a number of minutes >= 0: use "
                                 "e.g. --cull-idle 30 (0: never)")
        if isinstance(self.preheat, bool) or not isinstance(self.preheat, int) or not 0 <= self.preheat <= 64:
            raise WorkbenchError(f"preheat={self.preheat!r} is not a number of kernels from 0 to 64: use e.g. "
                                 "--preheat 2")

    def voila_options(self) -> tuple[str, ...]:
        """Voila's and Jupyter's options for these settings."""
        options = []
        if self.cull_idle_minutes:
            options += [f"--MappingKernelManager.cull_idle_timeout={round(self.cull_idle_minutes * 60)}",
                        "--MappingKernelManager.cull_interval=60", "--MappingKernelManager.cull_connected=False"]
        if self.preheat:
            options += ["--VoilaConfiguration.preheat_kernel=True",
                        f"--VoilaConfiguration.default_pool_size={self.preheat}"]
        return tuple(options)


# A Unix socket's path holds at most 103 characters on macOS (107 on Linux). Voila's kernel sockets are
# <root>/voila_XXXXXXXX/kernel-<uuid4>-ipc-<n>, that many after the root.
UNIX_SOCKET_PATH_MAX = 103
_VOILA_SOCKET_TAIL = len("/voila_XXXXXXXX/kernel-") + 36 + len("-ipc-99")


def kernel_transport_options(temp_root: str | None = None) -> tuple[str, ...]:
    """How the app's server reaches its kernels: Unix sockets on Linux and macOS, loopback TCP elsewhere.

    A class starts many kernels at once. Over TCP, Jupyter finds free ports, closes them and writes them to
    the kernel's connection file; the kernel binds them a few seconds later, and if another process took
    one meanwhile it dies at start (jupyter_client issue 487, which names Voila). Unix sockets need no
    ports, and sit in Voila's connection folder, which only its owner can open, where a loopback port is
    open to every local user. ``temp_root`` is where that folder goes (default: the system's temp folder;
    ``/tmp`` when that is too deep for a socket's path, as macOS's per-user one is).

    Example:
        >>> kernel_transport_options("/tmp")  # on Linux or macOS; () on Windows
        ('--KernelManager.transport=ipc', '--Voila.connection_dir_root=/tmp')
    """
    if os.name != "posix":
        return ()
    root = temp_root or tempfile.gettempdir()
    if len(root) + _VOILA_SOCKET_TAIL > UNIX_SOCKET_PATH_MAX:
        root = "/tmp"
    return ("--KernelManager.transport=ipc", f"--Voila.connection_dir_root={root}")


# How long Voila waits, after the app's cell has finished, for the kernel's last outputs (the widget itself)
# to arrive. Voila's executor gives up after nbclient's 4 s and serves the page without them: the page shows
# the title and no app. On a machine busy with a class starting at once (CI's 2 cores, five browsers, seven
# kernels importing JAX) the outputs came later than that. The wait ends as soon as the kernel says it is
# idle, so a longer bound costs nothing when they come at once.
APP_OUTPUT_WAIT_S = 120


def app_launch(port: int = 8866, open_browser: bool = True, no_token: bool = False,
               run_root: str | os.PathLike = "runs", extra: tuple[str, ...] = (),
               classroom: Classroom = Classroom()) -> Launch:
    """The workbench as a standalone web app (Voila): widgets only, no code; 127.0.0.1 and a token
    unless ``no_token`` is asked for. Runs go to ``run_root`` (relative to the working directory); each
    student's kernel has ``classroom.devices`` simulated devices, idle kernels are culled and some may be
    started ahead (:class:`Classroom`); the server reaches them over Unix sockets where it can
    (:func:`kernel_transport_options`). Voila waits up to :data:`APP_OUTPUT_WAIT_S` for the app's widget
    unless ``extra`` sets ``--VoilaExecutor.iopub_timeout`` itself (Jupyter refuses an option given twice)."""
    if importlib.util.find_spec("voila") is None:
        raise WorkbenchError("voila is not installed: run 'make lab' (or pip install -e .) to install it")
    port = validated_port(port)
    token = _token(required=not no_token)
    notebook = app_notebook()
    output_wait = "--VoilaExecutor.iopub_timeout"
    waits = () if any(option.startswith(output_wait) for option in extra) else (f"{output_wait}={APP_OUTPUT_WAIT_S}",)
    argv = (sys.executable, "-m", "voila", str(notebook), f"--Voila.ip={HOST}", f"--port={port}",
            "--Voila.port_retries=0", "--strip_sources=True", *waits,
            *(f"--VoilaConfiguration.extension_allowlist={name}" for name in APP_EXTENSIONS),
            *classroom.voila_options(), *kernel_transport_options(),
            *([] if open_browser else ["--no-browser"]), *([f"--token={token}"] if token else []), *extra)
    env = {"WORKBENCH_RUN_ROOT": str(pathlib.Path(run_root).expanduser().resolve()),
           "WORKBENCH_CPU_DEVICES": str(classroom.devices)}  # read by each kernel's import of workbench
    url = f"http://{HOST}:{port}/" + (f"?token={token}" if token else "")
    return Launch(argv, env, url, port, token)


def run_server(launch: Launch, what: str) -> None:
    """Print where to open ``what``, then become the server process (this call does not return)."""
    print(f"{what} on {launch.url}", flush=True)
    if launch.token is None:
        print(f"warning: no token: anyone who can reach {HOST}:{launch.port} on this machine can use it", flush=True)
    os.execve(launch.argv[0], list(launch.argv), {**os.environ, **launch.env})


__all__ = ["APP_OUTPUT_WAIT_S", "HOST", "Classroom", "Launch", "app_launch", "app_notebook", "validated_port",
           "free_port", "kernel_transport_options", "lab_launch", "project_notebooks", "run_server"]
