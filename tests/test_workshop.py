"""The workshop's exercise checks fail on wrong answers, pass on right ones, and the notebook's answers pass.

The answers tested last are the ones printed in the workshop notebook's collapsible "Answer" blocks,
read from the notebook itself, so a student who copies them passes.
"""

import os
import pathlib
import re

import jax
import nbformat
import pytest
from jax import lax

import workbench as wb
from workbench import workshop
from workbench.workshop import (
    check_all_reduce_bytes,
    check_bytes_per_device,
    check_dominant_collective,
    check_fits_chip,
    check_grad_scale,
    check_gradient_sync,
    check_process_rows,
    regression_loss,
)
from helpers import profile_while_training

WORKSHOP = pathlib.Path(__file__).parent.parent / "notebooks" / "02_data_parallel_workshop.ipynb"
CHECKS = {
    "bytes-per-device": ("ANSWER_BYTES", check_bytes_per_device),
    "all-reduce-bytes": ("ANSWER_ALL_REDUCE", check_all_reduce_bytes),
    "grad-scale": ("ANSWER_GRAD_SCALE", check_grad_scale),
    "fix-the-step": ("local_gradients", check_gradient_sync),
    "process-rows": ("ANSWER_PROCESS_ROWS", check_process_rows),
    "dominant-collective": ("ANSWER_DOMINANT", check_dominant_collective),
}
JUDGED_ON_A_PROFILE = {"dominant-collective"}  # these checks take the notebook's profile report too


def run_exercise_check(name, answer, report=None):
    check = CHECKS[name][1]
    return check(answer, report) if name in JUDGED_ON_A_PROFILE else check(answer)


@pytest.mark.parametrize("name", list(CHECKS))
def test_unanswered_is_neither_pass_nor_crash(name):
    for placeholder in (..., None):
        result = run_exercise_check(name, placeholder)  # no report: an unanswered cell needs none
        assert result.status == "unanswered" and not result.passed and "replace the ..." in result.message


def profile_of(mode, run_root):
    """A real profile of 3 steady steps of the mlp in ``mode`` on data=8, read back."""
    config = wb.TrainConfig(model="mlp", mode=mode, mesh="data=8", batch=64, steps=60, log_every=60, eval_every=0,
                            sync_every=0)
    return profile_while_training(config, 3, run_root)


@pytest.fixture(scope="module")
def fsdp_report(tmp_path_factory):
    return profile_of("fsdp", tmp_path_factory.mktemp("fsdp-profile"))


def test_bytes_per_device():
    assert check_bytes_per_device(dict.fromkeys(workshop.BYTES_KEYS, ...)).status == "unanswered"
    assert check_bytes_per_device({"kernel_dp": 32768, "kernel_fsdp": 4096, "bias_fsdp": 40}).passed
    wrong = check_bytes_per_device({"kernel_dp": 32768, "kernel_fsdp": 4096, "bias_fsdp": 5})
    assert wrong.status == "failed" and "bias_fsdp" in wrong.message and "kernel_fsdp" not in wrong.message
    assert "exactly the keys" in check_bytes_per_device({"kernel_dp": 1}).message
    assert not check_bytes_per_device({"kernel_dp": "32768", "kernel_fsdp": 4096, "bias_fsdp": 40}).passed
    # the truth comes from the layout engine, and matches hand arithmetic
    assert workshop.bytes_per_device_truth(8) == {"kernel_dp": 64 * 128 * 4, "kernel_fsdp": 64 * 128 * 4 // 8,
                                                  "bias_fsdp": 10 * 4}


