"""`workbench lab` / `workbench app`: loopback only, a token always unless explicitly refused, clear refusals.

Starting the servers for real is the browser tests' job (tests/test_browser.py); these check what is launched.
"""

import os
import pathlib
import shutil
import socket
import tempfile
import uuid

import pytest

from workbench.cli.main import main
from workbench.errors import WorkbenchError
from workbench.servers import (APP_OUTPUT_WAIT_S, HOST, UNIX_SOCKET_PATH_MAX, Classroom, app_launch, free_port,
                               kernel_transport_options, lab_launch, project_notebooks, validated_port)


def test_lab_launch_is_loopback_with_a_token_kept_out_of_argv(monkeypatch, tmp_path):
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    launch = lab_launch(port=0, open_browser=False, notebook_dir=tmp_path,
                        extra=("--LabApp.expose_app_in_browser=True",))
    argv = " ".join(launch.argv)
    assert f"--ServerApp.ip={HOST}" in argv and HOST == "127.0.0.1" and "--no-browser" in argv
    assert f"--ServerApp.root_dir={tmp_path}" in argv and argv.endswith("--LabApp.expose_app_in_browser=True")
    assert len(launch.token) >= 24 and launch.token not in argv and launch.env["JUPYTER_TOKEN"] == launch.token
    assert launch.url == f"http://127.0.0.1:{launch.port}/lab?token={launch.token}"
    assert lab_launch(port=0).token != launch.token  # a fresh token each time
    monkeypatch.setenv("JUPYTER_TOKEN", "chosen")
    assert lab_launch(port=0).token == "chosen"
    assert project_notebooks().name == "notebooks"


def test_app_launch_requires_a_token_unless_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTER_TOKEN", "chosen")
    launch = app_launch(port=0, open_browser=False, run_root=tmp_path / "runs")
    assert "--token=chosen" in launch.argv and f"--Voila.ip={HOST}" in launch.argv
    assert launch.argv[3].endswith("widgets/app.ipynb") and launch.env["WORKBENCH_RUN_ROOT"] == str(tmp_path / "runs")
    # Voila waits for the app's widget as long as a busy machine needs, not nbclient's 4 s (CI's class test:
    # "Timeout waiting for IOPub output", then a page with the title and no app).
    assert f"--VoilaExecutor.iopub_timeout={APP_OUTPUT_WAIT_S}" in launch.argv and APP_OUTPUT_WAIT_S >= 60
    chosen = app_launch(port=0, open_browser=False, extra=("--VoilaExecutor.iopub_timeout=300",))
    assert [a for a in chosen.argv if "iopub_timeout" in a] == ["--VoilaExecutor.iopub_timeout=300"]  # once
    open_launch = app_launch(port=0, no_token=True)
    assert open_launch.token is None and not any(a.startswith("--token") for a in open_launch.argv)


def test_ports_are_checked():
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(WorkbenchError, match=f"port {port} is in use on 127.0.0.1: choose another with --port"):
            validated_port(port)
    assert 0 < free_port() < 65536 and validated_port(0) > 0
    with pytest.raises(WorkbenchError, match="port 70000 is not a TCP port"):
        validated_port(70000)


@pytest.mark.parametrize("argv, message", [
    (["lab", "--port", "70000"], "port 70000 is not a TCP port"),
    (["lab", "--port", "eighty"], "invalid int value"),
    (["lab", "--notebook-dir", "/no/such/folder"], "notebook folder '/no/such/folder' does not exist"),
    (["app", "--port", "-1"], "port -1 is not a TCP port"),
    (["app", "--devices", "0"], "devices=0 per student is not a count from 1 to 64: use e.g. --devices 4"),
    (["app", "--devices", "two"], "invalid int value: 'two'"),
    (["app", "--cull-idle", "-5"], "cull_idle_minutes=-5.0 is not a number of minutes >= 0"),
    (["app", "--preheat", "100"], "preheat=100 is not a number of kernels from 0 to 64"),
])
def test_bad_server_options_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_a_class_is_served_with_its_devices_culling_and_preheated_kernels(tmp_path):
    # Each student's kernel imports workbench, which gives JAX the devices WORKBENCH_CPU_DEVICES names.
    launch = app_launch(port=0, open_browser=False, run_root=tmp_path,
                        classroom=Classroom(devices=2, cull_idle_minutes=30, preheat=3))
    assert launch.env["WORKBENCH_CPU_DEVICES"] == "2"
    argv = launch.argv
    assert "--MappingKernelManager.cull_idle_timeout=1800" in argv
    assert "--MappingKernelManager.cull_connected=False" in argv
    assert "--VoilaConfiguration.preheat_kernel=True" in argv and "--VoilaConfiguration.default_pool_size=3" in argv
    quiet = app_launch(port=0, classroom=Classroom(cull_idle_minutes=0))
    assert quiet.env["WORKBENCH_CPU_DEVICES"] == "8"  # every mode and mesh of the notebooks
    assert quiet.argv and not any("cull" in a or "preheat" in a for a in quiet.argv)  # never culled, none started ahead
    for bad in (True, 2.5, 65):
        with pytest.raises(WorkbenchError, match="per student is not a count from 1 to 64"):
            Classroom(devices=bad)


@pytest.mark.skipif(os.name != "posix", reason="Unix sockets: Linux and macOS")
def test_the_app_reaches_its_kernels_over_unix_sockets_whose_paths_fit(tmp_path):
    launch = app_launch(port=0, open_browser=False, run_root=tmp_path)
    assert "--KernelManager.transport=ipc" in launch.argv  # no ports to race for while a class starts its kernels
    assert kernel_transport_options("/tmp") == ("--KernelManager.transport=ipc", "--Voila.connection_dir_root=/tmp")
    macos_temp = "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T"  # too deep: its sockets' paths would not fit
    assert kernel_transport_options(macos_temp)[1] == "--Voila.connection_dir_root=/tmp"
    short = tempfile.mkdtemp(prefix="wb", dir="/tmp")  # kept: its sockets' paths fit
    deep = tmp_path / ("d" * 40)  # too deep: /tmp instead
    deep.mkdir()
    try:
        for temp, expected in ((short, short), (str(deep), "/tmp")):
            root = kernel_transport_options(temp)[1].split("=", 1)[1]
            assert root == expected
            # The longest path Voila gives a kernel's socket there: one binds, on this very system.
            folder = pathlib.Path(root) / f"voila_{uuid.uuid4().hex[:8]}"
            folder.mkdir()
            try:
                path = f"{folder}/kernel-{uuid.uuid4()}-ipc-99"
                assert len(path) <= UNIX_SOCKET_PATH_MAX
                with socket.socket(socket.AF_UNIX) as kernel_socket:
                    kernel_socket.bind(path)
            finally:
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(short)
