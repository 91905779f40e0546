"""GPUs as compile targets: ``gpu:<chip>:<count>`` read and judged before any process starts, the chips'
target descriptions loaded by XLA:GPU, the real step compiled without a GPU, and collectives priced on the
slower link when their group spans hosts.

The compile tests need XLA:GPU's CUDA plugin (``make gpu-compile``): skipped without it, except in CI
(``CI=true``), where ``.ci/run`` installs it and they must run.
"""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workbench as wb
from workbench.analysis import gpu_target
from workbench.analysis.compile_target import validate_target, parse_target
from workbench.analysis.cost_model import collective_time, group_spans_hosts, hardware
from workbench.analysis.gpu_target import GPU_CHIPS, gpu_compiler_problem, gpu_topology
from workbench.cli.main import main
from workbench.errors import MeshError, WorkbenchError
from workbench.layout.mesh import MeshShape

IN_CI = os.environ.get("CI", "").lower() == "true"
SMALL_LM = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 32}


def test_gpu_targets_name_a_chip_and_whole_hosts():
    target = parse_target(" GPU:h100:512 ")
    assert (str(target), target.kind, target.chips, target.hardware) == ("gpu:h100:512", "gpu", 512, "h100-nvlink")
    assert [parse_target(f"gpu:{chip}:8").hardware for chip in GPU_CHIPS] == [
        "a100-80gb", "h100-nvlink", "h100-pcie", "h200", "b200"]
    assert gpu_topology("h200", 1) == "1x1x1" and gpu_topology("h100", 4096) == "1x512x8"
    with pytest.raises(WorkbenchError,
                       match=r"unknown GPU 'h300': choose one of a100-80gb, h100, h100-pcie, h200, b200"):
        parse_target("gpu:h300:8")
    with pytest.raises(WorkbenchError, match=r"gpu:h100:12 is not a whole number of 8-GPU hosts: use gpu:h100:8 or "
                                             r"gpu:h100:16"):
        parse_target("gpu:h100:12")
    with pytest.raises(WorkbenchError, match=r"gpu:<chip>:<count> with a chip of a100-80gb"):
        parse_target("gpu:h100")


def test_a_mesh_that_is_not_the_gpu_count_names_one_that_is():
    with pytest.raises(MeshError, match=r"mesh data=64,model=8 has 512 devices but gpu:h100:64 has 64 GPUs: plan on "
                                        r"--mesh data=8,model=8, or verify on gpu:h100:512"):
        validate_target(parse_target("gpu:h100:64"), MeshShape(("data", "model"), (64, 8)))


def test_without_the_plugin_or_with_another_version_one_line_gives_the_exact_command(monkeypatch, tmp_path):
    monkeypatch.setenv(gpu_target.GPU_COMPILER_ENV, str(tmp_path))  # an empty folder: no plugin there
    jaxlib = gpu_target._version("jaxlib")
    assert gpu_compiler_problem() == (
        f"compiling for GPUs needs XLA:GPU's CUDA plugin, which {tmp_path} lacks: run make gpu-compile in the "
        f"workbench's folder (it runs: pip install --no-deps --target {tmp_path} 'jax-cuda12-plugin=={jaxlib}' "
        f"'jax-cuda12-pjrt=={jaxlib}' nvidia-cuda-nvcc-cu12)")
    for name, version in (("jax_cuda12_plugin", "0.0.1"), ("jax_cuda12_pjrt", "0.0.1")):  # another version
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    with pytest.raises(WorkbenchError, match=rf"the CUDA plugin in {tmp_path} is 0.0.1 and jaxlib {jaxlib}: they "
                                             r"must match; run make gpu-compile"):
        validate_target(parse_target("gpu:h100:8"), MeshShape(("data",), (8,)))


