"""Your own nnx.Module (and your rule table), verified by the real compiler: the step is traced and exported in this
process, compiled in the verification's child for the target, and what comes back is what compiling the trained
step here gives; recommend compiles its top layouts for it; bad input names the value and what to pass.

The TPU and GPU tests need libtpu (the ``tpu`` extra) and XLA:GPU's plugin (``make gpu-compile``): skipped without
them, except in CI (``CI=true``), where they must run.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

import workbench as wb
from helpers import TWO_LAYER_BATCH, TWO_LAYER_RULES, TwoLayer, child_processes, my_loss, poll
from workbench.analysis.compile_target import INSTALL_LIBTPU, libtpu_installed
from workbench.analysis.exported_step import ExportedStep, OwnModel, OwnModelError, export_step
from workbench.analysis.ledger import memory_figures
from workbench.analysis.verification import VerifySettings, start_plan_verification
from workbench.cli.main import main
from workbench.errors import VerificationError
from workbench.training.config import TrainConfig
from workbench.training.step import CustomModel, build_step

BATCH = 64
JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".")[:2])


def _two_layer():
    return TwoLayer(nnx.Rngs(0))


def _batches(seed):
    rng = np.random.default_rng(seed)
    while True:
        yield {"x": rng.normal(size=(BATCH, 8)).astype(np.float32), "y": rng.normal(size=(BATCH, 1)).astype(np.float32)}


def _plan(mesh, mode, rules=None, hardware="cpu", **kwargs):
    return wb.plan_training(_two_layer, None, mesh, mode, global_batch=BATCH, hardware=hardware, loss=my_loss,
                            example_batch=TWO_LAYER_BATCH, rules=rules, **kwargs)


def _trained_step_figures(mode, mesh, rules=()):
    """The compiler's memory figures for the step the trainer trains your TwoLayer with, compiled here."""
    config = TrainConfig(model="custom:TwoLayer", mode=mode, mesh=mesh, batch=BATCH, precision="bf16",
                         optimizer="adamw")
    built = build_step(config, custom=CustomModel(_two_layer(), my_loss, _batches, tp_rules=tuple(rules)))
    compiled = built.mode.compile_step(built.mode.place_state(built.state),
                                       built.mode.place_batch(built.first_batches(1)[0]))
    return memory_figures(compiled), compiled.cost_analysis()["flops"]


# --- the compiled figures are the compiler's: the trained step, compiled here ----------------------------------


@pytest.mark.parametrize("mode, mesh, rules", [
    ("dp-tp", "data=4,model=2", TWO_LAYER_RULES),  # your rules split the pair of layers over 'model'
    ("fsdp", "data=8", None),  # fsdp's own placement and its shard_map step, layer by layer
])
def test_your_module_verified_in_a_child_is_the_trained_step_compiled_here(mode, mesh, rules):
    progress = []
    plan = _plan(mesh, mode, rules, verify=VerifySettings("cpu", on_progress=progress.append))
    compiled = plan.compiled
    figures, flops = _trained_step_figures(mode, mesh, rules or ())
    child = {name: getattr(compiled, name) for name in figures}
    # JAX 0.12 compiles a jit step called through jax.export with 64 bytes less of temporaries in tp and dp-tp (one
    # small buffer moves across the call's boundary, and 0.9% more FLOPs come with it); on 0.10 every figure is equal.
    newer = JAX_VERSION >= (0, 11)
    assert 0 <= figures.pop("temp_bytes") - child.pop("temp_bytes") <= (64 if newer else 0)
    assert child == figures
    assert compiled.flops == pytest.approx(flops, rel=0.02 if newer else 0)
    assert compiled.devices == 8 and compiled.mesh == mesh and compiled.target == "cpu"
    assert any("exporting the step of your TwoLayer" in text for text in progress)
    assert any("compiling your model's exported step for 8 cpu devices" in text for text in progress)
    assert plan.comparison is not None and "peak" in plan.to_text()


def test_your_rule_table_is_the_layout_compiled():
    # A table that splits only the first layer over 'data' (what plan_training plans with rules, for any mode):
    # the compiled arguments hold a(kernel) and its two Adam moments at 1/8 each, the rest whole.
    rules = [("a/kernel", "None, data")]
    plan = _plan("data=8", "dp", rules, verify="cpu")
    whole = _plan("data=8", "dp", verify="cpu")
    split_bytes = 8 * 16 * 4 * 3  # a/kernel (8 x 16 float32) and its two moments
    assert whole.compiled.argument_bytes - plan.compiled.argument_bytes == split_bytes - split_bytes // 8
    assert plan.params_layout.leaf("a/kernel").layout.spec == wb.parse_spec("None, data")
    # The plan simulated the same step (the table's layout), so its arguments are the compiler's to the byte.
    assert plan.memory is not None and plan.memory.argument_bytes == plan.compiled.argument_bytes


def test_a_registered_model_with_your_table_compiles_your_table():
    # Every leaf over 'data' where it divides (the mlp's 10 output biases stay whole): the compiler's arguments are
    # the plan's state per device, to the byte, beside the batch's share (what dp's own replicated step holds too).
    plan = wb.plan_training("mlp", {}, "data=8", "dp", rules=[(".*", "data")], hardware="cpu", global_batch=BATCH,
                            verify="cpu")
    replicated = wb.plan_training("mlp", {}, "data=8", "dp", hardware="cpu", global_batch=BATCH, verify="cpu")

    def batch_share(p):
        return p.compiled.argument_bytes - p.params_bytes - p.opt_state_bytes

    assert batch_share(plan) == batch_share(replicated) > 0
    assert plan.compiled.argument_bytes < replicated.compiled.argument_bytes / 4


