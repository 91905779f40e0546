"""Compile verification: the real step compiled in a child process for a planned mesh, the compiler's
figures read back, the collectives traced to the layer and line that caused them, and every bad input
or failed child as one clear error.

The TPU test needs libtpu (the ``tpu`` extra): skipped without it, except in CI (``CI=true``), where
it must run.
"""

import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import pytest

import workbench as wb
from workbench.analysis.compile_target import (
    CPU_DEVICE_LIMIT, INSTALL_LIBTPU, validate_target, fitting_mesh, libtpu_installed, parse_target,
)
from workbench.analysis.compiled_step import CompiledStep, read_compiled_step
from workbench.analysis.hlo_sources import SourceTables, op_source
from workbench.analysis.cost_model import collective_time
from workbench.analysis.ledger import memory_figures
from workbench.analysis.plan_comparison import compare_plan
from workbench.analysis.step_time import step_time
from workbench.analysis.verification import start_verification, verify_step
from workbench.cli.main import main
from workbench.errors import MeshError, StepDoesNotFit, VerificationError, WorkbenchError
from workbench.layout.mesh import MeshShape
from workbench.training import head_projection, models
from workbench.training.config import TrainConfig
from workbench.training.layer_scopes import layer_of
from workbench.training.models import abstract_batch, model_config_for_data
from workbench.training.step import build_abstract_step, build_step

SMALL_LM = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 32}
IN_CI = os.environ.get("CI", "").lower() == "true"


@contextlib.contextmanager
def _compiled_afresh():
    """Compiles in this block skip JAX's persistent cache: a cached program keeps the op metadata of
    whichever process compiled it first (JAX's cache key leaves metadata out), and these tests read it."""
    from jax._src import compilation_cache  # JAX decides once per process whether to use its cache: ask again

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def tensor_parallel_step():
    """A 2-layer LM's dp-tp step, compiled for real in this process: (abstract step, compiled)."""
    with _compiled_afresh():
        config = TrainConfig(model="transformer", mode="dp-tp", mesh="data=4,model=2", batch=8, model_options=SMALL_LM)
        step = build_abstract_step(config)
        yield step, step.compile()


def _line_of(function, text: str) -> str:
    """``workbench/training/<module>.py:N`` of the line of ``function`` that contains ``text``."""
    lines, first = inspect.getsourcelines(function)
    number = first + next(i for i, line in enumerate(lines) if text in line)
    return f"workbench/training/{function.__module__.rsplit('.', 1)[-1]}.py:{number}"


# --- the engine against an in-process compile of the same step ------------------------------------------


def test_child_compile_equals_in_process_compile_of_the_trained_step():
    # bf16 with gradient accumulation on a 2-D mesh: the step's every option goes through the child.
    config = TrainConfig(model="mlp", data="digits", mode="dp-tp", mesh="data=4,model=2", batch=32,
                         precision="bf16", accum=2, optimizer="adam")
    built = build_step(config)  # the trainer's own step, on real data, placed on this process's devices
    compiled = built.mode.compile_step(built.mode.place_state(built.state),
                                       built.mode.place_batch(built.first_batches(1)[0]))
    progress = []
    report = verify_step(config, "cpu", on_progress=progress.append)

    assert {name: getattr(report, name) for name in memory_figures(compiled)} == memory_figures(compiled)
    assert report.flops == compiled.cost_analysis()["flops"]
    in_process = read_compiled_step(compiled, built.mode.mesh)
    shape = [(c.kind, c.bytes, c.axes, c.group_size, c.count) for c in in_process.collectives]
    assert [(c.kind, c.bytes, c.axes, c.group_size, c.count) for c in report.collectives] == shape
    assert {"data", "model"} == {axis for c in report.collectives for axis in c.axes}
    assert report.devices == 8 and report.device_kind == "cpu" and report.mesh == "data=4,model=2"
    assert report.peak_bytes == report.argument_bytes + report.output_bytes - report.alias_bytes + report.temp_bytes
    assert 0 < report.peak_rss_bytes < 4 * 2**30 and report.compile_seconds > 0
    assert any("compiling the step for 8 cpu devices" in text for text in progress)
    assert CompiledStep.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_abstract_step_compiles_like_the_placed_step():
    config = TrainConfig(model="mlp", data="digits", mode="fsdp", mesh="data=8", batch=64)
    built = build_step(config)
    placed = built.mode.compile_step(built.mode.place_state(built.state),
                                     built.mode.place_batch(built.first_batches(1)[0]))
    abstract = build_abstract_step(config)
    assert memory_figures(abstract.compile()) == memory_figures(placed)
    assert abstract.layers == ("hidden1", "hidden2", "output")