def test_all_reduce_bytes_against_the_compiled_ledger():
    gradients = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)
    assert workshop.all_reduce_truth(8)[0] == gradients
    right = check_all_reduce_bytes(gradients)
    assert right.passed and f"{gradients:,} B" in right.message
    too_big = check_all_reduce_bytes(gradients * 8)
    assert too_big.status == "failed" and "one gradient per device added up" in too_big.message
    assert "dtype" in check_all_reduce_bytes(gradients // 2).message
    assert not check_all_reduce_bytes("lots").passed


def test_grad_scale_is_measured():
    assert check_grad_scale(8).passed
    assert check_grad_scale(64).status == "failed" and "not N squared" in check_grad_scale(64).message
    assert check_grad_scale(1).status == "failed"


def naive(params, shard):  # the recipe as commonly written: N times too large under check_vma
    return lax.pmean(jax.grad(regression_loss)(params, shard), "data")


def fixed(params, shard):
    params = lax.pcast(params, "data", to="varying")
    return lax.pmean(jax.grad(regression_loss)(params, shard), "data")


def summed(params, shard):
    params = lax.pcast(params, "data", to="varying")
    return lax.psum(jax.grad(regression_loss)(params, shard), "data")


def unreduced(params, shard):
    params = lax.pcast(params, "data", to="varying")
    return jax.grad(regression_loss)(params, shard)


def with_the_engine(params, shard):
    params = lax.pcast(params, "data", to="varying")
    return wb.reduce_gradients(jax.grad(regression_loss)(params, shard), "mean", "data")


def test_fix_the_step_runs_real_shard_map():
    assert check_gradient_sync(fixed).passed and check_gradient_sync(with_the_engine).passed
    for wrong in (naive, summed):
        result = check_gradient_sync(wrong)
        assert result.status == "failed" and result.message.startswith("8x too large") and "pcast" in result.message
    result = check_gradient_sync(unreduced)
    assert result.status == "failed" and "raised" in result.message and "lax.pmean" in result.message
    summed_once = check_gradient_sync(lambda p, s: lax.pmean(lax.pcast(p, "data", to="varying")["w"], "data"))
    assert "same structure" in summed_once.message
    assert not check_gradient_sync(42).passed


# --- which rows each process loads (part 8) ------------------------------------------------------------------


@pytest.mark.parametrize("processes", [2, 4, 8])
@pytest.mark.parametrize("mesh, mode", [*workshop.PROCESS_ROWS_MESHES.items(), ("data=2,model=4", "dp-tp")])
def test_process_rows_are_the_rows_jax_places_on_that_process_devices(mesh, mode, processes):
    """The engine's batch_share over the mode's mesh, against JAX's own map of a batch split over 'data': the
    rows of the devices at positions p * 8 / N ... of jax.devices() (the order jax.distributed lists them)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.training.modes.base import training_mesh

    training = training_mesh(wb.parse_mesh(mesh))
    where = NamedSharding(training, P("data")).devices_indices_map((64,))
    per_process = training.devices.size // processes
    shares = workshop.process_rows(mesh, processes, 64, mode)
    assert [s.share.process_index for s in shares] == list(range(processes))
    for process, share in enumerate(shares):
        devices = jax.devices()[process * per_process:(process + 1) * per_process]
        rows = sorted({row for device in devices for row in range(64)[where[device][0]]})
        assert list(share.rows) == rows and share.share.process_count == processes
        assert share.devices == tuple(d.id for d in devices)


def test_process_rows_table_and_bad_input():
    table = workshop.process_rows_table(workshop.process_rows("data=4,model=2", 2, 64, "dp-tp"))
    assert table.splitlines()[2].split() == ["0", "0-3", "0-1", "0-31", "32"]
    assert table.splitlines()[3].split() == ["1", "4-7", "2-3", "32-63", "32"]
    with pytest.raises(wb.WorkbenchError, match="processes=3 does not divide the 8 devices"):
        workshop.process_rows("data=8", 3, 64)
    with pytest.raises(wb.WorkbenchError, match="does not split into the 8 parts of axis 'data'"):
        workshop.process_rows("data=8", 2, 60)
    with pytest.raises(wb.WorkbenchError, match="needs a mesh axis 'data'"):
        workshop.process_rows("model=8", 2, 64, "dp")


RIGHT_ROWS = {"data=8": range(32, 64), "data=4,model=2": range(32, 64), "model=2,data=4": range(0, 64)}


def test_process_rows_right_answers_pass_in_any_form():
    assert check_process_rows(RIGHT_ROWS).passed
    assert check_process_rows({"data=8": slice(32, 64), "data=4,model=2": list(range(32, 64)),
                               "model=2,data=4": set(range(64))}).passed
    assert "whole batch" in check_process_rows(RIGHT_ROWS).message


@pytest.mark.parametrize("mesh, said, hint", [
    ("data=8", range(0, 32), "another process's rows"),  # process 0's
    ("data=8", range(1, 64, 2), "not interleaved"),  # every second row
    ("data=8", range(32, 40), "one batch part (8 rows"),
    ("data=4,model=2", range(16, 32), "one batch part (16 rows"),
    ("data=4,model=2", (32, 63), "give every row"),
    ("model=2,data=4", range(32, 64), "this process loads the whole batch"),
    ("model=2,data=4", "0-63", "give the rows as range"),
])
def test_process_rows_wrong_answers_fail_with_a_hint(mesh, said, hint):
    result = check_process_rows({**RIGHT_ROWS, mesh: said})
    assert result.status == "failed" and hint in result.message, result.message
    others = [other for other in RIGHT_ROWS if other != mesh]
    assert all(f"{other}:" not in result.message for other in others)  # only the wrong mesh is named


def test_process_rows_incomplete_answers():
    assert check_process_rows({**RIGHT_ROWS, "data=8": ...}).status == "unanswered"
    assert "exactly the keys" in check_process_rows({"data=8": range(32, 64)}).message
    assert "exactly the keys" in check_process_rows([range(32, 64)]).message


def answer_blocks(notebook) -> dict[str, str]:
    """Exercise name -> the code of its collapsible answer in the notebook's markdown."""
    blocks = {}
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for name, code in re.findall(r"<!-- answer: ([\w-]+) -->.*?```python\n(.*?)```", cell.source, re.DOTALL):
            blocks[name] = code
    return blocks


def test_the_notebooks_answers_pass_and_its_starting_code_does_not(fsdp_report):
    notebook = nbformat.read(WORKSHOP, as_version=4)
    blocks = answer_blocks(notebook)
    assert set(blocks) == set(CHECKS), f"answer blocks found: {sorted(blocks)}"
    for name, (variable, _) in CHECKS.items():
        namespace = {"jax": jax, "lax": lax, "wb": wb, "workshop": workshop, "regression_loss": regression_loss,
                     "fsdp_report": fsdp_report}
        exec(blocks[name], namespace)
        assert run_exercise_check(name, namespace[variable], fsdp_report).passed, name
    exercise_cells = [c.source for c in notebook.cells if c.cell_type == "code" and "# EXERCISE" in c.source]
    assert len(exercise_cells) == len(CHECKS)
    starting = next(source for source in exercise_cells if "def local_gradients" in source)
    namespace = {"jax": jax, "lax": lax, "wb": wb, "workshop": workshop, "regression_loss": regression_loss}
    exec(starting.split("workshop.check_gradient_sync")[0], namespace)
    assert check_gradient_sync(namespace["local_gradients"]).message.startswith("8x too large")


# --- which collective dominates fsdp's profiled step (part 7) --------------------------------------------------


def test_the_dominant_collective_is_the_profiles_and_its_bytes_the_ledgers(fsdp_report):
    """The truth is read from a real profile: the kind with the most time per step, and the bytes per step that
    kind's ops carry, which equal the compiled step's ledger (compiled here on its own)."""
    from workbench.analysis.step_ledger import ledger_for_config

    truth = workshop.dominant_collective_truth(fsdp_report)
    times = fsdp_report.timeline.collective_time_by_kind()
    assert truth["kind"] == max(times, key=times.get) and set(times) == {"all-gather", "reduce-scatter", "all-reduce"}
    ledger = ledger_for_config(wb.TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64))
    assert truth["bytes_by_kind"] == ledger.bytes_by_kind()
    assert truth["bytes"] == sum(truth["ops"]) == ledger.bytes_by_kind()[truth["kind"]]