def test_the_cli_verifies_a_rule_table_from_a_file(tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("kernel$ => None, data\n")
    status = main(["plan", "--model", "mlp", "--mesh", "data=8", "--mode", "dp", "--hardware", "cpu", "--rules",
                   str(rules), "--verify", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    rows = {row["figure"]: row for row in json.loads(out)["compiler"]["rows"]}
    assert rows["arguments"]["analytic"] == rows["arguments"]["compiler"]  # the table's layout, compiled


def test_the_exported_step_travels_as_json_and_compiles_anywhere_of_its_size():
    own = OwnModel(_two_layer, my_loss, TWO_LAYER_BATCH, TWO_LAYER_RULES)
    # 512 devices, traced in this process of 8: an abstract mesh needs none.
    exported = export_step(own.step_config("dp-tp", "data=64,model=8", 1024), own, "tpu")
    assert exported.platform == "tpu" and exported.mesh == "data=64,model=8" and exported.layers == ("a", "b")
    text = json.dumps(exported.to_json())  # what the child is sent: JSON, the program as base64
    assert ExportedStep.from_json(json.loads(text)) == exported


@pytest.mark.slow
def test_recommend_compiles_the_top_layouts_of_your_module_on_16_devices():
    rec = wb.recommend(_two_layer, "cpu", BATCH, devices=16, rules=TWO_LAYER_RULES, loss=my_loss,
                       example_batch=TWO_LAYER_BATCH, top=2, timeout=300)
    assert rec.model == "TwoLayer" and rec.verification_note is None and rec.chosen.verified
    verified = rec.verified
    assert len(verified) == 2 and len({(c.mode, c.mesh) for c in verified}) == 2
    for candidate in verified:
        compiled = candidate.plan.compiled
        assert compiled.devices == 16 and compiled.mesh == str(candidate.mesh)
        assert compiled.peak_bytes == candidate.compiler_peak_bytes > 0
        assert compiled.peak_bytes == (compiled.argument_bytes + compiled.output_bytes - compiled.alias_bytes
                                       + compiled.temp_bytes)
        assert candidate.verification.startswith("compiled for cpu")
        assert candidate.memory_source == "simulated"  # the mode's step on your table, traced before compiling
    assert "verified by the compiler" in rec.to_text()
    assert poll(lambda: not child_processes(), timeout=10)


# --- TPU and GPU compilers --------------------------------------------------------------------------------------


@pytest.fixture
def libtpu():
    if not libtpu_installed():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the TPU test must run in CI: {INSTALL_LIBTPU}")
        pytest.skip(INSTALL_LIBTPU)


@pytest.mark.slow
def test_your_module_verified_for_a_tpu_topology(libtpu):
    plan = _plan("data=4,model=4", "dp-tp", TWO_LAYER_RULES, hardware=None, verify="tpu:v5e:4x4")
    compiled = plan.compiled
    assert compiled.target == "tpu:v5e:4x4" and compiled.device_kind.startswith("TPU v5") and compiled.devices == 16
    assert compiled.peak_bytes >= compiled.argument_bytes > 0
    assert {layer for c in compiled.collectives if c.axes == ("model",) for layer in c.layers} >= {"b"}


@pytest.mark.slow
def test_your_module_verified_for_gpus_without_a_gpu(gpu_compiler):
    plan = _plan("data=16", "fsdp", hardware=None, verify="gpu:h100:16")
    compiled = plan.compiled
    assert compiled.target == "gpu:h100:16" and "H100" in compiled.device_kind and compiled.devices == 16
    assert {c.kind for c in compiled.collectives} >= {"all-gather"}


# --- bad input, and the child on every way out -------------------------------------------------------------------


def test_verifying_your_module_needs_an_example_batch_and_a_loss():
    with pytest.raises(OwnModelError, match=r"needs the shapes of its input: pass example_batch="):
        wb.plan_training(_two_layer, None, "data=8", "dp", loss=my_loss, verify="cpu")
    with pytest.raises(OwnModelError, match=r"TwoLayer has no loss method: pass loss=fn"):
        wb.plan_training(_two_layer, None, "data=8", "dp", example_batch=TWO_LAYER_BATCH, verify="cpu")
    with pytest.raises(OwnModelError, match=r"example_batch\['y'\] is 1.0, not an array with rows: give \['y'\]"):
        OwnModel(_two_layer, my_loss, {"x": np.zeros((8, 8)), "y": 1.0})
    with pytest.raises(OwnModelError, match=r"loss='mse' is not a function"):
        OwnModel(_two_layer, "mse", TWO_LAYER_BATCH)
    plan = wb.plan_training("mlp", {}, "data=8", "dp", simulate=False)
    with pytest.raises(OwnModelError, match=r"the plan is for mlp, but the model to verify is TwoLayer"):
        start_plan_verification(plan, "cpu", OwnModel(_two_layer, my_loss, TWO_LAYER_BATCH))


def test_recommend_without_an_example_batch_says_what_would_verify_your_module():
    rec = wb.recommend(_two_layer, "cpu", BATCH, rules=TWO_LAYER_RULES, loss=my_loss, top=1)
    assert not rec.verified and "pass example_batch=" in rec.verification_note
    assert rec.verification_note.endswith("the ranking is the plan's alone")


def test_a_compile_of_your_module_past_its_time_limit_is_stopped_and_reaped():
    plan = _plan("data=8", "dp", simulate=False)
    job = start_plan_verification(plan, VerifySettings("cpu", timeout=0.5),
                                  OwnModel(_two_layer, my_loss, TWO_LAYER_BATCH))
    with pytest.raises(VerificationError, match=r"your TwoLayer on data=8 for cpu took longer than 0.5 s"):
        job.result()
    assert job._process.returncode is not None
    assert poll(lambda: not child_processes(), timeout=10)
