"""Model traits: the planner and the step-memory simulation read what a model's class declares, never its name,
so a new model declares its traits instead of editing them."""

from __future__ import annotations

import pytest

from workbench.analysis.planning import plan_training
from workbench.errors import WorkbenchError
from workbench.training import models
from workbench.training.models import TransformerLM, model_class

TRAITS = ("SEQUENCE_OPTION", "BLOCKS_OPTION", "TRANSFORMER_ESTIMATES")
SMALL_LM = {"n_layers": 4, "d_model": 64, "n_heads": 4, "vocab": 512}


class RenamedTransformer(TransformerLM):
    """The transformer under another name: only its traits can tell the planner how to count it."""

    NAME = "decoder"


@pytest.fixture
def decoder(monkeypatch):
    monkeypatch.setitem(models._REGISTRY, RenamedTransformer.NAME, RenamedTransformer)
    return RenamedTransformer.NAME


def traits(name: str) -> tuple:
    return tuple(getattr(model_class(name), trait) for trait in TRAITS)


def test_the_transformer_declares_its_traits_and_the_other_models_keep_the_defaults():
    assert traits("transformer") == ("max_len", "n_layers", True)
    assert {name: traits(name) for name in ("linear", "mlp", "cnn")} == {
        name: (None, None, False) for name in ("linear", "mlp", "cnn")
    }


def test_a_model_declaring_the_transformers_traits_is_planned_as_the_transformer(decoder):
    ours = plan_training(decoder, SMALL_LM, "data=4,model=2", "dp-tp", hardware="cpu", seq_len=64)
    reference = plan_training("transformer", SMALL_LM, "data=4,model=2", "dp-tp", hardware="cpu", seq_len=64)
    assert ours.activation_bytes is not None and ours.memory is not None  # estimated and simulated, as the transformer
    assert {**ours.to_json(), "model": "transformer"} == reference.to_json()


def test_a_model_without_sequences_refuses_a_sequence_length_and_the_transformer_bounds_it():
    with pytest.raises(WorkbenchError, match="reads no sequences"):
        plan_training("mlp", {}, "data=8", "dp", seq_len=64)
    with pytest.raises(WorkbenchError, match="exceeds the model's max_len=128: add max_len=256"):
        plan_training("transformer", {}, "data=8", "dp", seq_len=256)
