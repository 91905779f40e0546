"""The reference check on 8 simulated devices: every data-parallel mode passes, every teaching fault is
caught and named, and the causes come from measurements (a user's own buggy step is diagnosed too)."""

from __future__ import annotations

import itertools
import json

import pytest
from jax import lax

import workbench as wb
from workbench.cli.main import main
from workbench.errors import WorkbenchError
from workbench.training.modes import DATA_PARALLEL_MODES, FAULTS, StepSetup, build_mode, modes_supporting
from workbench.training.modes.core import init_state
from workbench.training.modes.dp_shard_map import ShardMapDataParallel
from workbench.analysis.reference_check import reference_check, run_check

SMALL = {"hidden": 32}
# same-shard needs several processes: tests/test_distributed.py catches it across two.
FAULT_PAIRS = [(mode, fault) for fault in FAULTS if fault != "same-shard"
               for mode in modes_supporting(fault) if mode in DATA_PARALLEL_MODES]


def _check(mode: str, faults=(), **options):
    return run_check(mode, mesh="data=4", batch=32, faults=faults, model_options=SMALL, **options)


@pytest.mark.parametrize("mode", DATA_PARALLEL_MODES)
def test_every_data_parallel_mode_matches_single(mode):
    report = _check(mode)
    assert report.verdict == "ok", report.to_text()
    assert abs(report.grad_scale - 1.0) < 1e-4
    assert report.replica_divergence == 0.0
    assert report.max_param_diff < 1e-6
    assert len(report.param_diffs) == 3


def test_every_supported_pair_is_tested():
    # Each fault makes sense somewhere; optimizer-reset anywhere.
    assert {fault for _, fault in FAULT_PAIRS} == set(FAULTS) - {"same-shard"}
    assert set(modes_supporting("optimizer-reset")) >= set(DATA_PARALLEL_MODES)


@pytest.mark.parametrize(("mode", "fault"), FAULT_PAIRS)
def test_each_fault_is_caught_and_named(mode, fault):
    report = _check(mode, [fault])
    assert report.verdict == "problem"
    causes = {cause for finding in report.problems for cause in finding.causes}
    assert fault in causes, report.to_text()
    # The most likely cause of the decisive finding is the fault itself (psum and the double count
    # give the same numbers; where both can happen, the ledger decides).
    decisive = report.problems[-1]
    assert (decisive.causes[0] == fault
            or {decisive.causes[0], fault} == {"psum", "vma-double-count"} and mode == "simulated")
    assert decisive.explanation == FAULTS[decisive.causes[0]].explanation


@pytest.mark.parametrize(("mode", "fault"), [("dp-shard-map", "psum"), ("dp-shard-map", "vma-double-count"),
                                             ("dp-pmap", "psum"), ("simulated", "psum")])
def test_summed_gradients_are_n_times_too_large(mode, fault):
    report = _check(mode, [fault])
    finding = report.problems[0]
    assert finding.name == "grad-scale"
    assert report.grad_scale == pytest.approx(4.0, rel=1e-5)
    assert finding.causes[0] == fault  # dp-shard-map: told apart by the ledger's all-reduce bytes


def test_skip_sync_shows_as_replica_divergence():
    report = _check("dp-pmap", ["skip-sync"])
    names = [p.name for p in report.problems]
    assert names == ["grad-scale", "replica-divergence", "update-mismatch"]
    assert report.replica_divergence > 1e-4
    assert report.problems[1].causes == ("skip-sync",)


def test_optimizer_reset_matches_at_step_one_and_differs_after():
    report = _check("dp", ["optimizer-reset"])
    assert report.param_diffs[0] < 1e-6 < report.param_diffs[1]
    assert [p.name for p in report.problems] == ["update-mismatch"]
    assert report.fault_residuals["optimizer-reset"] < 1e-6


def test_optimizer_reset_is_harmless_without_optimizer_state():
    # Plain SGD has no state to lose: the check must not invent a problem.
    assert _check("dp", ["optimizer-reset"], optimizer="sgd", lr=0.1).verdict == "ok"


class _UsersShardMapStep(ShardMapDataParallel):
    """A user's own step with the shard_map recipe as commonly written: no pcast, then pmean.
    No fault switch is set: the check must infer the cause from what it measures."""

    def _local_sums(self, params, other, shard):
        from workbench.training.modes.base import step_sums

        sums = step_sums(self.setup, params, other, shard)
        return {"grads": lax.pmean(sums["grads"], "data"), "metrics": lax.pmean(sums["metrics"], "data"),
                "weight": lax.pmean(sums["weight"], "data")}


