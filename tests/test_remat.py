"""Remat policies (``TrainConfig.remat``) train the same numbers with less memory, on 8 simulated devices.

* Every policy trains the transformer to the losses of ``none`` within 1e-5 relative (fp32, SGD), in ``single``,
  ``fsdp`` and ``dp-tp``, unrolled and scanned: remat recomputes values, it never changes them.
* ``block`` keeps each block's input only: the compiled step's temporaries shrink on a deep, long-sequence model;
  ``dots`` keeps the matmul outputs: between the two.
* Under per-layer fsdp, which already recomputes each layer, a policy gathers no layer a third time: the
  parameters are gathered once in the forward and once in the backward pass, whatever the policy.
* A policy that is unknown, or one the model cannot apply, is one message naming the choices.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.analysis.hlo import collective_ops
from workbench.training.remat import REMAT_POLICIES
from workbench.training.step import build_abstract_step, build_step

STEPS = 3
SMALL = {"d_model": 32, "n_heads": 4, "n_layers": 2}
DATA = {"seq_len": 16, "num_train": 256, "num_eval": 64, "vocab_size": 32}
MESHES = {"single": "data=1", "fsdp": "data=8", "dp-tp": "data=4,model=2"}


@functools.cache
def _losses(mode: str, remat: str, scan: bool) -> np.ndarray:
    config = wb.TrainConfig(model="transformer", data="tokens", data_options=DATA,
                            model_options={**SMALL, "scan_layers": scan}, mode=mode, mesh=MESHES[mode], batch=64,
                            optimizer="sgd", lr=0.1, remat=remat)
    built = build_step(config)
    state = built.mode.place_state(built.state)
    losses = []
    for batch in built.first_batches(STEPS):
        state, metrics = built.mode.step(state, built.mode.place_batch(batch))
        losses.append(metrics["loss"])
    return np.array(jax.device_get(losses))


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("mode", list(MESHES))
@pytest.mark.parametrize("remat", [p for p in REMAT_POLICIES if p != "none"])
def test_every_policy_trains_the_losses_of_no_remat(remat, mode, scan):
    losses, reference = _losses(mode, remat, scan), _losses(mode, "none", scan)
    worst = np.max(np.abs(losses - reference) / np.abs(reference))
    assert worst <= 1e-5, (losses, reference)
    assert not np.allclose(losses[0], losses[-1])  # it trained


DEEP = {"d_model": 64, "n_heads": 4, "n_layers": 4, "max_len": 256, "vocab": 64}


def _compiled(remat: str, mode: str = "dp", mesh: str = "data=8", **options):
    config = wb.TrainConfig(model="transformer", model_options={**DEEP, **options}, mode=mode, mesh=mesh,
                            batch=64, remat=remat)
    return build_abstract_step(config).compile()


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_block_keeps_less_than_dots_which_keeps_less_than_none(scan):
    temp = {policy: _compiled(policy, scan_layers=scan).memory_analysis().temp_size_in_bytes
            for policy in REMAT_POLICIES}
    assert temp["block"] < temp["dots"] < temp["none"], temp


def test_fsdp_gathers_each_layer_twice_under_every_policy():
    # The same bytes to within one bias per layer (XLA:CPU merges a (64,) leaf's forward gather with its
    # re-gather without remat, not with it); a layer gathered a third time would add its whole 200 KB.
    gathers = {}
    for policy in REMAT_POLICIES:
        ops = collective_ops(_compiled(policy, "fsdp", "data=8").as_text())
        gathers[policy] = sum(op.count * op.bytes for op in ops if op.kind == "all-gather")
    assert max(gathers.values()) - min(gathers.values()) <= DEEP["n_layers"] * DEEP["d_model"] * 4, gathers


@pytest.mark.parametrize("remat,model,message", [
    ("blocks", "transformer", "unknown remat policy 'blocks': choose one of none, block, dots"),
    ("block", "mlp", "model 'mlp' cannot apply remat 'block' (it has no repeated blocks): choose one of none, "
                     "or model 'transformer', which applies none, block, dots"),
])
def test_a_policy_the_model_cannot_apply_is_one_message_with_the_choices(remat, model, message):
    with pytest.raises(wb.training.RematError) as refused:
        wb.TrainConfig(model=model, remat=remat).resolved()
    assert str(refused.value) == message


def test_the_policy_is_stored_with_the_run_config():
    config = wb.TrainConfig(model="transformer", data="tokens", remat="dots")
    assert wb.TrainConfig.from_json(config.to_json()).remat == "dots"
    assert wb.TrainConfig.from_json({k: v for k, v in config.to_json().items() if k != "remat"}).remat == "none"
