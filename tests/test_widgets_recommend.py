"""The Recommend tab, headless, with the real engine: it recommends a layout for a small transformer on the 8
simulated CPU devices (the best one compiled), "Use this layout" sets the selection every other tab shows,
Cancel stops a running recommendation and leaves no child process, and bad input is shown inline with the last
answer kept.

Waits are generous and nothing is timed: the machine may be busy.
"""

from __future__ import annotations


import pytest

import workbench as wb
from widgets.common import Selection
from widgets.recommend_panel import RecommendPanel
from widgets.verify_panel import VerifyPanel
from widgets.workbench_widget import Workbench
from helpers import TWO_LAYER_BATCH, TWO_LAYER_RULES, TableRows, TwoLayer, child_processes, my_loss, poll

WAIT_S = 600  # a compile in a child process: seconds when quiet, far more on a busy machine
SMALL = {"d_model": 32, "n_heads": 4, "n_layers": 1, "vocab": 32, "max_len": 16}


def _last(panel: RecommendPanel) -> tuple[str, str]:
    """The panel's last (level, text) status: one was shown."""
    last = panel.status.last
    assert last is not None
    return last


def _panel(**inputs) -> RecommendPanel:
    selection = Selection(model="transformer", model_options=SMALL, mesh="data=8", mode="dp",
                          options={"optimizer": "sgd", "precision": "fp32"})
    panel = RecommendPanel(selection)
    panel.target.value, panel.batch.value, panel.seq_len.value, panel.top.value = "cpu", 64, 16, 1
    for name, value in inputs.items():
        getattr(panel, name).value = value
    return panel


@pytest.fixture(scope="module")
def recommended():
    """One panel that has recommended (its best layout compiled): the tests read it, none changes its answer."""
    bench = Workbench(model="transformer", mesh="data=8")
    panel = bench.recommender
    bench.selection.model_options = SMALL
    bench.selection.options = {"optimizer": "sgd", "precision": "fp32", "batch": 64}
    panel.target.value, panel.batch.value, panel.seq_len.value, panel.top.value = "cpu", 64, 16, 1
    panel.recommend()
    assert panel.running
    answer = panel.wait(WAIT_S)
    assert answer is not None, panel.status.messages
    yield bench
    bench.close()


def test_the_tab_recommends_a_compiled_layout_and_explains_it(recommended):
    panel = recommended.recommender
    answer = panel.recommendation
    assert answer is not None and answer.devices == 8 and answer.chosen.verified
    level, text = _last(panel)
    assert level == "ok" and "verified by the compiler" in text
    assert "transformer on cpu (8 chips), batch 64 x 16 tokens, sgd, fp32" in panel.table.value
    table = TableRows()
    table.feed(panel.table.value)
    header, *rows = table.rows
    assert header[1:] == answer.table_cells()[0]
    assert [row[1:] for row in rows] == answer.table_cells()[1] and rows[0][0] == "▶"  # the chosen one marked
    if len(rows) > 1:  # picking another candidate moves the mark to its row
        panel.pick.value = 1
        table = TableRows()
        table.feed(panel.table.value)
        assert [row[0] for row in table.rows[1:3]] == ["", "▶"]
        panel.pick.value = 0
    names = {trace.name for trace in panel.figure.data}
    assert "chosen" in names and answer.chosen.mode in names
    assert all(f"{family.mode} ({family.verdict})" in panel.families.value for family in answer.rejected)
    assert not panel.running and not panel.recommend_button.disabled and panel.cancel_button.disabled


def test_use_this_layout_sets_the_selection_the_other_tabs_show(recommended):
    panel, selection = recommended.recommender, recommended.selection
    candidate = panel.recommendation.candidates[1]  # a picked one, not only the chosen
    panel.pick.value = 1
    panel.use_button.click()
    assert (selection.mode, selection.mesh) == (candidate.mode, str(candidate.mesh))
    assert selection.options["accum"] == candidate.accum and selection.options["remat"] == candidate.remat
    assert selection.options["batch"] == 64 and selection.options["optimizer"] == "sgd"
    assert recommended.mode_selector.mode.value == candidate.mode
    assert recommended.mesh_picker.mesh_text.value.replace(" ", "") == str(candidate.mesh).replace(" ", "")
    assert selection.train_config().mesh == str(candidate.mesh)
    level, text = _last(panel)
    assert level == "ok" and "Train trains it here" in text
    assert not panel.is_stale and panel.stale.value == ""  # using the answer does not make it stale


def test_the_answer_is_marked_stale_when_the_selected_model_changes(recommended):
    panel, selection = recommended.recommender, recommended.selection
    before = dict(selection.model_options)
    selection.model_options = {**before, "n_layers": before.get("n_layers", 2) + 1}
    try:
        assert panel.is_stale and "Stale: the answer below is for transformer" in panel.stale.value
        assert panel.recommendation is not None and panel.table.value  # the answer stays, marked
    finally:
        selection.model_options = before
    assert not panel.is_stale and panel.stale.value == ""


