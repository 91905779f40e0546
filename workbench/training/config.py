"""What a training run is: a :class:`TrainConfig` of plain values, checked before anything runs.

The same record drives the CLI (``workbench train --model mlp --mode dp ...``), the Python API and the
widgets, and it is what ``runs/<name>/config.json`` stores, so a run can be repeated from its folder.
:func:`make_optimizer` keeps the learning rate in the optimizer state (:class:`LearningRateState`), so a
new one reuses the compiled step; why only it: docs/design/learning-rate-in-state.md.

Example:
    >>> config = TrainConfig(model="mlp", data="digits", mode="dp", steps=300).validated()
    >>> config.optimizer, config.lr
    ('adam', 0.001)
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..devices import every_device_mesh
from ..errors import WorkbenchError
from ..layout.mesh import MeshShape, parse_mesh
from .data import DATASETS
from .models import MODELS, model_class
from .modes import MODES, PRECISIONS, mode_class
from .modes.faults import validate_faults
from .remat import validate_remat

if TYPE_CHECKING:  # annotations only: the modes and models import this module
    from .models import RegisteredModel
    from .modes import ParallelMode

OPTIMIZERS = ("sgd", "adam", "adamw")
_OPTAX = {"sgd": optax.sgd, "adam": optax.adam, "adamw": optax.adamw}


class LearningRateState(NamedTuple):
    """An optimizer's state with its learning rate held as a value: ``learning_rate`` (a float32
    scalar) and the wrapped optimizer's own ``inner_state``."""

    learning_rate: jax.Array
    inner_state: optax.OptState


def with_learning_rate_in_state(inner: optax.GradientTransformation, lr: float) -> optax.GradientTransformation:
    """``inner`` (built with learning rate 1) with its updates scaled by a learning rate read from the state.

    What ``optax.inject_hyperparams`` does for the learning rate, without its step counter: one scalar
    in the state, not two. ``inner`` at rate 1 returns ``-u``; times ``lr`` that is ``-(lr * u)``, the
    same floats optax's own ``scale_by_learning_rate(lr)`` gives.

    Example:
        >>> tx = with_learning_rate_in_state(optax.sgd(1.0), 0.5)
        >>> tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.zeros(2)}))[0]["w"]
        Array([-0.5, -0.5], dtype=float32)
    """

    def init(params: Any) -> LearningRateState:
        return LearningRateState(jnp.asarray(lr, jnp.float32), inner.init(params))

    def update(updates: Any, state: LearningRateState, params: Any = None) -> tuple[Any, LearningRateState]:
        updates, inner_state = inner.update(updates, state.inner_state, params)
        rate = state.learning_rate
        updates = jax.tree.map(lambda u: rate.astype(u.dtype) * u, updates)  # None leaves are empty subtrees: skipped
        return updates, LearningRateState(rate, inner_state)

    # optax types every update's state as the OptState union, not the transformation's own state type.
    return optax.GradientTransformation(init, update)  # pyright: ignore[reportArgumentType]


def make_optimizer(name: str, lr: float) -> optax.GradientTransformation:
    """Optimizer ``name`` (sgd, adam, adamw with optax's defaults) at learning rate ``lr``, held in its state.

    Example:
        >>> make_optimizer("adam", 1e-3).init({"w": jnp.zeros(2)}).learning_rate
        Array(0.001, dtype=float32)
    """
    if name not in _OPTAX:
        raise WorkbenchError(f"unknown optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}")
    validate_positive("lr", lr, "1e-3")
    return with_learning_rate_in_state(_OPTAX[name](learning_rate=1.0), float(lr))