@pytest.mark.parametrize("model, data, options", [
    ("linear", "regression", {}), ("mlp", "digits", {}), ("cnn", "digits", {}), ("transformer", "text", {}),
])
def test_abstract_batch_has_the_shapes_and_dtypes_of_the_data(model, data, options):
    dataset = wb.load_dataset(data)
    real = next(dataset.batches(8, seed=0))
    expected = {name: (array.shape, str(array.dtype)) for name, array in real.items()}
    shapes = abstract_batch(model_config_for_data(model, dataset, **options), 8)
    assert {name: (leaf.shape, str(leaf.dtype)) for name, leaf in shapes.items()} == expected


# --- collectives and the code that caused them ----------------------------------------------------------


def test_tensor_parallel_all_reduces_name_their_layer_and_line(tensor_parallel_step):
    step, compiled = tensor_parallel_step
    report = read_compiled_step(compiled, step.mode.mesh, step.layers)
    over_model = [c for c in report.collectives if c.axes == ("model",)]
    forward = {layer: c.sources for c in over_model for layer in c.layers if layer.endswith(("/out", "/down"))}
    # Megatron's pairs: each block's row-parallel layers (attention out, MLP down) end in an all-reduce.
    assert set(forward) == {f"blocks/{i}/{name}" for i in range(2) for name in ("attn/out", "mlp/down")}
    assert forward["blocks/1/mlp/down"] == (_line_of(models.FeedForward.forward, "self.down"),)
    # The attention's output projection contracts the heads (head_projection): its matmul is the innermost line.
    assert forward["blocks/0/attn/out"] == (_line_of(head_projection._project, "dot_general("),)
    # The gradient all-reduces over 'data' (XLA combines them into one or a few) carry every replicated
    # gradient: many arrays, many layers, once per step.
    gradients = [c for c in report.collectives if c.axes == ("data",) and c.arrays > 1]
    assert gradients and all(c.count == 1 for c in gradients)
    assert len({layer for c in gradients for layer in c.layers}) > 4
    assert "blocks/*/" in report.collectives_text()


def test_fsdp_gathers_name_the_layer_and_the_model_line_that_called_it():
    with _compiled_afresh():
        config = TrainConfig(model="transformer", mode="fsdp", mesh="data=8", batch=8, model_options=SMALL_LM)
        step = build_abstract_step(config)
        report = read_compiled_step(step.compile(), step.mode.mesh, step.layers)
    gathers = [c for c in report.collectives if c.kind == "all-gather"]
    assert {layer for c in gathers for layer in c.layers} >= {"embed", "head", "blocks/0", "blocks/1"}
    block_call = _line_of(models.TransformerLM.hidden_states, "x = block(x)")
    assert any(block_call in c.sources for c in gathers)  # the model's line, not the gathering wrapper's
    assert not any("param_gathering" in source for c in report.collectives for source in c.sources)


def test_stack_frames_lead_to_the_model_code_not_the_libraries(tensor_parallel_step):
    text = tensor_parallel_step[1].as_text()
    tables = SourceTables.parse(text)
    metadata = re.findall(r"all-reduce\([^\n]*?(metadata=\{[^\n]*?\})", text)
    sources = [op_source(m[len("metadata="):], tables) for m in metadata]
    assert sources and all(s.frame is not None for s in sources)
    assert all(not re.search(r"/(flax|jax|optax)/", s.frame.file) for s in sources)
    model_code = {"workbench/training/models.py", "workbench/training/token_embedding.py",
                  "workbench/training/lm_head.py", "workbench/training/head_projection.py"}
    files = {s.location.split(":")[0] for s in sources}
    assert "workbench/training/models.py" in files and files <= model_code, files
    # the innermost frame is the model's own line, its outer frames the step that called it
    stack = tables.frames[int(re.search(r"stack_frame_id=(\d+)", metadata[0])[1])]
    assert any(frame.function == "model_loss" for frame in stack)