def test_dominant_collective_right_answers_pass_in_any_form(fsdp_report):
    truth = workshop.dominant_collective_truth(fsdp_report)
    kind, total = truth["kind"], truth["bytes"]
    for answer in ((kind, total), [kind.replace("-", "_"), float(total)], {"kind": kind.upper(), "bytes": total}):
        result = check_dominant_collective(answer, fsdp_report)
        assert result.passed and f"{total:,} B" in result.message, (answer, result.message)


def test_dominant_collective_wrong_answers_fail_with_a_hint(fsdp_report):
    truth = workshop.dominant_collective_truth(fsdp_report)
    kind, total, totals = truth["kind"], truth["bytes"], truth["bytes_by_kind"]
    other = next(k for k in totals if k != kind)
    # One op's bytes is a wrong answer only where the kind runs several ops: on simulated devices the kind that
    # takes the most time is noisy, and a lone all-reduce of the loss (one op, 48 B) sometimes comes first.
    one_op = [((kind, truth["ops"][0]), f"that is one {kind} op's bytes")] if len(truth["ops"]) > 1 else []
    for answer, hint in [
        ((other, total), "put another kind first"),  # wrong kind, right bytes
        ((other, totals[other]), f"is what the {other} ops carry"),  # the other kind's answer, consistently
        *one_op,
        ((kind, totals[other]), f"that is what the {other} ops carry per step"),
        ((kind, total // 8), "one device's shard"),
        ((kind, total * 8), "give the bytes per device"),
        ((kind, total + 1), f"the step runs {len(truth['ops'])} {kind} ops"),
        (("all-to-all", total), "the step runs no all-to-all"),
    ]:
        result = check_dominant_collective(answer, fsdp_report)
        assert result.status == "failed" and hint in result.message, (answer, result.message)
        if answer[0] != kind:  # the hint points at the profile, it does not name the answer
            assert f"{kind} takes" not in result.message


@pytest.mark.parametrize("answer, says", [
    ("all-gather", "give a pair (kind, bytes)"),
    (("all-gather", 1, 2), "give a pair (kind, bytes)"),
    (("gather", 1024), "'gather' is not a collective kind"),
    ((1024, "all-gather"), "1024 is not a collective kind"),
    (("all-gather", -1), "a whole number, 0 or more, not -1"),
    (("all-gather", 1.5), "not 1.5"),
    ({"kind": "all-gather"}, "exactly the keys kind, bytes"),
])
def test_dominant_collective_bad_answers_say_what_to_give(answer, says, fsdp_report):
    result = check_dominant_collective(answer, fsdp_report)
    assert result.status == "failed" and says in result.message, result.message


def test_dominant_collective_half_answers_and_bad_reports(fsdp_report, tmp_path):
    for half in (("all-gather", ...), (..., 1024), {"kind": ..., "bytes": 1024}):
        assert check_dominant_collective(half, fsdp_report).status == "unanswered"
    with pytest.raises(wb.WorkbenchError, match="nothing to judge by: pass the report of an fsdp profile"):
        check_dominant_collective(("all-gather", 1024), None)
    with pytest.raises(wb.WorkbenchError, match="this is a profile of a dp run, the exercise asks about fsdp"):
        check_dominant_collective(("all-gather", 1024), profile_of("dp", tmp_path))


# --- notebook 03: does the layout fit the chip? --------------------------------------------------------------

DEBUG_LAYOUTS = WORKSHOP.parent / "03_debug_layouts_before_production.ipynb"


@pytest.fixture(scope="module")
def small_compile():
    """The mlp's fsdp step on data=16 (twice this machine's devices), compiling in a child process."""
    plan = wb.plan_training("mlp", {}, "data=16", "fsdp", hardware="cpu", global_batch=64)
    job = wb.start_plan_verification(plan, "cpu")
    yield plan, job
    job.cancel()


def test_fits_the_chip_is_judged_by_the_compilers_peak(small_compile):
    plan, job = small_compile
    assert check_fits_chip(..., plan, job).status == "unanswered"  # no wait for an unanswered cell
    compiled = job.result(timeout=600)
    peak = compiled.peak_bytes
    roomy = wb.plan_training("mlp", {}, "data=16", "fsdp", hardware="cpu", global_batch=64, device_memory=2 * peak)
    tight = wb.plan_training("mlp", {}, "data=16", "fsdp", hardware="cpu", global_batch=64, device_memory=peak // 2)

    assert check_fits_chip(True, roomy, job).passed and check_fits_chip(False, tight, compiled).passed
    wrong = check_fits_chip(False, roomy, job)
    assert wrong.status == "failed" and wrong.message.startswith("it fits") and wb.format_bytes(peak) in wrong.message
    wrong = check_fits_chip(True, tight, job)
    assert wrong.status == "failed" and wrong.message.startswith("it does not fit")
    assert check_fits_chip(True, roomy.with_compiled(compiled)).passed  # a verified plan carries its record
    assert "True (it fits) or False" in check_fits_chip("yes", roomy, job).message

    # The compiler judges, not the plan: between the two peaks, the plan and the compiler disagree.
    if plan.peak_bytes != peak:
        between = wb.plan_training("mlp", {}, "data=16", "fsdp", hardware="cpu", global_batch=64,
                                   device_memory=(plan.peak_bytes + peak) // 2)
        assert between.fits != (peak <= between.device_memory)
        assert check_fits_chip(peak <= between.device_memory, between, compiled).passed
        assert not check_fits_chip(between.fits, between, compiled).passed


def test_fits_the_chip_refuses_another_steps_record(small_compile):
    plan, job = small_compile
    other = wb.plan_training("mlp", {}, "data=8", "fsdp", hardware="cpu", global_batch=64)
    with pytest.raises(wb.WorkbenchError, match="mesh data=16 but the plan is for data=8"):
        check_fits_chip(True, other, job)
    with pytest.raises(wb.WorkbenchError, match="nothing to judge by"):
        check_fits_chip(True, other)


@pytest.mark.slow
def test_notebook_03s_answer_passes_on_its_own_layout():
    """The answer in notebook 03's collapsed block, checked against the compile of the layout it asks about:
    the 1.3B transformer in dp with every device on 'data', at the parameters cell's batch and chip."""
    notebook = nbformat.read(DEBUG_LAYOUTS, as_version=4)
    parameters = {}
    exec(next(c.source for c in notebook.cells if c.cell_type == "code"), parameters)
    answer = {}
    exec(answer_blocks(notebook)["fits-the-chip"], answer)
    exercise = next(c.source for c in notebook.cells
                    if c.cell_type == "code" and "# EXERCISE fits-the-chip" in c.source)
    assert "ANSWER_FITS = ...\n" in exercise  # the learner starts from a blank

    devices = wb.parse_mesh(parameters["PRODUCTION_MESH"]).size
    plan = wb.plan_training("transformer", parameters["VERIFY_MODEL"], f"data={devices}", "dp",
                            hardware=parameters["HARDWARE"], device_memory=parameters["DEVICE_MEMORY"],
                            global_batch=parameters["VERIFY_BATCH"])
    assert check_fits_chip(answer["ANSWER_FITS"], plan, wb.start_plan_verification(plan, "cpu")).passed


@pytest.mark.slow
def test_notebook_03s_gpu_answer_passes_on_what_xla_gpu_compiles():
    """Exercise 2's answer against XLA:GPU's compile of the layout it asks about: dp of the 1.3B transformer on
    one host of 8 H100s (make gpu-compile; in CI it must run)."""
    from workbench.analysis.gpu_target import gpu_compiler_problem

    if (problem := gpu_compiler_problem()) is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the GPU exercise must be checked in CI: {problem}")
        pytest.skip(problem)
    notebook = nbformat.read(DEBUG_LAYOUTS, as_version=4)
    parameters = {}
    exec(next(c.source for c in notebook.cells if c.cell_type == "code"), parameters)
    answer = {}
    exec(answer_blocks(notebook)["fits-the-gpu"], answer)
    plan = wb.plan_training("transformer", parameters["VERIFY_MODEL"], "data=8", "dp",
                            hardware=parameters["GPU_HARDWARE"], global_batch=64)
    job = wb.start_plan_verification(plan, f"gpu:{parameters['GPU_CHIP']}:8")
    result = check_fits_chip(answer["ANSWER_FITS_GPU"], plan, job, name="fits-the-gpu")
    assert result.passed and result.exercise == "fits-the-gpu", result.message
    assert not check_fits_chip(False, plan, job, name="fits-the-gpu").passed


# --- notebook 04: the shard shape of a restored leaf -------------------------------------------------------

LIVE_TRAINING = WORKSHOP.parent / "04_live_training.ipynb"


def test_the_restored_shard_shape_is_the_one_a_real_restore_gives(tmp_path):
    """The checker's truth equals the shard Orbax reads onto each device when an fsdp checkpoint is resumed
    under dp-tp; wrong answers fail with the hint that fits them."""
    trainer = wb.Trainer(wb.TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64, steps=2, log_every=1,
                                        eval_every=0, sync_every=0, checkpoint_every=2), run_root=str(tmp_path))
    trainer.run(name="saved")
    built = wb.build_step(wb.TrainConfig(model="mlp", mode="dp-tp", mesh="data=4,model=2", batch=64))
    restored = wb.Trainer._restored_state(built.mode, built.state, wb.latest_checkpoint(tmp_path / "saved"))
    kernel = jax.tree.leaves(restored.params["hidden1"]["kernel"])[0]
    shard = tuple(kernel.addressable_shards[0].data.shape)
    assert workshop.check_restored_shard_shape(shard).passed
    assert workshop.check_restored_shard_shape(list(shard)).passed
    truth = workshop.restored_shard_truth()
    for wrong, says in ((truth["saved_shard"], "the shard fsdp saved"), (truth["shape"], "the whole kernel"),
                        ((shard[0] // 2, shard[1]), "which dimension"), ((1, 2, 3), "a tuple of 2 whole numbers"),
                        ("64x64", "a tuple of 2")):
        result = workshop.check_restored_shard_shape(wrong)
        assert result.status == "failed" and says in result.message, (wrong, result.message)
    assert workshop.check_restored_shard_shape(...).status == "unanswered"


def _answer_and_exercise(path, name: str) -> tuple[dict, dict]:
    """The namespaces after running notebook ``path``'s answer block ``name`` and its ``# EXERCISE name`` cell
    (whose last line is the check, run on the placeholder)."""
    notebook = nbformat.read(path, as_version=4)
    answer, exercise = {}, {"workshop": workshop}
    exec(answer_blocks(notebook)[name], answer)
    exec(next(c.source for c in notebook.cells if c.cell_type == "code" and f"# EXERCISE {name}" in c.source),
         exercise)
    return answer, exercise


def test_notebook_04s_answer_passes_and_its_exercise_starts_unanswered():
    answer, exercise = _answer_and_exercise(LIVE_TRAINING, "restored-shard-shape")
    assert workshop.check_restored_shard_shape(answer["ANSWER_RESTORED_SHARD"]).passed
    assert workshop.check_restored_shard_shape(exercise["ANSWER_RESTORED_SHARD"]).status == "unanswered"


# --- beat the recommender (notebook 03, part 8) ----------------------------------------------------------------

# As fast as recommend's choice (fsdp-tp on the same mesh today).
RECOMMENDED = {"mode": "dp-tp", "mesh": "data=32,model=2", "remat": "none", "accum": 1}


def test_the_recommenders_own_layout_passes_and_names_what_bounds_it():
    result = workshop.check_beat_the_recommender(RECOMMENDED)
    assert result.passed and result.message.startswith("as fast as the recommender")
    assert result.message.count("bound by compute") == 2


def test_a_slower_layout_fails_and_says_what_bounds_each():
    result = workshop.check_beat_the_recommender({"mode": "dp", "mesh": "data=64", "remat": "none", "accum": 1})
    assert result.status == "failed" and result.message.startswith("1.26x the recommender's step time")
    assert "all-reduce of gradients" in result.message and "links between hosts" in result.message
    assert "bound by compute" in result.message and "shard fewer ways over 'data'" in result.message


@pytest.mark.parametrize(("layout", "hint"), [
    ({"mode": "dp-tp", "mesh": "data=8,model=8"}, "a smaller 'model' axis"),
    ({"remat": "block"}, "your remat policy recomputes"),
    ({"accum": 4}, "use fewer microbatches"),
])
def test_each_slower_choice_gets_its_own_hint(layout, hint):
    result = workshop.check_beat_the_recommender({**RECOMMENDED, **layout})
    assert result.status == "failed" and hint in result.message, result.message


def test_a_layout_the_fleet_cannot_have_or_a_half_answer_says_so():
    wrong_size = workshop.check_beat_the_recommender({**RECOMMENDED, "mesh": "data=2,model=4"})
    assert wrong_size.status == "failed" and "the fleet is 64 chips" in wrong_size.message
    no_model_axis = workshop.check_beat_the_recommender({**RECOMMENDED, "mode": "tp", "mesh": "data=64"})
    assert no_model_axis.status == "failed" and "needs a mesh axis 'model'" in no_model_axis.message
    assert workshop.check_beat_the_recommender({**RECOMMENDED, "remat": ...}).status == "unanswered"
    assert "exactly the keys" in workshop.check_beat_the_recommender({"mode": "dp"}).message


def test_a_layout_that_does_not_fit_fails_however_fast():
    seven_b = {"d_model": 8192, "n_layers": 8, "n_heads": 64, "vocab": 32000, "max_len": 2048}  # 111 GB under dp
    fleet = {**workshop.BEAT_FLEET, "model_options": seven_b, "target": "gpu:h100:8", "global_batch": 16}
    result = workshop.check_beat_the_recommender({"mode": "dp", "mesh": "data=8", "remat": "none", "accum": 1}, fleet)
    assert result.status == "failed" and "does not fit is no step" in result.message, result.message


def test_notebook_03s_layout_answer_passes_and_its_exercise_starts_unanswered():
    answer, exercise = _answer_and_exercise(DEBUG_LAYOUTS, "beat-the-recommender")
    assert workshop.check_beat_the_recommender(answer["ANSWER_LAYOUT"]).passed
    assert workshop.check_beat_the_recommender(exercise["ANSWER_LAYOUT"]).status == "unanswered"
