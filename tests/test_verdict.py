"""The run verdict: no ✓ for anything Start, Check or Verify then refuses, on this machine's 8 devices.

A walk over modes, meshes, batches, microbatches and faults compares what the verdict says with what the
trainer's own build (what Start and Check run) and Verify's own check do, and the widgets' tabs with each other.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workbench as wb
from workbench.analysis.verdict import batch_fixes, mesh_within
from workbench.training.modes import MODES  # every registered mode
from workbench.training.modes.base import ShardedJitMode
from workbench.training.step import build_step
from widgets import Workbench

MESHES = ("data=8", "data=4,model=2", "model=8", "data=3", "data=16", "data=512")
BATCHES = (64, 100)
COMBINATIONS = [
    wb.TrainConfig(mode=mode, mesh=mesh, batch=batch, accum=accum, faults=faults)
    for mode, mesh, batch, (accum, faults) in itertools.product(
        MODES, MESHES, BATCHES, [(1, ()), (2, ()), (1, ("psum",)), (1, ("bogus",))])
]


def _outcome(action) -> str | None:
    """None if ``action()`` goes through, else its WorkbenchError's message."""
    try:
        action()
    except wb.WorkbenchError as error:
        return str(error)
    return None


@pytest.mark.parametrize("config", COMBINATIONS, ids=lambda c: f"{c.mode}-{c.mesh}-b{c.batch}-a{c.accum}-{c.faults}")
def test_what_the_verdict_lets_through_trains_and_what_it_refuses_nothing_runs(config):
    verdict = wb.training_verdict(config)
    trained = _outcome(lambda: build_step(config))  # what Start and Check build before anything runs
    verified = _outcome(lambda: wb.analysis.validate_verifiable(config, "cpu"))

    assert verdict.level in ("ok", "warning", "plan", "error")
    if verdict.trains:
        assert trained is None, f"the verdict said {verdict.level} but the trainer refused: {trained}"
    else:
        assert trained is not None, f"the verdict said {verdict.level} ({verdict.message}) but the trainer builds it"
    if verdict.level == "error":
        assert trained == verdict.message  # the trainer's words, word for word
        assert verified == verdict.message  # Verify refuses the same, in the same words
    elif verified is not None:  # Verify refuses only what it cannot compile: a mode that is not one program
        assert not issubclass(wb.training.mode_class(config.mode), ShardedJitMode), verified
    if verdict.level == "plan":
        assert "plan and verify only" in verdict.message and [fix.mesh for fix in verdict.fixes]
    for fix in verdict.fixes:  # every fix leads somewhere that runs, or at least plans
        fixed = wb.training_verdict(wb.TrainConfig(
            mode=fix.mode or config.mode, mesh=fix.mesh or config.mesh, batch=fix.batch or config.batch,
            accum=config.accum, faults=config.faults if fix.mode is None else ()))
        assert fixed.level != "error" or fixed.message != verdict.message, (fix, fixed.message)


def test_the_batch_of_the_issue_is_plan_only_with_a_batch_that_fits_and_start_refuses_it_in_one_line(tmp_path):
    config = wb.TrainConfig(batch=10**9)
    verdict = wb.training_verdict(config, available_memory=16 * 2**30)
    assert verdict.level == "plan" and "a batch of 1,000,000,000 needs about" in verdict.message
    fits = verdict.fixes[0].batch
    assert fits % 8 == 0 and wb.training_verdict(wb.TrainConfig(batch=fits), available_memory=16 * 2**30).trains
    with pytest.raises(wb.WorkbenchError, match="needs about .* of this machine's memory for its data"):
        wb.Trainer(config, run_root=str(tmp_path)).start()  # refused before any batch is made
    assert not list(tmp_path.iterdir())  # nothing was written either