def test_layer_of_reads_the_scopes_under_transformations():
    layers = ["blocks", "blocks/0", "blocks/0/attn", "blocks/0/attn/out", "head"]
    assert layer_of("jit(_step_fn)/transpose(jvp(blocks/0))/attn/out/dot_general", layers) == "blocks/0/attn/out"
    assert layer_of("jit(_step_fn)/jvp(blocks/0)/attn/bhqk,bkhd->bqhd/dot_general", layers) == "blocks/0/attn"
    assert layer_of("jit(_step_fn)/jvp()/reduce_sum", layers) is None


# --- bad input: one error naming the fix, before any process starts -------------------------------------


def test_unknown_targets_list_the_known_names():
    for bad in ("tpu:v9:4x4", "gpu", "tpu:v5e", "tpu:v5p:8x8x8x8"):
        with pytest.raises(WorkbenchError, match=r"v4, v5e, v5p, v6e.*tpu:v5p:8x8x8"):
            parse_target(bad)
    assert str(parse_target(" TPU:v5p:8x8x8 ")) == "tpu:v5p:8x8x8" and parse_target("tpu:v5e:4x4").chips == 16


def test_a_mesh_of_the_wrong_size_for_the_topology_names_one_that_fits():
    with pytest.raises(MeshError, match=r"512 devices but TPU topology v5e:4x4 has 16: plan on --mesh data=2,model=8"):
        validate_target(parse_target("tpu:v5e:4x4"), MeshShape(("data", "model"), (64, 8)))
    assert str(fitting_mesh(MeshShape(("data", "model"), (64, 8)), 512)) == "data=64,model=8"
    assert str(fitting_mesh(MeshShape(("model",), (4,)), 16)) == "model=16"


def test_more_cpu_devices_than_xla_compiles_for_is_refused_with_a_mesh_that_works():
    validate_target(parse_target("cpu"), MeshShape(("data",), (CPU_DEVICE_LIMIT,)))
    with pytest.raises(WorkbenchError,
                       match=r"4,096 devices; XLA:CPU compiles for at most 2,048.*--mesh data=256,model=8"):
        wb.plan_training("mlp", {}, "data=512,model=8", "dp-tp", verify="cpu")


def test_verify_refuses_what_the_step_cannot_express():
    from flax import nnx

    # Your own module is traced here (tests/test_own_model_verification.py), from the shapes of its input.
    with pytest.raises(WorkbenchError, match="needs the shapes of its input: pass example_batch="):
        wb.plan_training(lambda: nnx.Linear(4, 4, rngs=nnx.Rngs(0)), None, "data=8", "dp", verify="cpu")
    with pytest.raises(WorkbenchError, match="'dp-pmap'.*is not one jit program.*use 'dp'"):
        build_abstract_step(TrainConfig(model="mlp", mode="dp-pmap", mesh="data=8", batch=64))
    with pytest.raises(WorkbenchError, match="'simulated'.*is not one jit program.*use 'dp'"):
        wb.plan_training("mlp", {}, "data=8", "simulated", verify="cpu")
    with pytest.raises(WorkbenchError, match="contradicts --verify tpu:v5e:4x4"):
        wb.plan_training("mlp", {}, "data=16", "dp", hardware="h100-nvlink", verify="tpu:v5e:4x4")


@pytest.mark.parametrize("argv, fragment", [
    (["--verify", "tpu:v7x:2x2"], "unknown TPU generation 'v7x'"),
    (["--verify", "tpu:v5p:8x8x8"], "8 devices but TPU topology v5p:8x8x8 has 512: plan on --mesh data=512"),
    (["--mesh", "data=4096", "--verify", "cpu"], "XLA:CPU compiles for at most 2,048 simulated devices"),
])
def test_cli_bad_verify_input_is_one_line_and_status_2(capsys, argv, fragment):
    status = main(["plan", "--model", "mlp", "--mesh", "data=8", "--mode", "dp", *argv])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err


