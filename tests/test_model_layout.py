"""Model layouts on meshes of any size (what the inspector draws) and the compiled step's ledger for a config."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.analysis.model_layout import default_data, model_layout, standard_rules
from workbench.analysis.step_ledger import ledger_for_config


def test_modes_standard_specs():
    assert standard_rules("mlp", "data=8", "dp").to_text() == ".* => P()"
    fsdp = model_layout("mlp", "data=8", "fsdp")
    assert wb.layout.format_spec(fsdp.params.leaf("hidden1/kernel").layout.spec) == "None, data"
    assert fsdp.params.leaf("output/bias").layout.replication == 8  # 10 classes do not split 8 ways
    # Adam's moments follow their parameters (the rules match the paths' ends).
    mu = next(leaf for leaf in fsdp.opt_state.leaves if leaf.path.endswith("mu/hidden1/kernel"))
    assert mu.layout.spec == fsdp.params.leaf("hidden1/kernel").layout.spec


def test_batch_is_split_as_the_mode_splits_it():
    assert model_layout("mlp", "data=8", "dp", batch=64).batch.leaf("x").layout.shard_shape == (8, 64)
    assert model_layout("mlp", "model=2", "tp", batch=64).batch.leaf("x").layout.shard_shape == (64, 64)
    assert model_layout("transformer", "data=4,model=2", "dp-tp", batch=32).batch.leaf("x").layout.shard_shape[0] == 8


def test_custom_rules_replace_the_modes_and_report_matches():
    layout = model_layout("mlp", "data=4,model=2", "dp", rules="kernel$ => None, model\nnever => data\n.* => P()")
    assert layout.rule_matches()[1] == []
    assert sorted(layout.rule_matches()[0]) == ["hidden1/kernel", "hidden2/kernel", "output/kernel"]
    with pytest.raises(wb.SpecError, match="leaf 'hidden1/bias'"):
        model_layout("mlp", "data=8", "dp", rules=[(".*", "model")])


def test_a_production_mesh_is_laid_out_without_devices():
    layout = model_layout("transformer", "data=64,model=8", "dp-tp")
    assert layout.mesh.size == 512
    assert sum(layout.bytes_per_device().values()) > 0
    slices = layout.device_slices(511)
    assert len(slices) == len(layout.params.leaves) + len(layout.opt_state.leaves) + len(layout.batch.leaves)
    with pytest.raises(wb.WorkbenchError, match="device 512 is not on mesh"):
        layout.device_slices(512)


def test_device_slices_match_the_array_layouts():
    layout = model_layout("mlp", "data=8", "fsdp")
    row = next(r for r in layout.device_slices(3) if r["path"] == "hidden1/kernel" and r["tree"] == "params")
    assert row["index"] == [list(i) for i in layout.params.leaf("hidden1/kernel").layout.devices[3].index]


def test_the_combined_tree_holds_every_leaf_by_tree():
    layout = model_layout("mlp", "data=8", "fsdp")
    combined = layout.combined()
    assert combined.group_bytes_per_device(1) == layout.bytes_per_device()
    assert combined.leaf("params/hidden1/kernel").layout is layout.params.leaf("hidden1/kernel").layout


def test_default_data():
    assert ([default_data(m) for m in ("linear", "mlp", "cnn", "transformer")]
            == ["regression", "digits", "digits", "text"])


def test_ledger_for_a_config_compiles_without_training():
    ledger = ledger_for_config(wb.TrainConfig(mode="dp", mesh="data=4", batch=32, model_options={"hidden": 32}))
    assert ledger.bytes_by_kind()["all-reduce"] > 0 and ledger.memory["argument_bytes"] > 0
    with pytest.raises(wb.WorkbenchError, match="several programs"):
        ledger_for_config(wb.TrainConfig(mode="simulated", mesh="data=4", batch=32))
