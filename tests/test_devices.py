"""Simulated devices: configured on import, overridable, and a clear warning when JAX started first."""

import json
import os
import subprocess
import sys

import workbench as wb
from workbench.child_processes import child_environment
from workbench.devices import THREADS_ENV_VAR, THREADS_SET_BY_ENV_VAR


def _python(code, **env):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    environment.pop("WORKBENCH_CPU_DEVICES", None)
    environment.pop(THREADS_ENV_VAR, None)  # this process's workbench set it: each child sizes its own
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
    done = _python("import workbench as wb; print(wb.devices.device_setup().reason)", JAX_PLATFORMS="cuda")
    assert "left alone" in done.stdout


def test_describe_devices_matches_jax():
    report = wb.describe_devices()
    assert report["count"] == 8 and [d["id"] for d in report["devices"]] == list(range(8))
    json.dumps(report)


COUNT_XLA_THREADS = (
    "import os, collections, workbench as wb, jax.numpy as jnp\n"
    "(jnp.ones(3) + 1).block_until_ready()  # the backend starts: its pools exist\n"
    "tasks = os.listdir('/proc/self/task')\n"
    "names = collections.Counter(open(f'/proc/self/task/{t}/comm').read().strip() for t in tasks)\n"
    "print(wb.devices.device_setup().threads, names['tf_XLAEigen'])\n"
)


def test_xla_gets_four_threads_per_simulated_device_unless_the_user_sized_its_pools():
    assert _python(COUNT_XLA_THREADS).stdout.split() == ["32", "32"]  # XLA alone would make 8 on this machine
    assert _python(COUNT_XLA_THREADS, WORKBENCH_CPU_DEVICES="4").stdout.split() == ["16", "16"]
    assert _python(COUNT_XLA_THREADS, PJRT_NPROC="12").stdout.split() == ["None", "12"]  # the user's choice


def test_a_process_that_inherits_a_parents_pool_size_sizes_its_own():
    # A pytest-xdist worker or a spawned multiprocessing child inherits the environment of a workbench parent
    # (sized for the parent's 8 devices): the size is recognised as the workbench's, not the user's.
    inherited = {THREADS_ENV_VAR: "32", THREADS_SET_BY_ENV_VAR: "32"}
    assert _python(COUNT_XLA_THREADS, WORKBENCH_CPU_DEVICES="4", **inherited).stdout.split() == ["16", "16"]
    users = {THREADS_ENV_VAR: "12", THREADS_SET_BY_ENV_VAR: "32"}  # the user changed it after the parent set it
    assert _python(COUNT_XLA_THREADS, WORKBENCH_CPU_DEVICES="4", **users).stdout.split() == ["None", "12"]


def test_a_child_sizes_its_own_pools_and_keeps_the_users_size(monkeypatch):
    assert wb.devices.device_setup().threads == 32 and os.environ[THREADS_ENV_VAR] == "32"
    assert THREADS_ENV_VAR not in child_environment(4)  # ours was for 8 devices: the child's import sizes it for 4
    monkeypatch.setenv(THREADS_ENV_VAR, "12")
    assert child_environment(4)[THREADS_ENV_VAR] == "12"


def test_steps_queued_far_ahead_of_the_devices_finish_instead_of_aborting_in_the_collectives():
    """With one XLA thread per device, 300 chained dp steps dispatched without waiting aborted the process in
    the all-reduce rendezvous (3 runs of 3, 2 cores): a device already in the next step's all-reduce held
    the thread another needed to finish this one's. The rendezvous is given 10 s here, not 40."""
    code = (
        "import jax, jax.numpy as jnp, workbench as wb\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = wb.build_mesh('data=8')\n"
        "params = jax.device_put(jnp.full((64, 16), 0.1), NamedSharding(mesh, P()))\n"
        "x = jax.device_put(jnp.ones((256, 64)), NamedSharding(mesh, P('data')))\n"
        "def loss(w): return jnp.mean(jnp.tanh(x @ w) ** 2)\n"
        "step = jax.jit(lambda w: w - 0.01 * jax.grad(loss)(w))  # the gradient's mean: an all-reduce over data\n"
        "for _ in range(300):\n"
        "    params = step(params)  # no wait: every step queued behind the one before\n"
        "print(float(params.sum()))\n"
    )
    flags = ("--xla_cpu_collective_call_warn_stuck_timeout_seconds=5 "
             "--xla_cpu_collective_call_terminate_timeout_seconds=10")
    done = _python(code, XLA_FLAGS=flags)
    assert float(done.stdout.strip()) < 0.1 * 64 * 16  # trained: 300 steps ran


def test_the_default_run_trains_on_every_device_the_machine_has():
    # A machine with one device (one GPU, or a student's kernel with --devices 1) trains its defaults.
    code = ("import workbench as wb\n"
            "config = wb.TrainConfig(steps=3, batch=32)\n"
            "print(config.mesh, wb.Trainer(config, run_root=__import__('tempfile').mkdtemp()).run()['steps'])\n")
    assert _python(code, WORKBENCH_CPU_DEVICES="1").stdout.split() == ["data=1", "3"]
    assert wb.TrainConfig().mesh == "data=8"  # these tests' 8 simulated devices


def test_a_mesh_larger_than_an_accelerator_machine_gets_fixes_that_work_there(monkeypatch):
    import jax

    from workbench.devices import more_devices_hint

    assert more_devices_hint(16) == "or set WORKBENCH_CPU_DEVICES=16 before importing workbench (restart the kernel)"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # simulated CPU devices need JAX_PLATFORMS=cpu there
    hint = more_devices_hint(16)
    assert "--verify gpu:h100:16" in hint and "JAX_PLATFORMS=cpu WORKBENCH_CPU_DEVICES=16" in hint


def test_join_without_a_mesh_is_refused_before_jax_starts(capsys):
    from workbench.cli.main import main

    assert main(["train", "--join", "auto", "--name", "run"]) == 2
    assert "--join needs --mesh" in capsys.readouterr().err
