"""Simulated devices: configured on import, overridable, and a clear warning when JAX started first."""

import json
import os
import subprocess
import sys

import workbench as wb


def _python(code, **env):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    environment.pop("WORKBENCH_CPU_DEVICES", None)
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_import_gives_eight_devices_by_default():
    done = _python("import workbench, jax; print(len(jax.devices()))")
    assert done.stdout.strip() == "8"


def test_environment_variable_overrides():
    done = _python("import workbench, jax; print(len(jax.devices()))", WORKBENCH_CPU_DEVICES="4")
    assert done.stdout.strip() == "4"


def test_bad_environment_value_warns_and_uses_default():
    done = _python("import workbench, jax; print(len(jax.devices()))", WORKBENCH_CPU_DEVICES="lots")
    assert done.stdout.strip() == "8"
    assert "WORKBENCH_CPU_DEVICES='lots'" in done.stderr and "using 8" in done.stderr


def test_jax_started_first_is_said_once_with_the_fix():
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "import jax; jax.devices()\n"
        "import workbench as wb\n"
        "for _ in range(3):\n"
        "    try: wb.build_mesh('data=8')\n"
        "    except wb.MeshError as e: print('MESHERROR', e)\n"
    )
    done = _python(code)
    assert done.stderr.count("DeviceCountWarning") == 1, done.stderr
    assert "has 1 CPU device(s), not 8" in done.stderr
    assert "restart the kernel" in done.stderr and "WORKBENCH_CPU_DEVICES=8" in done.stderr
    assert done.stdout.count("MESHERROR") == 3 and "JAX has 1" in done.stdout


def test_accelerator_platform_is_left_alone():
    # Only reads the decision: starting a CUDA backend is not possible here.
    done = _python("import workbench as wb; print(wb.device_setup().reason)", JAX_PLATFORMS="cuda")
    assert "left alone" in done.stdout


def test_describe_devices_matches_jax():
    report = wb.describe_devices()
    assert report["count"] == 8 and [d["id"] for d in report["devices"]] == list(range(8))
    json.dumps(report)