def validate_positive(what: str, value: Any, example: str, *, integer: bool = False, allow_zero: bool = False) -> Any:
    """``value`` if it is a (whole, with ``integer``) number > 0 (>= 0 with ``allow_zero``), else a
    WorkbenchError naming it and giving ``example``."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        kind = "a whole number" if integer else "a number"
        raise WorkbenchError(f"{what}={value!r} must be {kind} {bound}: use e.g. {what}={example}")
    return value


def validate_processes(processes: Any, mode: Any, mesh: MeshShape, batch: int, faults: tuple) -> int:
    """``processes`` if ``mode`` (a mode class) can train across that many processes on ``mesh``, else a
    WorkbenchError naming what does not fit and what would.

    Example:
        >>> from workbench.training.modes import mode_class
        >>> validate_processes(3, mode_class("dp"), parse_mesh("data=8"), 64, ())
        Traceback (most recent call last):
        ...
        workbench.errors.WorkbenchError: processes=3 does not divide the 8 devices of mesh data=8 (each process ...
    """
    validate_positive("processes", processes, "2", integer=True)
    if processes == 1:
        if "same-shard" in faults:
            raise WorkbenchError("fault 'same-shard' needs several processes (one process loads the whole batch): "
                                 "add processes=2 (--processes 2)")
        return processes
    if mode.one_device:
        raise WorkbenchError(f"mode {mode.name!r} computes on one device in one process, so it cannot run across "
                             f"processes={processes}: use mode dp (or processes=1)")
    if mesh.size % processes:
        divisors = [n for n in range(2, mesh.size + 1) if mesh.size % n == 0]
        choices = ", ".join(map(str, divisors[:-1])) + f" or {divisors[-1]}" if len(divisors) > 1 else str(divisors[0])
        raise WorkbenchError(f"processes={processes} does not divide the {mesh.size} devices of mesh {mesh} (each "
                             f"process holds an equal share): use processes={choices}")
    if mode.batch_axis is not None and batch % processes:
        raise WorkbenchError(f"global batch {batch} does not split into {processes} processes' equal parts: use a "
                             f"batch of {processes * max(1, round(batch / processes))} (a multiple of {processes})")
    return processes


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run's settings, as plain JSON-able values.

    Attributes:
        model, model_options: a registered model and overrides of its preset (sizes the data decides
            are set from the data).
        data, data_options: a registered data set and its options.
        mode: a parallel mode (see :data:`workbench.training.modes.MODES`).
        mesh: mesh text, e.g. ``"data=8"`` or ``"data=4,model=2"``; ``single`` ignores its size. Default: every
            device JAX has here, over ``data`` (``data=8`` on the simulated CPU devices, ``data=1`` on one GPU).
        steps: optimizer updates to run.
        batch: global batch size (all devices, all microbatches).
        lr, optimizer: learning rate and ``sgd``/``adam``/``adamw``.
        accum: microbatches per step (gradients accumulated, one synchronisation).
        precision: ``fp32`` or ``bf16`` (bfloat16 compute, float32 master weights).
        remat: what each transformer block keeps for the backward pass: ``none`` (everything), ``block`` (its
            input; the block is recomputed) or ``dots`` (its matmul outputs); see :mod:`workbench.training.remat`.
        seed: model initialisation and batch order.
        log_every: steps between metric reads (the only host syncs while training).
        eval_every: steps between held-out evaluations (0: only at the end).
        sync_every: steps between gradient-sync diagnostics (0: never); see
            :mod:`workbench.training.sync_diagnostics`. Each costs about one extra gradient of the batch.
        drop_remainder: drop each epoch's last partial batch instead of padding and masking it.
        faults: teaching faults written into the step, e.g. ``("psum",)`` (see
            :mod:`workbench.training.modes.faults`); empty, the default, means none: a fault is never on unless asked.
        processes: how many processes train together on ``jax.distributed`` (1: this one). On one machine
            the trainer starts them, each with ``mesh size / processes`` simulated devices and its own rows
            of every batch (see :mod:`workbench.distributed`).
        checkpoint_every: steps between checkpoints in ``runs/<name>/checkpoints/`` (0: none); a finished
            run also saves its last step. See :mod:`workbench.training.checkpoints`.
        keep_checkpoints: how many of the newest checkpoints are kept.
    """

    model: str = "mlp"
    data: str = "digits"
    mode: str = "dp"
    mesh: str = dataclasses.field(default_factory=every_device_mesh)
    steps: int = 300
    batch: int = 256
    lr: float = 1e-3
    optimizer: str = "adam"
    accum: int = 1
    precision: str = "fp32"
    remat: str = "none"
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    sync_every: int = 50
    drop_remainder: bool = False
    faults: tuple = ()
    processes: int = 1
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    model_options: dict = dataclasses.field(default_factory=dict)
    data_options: dict = dataclasses.field(default_factory=dict)

    def validated(self) -> TrainConfig:
        """This config with the mesh normalised, or a WorkbenchError naming the first bad field."""
        return self.resolved().config

    def resolved(self) -> ResolvedConfig:
        """This config checked (as :meth:`checked`) and resolved, once, into records: the parsed mesh, the
        mode's class and the model's class. What the trainer, :func:`~workbench.training.step.build_step` and
        the planner pass down, so nothing below them reads the text again.

        Example:
            >>> resolved = TrainConfig(mode="fsdp", mesh="data=4, model=2").resolved()
            >>> resolved.config.mesh, resolved.mesh_shape.axes, resolved.mode_class.name
            ('data=4,model=2', {'data': 4, 'model': 2}, 'fsdp')
        """
        for field, value, choices in (
            ("model", self.model, MODELS), ("data", self.data, tuple(DATASETS)), ("mode", self.mode, MODES),
            ("optimizer", self.optimizer, OPTIMIZERS), ("precision", self.precision, PRECISIONS),
        ):
            if value not in choices and not (field == "model" and str(value).startswith("custom:")):
                raise WorkbenchError(f"unknown {field} {value!r}: choose one of {', '.join(choices)}")
        for field, example in (("steps", "300"), ("batch", "256"), ("accum", "1"), ("log_every", "10")):
            validate_positive(field, getattr(self, field), example, integer=True)
        validate_positive("eval_every", self.eval_every, "100 (0: only at the end)", integer=True, allow_zero=True)
        validate_positive("sync_every", self.sync_every, "50 (0: never)", integer=True, allow_zero=True)
        validate_positive("seed", self.seed, "0", integer=True, allow_zero=True)
        validate_positive("checkpoint_every", self.checkpoint_every, "100 (0: no checkpoints)", integer=True,
                       allow_zero=True)
        validate_positive("keep_checkpoints", self.keep_checkpoints, "3", integer=True)
        validate_positive("lr", self.lr, "1e-3")
        declared = mode_class(self.mode)
        faults = validate_faults(self.faults, self.mode, declared.supported_faults, declared.fault_reasons)
        mesh = parse_mesh(self.mesh)
        validate_processes(self.processes, declared, mesh, self.batch, faults)
        config = dataclasses.replace(self, mesh=str(mesh), lr=float(self.lr), faults=faults)
        model = None if str(self.model).startswith("custom:") else model_class(self.model)
        validate_remat(self.remat, None if model is None else model.NAME, ("none",) if model is None
                       else model.REMAT_POLICIES)
        return ResolvedConfig(config, mesh, declared, model)

    @property
    def mesh_shape(self) -> MeshShape:
        """The mesh as a record (``mesh`` stays text: it is what ``config.json`` stores)."""
        return parse_mesh(self.mesh)

    def to_json(self) -> dict[str, Any]:
        """The config as a JSON-able dict (what ``config.json`` stores)."""
        return {**dataclasses.asdict(self), "faults": list(self.faults)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from :meth:`to_json` output; extra keys (run metadata) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}  # a run stored before a field existed takes its default
        fields = {k: v for k, v in data.items() if k in names}
        if "faults" in fields:
            fields["faults"] = tuple(fields["faults"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A :class:`TrainConfig` checked and resolved into records, once, where it enters (the trainer, a public
    function, the CLI, a widget), for everything below to take instead of text.

    Made by :meth:`TrainConfig.resolved`. A config changed in fields that name no record (batch, steps, model
    options, ...) keeps its records: ``dataclasses.replace(resolved, config=...)``.

    Attributes:
        config: the checked config (mesh text normalised, ``lr`` a float, faults checked): what runs store.
        mesh_shape: the parsed mesh.
        mode_class: the parallel mode's class (:func:`~workbench.training.modes.mode_class`).
        model_class: the registered model's class; None for your own model (``model="custom:..."``).

    Example:
        >>> TrainConfig(mode="dp", mesh="data=8").resolved().mode_class.batch_axis
        'data'
    """

    config: TrainConfig
    mesh_shape: MeshShape
    mode_class: type[ParallelMode]
    model_class: type[RegisteredModel] | None


def resolve_config(config: TrainConfig | ResolvedConfig) -> ResolvedConfig:
    """``config`` resolved (:meth:`TrainConfig.resolved`); a :class:`ResolvedConfig` is returned as it is, so a
    public function can take either and check a config only where it enters.

    Example:
        >>> resolved = resolve_config(TrainConfig(mesh="data=8"))
        >>> resolve_config(resolved) is resolved
        True
    """
    return config if isinstance(config, ResolvedConfig) else config.resolved()