def test_the_plugin_stays_out_of_every_process_but_a_gpu_compile():
    # Installed beside JAX, the plugin would load into every JAX process and print CUDA's "no driver" lines.
    import importlib.util

    assert importlib.util.find_spec("jax_cuda12_plugin") is None
    from workbench.analysis.verification import _child_environment

    env = _child_environment(wb.TrainConfig(mesh="data=16"), parse_target("gpu:h100:16"))
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == str(gpu_target.gpu_compiler_dir())
    assert "--xla_gpu_autotune_level=0" in env["XLA_FLAGS"]


@pytest.mark.parametrize("argv, message", [
    (["--verify", "gpu:h300:8"], "unknown GPU 'h300'"),
    (["--verify", "gpu:h100:12"], "is not a whole number of 8-GPU hosts"),
    (["--verify", "gpu:h100:16"], "mesh data=8 has 8 devices but gpu:h100:16 has 16 GPUs"),
])
def test_bad_gpu_targets_exit_2_with_one_line(capsys, argv, message):
    assert main(["plan", "--model", "mlp", "--mesh", "data=8", "--mode", "dp", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err


# --- two link levels -------------------------------------------------------------------------------------


@given(st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=3), st.sampled_from([2, 4, 8]))
def test_a_group_spans_hosts_exactly_when_its_devices_do(sizes, per_host):
    mesh = MeshShape(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    for axis, (size, stride) in enumerate(zip(sizes, strides, strict=True)):
        # The devices of one group: the axis runs, the others stay at 0; devices fill hosts in mesh order.
        hosts = {(position * stride) // per_host for position in range(size)}
        assert group_spans_hosts(mesh, (mesh.names[axis],), per_host) == (len(hosts) > 1)


def test_a_collective_across_hosts_is_priced_on_the_network_and_one_within_on_nvlink():
    h100 = hardware("h100-nvlink")
    within = collective_time("all-reduce", 1e9, 8, h100)
    across = collective_time("all-reduce", 1e9, 8, h100, spans_hosts=True)
    assert across / within == pytest.approx(h100.bandwidth / h100.host_bandwidth, rel=0.01)  # 9x: 450 vs 50 GB/s
    plan = wb.plan_training("transformer", {"d_model": 1024, "n_layers": 4, "n_heads": 16, "vocab": 32000},
                            "data=64,model=8", "dp-tp", hardware="h100-nvlink")
    for collective in plan.collectives:  # model=8 is the host's NVLink domain; data=64 spans 64 hosts
        spans = collective.axes == ("data",)
        assert collective.time_each_s == pytest.approx(collective_time(
            collective.kind, collective.bytes, collective.group_size, h100, spans_hosts=spans), rel=1e-9)
    assert {c.axes for c in plan.collectives} == {("data",), ("model",)}


# --- XLA:GPU without a GPU --------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_chip_description_is_accepted_by_this_jaxlib(gpu_compiler):
    import subprocess
    import sys

    code = ("from jax.experimental import topologies\n"
            "from workbench.analysis.gpu_target import GPU_CHIPS\n"
            "for chip in GPU_CHIPS.values():\n"
            "    devices = topologies.get_topology_desc(platform='cuda', target_config=chip.target_config(),\n"
            "                                           topology='1x2x8').devices\n"
            "    print(chip.name, len(devices), devices[0].device_kind)\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), str(gpu_target.gpu_compiler_dir())])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"{chip.name} 16 {chip.description}" for chip in GPU_CHIPS.values()]


@pytest.mark.slow
def test_plan_verified_by_xla_gpu_without_a_gpu(gpu_compiler):
    plan = wb.plan_training("transformer", SMALL_LM, "data=8,model=2", "dp-tp", verify="gpu:h100:16")
    assert plan.hardware.name == "h100-nvlink"  # the preset follows the chip
    compiled = plan.compiled
    assert compiled.target == "gpu:h100:16" and compiled.devices == 16
    assert compiled.device_kind == "NVIDIA H100 80GB HBM3"
    assert compiled.peak_bytes >= compiled.argument_bytes > 0
    assert compiled.as_written_temp_bytes is None  # far within XLA:GPU's budget: compiled once
    layers = {layer for c in compiled.collectives if c.axes == ("model",) for layer in c.layers}
    assert {"blocks/0/mlp/down", "blocks/1/attn/out"} <= layers
    assert {c.axes for c in compiled.collectives} >= {("data",), ("model",)}
    # tp's activation all-reduces: bfloat16 partial sums, 2 forward and 2 backward per block: to the byte on JAX
    # 0.10.2's and 0.12's XLA:GPU
    planned = sum(c.bytes * c.count for c in plan.collectives if c.kind == "all-reduce" and c.axes == ("model",))
    sent = sum(c.bytes * c.count for c in compiled.collectives if c.kind == "all-reduce" and c.axes == ("model",))
    assert plan.precision == "bf16" and 0 < planned == sent, (planned, sent)
    # the gradient all-reduce over 'data': bf16, on the matmuls' outputs, as the plan prices it (not float32: 2x)
    planned, sent = (sum(c.bytes * c.count for c in collectives if c.kind == "all-reduce" and c.axes == ("data",))
                     for collectives in (plan.collectives, compiled.collectives))
    assert 0.98 <= planned / sent <= 1.02, (planned, sent)


@pytest.mark.slow
def test_remat_block_all_reduces_on_xla_gpu(gpu_compiler):
    # XLA:GPU adds q, k and v's input gradients before it all-reduces them once (XLA:CPU sends three), and remat
    # block sends the attention's forward all-reduce again in the backward pass: 5 a block, as the plan counts.
    # Scalars aside: a schedule tie's marker, read off a sharded array (schedule_ties.done_marker), is one.
    plan = wb.plan_training("transformer", SMALL_LM, "data=4,model=2", "fsdp-tp", remat="block", verify="gpu:h100:8")
    planned, sent = (sum(c.bytes * c.count for c in collectives
                         if c.kind == "all-reduce" and c.axes == ("model",) and c.bytes > 4)
                     for collectives in (plan.collectives, plan.compiled.collectives))
    assert 0 < planned == sent, (planned, sent)
    assert sum(c.count for c in plan.collectives if c.axes == ("model",)) == 5 * SMALL_LM["n_layers"]


@pytest.mark.slow
def test_over_its_budget_xla_gpu_recomputes_and_the_comparison_says_so(gpu_compiler, monkeypatch):
    # A slop factor of 0 makes XLA:GPU's budget 0 B (gpu_memory_budget): it recomputes what it can. The compile holds
    # clearly less than the plan, and the comparison names the budget rather than leaving a bare ratio.
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_memory_limit_slop_factor=0")
    lm = {**SMALL_LM, "max_len": 256}
    plan = wb.plan_training("transformer", lm, "data=8", "fsdp", global_batch=16, seq_len=256, precision="bf16",
                            verify="gpu:h100:8")
    assert plan.gpu_budget.slop_percent == 0 and plan.gpu_budget.on_gpu == plan.gpu_budget.without_gpu == 0
    assert any("over XLA:GPU's budget of 0 B" in note for note in plan.notes)
    assert plan.compiled.temp_bytes < 0.9 * plan.memory.temp_bytes, (plan.compiled.temp_bytes, plan.memory.temp_bytes)
    assert plan.comparison.recomputed_to_budget == 0 and plan.comparison.to_json()["recomputed_to_budget"] == 0
    # At its budget, the step is compiled again with the budget lifted: the step as written, which the plan simulates
    # (its own options override XLA_FLAGS for that compile).
    written = plan.comparison.row("temporaries as written")
    assert written.compiler == plan.compiled.as_written_temp_bytes > plan.compiled.temp_bytes
    assert 0.85 <= written.ratio <= 1.15, written.ratio
    assert "over this compile's budget, 0 B: XLA:GPU computed values again" in plan.comparison.row("temporaries").note
