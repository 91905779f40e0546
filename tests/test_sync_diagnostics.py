"""Gradient-sync diagnostics against independent computations on 8 simulated devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

import workbench as wb
from workbench.training.modes import StepSetup, build_mode
from workbench.training.modes.core import init_state
from workbench.training.sync_diagnostics import noise_scale, replica_divergence, sync_report
from workbench.training.trainer import Trainer


def _setup(mode_name: str, mesh: str = "data=8", batch_size: int = 64):
    dataset = wb.load_dataset("digits")
    config = wb.training.model_config_for_data("mlp", dataset, hidden=32)
    tx = wb.training.make_optimizer("sgd", 0.1)
    model = config.build(seed=0)
    graphdef, state = init_state(model, tx)
    mode = build_mode(mode_name, StepSetup(graphdef, type(model).loss, tx, wb.parse_mesh(mesh), batch_size))
    batch = next(dataset.batches(batch_size, seed=0))
    return mode, mode.place_state(state), batch, model


@nnx.jit  # one program per batch size; op by op, a cold cache compiled hundreds of small ones (24 s)
def _grads(model, batch):
    return nnx.grad(lambda m: wb.training.loss_fn(m, batch)[0])(model)


def _flat_grad(model, batch) -> np.ndarray:
    grads = _grads(model, batch)
    return np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(nnx.state(grads, nnx.Param))])


@pytest.mark.parametrize("mode_name", ["dp", "dp-pmap", "fsdp", "simulated"])
def test_norms_and_cosines_match_gradients_computed_directly(mode_name):
    mode, state, batch, model = _setup(mode_name)
    report = sync_report(mode, state, batch)
    assert report.replicas == 8 and report.per_replica_batch == 8 and report.global_batch == 64
    full = _flat_grad(model, batch)
    assert report.synced_grad_norm == pytest.approx(np.linalg.norm(full), rel=1e-5)
    for i in (0, 5):
        shard = {k: v[i * 8 : (i + 1) * 8] for k, v in batch.items()}
        local = _flat_grad(model, shard)
        assert report.per_replica_grad_norms[i] == pytest.approx(np.linalg.norm(local), rel=1e-5)
        cosine = local @ full / (np.linalg.norm(local) * np.linalg.norm(full))
        assert report.cosine_to_synced[i] == pytest.approx(cosine, abs=1e-5)
    assert report.replica_divergence == 0.0


def test_correct_training_keeps_replicas_identical():
    mode, state, batch, _ = _setup("dp")
    for _ in range(3):
        state, _ = mode.step(state, mode.place_batch(batch))
    assert sync_report(mode, state, batch).replica_divergence == 0.0


def test_divergence_shows_a_replica_that_drifted():
    mode, state, batch, _ = _setup("dp-pmap")
    kernel = np.asarray(state.params["hidden1"]["kernel"][...]).copy()
    kernel[3] += 0.25  # replica 3 applied a different update
    drifted = state.params
    drifted["hidden1"]["kernel"][...] = mode._on_devices(kernel)
    assert sync_report(mode, state._replace(params=drifted), batch).replica_divergence == pytest.approx(0.25)


def test_replica_divergence_groups_copies_of_the_same_slice():
    mesh = wb.build_mesh("data=4,model=2")
    placed = wb.training.shard_model_state({"w": np.arange(16.0).reshape(4, 4)}, mesh, {"w": "None, model"})
    assert replica_divergence(placed) == 0.0  # 4 copies of each column half, all equal


def test_noise_scale_formula_and_its_edges():
    assert noise_scale(2.0, 8, 1.125, 64) == pytest.approx(8.0)
    assert noise_scale(1.0, 64, 1.0, 64) is None  # one replica: no small batch to compare
    assert noise_scale(10.0, 8, 0.1, 64) is None  # |G|^2 estimate not positive: noise dominates


def test_the_trainer_streams_sync_events(tmp_path):
    trainer = Trainer(wb.TrainConfig(mode="dp", batch=64, steps=20, log_every=10, sync_every=10, eval_every=0,
                                     model_options={"hidden": 16}), run_root=tmp_path)
    trainer.run()
    events = [e for e in trainer.history if e.kind == "sync"]
    assert [e.step for e in events] == [10, 20]
    assert len(events[0].data["per_replica_grad_norms"]) == 8 and events[0].data["replica_divergence"] == 0.0
    steps, divergence = wb.load_run(trainer.run_name, tmp_path).series("sync_replica_divergence")
    assert steps == [10, 20] and divergence == [0.0, 0.0]


def test_replicas_holding_only_padding_are_not_small_batches():
    mode, state, batch, model = _setup("dp")
    padded = {key: value.copy() for key, value in batch.items()}
    padded["mask"][48:] = 0.0  # the epoch's last batch: replicas 6 and 7 hold only padding
    report = sync_report(mode, state, padded)
    assert report.per_replica_batch == 8 and report.global_batch == 48
    assert report.per_replica_grad_norms[6] == 0.0 and report.per_replica_grad_norms[7] == 0.0
    real = np.square(report.per_replica_grad_norms[:6]).mean()
    assert report.noise_scale == pytest.approx(noise_scale(float(real), 8, report.synced_grad_norm ** 2, 48), rel=1e-5)