def test_bf16_with_adam_is_judged_on_the_rms_difference():
    """A correct bf16 + Adam step passes (a few near-zero gradients round to the other sign and Adam
    steps those parameters by -lr instead of +lr), and a lost optimizer state is still caught."""
    options = dict(precision="bf16", accum=2, optimizer="adam", lr=1e-3)
    report = _check("dp", **options)
    assert report.verdict == "ok", report.to_text()
    # The max would flag it:
    assert report.max_param_diff > 10 * wb.analysis.reference_check.UPDATE_TOLERANCE * report.reference_step
    assert max(report.param_rms_diffs) < 0.1 * report.reference_rms_step
    assert "RMS diff (bf16)" in report.to_text()
    broken = _check("dp", faults=["optimizer-reset"], **options)
    assert [p.name for p in broken.problems] == ["update-mismatch"], broken.to_text()
    assert broken.problems[0].causes[0] == "optimizer-reset"
    assert "under bf16 the RMS difference" in broken.problems[0].message


def test_a_users_own_buggy_step_is_diagnosed_from_measurements():
    dataset = wb.load_dataset("digits")
    model = wb.training.model_config_for_data("mlp", dataset, **SMALL).build(seed=0)
    tx = wb.training.make_optimizer("adam", 1e-3)
    graphdef, state = init_state(model, tx)
    users = _UsersShardMapStep(StepSetup(graphdef, type(model).loss, tx, wb.parse_mesh("data=4"), 32))
    assert users.faults == ()
    report = reference_check(users, state, list(itertools.islice(dataset.batches(32, seed=0), 3)))
    assert report.grad_scale == pytest.approx(4.0, rel=1e-5)
    assert report.problems[0].causes[0] == "vma-double-count"


def test_bad_fault_requests_are_refused_before_compiling():
    with pytest.raises(WorkbenchError, match="unknown fault 'bogus'"):
        _check("dp", ["bogus"])
    with pytest.raises(WorkbenchError, match="does not apply to mode 'dp'.*simulated, dp-shard-map or dp-pmap"):
        _check("dp", ["psum"])
    with pytest.raises(WorkbenchError, match="at least 3"):
        _check("dp", steps=2)
    with pytest.raises(WorkbenchError, match="skip-sync"):
        wb.TrainConfig(mode="dp", faults=("skip-sync",)).validated()


def test_faults_are_off_unless_asked_for():
    assert wb.TrainConfig().validated().faults == ()
    setup = StepSetup(None, None, None)
    assert setup.faults == ()
    assert build_mode("dp", StepSetup(None, None, None, wb.parse_mesh("data=4"), 32)).faults == ()


def test_check_cli_json_contract_and_exit_status(capsys):
    assert main(["check", "--mode", "dp", "--mesh", "data=4", "--batch", "32", "--model-options", "hidden=32",
                 "--json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    for key in ("mode", "mesh", "verdict", "problems", "grad_scale", "max_param_diff", "replica_divergence",
                "per_replica_grad_norms", "synced_grad_norm", "param_bytes", "collectives"):
        assert key in ok
    assert ok["verdict"] == "ok" and ok["mesh"] == {"data": 4} and abs(ok["grad_scale"] - 1) < 1e-4
    assert len(ok["per_replica_grad_norms"]) == 4
    (reduce,) = [c for c in ok["collectives"] if c["kind"] == "all-reduce" and c["bytes"] > 1000]
    assert reduce["axes"] == ["data"] and abs(reduce["bytes"] / ok["param_bytes"] - 1) < 0.02

    assert main(["check", "--mode", "dp-shard-map", "--mesh", "data=4", "--batch", "32", "--inject", "psum",
                 "--model-options", "hidden=32", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["verdict"] == "problem"
    assert bad["problems"][0]["name"] == "grad-scale" and "psum" in bad["problems"][0]["causes"]
    assert all({"name", "causes", "message"} <= set(p) for p in bad["problems"])

    assert main(["check", "--mode", "dp", "--inject", "nope"]) == 2
    assert "unknown fault 'nope'" in capsys.readouterr().err
    assert main(["check", "--mode", "dp", "--mesh", "data=3", "--batch", "32"]) == 2
    assert "batch" in capsys.readouterr().err


def test_training_with_skip_sync_streams_replica_divergence(tmp_path):
    trainer = wb.Trainer(wb.TrainConfig(mode="dp-pmap", mesh="data=4", steps=20, batch=32, log_every=10,
                                        sync_every=10, faults=("skip-sync",), model_options=SMALL), run_root=tmp_path)
    trainer.run()
    syncs = [e for e in trainer.history if e.kind == "sync"]
    assert syncs and syncs[-1].data["replica_divergence"] > 0
    assert wb.load_run(trainer.run_path).config["faults"] == ["skip-sync"]
