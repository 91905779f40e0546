"""A config is read once, where it enters: the mesh text parsed once, the mode name looked up once.

The real functions are wrapped and counted at every module that imported them (nothing is replaced):
one ``Trainer.run()`` and one ``plan_training()`` each parse their mesh text once and resolve their mode
once; below that, everything takes the records (:class:`~workbench.training.config.ResolvedConfig`).
"""

from __future__ import annotations

import sys

import jax
import pytest

import workbench as wb
from workbench.layout import mesh as mesh_module
from workbench.training import modes as modes_module
from workbench.training.config import ResolvedConfig, resolve_config
from workbench.training.modes import StepSetup
from workbench.training.step import validate_mesh_for_training


def _count(monkeypatch, function, when=lambda *args: True) -> list[tuple]:
    """The arguments of every call of ``function`` for which ``when(*args)`` holds, from any workbench module
    that holds it (``from x import f`` copies the name: each copy is wrapped), the real function still run."""
    calls: list[tuple] = []

    def counted(*args, **kwargs):
        if when(*args):
            calls.append(args)
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        # vars(), not getattr(): the moved-name shim on `workbench` is not an attribute that a call site reads.
        if name.startswith("workbench") and vars(module).get(function.__name__) is function:
            monkeypatch.setattr(module, function.__name__, counted)
    return calls


def _text_parses(monkeypatch) -> list[tuple]:
    return _count(monkeypatch, mesh_module.parse_mesh, lambda value, *rest: isinstance(value, str))


def _mode_lookups(monkeypatch) -> list[tuple]:
    return _count(monkeypatch, modes_module.mode_class)


def _resolutions(monkeypatch) -> list[object]:
    calls: list[object] = []
    resolved = wb.TrainConfig.resolved

    def counted(self):
        calls.append(self)
        return resolved(self)

    monkeypatch.setattr(wb.TrainConfig, "resolved", counted)
    return calls


def test_a_training_run_parses_its_mesh_and_resolves_its_mode_once(monkeypatch, tmp_path):
    parses, lookups, resolutions = _text_parses(monkeypatch), _mode_lookups(monkeypatch), _resolutions(monkeypatch)
    config = wb.TrainConfig(mode="fsdp", mesh="data=8", steps=3, batch=64, eval_every=0, sync_every=0)
    summary = wb.Trainer(config, run_root=str(tmp_path)).run()
    assert summary["steps"] == 3 and summary["mesh"] == {"data": 8}  # it trained, on the mesh asked for
    assert parses == [("data=8",)]
    assert lookups == [("fsdp",)]
    assert len(resolutions) == 1


def test_a_plan_parses_its_mesh_and_resolves_its_mode_once(monkeypatch):
    parses, lookups = _text_parses(monkeypatch), _mode_lookups(monkeypatch)
    plan = wb.plan_training("mlp", {"hidden": 64}, "data=4,model=2", "fsdp", hardware="cpu")
    assert plan.memory is not None  # the step was traced too: build_abstract_step took the planner's records
    assert parses == [("data=4,model=2",)]
    assert lookups == [("fsdp",)]


def test_the_resolved_record_holds_the_parsed_mesh_and_the_classes():
    resolved = wb.TrainConfig(model="mlp", mode="dp-tp", mesh=" data=4 , model=2").resolved()
    assert resolved.config == wb.TrainConfig(model="mlp", mode="dp-tp", mesh="data=4 , model=2").validated()
    assert resolved.config.mesh == "data=4,model=2" and resolved.mesh_shape == wb.parse_mesh("data=4,model=2")
    assert resolved.mode_class is wb.training.mode_class("dp-tp")
    assert resolved.model_class is wb.training.model_class("mlp")
    assert resolve_config(resolved) is resolved
    custom = wb.TrainConfig(model="custom:Mine").resolved()
    assert isinstance(custom, ResolvedConfig) and custom.model_class is None


def test_a_bad_config_is_refused_with_the_same_words_when_resolved_or_checked():
    for bad in (wb.TrainConfig(mode="ddp"), wb.TrainConfig(mesh="data=x"), wb.TrainConfig(model="gpt")):
        with pytest.raises(wb.WorkbenchError) as checked:
            bad.validated()
        with pytest.raises(wb.WorkbenchError) as resolved:
            bad.resolved()
        assert str(checked.value) == str(resolved.value) and str(checked.value)


def test_a_step_plan_takes_a_parsed_mesh_never_text():
    with pytest.raises(wb.WorkbenchError, match=r"pass parse_mesh\('data=8'\)"):
        StepSetup(None, None, None, "data=8", 64)
    assert StepSetup(None, None, None, wb.parse_mesh("data=8"), 64).mesh.size == 8


def test_checking_a_mesh_for_training_builds_no_mesh(monkeypatch):
    built = _count(monkeypatch, mesh_module.build_mesh)
    validate_mesh_for_training(wb.TrainConfig(mode="dp", mesh="data=8", batch=64))
    with pytest.raises(wb.MeshError, match="needs 16 devices but JAX has"):
        validate_mesh_for_training(wb.TrainConfig(mode="dp", mesh="data=16", batch=64))
    with pytest.raises(wb.MeshError, match="needs 8 devices but 4 were given: pass exactly 8 devices"):
        validate_mesh_for_training(wb.TrainConfig(mode="dp", mesh="data=8", batch=64), jax.devices()[:4])
    assert built == []


def test_a_verified_plan_reads_its_mesh_and_mode_once_in_this_process(monkeypatch):
    parses, lookups = _text_parses(monkeypatch), _mode_lookups(monkeypatch)
    plan = wb.plan_training("mlp", {"hidden": 64}, "data=8", "dp", hardware="cpu", verify="cpu")
    assert parses == [("data=8",)]
    assert lookups == [("dp",)]
    assert plan.compiled.devices == 8  # compiled in a child, which reads the config's JSON (reading text: after)
