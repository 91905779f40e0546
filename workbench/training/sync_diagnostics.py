"""Gradient-sync diagnostics: each replica's gradient before synchronisation, how far the replicas'
parameter copies have drifted apart, and what batch size the gradient noise suggests.

:func:`sync_report` measures per-replica and synchronised gradient norms, each replica's cosine to the
synchronised gradient, replica divergence (exactly 0 when synchronisation is right) and the gradient
noise scale (McCandlish et al. 2018) as a :class:`SyncReport`. What each figure means and how it is
computed: docs/design/gradient-sync-diagnostics.md.

Example:
    >>> import optax
    >>> from workbench.training.data import load_dataset
    >>> from workbench.training.models import build_model, model_class
    >>> from workbench.layout import parse_mesh
    >>> from workbench.training.modes import StepSetup, build_mode
    >>> from workbench.training.modes.core import init_state
    >>> graphdef, state = init_state(build_model("mlp"), optax.sgd(0.1))
    >>> setup = StepSetup(graphdef, model_class("mlp").loss, optax.sgd(0.1), parse_mesh("data=8"), 64)
    >>> mode = build_mode("dp", setup)
    >>> state, batch = mode.place_state(state), next(load_dataset("digits").batches(64, seed=0))
    >>> report = sync_report(mode, state, batch)
    >>> round(report.synced_grad_norm, 2), report.replica_divergence
    (0.8, 0.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from ..errors import WorkbenchError
from .process_share import batch_share, host_values
from .modes.base import ParallelMode
from .modes.core import TrainState, mean_loss_and_grads


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """The measurements of docs/design/gradient-sync-diagnostics.md, as plain floats."""

    replicas: int
    per_replica_grad_norms: list[float]
    synced_grad_norm: float
    cosine_to_synced: list[float]
    replica_divergence: float
    per_replica_batch: float
    global_batch: float
    noise_scale: float | None
    replica_devices: list[list[int]] | None = None  # each replica's device ids (None: replicas are not devices)

    @property
    def suggested_batch(self) -> int | None:
        """B_simple rounded to a whole batch, or None when the estimate is not positive and finite."""
        if self.noise_scale is None or not math.isfinite(self.noise_scale) or self.noise_scale <= 0:
            return None
        return max(1, round(self.noise_scale))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "suggested_batch": self.suggested_batch}


def noise_scale(small_sq_norm: float, small_batch: float, big_sq_norm: float, big_batch: float) -> float | None:
    """McCandlish et al.'s B_simple from a small and a large batch's squared gradient norms.

    None when the two batch sizes are equal (one replica) or the estimated ``|G|^2`` is not positive
    (the noise swamps the signal at these batch sizes).

    Example:
        >>> round(noise_scale(small_sq_norm=2.0, small_batch=8, big_sq_norm=1.125, big_batch=64), 2)
        8.0
    """
    if big_batch <= small_batch:
        return None
    signal = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    if signal <= 0:
        return None
    return float(trace / signal)


@functools.lru_cache(maxsize=32)
def _replica_gradients_fn(graphdef: Any, loss: Any, precision: str):
    """A jitted ``(params, other, shards) -> (local grads stacked, weights)`` for one model and loss."""

    def local(params, other, shard):
        result = mean_loss_and_grads(graphdef, loss, precision, params, other, shard)
        return result["grads"], result["weight"]

    return jax.jit(jax.vmap(local, in_axes=(None, None, 0)))


def _flat(tree: Any) -> jax.Array:
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(tree)])


def replica_divergence(params: Any) -> float:
    """The largest absolute difference between copies of the same slice of any parameter.

    Every array leaf's addressable shards are grouped by the slice they hold; within a group all
    copies must be bit-identical when every replica applied the same update. For a stacked (pmap)
    state pass the stacked arrays: row i is replica i.

    Example:
        >>> from workbench.layout.mesh import build_mesh
        >>> from workbench.training.data_parallel import replicate_params
        >>> replica_divergence(replicate_params({"w": np.ones(4)}, build_mesh("data=8")))
        0.0
    """
    worst = 0.0
    for leaf in jax.tree.leaves(params):
        groups: dict[Any, np.ndarray] = {}
        for shard in getattr(leaf, "addressable_shards", ()):
            key = tuple((s.start, s.stop) for s in shard.index)
            data = np.asarray(shard.data, np.float64)
            if key in groups:
                worst = max(worst, float(np.max(np.abs(data - groups[key]), initial=0.0)))
            else:
                groups[key] = data
    return worst


def _cross_process_divergence(params: Any) -> float:
    """The largest difference between what different processes hold of the same parameter elements.

    Each process writes what its devices hold into a full-size array (NaN where it holds nothing); the
    arrays are gathered from every process and compared where two processes both hold an element.
    """
    worst = 0.0
    for leaf in jax.tree.leaves(params):
        view = np.full(leaf.shape, np.nan, np.float64)
        for shard in leaf.addressable_shards:
            view[shard.index] = np.asarray(shard.data, np.float64)
        views = np.asarray(multihost_utils.process_allgather(view))  # (processes, *shape)
        shared = np.sum(~np.isnan(views), axis=0) > 1  # elements two or more processes hold
        if shared.any():
            spread = np.nanmax(views[:, shared], axis=0) - np.nanmin(views[:, shared], axis=0)
            worst = max(worst, float(np.max(spread)))
    return worst


def _stacked_rows_divergence(params: Any) -> float:
    worst = 0.0
    for leaf in jax.tree.leaves(params):
        rows = np.asarray(leaf, np.float64)
        worst = max(worst, float(np.max(np.abs(rows - rows[:1]), initial=0.0)))
    return worst


def state_divergence(mode: ParallelMode, state: TrainState) -> float:
    """Replica divergence of ``mode``'s placed ``state``: the largest difference between any two
    replicas' copies of the same parameter slice (0.0 when every replica applied the same update).

    Example:
        >>> import optax
        >>> from workbench.training.models import build_model, model_class
        >>> from workbench.layout import parse_mesh
        >>> from workbench.training.modes import StepSetup, build_mode
        >>> from workbench.training.modes.core import init_state
        >>> graphdef, state = init_state(build_model("mlp"), optax.sgd(0.1))
        >>> setup = StepSetup(graphdef, model_class("mlp").loss, optax.sgd(0.1), parse_mesh("data=8"), 64)
        >>> mode = build_mode("dp", setup)
        >>> state_divergence(mode, mode.place_state(state))
        0.0
    """
    if getattr(mode, "stacked_state", False):
        return _stacked_rows_divergence(host_values(state.params))
    if jax.process_count() > 1:  # replicas on other processes' devices are replicas too
        return max(replica_divergence(state.params), _cross_process_divergence(state.params))
    return replica_divergence(state.params)


def _all_replicas(mode: ParallelMode, replicas: int, flat: np.ndarray, weights: np.ndarray):
    """Every replica's flattened gradient and weight, from each process's own replicas (a collective)."""
    # Where this process's own devices sit (not the rows it loaded: under the same-shard fault those are process 0's).
    mesh = getattr(mode, "mesh", None)  # replicas in several processes are devices of a mesh
    if mesh is None:
        raise WorkbenchError(f"mode {mode.name!r} has no mesh, so its replicas cannot be gathered across processes")
    own = batch_share(mesh, mode.batch_axis, mode.setup.global_batch)
    first = own.rows.start * replicas // mode.setup.global_batch
    flats, weightss, firsts = multihost_utils.process_allgather((flat, weights, np.int32(first)))
    every_flat, every_weight = np.zeros((replicas, flat.shape[1]), flat.dtype), np.zeros(replicas, weights.dtype)
    # Processes holding the same rows agree.
    for start, part, weight in zip(np.ravel(firsts), flats, weightss, strict=True):
        every_flat[start:start + len(part)], every_weight[start:start + len(weight)] = part, weight
    return jnp.asarray(every_flat), every_weight


def sync_report(mode: ParallelMode, state: TrainState, batch: dict[str, Any]) -> SyncReport:
    """Measure gradient synchronisation for ``mode`` at ``state`` on one ``batch`` (NumPy).

    ``state`` is the mode's placed state (as ``mode.step`` returns it); ``batch`` the host batch
    before ``place_batch``: the global batch, or across processes this process's rows of it (each
    process computes its own replicas' gradients, and every replica's are gathered). What is measured:
    docs/design/gradient-sync-diagnostics.md.
    """
    replicas = max(1, mode.data_parallel_size)
    plain = host_values(mode.export_state(state))
    device = jax.local_devices()[0]
    params, other = jax.device_put(plain.params, device), jax.device_put(plain.other, device)
    rows = len(jax.tree.leaves(batch)[0])
    mine = replicas * rows // mode.setup.global_batch  # the replicas whose rows this process holds
    shards = jax.tree.map(lambda x: np.asarray(x).reshape(mine, -1, *np.shape(x)[1:]), batch)
    replica_gradients = _replica_gradients_fn(mode.setup.graphdef, mode.setup.loss, mode.setup.precision)
    grads, weights = replica_gradients(params, other, shards)
    flat = jax.vmap(_flat)(grads)  # (this process's replicas, parameters)
    if mine < replicas:
        flat, weights = _all_replicas(mode, replicas, np.asarray(flat), np.asarray(weights))
    weights = jnp.asarray(weights, jnp.float32)
    synced = jnp.sum(flat * weights[:, None], axis=0) / jnp.maximum(jnp.sum(weights), 1e-30)
    local_norms = jnp.linalg.norm(flat, axis=1)
    synced_norm = jnp.linalg.norm(synced)
    cosines = flat @ synced / jnp.maximum(local_norms * synced_norm, 1e-30)
    local_norms, synced_norm, cosines, weights = jax.device_get((local_norms, synced_norm, cosines, weights))
    # A replica whose shard is all padding (the end of an epoch) has no gradient: it is not a small batch.
    real = np.asarray(weights) > 0
    small_batch = float(np.mean(weights[real])) if real.any() else 0.0
    big_batch = float(np.sum(weights))
    divergence = state_divergence(mode, state)
    return SyncReport(
        replicas=replicas,
        per_replica_grad_norms=[float(n) for n in local_norms],
        synced_grad_norm=float(synced_norm),
        cosine_to_synced=[float(c) for c in cosines],
        replica_divergence=divergence,
        per_replica_batch=small_batch,
        global_batch=big_batch,
        noise_scale=noise_scale(float(np.mean(np.square(local_norms[real]))) if real.any() else 0.0, small_batch,
                                float(synced_norm) ** 2, big_batch),
        replica_devices=getattr(mode, "replica_devices", lambda: None)(),  # a user's own step may not say
    )