def test_cli_without_libtpu_says_how_to_install_it(tmp_path):
    # An environment without libtpu, made real: an import hook in this interpreter hides the package.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoLibtpu:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'libtpu' or name.startswith('libtpu.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _NoLibtpu())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli.main", "plan", "--model", "mlp", "--mesh", "data=16", "--mode", "dp",
         "--verify", "tpu:v5e:4x4"], capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: {INSTALL_LIBTPU}\n"


# --- the child process: progress, cancel, time limit, death -----------------------------------------------


def _job(**kwargs):
    config = TrainConfig(model="transformer", mode="dp", mesh="data=16", batch=16, model_options=SMALL_LM)
    return start_verification(config, "cpu", **kwargs)


def _wait_for(condition, seconds=120.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_cancel_stops_the_child_at_once():
    job = _job()
    assert _wait_for(lambda: job.progress or job.done)  # the child is up and working
    job.cancel()  # kills the child's process group and reaps it before it returns
    assert job.done
    assert job._process.returncode is not None  # reaped, not left a zombie
    with pytest.raises(VerificationError, match="cancelled"):
        job.result(timeout=1)


def test_a_compile_past_its_time_limit_is_stopped():
    job = _job(timeout=0.5)
    with pytest.raises(VerificationError, match=r"took longer than 0.5 s and was stopped"):
        job.result()
    assert job._process.returncode is not None


def test_a_child_that_dies_is_one_clear_error():
    job = _job()
    assert _wait_for(lambda: job.progress or job.done)
    os.kill(job._process.pid, signal.SIGKILL)  # what the kernel's out-of-memory killer does
    with pytest.raises(VerificationError, match=r"was killed \(SIGKILL, most likely out of memory\)"):
        job.result(timeout=60)


@pytest.mark.slow
def test_plan_verified_on_16_simulated_devices_side_by_side(capsys):
    status = main(["plan", "--model", "transformer", "--config", "d_model=64,n_layers=2,n_heads=4,vocab=256,max_len=32",
                   "--mesh", "data=8,model=2", "--mode", "dp-tp", "--hardware", "cpu", "--verify", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    plan = json.loads(out)
    rows = {row["figure"]: row for row in plan["compiler"]["rows"]}
    assert {"arguments", "outputs", "aliased", "temporaries", "peak", "FLOPs", "all-reduce bytes"} <= set(rows)
    for row in rows.values():
        assert set(row) == {"figure", "unit", "analytic", "compiler", "ratio", "note"}
        expected = row["analytic"] / row["compiler"] if row["analytic"] is not None and row["compiler"] else None
        assert row["ratio"] == pytest.approx(expected) if expected is not None else row["ratio"] is None
    assert rows["peak"]["analytic"] == plan["per_device"]["peak_bytes"]
    assert rows["arguments"]["ratio"] == pytest.approx(1.0, abs=0.05)  # the state is laid out the same way
    compiled = plan["compiler"]["compiled"]
    assert compiled["devices"] == 16 and compiled["mesh"] == "data=8,model=2"
    layers = {layer for c in compiled["collectives"] if c["axes"] == ["model"] for layer in c["layers"]}
    assert {"blocks/0/mlp/down", "blocks/1/attn/out"} <= layers


# --- the TPU compiler, through libtpu -----------------------------------------------------------------------


@pytest.fixture
def libtpu():
    if not libtpu_installed():
        if IN_CI:
            pytest.fail(f"the TPU test must run in CI: {INSTALL_LIBTPU}")
        pytest.skip(INSTALL_LIBTPU)


@pytest.mark.slow
def test_plan_verified_against_a_tpu_topology(libtpu):
    plan = wb.plan_training("transformer", SMALL_LM, "data=8,model=2", "dp-tp", verify="tpu:v5e:4x4")
    assert plan.hardware.name == "tpu-v5e"  # the preset follows the topology
    compiled = plan.compiled
    assert compiled.target == "tpu:v5e:4x4" and compiled.device_kind.startswith("TPU v5") and compiled.devices == 16
    assert compiled.flops and compiled.peak_bytes >= compiled.argument_bytes
    layers = {layer for c in compiled.collectives if c.axes == ("model",) for layer in c.layers}
    assert {"blocks/0/mlp/down", "blocks/1/attn/out"} <= layers
    text = plan.to_text()
    assert "compiler     tpu:v5e:4x4: TPU v5 lite, 16 devices" in text
    assert not re.search(r"^(WARNING|[EIW]\d{4} )", text, re.M)  # libtpu's start-up noise stays in the child
    peak = next(line for line in text.splitlines() if line.strip().startswith("peak"))
    assert "trust the compiler's peak" in peak  # libtpu schedules per generation: the plan says so
    # Its temporaries: the block its buffer assignment keeps in HBM (analysis/tpu_buffers.py: its memory analysis
    # reported 0 B for small steps on v5e and v6e, and more than the block elsewhere); what it keeps on chip, in VMEM,
    # is said apart.
    assert compiled.temp_bytes == compiled.hbm_block_bytes > 0 and compiled.reported_temp_bytes is not None
    assert compiled.on_chip_bytes > 0
    temporaries = next(line for line in text.splitlines() if line.strip().startswith("temporaries") and "plan:" in line)
    assert "buffer assignment keeps in HBM" in temporaries and "in on-chip VMEM" in temporaries
    assert "memory analysis estimates" in temporaries


@pytest.mark.slow
def test_a_topology_libtpu_refuses_is_one_clear_error(libtpu):
    with pytest.raises(WorkbenchError, match=r"libtpu does not accept TPU topology 'v5e:3x3'"):
        verify_step(TrainConfig(model="mlp", mode="dp", mesh="data=9", batch=18), "tpu:v5e:3x3")


@pytest.mark.slow
def test_a_step_that_does_not_fit_the_chip_is_the_targets_answer_not_this_machines(libtpu):
    # libtpu checks the step against the chip's HBM while it compiles (16 GB on v5e) and refuses it: the error says the
    # step does not fit the target, with what the compiler reported, and not that this machine ran out of memory.
    config = TrainConfig(model="transformer", model_options={"d_model": 128, "n_layers": 1, "n_heads": 4, "vocab": 256,
                                                              "max_len": 4096},
                         data="text", mode="dp", mesh="data=16", batch=1024)  # 64 sequences of 4,096 tokens a chip
    with pytest.raises(VerificationError, match=r"^the dp step of transformer on data=16 for tpu:v5e:4x4 does not fit: "
                       r"the compiler reports [\d.]+G of temporaries, more than the [\d.]+G of HBM a chip has "
                       r"\(the target's memory, not this machine's\): plan it with remat dots or block, "
                       r"a smaller batch per device or more devices") as refused:
        verify_step(config, "tpu:v5e:4x4", seq_len=4096)
    assert isinstance(refused.value, StepDoesNotFit) and "more memory" not in str(refused.value)
    # The advice names only the policies the model has: the mlp has none but none.
    wide = TrainConfig(model="mlp", model_options={"hidden": 16384}, mode="dp", mesh="data=16", batch=4194304)
    with pytest.raises(StepDoesNotFit, match=r"plan it with a smaller batch per device or more devices"):
        verify_step(wide, "tpu:v5e:4x4")


@pytest.mark.slow
def test_cli_prints_the_plan_beside_the_compilers_refusal_and_exits_1(libtpu, capsys):
    # The plan is worth reading when the target refuses the step: workbench plan prints it (priced on the topology's
    # chip, simulated for libtpu, as a verified plan is), then the refusal on stderr; status 1, "it ran, the answer is
    # bad", not 2 (bad input).
    status = main(["plan", "--model", "transformer", "--mesh", "data=16", "--mode", "dp", "--batch", "1024",
                   "--config", "d_model=128,n_layers=1,n_heads=4,vocab=256,max_len=4096", "--verify", "tpu:v5e:4x4"])
    out, err = capsys.readouterr()
    assert status == 1, err
    assert re.search(r"^hardware +tpu-v5e:", out, re.M) and re.search(r"^  peak .* does NOT fit", out, re.M)
    assert "compiler     tpu:v5e:4x4" not in out  # nothing compiled to show beside it
    assert re.fullmatch(r"verify: the dp step of transformer on data=16 for tpu:v5e:4x4 does not fit: .*\n", err)


@pytest.mark.slow
def test_a_recommendation_never_chooses_a_layout_the_targets_compiler_refused(libtpu):
    # Told the chips have 64 GiB (a v5e has 16 GB), the plan finds every layout fitting and ranks the fastest, one
    # microbatch of 16 GiB, first; libtpu refuses those. They do not fit whatever the plan said: the next layouts are
    # compiled in their place until one fits (3 compiles in 3 rounds here), the answer is that one, verified, and the
    # refusals are said in the verification. Each refused layout's heavier remat policy joins the ranking.
    rec = wb.recommend("transformer", "tpu:v5e:2x2", 256, seq_len=4096, device_memory="64GiB", top=1,
                       model_options={"d_model": 128, "n_layers": 1, "n_heads": 4, "vocab": 256, "max_len": 4096})
    refused = [c for c in rec.unfit if c.refused]
    assert refused and all(not c.fits and "does not fit: the compiler reports" in c.refused for c in refused)
    assert rec.chosen.verified and rec.chosen.fits and not rec.chosen.refused
    assert rec.chosen.accum > 1 and rec.chosen.compiler_peak_bytes < 15.75 * 2**30  # microbatches: a smaller step
    compiled = len(rec.verified) + len(refused)
    assert all(c.verification == f"not verified: only the top 1 are compiled ({compiled} with those compiled in place "
               "of the ones the compiler turned down)" for c in rec.candidates if not c.verified)
    assert all((c.mode, c.mesh, "dots", c.accum) in {(r.mode, r.mesh, r.remat, r.accum) for r in rec.candidates}
               for c in refused)
    records = [c.to_json() for c in rec.unfit]
    assert any(record["refused"] and not record["fits"] for record in records)
    assert len(rec.refusals) == len(refused) and all(": refused by the compiler: " in line for line in rec.refusals)
    text = rec.to_text()
    assert all(f"  {line}" in text[text.index("\nverification\n"):] for line in rec.refusals)


# A scanned 2-block transformer small enough to compile for tpu:v5e:2x2 in seconds; run on 128 tokens, so that no
# dimension of the residual stream's shape is d_model by chance.
SCANNED_LM = {"d_model": 256, "n_layers": 2, "n_heads": 4, "vocab": 512, "max_len": 256, "scan_layers": True}


@pytest.mark.slow
@pytest.mark.parametrize("mode, remat, accum, scanned", [
    ("fsdp-tp", "none", 1, True),  # scanned in a shard_map manual over 'data' only
    ("fsdp-tp", "dots", 4, True),
    ("dp-tp", "none", 4, True),  # its microbatches accumulate in such a shard_map
    ("dp-tp", "block", 4, True),  # ... their blocks under remat, scanned and unrolled
    ("dp-tp", "dots", 4, True),
    ("dp-tp", "block", 4, False),
])
def test_libtpu_sends_megatrons_all_reduces_over_model_and_nothing_else(libtpu, mode, remat, accum, scanned):
    # Until the attention projected into and out of its heads as (d_model, heads, head_dim) contractions, the
    # microbatches held their parameters to their layout and remat left the vectors untied under dots, libtpu split
    # these steps' residual stream over 'model' and gathered it before every matmul: 3.7-5.3x the planned bytes over
    # 'model' (docs/design/compile-verification.md, "libtpu's traffic over model"; "The split gone": the fix). dp-tp's
    # microbatches under remat stayed split (4.3-6.9x) until the loop buffers took shapes of their own and the blocks
    # held their parameters inside their remat boundary ("Loop buffers in shapes of their own").
    options = {**SCANNED_LM, "scan_layers": scanned}
    config = TrainConfig(model="transformer", model_options=options, data="text", mode=mode, mesh="data=2,model=2",
                         batch=16, remat=remat, accum=accum, precision="bf16")
    compiled = verify_step(config, "tpu:v5e:2x2", seq_len=128)
    plan = wb.plan_training("transformer", options, "data=2,model=2", mode, hardware="tpu-v5e", global_batch=16,
                            seq_len=128, remat=remat, accum=accum, simulate=False)
    over_model = [c for c in compiled.collectives if "model" in c.axes]
    assert not any(c.kind == "all-gather" and c.total_bytes > 64 * 1024 for c in over_model), over_model
    compiled_sums = sum(c.total_bytes for c in over_model if c.kind == "all-reduce")
    planned_sums = sum(c.total_bytes for c in plan.collectives if c.kind == "all-reduce" and c.axes == ("model",))
    assert compiled_sums == pytest.approx(planned_sums, rel=0.01)
    assert sum(c.total_bytes for c in over_model) <= 1.15 * planned_sums  # the rest: a few small all-to-alls


@pytest.mark.slow
def test_a_verified_step_is_priced_on_the_collectives_the_compiler_placed_each_on_its_own_axis(libtpu):
    # dp-tp's unrolled blocks under remat dots, accumulated over microbatches: libtpu moves a few of their values
    # between layouts over 'model' with all-to-alls the plan does not have. Priced on what was compiled, they sit on
    # the critical path beside tp's all-reduces, each occurrence priced with the ring model; scaling the plan's
    # collectives by the compiler's bytes of their kind had hidden such additions (the all-gathers libtpu once added
    # over 'model', scaled as the plan's all-gathers over 'data', beside the maths).
    options = {**SCANNED_LM, "scan_layers": False}
    config = TrainConfig(model="transformer", model_options=options, data="text", mode="dp-tp",
                         mesh="data=2,model=2", batch=16, remat="dots", accum=4, precision="bf16")
    compiled = verify_step(config, "tpu:v5e:2x2", seq_len=128)
    plan = wb.plan_training("transformer", options, "data=2,model=2", "dp-tp", hardware="tpu-v5e", global_batch=16,
                            seq_len=128, remat="dots", accum=4, simulate=False)
    added = [c for c in compiled.collectives if c.kind == "all-to-all" and c.axes == ("model",)]
    assert added and not any(c.kind == "all-to-all" for c in plan.collectives)
    planned, on_compiled = step_time(plan), step_time(plan, compiled.collectives)
    # tp's all-reduces over 'model' are the plan's; the all-to-alls come on top of them.
    model_all_reduces = [c for c in compiled.collectives if c.kind == "all-reduce" and c.axes == ("model",)]
    planned_all_reduces = [c for c in plan.collectives if c.kind == "all-reduce" and c.axes == ("model",)]
    assert sum(c.total_bytes for c in model_all_reduces) >= 0.99 * sum(c.total_bytes for c in planned_all_reduces)
    moved = sum(c.count * collective_time(c.kind, c.bytes, c.group_size, plan.hardware) for c in added)
    assert moved > 0 and on_compiled.exposed_s >= (planned.exposed_s + moved) * 0.99
    # workbench plan --verify shows it: the step time on the plan's collectives beside the compiler's.
    row = compare_plan(plan, compiled).row("step time")
    assert (row.analytic, row.compiler) == (planned.step_s, on_compiled.step_s) and row.ratio < 1


def test_the_comparison_prices_the_step_on_the_plans_collectives_and_on_the_compilers():
    # dp's gradient all-reduce is the plan's (and the loss's 8 bytes): the same step time both ways, in seconds.
    plan = wb.plan_training("mlp", {}, "data=8", "dp", hardware="cpu", verify="cpu")
    comparison = compare_plan(plan, plan.compiled)
    assert comparison.row("all-reduce bytes").ratio == pytest.approx(1.0, rel=1e-3)
    row = comparison.row("step time")
    assert row.unit == "s" and row.analytic > 0 and row.analytic == pytest.approx(row.compiler, rel=1e-3)
    assert re.search(r"^  step time +[\d.]+ \w?s +[\d.]+ \w?s +1\.00  the cost model on cpu", comparison.to_text(),
                     re.M)


def test_importing_the_workbench_with_libtpu_installed_prints_nothing(libtpu):
    # On a machine without TPU chips JAX would start libtpu with its default platforms, and libtpu
    # prints a screenful of warnings: the workbench keeps JAX on the CPU there.
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.getcwd()
    done = subprocess.run([sys.executable, "-c", "import workbench, jax; print(jax.default_backend())"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "cpu\n", "")
