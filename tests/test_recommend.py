"""The recommender, trusted on what can be measured: the scaling book's regimes on its own numbers, as properties of
the ranking; on the 8 simulated CPU devices its best layouts for a small model train exactly as ``single`` does
and compile to the memory it verified; a disagreement with the compiler is flagged; the exported budget test runs
in a child pytest, passes today and fails once the budget is broken; bad input says what would work."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

import workbench as wb
from helpers import TWO_LAYER_BATCH, TWO_LAYER_RULES, TwoLayer, child_processes, my_loss, poll
from workbench.analysis import layout_code, budget_test_code
from workbench.analysis.compiled_step import read_compiled_step
from workbench.analysis.recommender import RecommendationError
from workbench.analysis.cost_model import collective_time
from workbench.analysis.step_time import step_time
from workbench.cli.main import main
from workbench.training.config import make_optimizer
from workbench.training.data import load_dataset
from workbench.training.models import model_config_for_data, tensor_parallel_rules
from workbench.training.modes import StepSetup, build_mode
from workbench.training.modes.core import init_state
from workbench.training.step import build_abstract_step

GiB = 2**30
# The README's 1.3B, its blocks in one loop: the same plan, planned from a few stacked leaves (0.01 s a layout).
BOOK_1B = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "vocab": 32000, "max_len": 2048, "scan_layers": True}
# A small transformer that trains on the 'tokens' data set (as tests/test_modes.py's), in fp32 with SGD: exact.
SMALL = {"d_model": 32, "n_heads": 4, "n_layers": 1, "vocab": 32, "max_len": 16}
SMALL_DATA = {"seq_len": 16, "num_train": 256, "num_eval": 64, "vocab_size": 32}
BATCH, STEPS = 64, 3


def _family(rec, mode):
    return next(f for f in rec.families if f.mode == mode)


def _best(rec, mode):
    return next(c for c in rec.candidates if c.mode == mode)


# --- the scaling book's regimes, as properties of the ranking (plans only: top=0 compiles and simulates nothing)


def test_pure_data_parallelism_stops_fitting_at_about_16_bytes_per_parameter_with_adam():
    options = {"d_model": 256, "n_layers": 4, "n_heads": 4, "vocab": 4096, "max_len": 64}
    params = wb.plan_training("transformer", options, "data=4", "dp", simulate=False).params
    book = 16 * params  # fp32 parameters, gradients and Adam's two moments: 4 x 4 bytes
    above = wb.recommend("transformer", "tpu:v5p:2x2x1", 8, seq_len=64, model_options=options, top=0,
                         device_memory=int(1.5 * book))
    below = wb.recommend("transformer", "tpu:v5p:2x2x1", 8, seq_len=64, model_options=options, top=0,
                         device_memory=int(0.9 * book))
    assert _family(above, "dp").verdict in ("chosen", "slower")
    assert _family(below, "dp").verdict == "does not fit"
    assert "adamw state alone take" in _family(below, "dp").reason
    assert _family(below, "fsdp").verdict in ("chosen", "slower")  # sharding the state is the way out


def _fsdp_time(tokens_per_chip: int, topology: str = "tpu:v5p:2x2x4"):
    chips = wb.analysis.compile_target.parse_target(topology).chips
    rec = wb.recommend("transformer", topology, chips * tokens_per_chip // 512, seq_len=512, model_options=BOOK_1B,
                       top=0)
    return rec, next(c for c in (*rec.candidates, *rec.unfit) if c.mode == "fsdp" and c.accum == 1)


def test_fsdp_turns_communication_bound_on_v5p_below_the_books_threshold():
    # The book: FSDP stays compute-bound while tokens per chip exceed about C / W_ici = 2,550 on v5p. This plan
    # prices fp32 gradients on one-way links at 50% utilisation: the same boundary within a factor of 1.5.
    below, fsdp_below = _fsdp_time(1024)
    above, fsdp_above = _fsdp_time(10240)  # four times the book's boundary
    assert fsdp_below.time.bound_kind == "overlapped" and "over 'data'" in fsdp_below.bound
    assert fsdp_above.time.bound_kind == "compute"
    threshold = fsdp_below.plan.compute_bound.threshold_tokens
    assert 2550 / 1.5 <= threshold <= 2550 * 1.5
    assert "communication-bound" in _family(below, "fsdp").reason or _family(below, "fsdp").verdict == "chosen"


def test_tensor_parallelism_moves_the_boundary():
    # At 1,024 tokens per chip fsdp waits on its gathers; splitting layers over 'model' leaves fewer bytes per
    # chip to sync over 'data' for the same tokens, so a tensor-parallel layout wins.
    rec, fsdp = _fsdp_time(1024)
    assert wb.training.mode_class(rec.chosen.mode).axes == ("data", "model")
    split = rec.chosen
    assert split.time.overlapped_s / split.time.compute_s < fsdp.time.overlapped_s / fsdp.time.compute_s
    assert split.step_s < fsdp.step_s


def test_a_remat_policy_is_weighed_only_where_the_lighter_one_does_not_fit():
    # dp on 8 devices with one microbatch: 1.9 GiB without remat, 0.6 GiB keeping the blocks' matmul outputs (dots),
    # 0.4 GiB recomputing whole blocks; with 8 microbatches 0.37 GiB without remat. On 1 GiB chips:
    options = {"d_model": 256, "n_layers": 8, "n_heads": 4, "vocab": 1024, "max_len": 1024}
    rec = wb.recommend("transformer", "cpu", 64, seq_len=1024, model_options=options, top=0, device_memory="1GiB")
    weighed = {(c.mode, c.accum, c.remat) for c in (*rec.candidates, *rec.unfit)}
    assert {("dp", 1, "none"), ("dp", 1, "dots")} <= weighed and ("dp", 1, "block") not in weighed
    assert ("dp", 8, "none") in weighed and ("dp", 8, "dots") not in weighed
    dots = next(c for c in rec.candidates if (c.mode, c.accum, c.remat) == ("dp", 1, "dots"))
    assert dots.plan.remat == "dots" and dots.time.compute_s > 0
    assert "remat='dots'" in layout_code(dots)


def test_on_a_gpu_a_layout_over_xla_gpus_budget_ranks_after_those_within_it():
    # On 40 MiB GPUs, dp without remat holds 28.7 MiB of temporaries (a 31.7 MiB peak: it fits) where XLA:GPU's budget
    # is 27.0 MiB: the compiler would recompute values, time the plan does not count. The same layout with dots is
    # simulated too, within it, and ranks first; the one without remat stays, after, saying why.
    lm = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab": 256, "max_len": 256}
    rec = wb.recommend("transformer", "gpu:h100:8", 64, seq_len=256, model_options=lm, device_memory="40MiB",
                       verify=False)
    assert (rec.chosen.mode, rec.chosen.remat, rec.chosen.over_gpu_budget) == ("dp", "dots", False)
    over = [c for c in rec.candidates if c.over_gpu_budget]
    assert ("dp", 1, "none") in {(c.mode, c.accum, c.remat) for c in over}
    simulated = [c for c in rec.candidates if c.memory_source == "simulated"]
    assert [c.over_gpu_budget for c in simulated] == sorted(c.over_gpu_budget for c in simulated)  # within first
    for c in over:
        assert c.fits and c.plan.memory.temp_bytes > c.plan.gpu_budget.on_gpu
        assert any("over XLA:GPU's budget" in d for d in c.disagreements)
    assert json.loads(json.dumps(rec.to_json()))["candidates"][0]["over_gpu_budget"] is False


# --- on the 8 simulated CPU devices: trained, compiled, compared


@pytest.fixture(scope="module")
def small_rec():
    """The top 2 layouts for a small transformer on 8 CPU devices, compiled (shared: each compile is a child)."""
    return wb.recommend("transformer", "cpu", BATCH, seq_len=16, model_options=SMALL, optimizer="sgd",
                        precision="fp32", top=2, timeout=300)


def _train(mode: str, mesh, accum: int):
    data = load_dataset("tokens", **SMALL_DATA)
    config = model_config_for_data("transformer", data, **{k: v for k, v in SMALL.items() if k != "vocab"})
    tx = make_optimizer("sgd", 0.1)
    graphdef, state = init_state(config.build(seed=0), tx)
    setup = StepSetup(graphdef, wb.training.model_class("transformer").loss, tx, wb.parse_mesh(mesh), BATCH, accum,
                      "fp32", tuple(tensor_parallel_rules("transformer")))
    runner = build_mode(mode, setup)
    state = runner.place_state(state)
    batches = data.batches(BATCH, seed=0)
    losses = []
    for _ in range(STEPS):
        state, metrics = runner.step(state, runner.place_batch(next(batches)))
        losses.append(metrics["loss"])
    params = runner.export_state(state).params
    return np.array(jax.device_get(losses)), [np.asarray(v) for _, v in wb.layout.leaves_with_paths(params)]


@pytest.mark.parametrize("mode, mesh", [("dp", "data=8"), ("fsdp", "data=8"), ("dp-tp", "data=4,model=2"),
                                        ("fsdp-tp", "data=4,model=2")])
def test_a_step_compiled_as_planned_is_priced_at_the_plans_time_and_what_the_compiler_adds_on_its_own_axis(mode, mesh):
    # A verified layout is priced on the compiler's bytes of each kind over each set of axes: where those are the
    # plan's own, its time is the plan's, to the bit; what the compiler adds over 'model' (libtpu's all-gathers of
    # the residual stream) comes on top of tp's all-reduces, not hidden under the maths with the data-axis ones.
    plan = wb.plan_training("transformer", {"n_layers": 2}, mesh, mode, hardware="tpu-v5e", global_batch=64,
                            simulate=False)
    assert step_time(plan, plan.collectives) == step_time(plan)
    stream = plan.collectives[0].bytes
    added = dataclasses.replace(plan.collectives[0], kind="all-gather", axes=("model",), group_size=2, count=16)
    more = step_time(plan, [*plan.collectives, added])
    assert more.overlapped_s == step_time(plan).overlapped_s
    assert more.exposed_s == pytest.approx(step_time(plan).exposed_s + 16 * collective_time("all-gather", stream, 2,
                                                                                          plan.hardware))


def test_the_top_layouts_train_exactly_as_single_and_compile_to_the_verified_memory(small_rec):
    verified = [c for c in small_rec.candidates if c.verified]
    assert len(verified) == 2 and small_rec.chosen.verified
    assert len({(c.mode, c.mesh) for c in verified}) == 2  # two different layouts, not one layout's microbatches
    reference_losses, reference_params = _train("single", "data=1", 1)
    for candidate in verified:
        losses, params = _train(candidate.mode, str(candidate.mesh), candidate.accum)
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
        for value, expected in zip(params, reference_params, strict=True):
            scale = max(float(np.max(np.abs(expected))), 1e-3)
            assert float(np.max(np.abs(value - expected))) / scale <= 1e-5
        # The memory the table shows as the compiler's is the step compiled here, in this process.
        config = wb.TrainConfig(**{k: v for k, v in wb.analysis.layout_settings(candidate).items() if k != "remat"})
        step = build_abstract_step(config, seq_len=16)
        here = read_compiled_step(step.compile(), step.mode.mesh, step.layers)
        assert here.peak_bytes == candidate.compiler_peak_bytes
        assert here.bytes_by_kind() == candidate.compiler_bytes_by_collective()


def test_the_table_and_json_say_what_was_verified_and_why_the_rest_was_not(small_rec):
    text = small_rec.to_text()
    assert "verified by the compiler" in text and "what bounds each" in text and "families" in text
    data = json.loads(json.dumps(small_rec.to_json()))
    assert data["chosen"]["verified"] and data["chosen"]["compiler_peak_bytes"] > 0
    unverified = [c for c in data["candidates"] if not c["verified"]]
    assert unverified and all("only the top 2 are compiled" in c["verification"] for c in unverified)
    assert data["chosen"]["settings"]["mesh"] == data["chosen"]["mesh_text"]
    # A verified layout's time is its plan's compute with the collectives the compiler placed, each on its own axes.
    chosen = small_rec.chosen
    assert chosen.compiled_time == step_time(chosen.plan, chosen.plan.compiled.collectives)
    figure = wb.views.recommendation_figure(small_rec)
    diamonds = [t for t in figure.data if t.marker.symbol == "diamond"]
    assert sum(len(t.x) for t in diamonds) == 2


def test_a_step_that_does_not_fit_after_all_is_flagged():
    # A layout whose plan promises less than its compiler needs, on chips with memory between the two: the plan
    # ranks it as fitting, the compiler says it does not, and the table says so. In bf16 this small step's dp-tp plan
    # is below XLA:CPU's peak (0.96 on 2026-11-28; dp, fsdp and fsdp-tp 1.02, 1.04 and 1.00), and ranks fourth.
    settings = {"seq_len": 16, "model_options": SMALL, "optimizer": "sgd", "precision": "bf16", "timeout": 300}
    first = wb.recommend("transformer", "cpu", BATCH, top=4, **settings)
    under = sorted((c for c in first.verified if c.analytic_peak_bytes < c.compiler_peak_bytes),
                   key=lambda c: c.analytic_peak_bytes / c.compiler_peak_bytes)
    assert under, "expected a verified layout whose plan is below its compiled peak"
    memory = (under[0].analytic_peak_bytes + under[0].compiler_peak_bytes) // 2
    rec = wb.recommend("transformer", "cpu", BATCH, top=4, device_memory=memory, **settings)
    flagged = [c for c in rec.unfit if any(d.startswith("does not fit after all") for d in c.disagreements)]
    assert flagged and all(c.verified and c.compiler_peak_bytes > memory for c in flagged), rec.to_text()
    assert "compiler and plan disagree" in rec.to_text() and rec.chosen.fits


def test_the_exported_budget_test_passes_today_and_fails_when_the_budget_breaks(small_rec, tmp_path):
    code = budget_test_code(small_rec.chosen)
    passing = tmp_path / "test_budget.py"
    passing.write_text(code)
    broken = tmp_path / "test_broken_budget.py"
    peak = small_rec.chosen.compiler_peak_bytes
    broken.write_text(code.replace(f"PEAK_BYTES = {peak}", f"PEAK_BYTES = {peak // 2}"))

    def run(path):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    ok = run(passing)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    failed = run(broken)
    assert failed.returncode == 1
    assert "peak memory per device" in failed.stdout and "above the budget" in failed.stdout


def test_the_exported_code_runs_and_names_the_layout(small_rec):
    namespace: dict = {}
    exec(layout_code(small_rec.chosen), namespace)
    assert namespace["MESH"] == str(small_rec.chosen.mesh)
    assert namespace["CONFIG"].mode == small_rec.chosen.mode and namespace["CONFIG"].accum == small_rec.chosen.accum
    assert namespace["SHARDING_RULES"]


def test_assert_layout_names_a_parameter_that_moved():
    config = wb.TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64)
    specs = wb.analysis.layout_specs(config)
    wb.analysis.assert_layout(config, specs)
    with pytest.raises(AssertionError, match="hidden1/kernel is"):
        wb.analysis.assert_layout(wb.TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64), specs)


# A user's own module, in a module of theirs that their tests import (as a budget test must).
USERS_MODULE = """
import jax.numpy as jnp
from flax import nnx


