"""Each mode's declaration is the one source of its facts: the planner, the ledger's theory and the mesh
verdict are derived from it, and they agree with what the mode really builds and compiles (8 devices)."""

from __future__ import annotations

import jax
import pytest

import workbench as wb
from helpers import mode_mesh
from workbench.training.modes import MODES, mode_class
from workbench.training.modes.base import MODEL_SPLIT_PLACEMENTS, ParallelMode, validate_declaration
from workbench.training.step import build_step

SMALL = {"transformer": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "mlp": {"hidden": 32}, "cnn": {}, "linear": {}}
PAIRS = [(mode, model) for mode in MODES for model in SMALL
         if not (mode_class(mode).state_placement in MODEL_SPLIT_PLACEMENTS and model == "linear")]


def _config(mode: str, model: str, **changes) -> wb.TrainConfig:
    fields = {"model": model, "data": wb.analysis.default_data(model), "mode": mode, "mesh": mode_mesh(mode),
              "batch": 16, "model_options": SMALL[model], **changes}
    return wb.TrainConfig(**fields)


def _specs(layout: wb.layout.TreeLayout, prefix: str = "") -> dict:
    return {prefix + leaf.path: leaf.layout.spec for leaf in layout.leaves}


@pytest.mark.parametrize(("mode", "model"), PAIRS)
def test_planner_places_the_state_as_the_mode_builds_it(mode, model):
    built = build_step(_config(mode, model))
    placed = built.mode.state_layout(built.state)  # what place_state puts on the devices
    built_specs = {path: spec for path, spec in _specs(placed).items() if not path.startswith("other/")}
    plan = wb.plan_training(model, built.model_options, built.config.mesh, mode, optimizer=built.config.optimizer,
                            hardware="cpu", precision="fp32", global_batch=16)
    planned = {**_specs(plan.params_layout, "params/"), **_specs(plan.opt_state_layout, "opt_state/")}
    assert planned == built_specs


@pytest.mark.parametrize(("mode", "model"), [(m, n) for m, n in PAIRS if m != "simulated"])
def test_declared_collectives_are_the_compiled_ones(mode, model):
    ledger = wb.ledger_for_config(_config(mode, model))
    compiled = {(c.kind, c.axes) for c in ledger.collectives if c.axes}
    declared = {(need.kind, (need.axis,)) for need in mode_class(mode).collectives}
    assert compiled == declared


def test_theory_and_selector_text_come_from_the_declaration():
    for mode in MODES:
        declared = mode_class(mode).collectives
        assert [(e["kind"], e["axes"], e["what"]) for e in wb.analysis.theoretical_collectives(mode, 1000)] == [
            (n.kind, [n.axis], n.what) for n in declared]
    assert wb.training.DATA_PARALLEL_MODES == tuple(m for m in MODES if "model" not in mode_class(m).axes)


def test_a_mode_that_leaves_a_fact_undeclared_is_refused():
    class Half(ParallelMode):
        name, summary, axes = "half", "a mode in progress", ("data",)
        supported_faults = ("optimizer-reset",)

    with pytest.raises(TypeError, match="declares no sharded.*declares no mesh_example.*why it cannot carry skip-sync"):
        validate_declaration(Half)


@pytest.mark.parametrize(("mode", "mesh", "level", "fixes"), [
    ("dp", "data=8", "ok", []),
    ("dp", "data=4,model=2", "warning", [("dp-tp", None), (None, "data=8")]),
    ("fsdp", "data=64,model=8", "warning", [("dp-tp", None), (None, "data=512")]),  # planning scale: axes only
    ("dp-pmap", "data=4,model=2", "error", [("dp-tp", None), (None, "data=8")]),
    ("tp", "data=8", "error", [("dp", None), (None, "model=8")]),
    ("dp-tp", "data=8", "error", [("dp", None), (None, "data=4,model=2")]),
    ("single", "data=4,model=2", "ok", []),
])
def test_mesh_verdict_and_its_fixes(mode, mesh, level, fixes):
    fit = wb.mesh_fit(mode, mesh)
    assert fit.level == level and [(f.mode, f.mesh) for f in fit.fixes] == fixes
    for fix in fit.fixes:  # every fix offered is itself a pair that trains
        assert wb.mesh_fit(fix.mode or mode, fix.mesh or mesh).ok


def test_trainer_planner_and_verdict_agree_on_every_pair():
    for mode in MODES:
        for mesh in ("data=8", "model=2", "data=4,model=2"):
            fit = wb.mesh_fit(mode, mesh)
            config = wb.TrainConfig(model="mlp", mode=mode, mesh=mesh, batch=64, steps=1)
            if fit.ok:
                wb.plan_training("mlp", {}, mesh, mode, hardware="cpu", global_batch=64)
                build_step(config)
            else:
                with pytest.raises(wb.MeshError, match=fit.message[:40]):
                    wb.plan_training("mlp", {}, mesh, mode, hardware="cpu", global_batch=64)
                with pytest.raises(wb.MeshError, match=fit.message[:40]):
                    build_step(config)


def test_a_data_mode_on_a_2d_mesh_trains_exactly_and_says_so():
    reference = wb.Trainer(wb.TrainConfig(mode="single", steps=3, batch=64, optimizer="sgd", lr=0.1, eval_every=0,
                                          sync_every=0), run_root="/tmp/wb-test-runs").run()
    summary = wb.Trainer(wb.TrainConfig(mode="dp", mesh="data=4,model=2", steps=3, batch=64, optimizer="sgd", lr=0.1,
                                        eval_every=0, sync_every=0), run_root="/tmp/wb-test-runs").run()
    assert summary["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
    plan = wb.plan_training("mlp", {}, "data=4,model=2", "dp", hardware="cpu", global_batch=64)
    assert any("identical copies" in note for note in plan.notes)


def test_check_verifies_exactly_the_step_trained():
    """Regression: Check used to build fp32, accum=1 whatever the Train tab had selected."""
    config = wb.TrainConfig(mode="dp", mesh="data=4", batch=32, precision="bf16", accum=2, optimizer="adam", lr=1e-3,
                            model_options={"hidden": 32})
    trainer = wb.Trainer(config, run_root="/tmp/wb-test-runs")
    report = wb.run_check(trainer)  # what the Train tab's Check does
    assert (report.precision, report.accum, report.batch) == ("bf16", 2, 32)
    assert report.verdict == "ok", report.to_text()
    assert report.ledger is not None and report.ledger.bytes_by_kind().get("all-reduce", 0) > 0
    same = wb.run_check(config)  # the config alone builds the same step
    assert (same.precision, same.accum) == ("bf16", 2)
    assert same.param_diffs == pytest.approx(report.param_diffs, abs=0)
    assert jax.tree.structure(trainer.build().state) == jax.tree.structure(build_step(config).state)