def test_export_shows_the_code_and_the_budget_test(recommended):
    panel = recommended.recommender
    panel.pick.value = 0
    panel.code_button.click()
    assert "CONFIG = " in panel.export.value and panel.export.layout.display is None
    panel.test_button.click()
    assert "def test_the_step_stays_within_its_budget" in panel.export.value


def test_exporting_a_test_for_an_unverified_layout_says_why_inline(recommended):
    panel = recommended.recommender
    shown = panel.export.value
    panel.pick.value = 1  # ranked below the compiled one: not verified
    panel.test_button.click()
    level, text = _last(panel)
    assert level == "error" and "no compiled figures" in text
    assert panel.export.value == shown


def test_your_own_module_is_recommended_compiled_and_exported_but_not_put_in_the_other_tabs():
    from flax import nnx

    own = wb.analysis.OwnModel(lambda: TwoLayer(nnx.Rngs(0)), my_loss, TWO_LAYER_BATCH, TWO_LAYER_RULES)
    selection = Selection(model="mlp", mesh="data=8", mode="dp")
    panel = RecommendPanel(selection, own=own)
    panel.target.value, panel.batch.value, panel.top.value = "cpu", 64, 1
    panel.recommend_button.click()
    answer = panel.wait(WAIT_S)
    assert answer is not None and answer.model == "TwoLayer" and answer.chosen.verified, panel.status.messages
    assert "TwoLayer on cpu" in panel.table.value and panel.use_button.disabled
    # The other tabs show registered models: the button is disabled, and a call from code says why.
    with pytest.raises(wb.WorkbenchError, match="not your TwoLayer: export this layout"):
        panel.use_layout()
    assert (selection.model, selection.mode) == ("mlp", "dp")  # the selection is left as it was
    panel.code_button.click()
    assert "SHARDING_RULES = [" in panel.export.value
    panel.test_button.click()  # a lambda: the test file could not import it, said inline with the fix
    level, text = _last(panel)
    assert level == "error" and "cannot be imported by a test file" in text and "imports=" in text
    panel.imports = {"model": "mypkg.models:make_two_layer", "loss": "mypkg.train:loss_fn"}
    panel.test_button.click()
    assert "from mypkg.models import make_two_layer" in panel.export.value
    assert "verify_plan(_plan(), settings, OwnModel(MODEL, LOSS, EXAMPLE_BATCH, RULES))" in panel.export.value
    panel.close()


def test_a_fleet_larger_than_this_machine_is_used_for_planning_and_the_status_says_training_cannot():
    panel = _panel(target="gpu:h100:16", top=0)
    panel.recommend()
    answer = panel.wait(WAIT_S)
    assert answer is not None and answer.devices == 16, panel.status.messages
    assert "compile" not in " ".join(text for _, text in panel.status.messages[:-1])
    panel.use_layout()
    assert panel.selection.mesh_shape().size == 16
    level, text = _last(panel)
    assert level == "warning" and "abstract mesh" in text and "needs 16 devices" in text
    assert not panel.selection.verdict().trains  # the Train tab refuses it, with its own verdict
    verify = VerifyPanel(panel.selection)  # the Inspect tab's: it compiles the 16-device step, nothing refused
    try:
        assert verify.readiness.value == "" and not verify.verify_button.disabled
        assert "gpu:h100:16" in verify.target.options
    finally:
        verify.close()


def test_cancel_stops_a_running_recommendation_and_leaves_no_child_process():
    panel = _panel(top=2)
    panel.recommend()
    assert poll(lambda: any(line.startswith("compiling") for line in panel._lines), timeout=WAIT_S)
    panel.cancel()
    assert panel.wait(60) is None and not panel.running
    assert panel.status.last == ("warning", "cancelled: the compiles were stopped; the last answer stays")
    assert poll(lambda: not child_processes(), timeout=30)
    assert not panel.recommend_button.disabled and panel.cancel_button.disabled


@pytest.mark.parametrize(("inputs", "said"), [
    ({"target": "tpu:v99:2x2"}, "unknown TPU generation 'v99'"),
    ({"batch": 3}, "use a batch of"),
    ({"batch": 0}, "must be a positive number"),
    ({"unit": "tokens", "seq_len": 0}, "needs a seq len"),
])
def test_bad_input_is_shown_inline_and_the_inputs_stay(inputs, said):
    panel = _panel(top=0, **inputs)
    panel.recommend_button.click()
    panel.wait(WAIT_S)
    level, text = _last(panel)
    assert level == "error" and said in text, text
    assert all(getattr(panel, name).value == value for name, value in inputs.items())
    assert panel.recommendation is None and not panel.recommend_button.disabled


def test_a_model_that_fits_nothing_says_what_would():
    panel = _panel(top=0)
    panel.selection.model_options = {"d_model": 8192, "n_heads": 64, "n_layers": 24, "vocab": 32000, "max_len": 16}
    panel.recommend()
    panel.wait(WAIT_S)
    level, text = _last(panel)
    assert level == "error" and "no layout fits" in text and "use a smaller model" in text, text
    assert panel.selection.model_options["d_model"] == 8192 and wb.parse_mesh(panel.selection.mesh).size == 8
