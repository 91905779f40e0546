"""Test setup: 8 simulated CPU devices, configured before JAX starts (importing workbench does it)."""

import os

# Tests always run on the CPU, even on a GPU host, with the device count the tests assume.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("WORKBENCH_CPU_DEVICES", "8")

import workbench  # noqa: E402,F401  (configures the devices before JAX starts)

import jax  # noqa: E402
import pytest  # noqa: E402

NUM_DEVICES = 8


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert len(jax.devices()) == NUM_DEVICES, (
        f"tests need {NUM_DEVICES} CPU devices, JAX has {len(jax.devices())}: "
        "was JAX started before workbench was imported?"
    )