def test_unknown_faults_and_a_mesh_larger_than_the_machine_are_never_ok():
    verdict = wb.training_verdict(wb.TrainConfig(faults=("bogus",)))
    assert verdict.message.startswith("unknown fault 'bogus': choose from")
    large = wb.training_verdict(wb.TrainConfig(mesh="data=4096", batch=4096))
    assert large.level == "plan" and "4,096 devices and this machine has 8 simulated CPU devices" in large.message
    assert [fix.mesh for fix in large.fixes] == ["data=8"]
    wasteful = wb.training_verdict(wb.TrainConfig(mesh="data=64,model=8", mode="dp"))
    assert wasteful.level == "plan" and "identical copies" in wasteful.notes[0]
    assert [fix.mesh for fix in wasteful.fixes] == ["data=8"]  # shrunk for the mode, not to data=1,model=8


def test_model_options_the_data_contradicts_are_planned_and_verified_but_never_trained():
    # notebook 03 verifies a transformer sized for a real vocabulary; only the trainer needs data that fits it
    config = wb.TrainConfig(model="transformer", data="text", model_options={"vocab": 1024}, mesh="data=8", batch=64)
    verdict = wb.training_verdict(config)
    assert verdict.level == "plan" and "vocab=1024 does not fit data 'text'" in verdict.message
    assert wb.analysis.validate_verifiable(config, "cpu").model_options == {"vocab": 1024}
    with pytest.raises(wb.WorkbenchError, match="vocab=1024 does not fit data 'text'"):
        build_step(config)
    other_kind = wb.training_verdict(wb.TrainConfig(model="transformer", data="digits", mesh="data=8"))
    assert other_kind.level == "plan" and "trains on language data, but data 'digits'" in other_kind.message


@pytest.mark.parametrize(("mesh", "mode", "batch"), [
    ("data=8", "dp", 64), ("data=4096", "dp", 256), ("data=4096", "dp", 4096), ("data=8", "dp", 100),
    ("data=4,model=2", "dp", 64), ("data=8", "tp", 64),
])
def test_every_tab_shows_the_same_verdict_and_only_ok_gets_a_tick(mesh, mode, batch):
    bench = Workbench(mesh=mesh, mode=mode)
    bench.selection.options = {**bench.selection.options, "batch": batch}
    expected = wb.training_verdict(bench.selection._config())
    lines = {tab: verdict.line.value for tab, verdict in (("model & mode", bench.mode_selector.verdict),
                                                           ("inspect", bench.inspector.verdict),
                                                           ("train", bench.dashboard.verdict))}
    assert len(set(lines.values())) == 1, lines
    assert all(verdict.fit == expected for verdict in (bench.mode_selector.verdict, bench.inspector.verdict,
                                                      bench.dashboard.verdict))
    if expected.level != "ok":  # no ✓ anywhere: not in the verdict, not in a status line under it
        assert "✓" not in next(iter(lines.values()))
        for status in (bench.mode_selector.status, bench.inspector.status):
            assert status.last is None or status.last[0] != "ok", status.last
    verify_refuses = bench.inspector.verification.verify_button.disabled
    refusal = _outcome(lambda: wb.analysis.validate_verifiable(bench.selection._config(), "cpu"))
    assert verify_refuses == (refusal is not None)
    assert verify_refuses or expected.level != "error"
    bench.close()


@given(st.lists(st.integers(1, 64), min_size=1, max_size=3), st.integers(1, 64))
def test_a_mesh_shrunk_for_the_machine_fits_it_and_keeps_its_axes(sizes, devices):
    mesh = wb.MeshShape(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))
    shrunk = mesh_within(mesh, devices)
    assert shrunk.names == mesh.names and shrunk.size <= max(devices, 1)
    assert all(1 <= new <= old for new, old in zip(shrunk.sizes, mesh.sizes, strict=True))
    if mesh.size <= devices:
        assert shrunk == mesh


@given(st.integers(1, 10**6), st.integers(1, 4096))
def test_batch_fixes_split_and_sit_next_to_the_batch(batch, unit):
    fixes = batch_fixes(batch, unit)
    assert fixes and all(fix.batch % unit == 0 and abs(fix.batch - batch) < unit for fix in fixes)
