"""The plan's peak per device for a GPU fleet against XLA:GPU's own, compiled without a GPU: within 0.85-1.15
on a matrix of models x modes x meshes x precision x batch, including a user's own nnx.Module.

The plan simulates the step with XLA:GPU's rules (workbench/analysis/compiler_rules.py): a softmax's
exponentials recomputed, shared broadcasts not stored, cheap work fused into matmul operands. Every step is
compiled in one child process (tests/gpu_compile_child.py), the way ``--verify gpu:...`` compiles it. The
wider matrix, with the issue's H200 rows up to the 0.8B transformer and the rows it does not reach, is a
bench: bench/bench_gpu_memory.py. Needs the CUDA plugin (``make gpu-compile``); CI installs it.
"""

import json
import pathlib
import subprocess
import sys

import pytest
from flax import nnx

from workbench.analysis.compile_target import parse_target
from workbench.analysis.compiled_step import CompiledStep
from workbench.analysis.planning import plan_training
from workbench.analysis.verification import _child_environment
from workbench.training.config import TrainConfig

from gpu_compile_child import OWN_EXAMPLE, OwnResidualMLP, own_loss

LM = {"d_model": 512, "n_heads": 8, "vocab": 32000, "max_len": 256}
MATRIX = [  # model, options, mode, mesh, precision, global batch, sequence length, remat
    ("transformer", {**LM, "n_layers": 2}, "dp", "data=1", "fp32", 8, 256, "none"),
    ("transformer", {**LM, "n_layers": 2}, "dp", "data=1", "bf16", 8, 256, "none"),
    ("transformer", {**LM, "n_layers": 4}, "fsdp", "data=8", "bf16", 64, 256, "none"),
    # Per-layer fsdp under remat block: XLA:GPU's reduce-scatter combiner merged every layer's gradients into a few
    # reduce-scatters at the end, holding them all (273 MiB where the plan says 182) until each layer's was tied to
    # the layer below (param_gathering._layer_call).
    ("transformer", {**LM, "n_layers": 4}, "fsdp", "data=8", "bf16", 64, 256, "block"),
    ("transformer", {**LM, "n_layers": 2}, "dp-tp", "data=2,model=4", "bf16", 32, 256, "none"),
    ("transformer", {**LM, "n_layers": 2}, "tp", "model=8", "bf16", 16, 256, "none"),
    ("transformer", {**LM, "n_layers": 4, "scan_layers": True}, "dp", "data=1", "bf16", 8, 256, "none"),
    # Long sequences, heads not split: (batch, heads, T, T) buffers weigh. Compiled 244 MiB (plan 0.88) while the
    # scanned stack's mask was hoisted out of its loop, 228 MiB since (causal_attention), 219 MiB (0.99) since the
    # feed-forward's weight gradients come first (schedule_ties.weight_gradients_first).
    ("transformer", {"d_model": 256, "n_heads": 8, "vocab": 8192, "max_len": 2048, "n_layers": 4,
                     "scan_layers": True}, "fsdp", "data=8", "bf16", 8, 2048, "block"),
    ("mlp", {"hidden": 4096}, "dp", "data=1", "fp32", 1024, None, "none"),
    ("custom:OwnResidualMLP", None, "dp", "data=8", "fp32", 8192, None, "none"),
]
CHIP = "h100"


def _target(mesh: str) -> str:
    return f"gpu:{CHIP}:{TrainConfig(mesh=mesh).mesh_shape.size}"


@pytest.fixture(scope="module")
def compiled(gpu_compiler):
    requests = []
    for model, options, mode, mesh, precision, batch, seq_len, remat in MATRIX:
        config = TrainConfig(model=model, model_options=options or {}, mode=mode, mesh=mesh, precision=precision,
                             batch=batch, optimizer="adamw", remat=remat)
        requests.append({"config": config.to_json(), "target": _target(mesh), "seq_len": seq_len})
    env = _child_environment(TrainConfig(), parse_target(_target("data=1")))
    env["PYTHONPATH"] = f"{pathlib.Path(__file__).parent}:{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, str(pathlib.Path(__file__).parent / "gpu_compile_child.py")],
                          input=json.dumps(requests), capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [CompiledStep.from_json(result) for result in json.loads(done.stdout.splitlines()[-1])]


@pytest.mark.slow
@pytest.mark.parametrize("row", [pytest.param(row, id=f"{m}-{mode}-{mesh}-{p}-{remat}")
                                 for row, (m, _, mode, mesh, p, _, _, remat) in enumerate(MATRIX)])
def test_plan_peak_is_within_15_percent_of_xla_gpu(compiled, row):
    model, options, mode, mesh, precision, batch, seq_len, remat = MATRIX[row]
    own = model.startswith("custom:")
    plan = plan_training(
        (lambda: OwnResidualMLP(nnx.Rngs(0))) if own else model, options, mesh, mode,
        hardware=parse_target(_target(mesh)).hardware, global_batch=batch, seq_len=seq_len, precision=precision,
        remat=remat, loss=own_loss if own else None, example_batch=OWN_EXAMPLE if own else None)
    step = compiled[row]
    assert plan.compiler == "gpu" and step.target == _target(mesh)
    assert plan.memory is not None and 0.85 <= plan.peak_bytes / step.peak_bytes <= 1.15, (
        plan.peak_bytes, step.peak_bytes, plan.memory, step.temp_bytes)
    assert plan.memory.argument_bytes == step.argument_bytes  # the state and the batch, exactly