class Pair(nnx.Module):
    def __init__(self, rngs):
        self.a, self.b = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.tanh(self.a(x)))


def make_pair():
    return Pair(nnx.Rngs(0))


def pair_loss(model, batch):
    return jnp.mean((model(batch["x"])[:, 0] - batch["y"][:, 0]) ** 2), {}
"""


def _pytest(*paths, cwd):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, paths)],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def test_your_own_module_is_ranked_compiled_and_held_to_its_budget_by_an_exported_test(tmp_path, monkeypatch):
    (tmp_path / "users_models.py").write_text(USERS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    users = importlib.import_module("users_models")
    # Traced and exported here, compiled in the child (tests/test_own_model_verification.py compares the figures).
    rec = wb.recommend(users.make_pair, "cpu", 64, rules=TWO_LAYER_RULES, loss=users.pair_loss,
                       example_batch=TWO_LAYER_BATCH, top=1, timeout=300)
    assert rec.model == "Pair" and rec.chosen.fits and rec.chosen.verified
    assert rec.verification_note is None and rec.chosen.compiler_peak_bytes > 0
    assert {c.mode for c in rec.candidates} >= {"dp", "fsdp"}

    with pytest.raises(wb.WorkbenchError, match=r"your Pair: pass own=rec.own"):
        budget_test_code(rec.chosen)
    code = budget_test_code(rec.chosen, own=rec.own)
    assert "from users_models import make_pair" in code and "from users_models import pair_loss" in code
    (tmp_path / "test_pair_budget.py").write_text(code)
    peak = rec.chosen.compiler_peak_bytes
    (tmp_path / "test_pair_broken.py").write_text(code.replace(f"PEAK_BYTES = {peak}", f"PEAK_BYTES = {peak // 2}"))
    ran = _pytest("test_pair_budget.py", "test_pair_broken.py", cwd=tmp_path)
    # Today's budget holds (the step compiled again, every spec kept); half of it fails, naming the figure.
    assert "1 failed, 3 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "FAILED test_pair_broken.py::test_the_step_stays_within_its_budget" in ran.stdout
    assert "peak memory per device" in ran.stdout and "above the budget" in ran.stdout


def test_a_builder_a_test_file_cannot_import_is_named_with_the_fix(small_rec):
    from flax import nnx

    own = wb.analysis.OwnModel(lambda: TwoLayer(nnx.Rngs(0)), my_loss, TWO_LAYER_BATCH, TWO_LAYER_RULES)
    with pytest.raises(wb.WorkbenchError, match=r"your model .*<lambda> cannot be imported by a test file: define "
                                                r"it at the top level .* imports=\{'model': 'mypkg.module:name'\}"):
        budget_test_code(small_rec.chosen, own=own)
    with pytest.raises(wb.WorkbenchError, match=r"imports\['model'\]='make_pair' is not 'module:name'"):
        budget_test_code(small_rec.chosen, own=own, imports={"model": "make_pair"})
    # A registered model with your rules needs no import: its name, your table, and no example batch.
    code = budget_test_code(small_rec.chosen, own=wb.analysis.OwnModel("transformer", rules=[("kernel$", "P()")]))
    compile(code, "test_budget.py", "exec")
    assert "MODEL = 'transformer'" in code and "EXAMPLE_BATCH = None" in code and "(r'kernel$', P())" in code


def test_stopping_a_recommendation_kills_its_compiles_at_once(monkeypatch):
    # Stopped as the first compile starts: its child process is killed and reaped on the way out, not waited for.
    import workbench.analysis.recommender as recommender

    stop, jobs = threading.Event(), []
    start = recommender.start_plan_verification
    monkeypatch.setattr(recommender, "start_plan_verification", lambda *args: jobs.append(start(*args)) or jobs[-1])
    with pytest.raises(wb.VerificationError, match="cancelled"):
        wb.recommend("transformer", "cpu", BATCH, seq_len=16, model_options=SMALL, top=2, optimizer="sgd",
                     precision="fp32", stop=stop,
                     on_progress=lambda text: stop.set() if text.startswith("compiling") else None)
    assert jobs and all(job.done for job in jobs)
    for job in jobs:  # killed while compiling: a compile that had been let finish would give its result here
        with pytest.raises(wb.VerificationError, match="cancelled"):
            job.result(timeout=0)
    assert poll(lambda: not child_processes(), timeout=10)


def test_a_plans_verification_compiles_its_microbatches():
    # The compiled step of an accumulated layout is the accumulated one: plan_config carries accum to the child.
    plan = wb.plan_training("mlp", {}, "data=8", "dp", global_batch=64, accum=4, simulate=False)
    assert wb.analysis.verification.plan_config(plan).accum == 4


# --- bad input


def test_a_batch_no_mesh_splits_names_the_nearest_that_work():
    with pytest.raises(RecommendationError, match=r"use a batch of 512 or 1024 \(a multiple of 512"):
        wb.recommend("transformer", "gpu:h100:4096", 1000, seq_len=2048, model_options=BOOK_1B, top=0)


def test_a_model_that_fits_no_layout_names_a_fleet_or_batch_that_would():
    with pytest.raises(RecommendationError, match="no layout fits.*a fleet of [0-9,]+ chips would fit it"):
        wb.recommend("transformer", "cpu", 64, seq_len=2048, model_options=BOOK_1B, top=0, device_memory="2GiB")


def test_a_compiler_that_is_not_installed_gives_the_plans_answer_marked_unverified(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_GPU_COMPILER", str(tmp_path))  # an empty folder: no CUDA plugin there
    rec = wb.recommend("mlp", "gpu:h100:8", 64)
    assert not rec.verified and "make gpu-compile" in rec.verification_note
    assert "unverified" in rec.to_text()


def test_the_cli_prints_one_json_object_and_refuses_bad_input_in_one_line(capsys):
    assert main(["recommend", "--model", "mlp", "--target", "cpu", "--batch", "64", "--no-verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"]["fits"] and data["verification_note"].startswith("not verified (--no-verify)")
    assert main(["recommend", "--model", "mlp", "--target", "gpu:h100:7", "--batch", "64"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    assert main(["recommend", "--model", "mlp", "--target", "cpu", "--batch", "64", "--no-verify",
                 "--export-test", "x.py"]) == 2
    assert "no compiled figures" in capsys.readouterr().err
