"""Test setup: 8 simulated CPU devices, configured before JAX starts (importing workbench does it)."""

import os

# Tests always run on the CPU, even on a GPU host, with the device count the tests assume.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("WORKBENCH_CPU_DEVICES", "8")

import workbench as wb  # first: configures the devices before JAX starts

import contextlib
import pathlib

import jax
import pytest

from widgets.dashboard import TrainingDashboard

NUM_DEVICES = 8


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert len(jax.devices()) == NUM_DEVICES, (
        f"tests need {NUM_DEVICES} CPU devices, JAX has {len(jax.devices())}: "
        "was JAX started before workbench was imported?"
    )


IPV4_MAPPED = "0000000000000000FFFF0000"  # /proc/net/tcp6's prefix of ::ffff:a.b.c.d


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as Linux's /proc/net/tcp writes them) a TCP socket listens on at ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in pathlib.Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    # An IPv4 address mapped into IPv6 (::ffff:a.b.c.d) is that IPv4 address.
                    found.add(address[-8:] if address.startswith(IPV4_MAPPED) else address)
    return found


@pytest.fixture
def resolutions(monkeypatch):
    """Every config the code under test resolves (:meth:`TrainConfig.resolved`, spied on): a list that grows.
    ``monkeypatch.undo()`` in the test stops counting."""
    seen = []
    resolved = wb.TrainConfig.resolved
    monkeypatch.setattr(wb.TrainConfig, "resolved", lambda config: seen.append(config) or resolved(config))
    return seen


@pytest.fixture
def listening_addresses():
    """``port -> set of local addresses listening there``: servers and coordinators must listen on loopback only."""
    return _listening_addresses


@pytest.fixture(scope="session")
def gpu_compiler():
    """XLA:GPU's CUDA plugin for deviceless GPU compiles (``make gpu-compile``): a test that needs it is skipped
    without it, except in CI (``CI=true``), where ``.ci/run`` installs it and such tests must run."""
    from workbench.analysis.gpu_target import gpu_compiler_problem

    problem = gpu_compiler_problem()
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the GPU compile tests must run in CI: {problem}")
        pytest.skip(problem)


@pytest.fixture
def make_dashboard(tmp_path):
    """``selection -> TrainingDashboard`` writing to tmp_path; every one is closed (its run stopped) when the test
    ends."""
    made = []

    def make(selection, **kwargs) -> TrainingDashboard:
        dashboard = TrainingDashboard(selection, run_root=str(tmp_path), **kwargs)
        made.append(dashboard)
        return dashboard

    yield make
    for dashboard in made:
        dashboard.close()
