"""One way to build a training step from a :class:`~workbench.TrainConfig`: data, model, optimizer,
state and the parallel mode, checked before anything compiles.

The trainer, the reference check, the communication ledger and the CLI all call :func:`build_step`, so
what is checked or compiled is exactly what is trained: the same accumulation, precision, data and
model options, faults and custom model. :func:`build_abstract_step` builds the same step with nothing
allocated and no data read, for compiling it ahead of time for a mesh larger than the machine.
The config is resolved once where it enters (:meth:`~workbench.TrainConfig.resolved`): below that the mesh
is a :class:`~workbench.MeshShape` and the mode and model are their classes, never text read again.

Example:
    >>> built = build_step(TrainConfig(model="mlp", mode="dp", mesh="data=8", batch=64))
    >>> state, metrics = built.mode.step(built.mode.place_state(built.state),
    ...                                  built.mode.place_batch(built.first_batches(1)[0]))
    >>> sorted(metrics)
    ['loss']
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import jax
from flax import nnx

from .process_share import ProcessShare
from ..errors import MeshError, WorkbenchError
from ..layout.rules import RuleTable
from .config import ResolvedConfig, TrainConfig, make_optimizer, resolve_config
from .data import Dataset, load_dataset
from .host_memory import batch_bytes, validate_batch_fits_host
from .layer_scopes import module_paths
from .models import RegisteredModel, abstract_batch, model_config, model_config_for_data
from .modes import ParallelMode, StepSetup, mode_class, mesh_fit
from .modes.base import ABSTRACT_DEVICES, ShardedJitMode, validate_enough_devices
from .modes.core import LossFn, TrainState, init_state


@dataclasses.dataclass(frozen=True, eq=False)
class CustomModel:
    """A user's own model and data for :func:`build_step`: the module (None: ``config.model`` on your
    batches; every build starts from the module's parameters as given), its loss, its batches
    (``seed -> iterator`` or an iterable used once), held-out batches and tensor-parallel rules."""

    module: nnx.Module | None
    loss: LossFn | None
    batches: Callable[[int], Iterator[Any]] | Iterable[Any]
    eval_batches: Callable[[], Iterable[Any]] | Iterable[Any] | None = None
    tp_rules: tuple = ()
    initial: tuple[Any, Any] | None = dataclasses.field(init=False, repr=False)  # module, split; None without

    def __post_init__(self):
        if self.module is not None and self.loss is None and not hasattr(type(self.module), "loss"):
            raise WorkbenchError(
                f"model {type(self.module).__name__} is not a workbench model, so the trainer needs its loss: "
                "pass loss=fn with fn(model, batch) -> (loss, aux)"
            )
        if self.batches is None:
            raise WorkbenchError("a custom model needs custom data: pass batches=fn(seed) -> iterator of batches")
        initial = nnx.split(self.module) if self.module is not None else None
        object.__setattr__(self, "initial", initial)  # the user's later in-place changes do not leak in


@dataclasses.dataclass(frozen=True, eq=False)
class BuiltStep:
    """What :func:`build_step` made: the checked ``config``, the built ``mode`` (its compiled step is
    made once and kept with it), the host ``state`` to start from, the ``model`` and its ``loss``,
    ``train_batches(seed, skip=0)`` and ``eval_batches()`` (None without held-out data), each yielding this
    process's rows of every global batch (all of them in one process), the ``dataset`` (None for custom
    batches), the resolved ``model_options`` and ``whole_batches(seed)``, the global batches themselves (what
    the one-device reference of the check trains on)."""

    config: TrainConfig
    mode: ParallelMode
    state: TrainState
    model: nnx.Module
    loss: LossFn
    train_batches: Callable[[int], Iterator[Any]]
    eval_batches: Callable[[], Iterable[Any]] | None
    dataset: Dataset | None
    model_options: dict[str, Any]
    whole_batches: Callable[[int], Iterator[Any]]

    def first_batches(self, count: int) -> list[Any]:
        """The first ``count`` batches this step trains on (seed ``config.seed``): global batches, or this
        process's rows of them when training across processes."""
        return list(itertools.islice(self.train_batches(self.config.seed), count))

    def first_whole_batches(self, count: int) -> list[Any]:
        """The first ``count`` global batches, whole in every process (the reference check's input)."""
        return list(itertools.islice(self.whole_batches(self.config.seed), count))


def validate_mesh_for_training(config: TrainConfig | ResolvedConfig, devices: Any = None) -> None:
    """The mode x mesh verdict, the batch split and the device count (of ``devices``, else the local ones),
    in that order (the order :func:`workbench.training_verdict` says them in), before any data or model is
    loaded."""
    resolved = resolve_config(config)
    declared, mesh, config = resolved.mode_class, resolved.mesh_shape, resolved.config
    fit = mesh_fit(declared, mesh)
    if not fit.ok:
        raise MeshError(fit.message)
    declared.validate_batch_split(StepSetup(None, None, None, mesh, config.batch, config.accum))
    if not declared.one_device:
        validate_enough_devices(mesh, devices)  # a mesh larger than the machine: says how to get the devices


def _data(config: TrainConfig, custom: CustomModel | None):
    """(model config or None, dataset or None): the data set is loaded once, before the model is sized."""
    if custom is not None:
        return None, None
    dataset = load_dataset(config.data, seed=config.seed, **config.data_options)
    return model_config_for_data(config.model, dataset, **config.model_options), dataset


def _batch_sources(config: TrainConfig, dataset: Dataset | None, custom: CustomModel | None, share: ProcessShare):
    """(train batches factory ``(seed, skip=0) -> iterator``, eval batches factory or None) yielding this
    process's ``share`` of each global batch: a data set reads only those rows; your own batches are cut to
    them. ``skip`` starts after that many batches (a resumed run): a data set computes where; your own
    batches are drawn and dropped."""
    if custom is None:
        if dataset is None:  # _data loads the data set whenever there is no custom model
            raise WorkbenchError("no data set and no custom batches to train on: pass config.data or custom")
        rows = None if share.whole else share.rows
        train = lambda seed, skip=0: dataset.batches(config.batch, seed=seed,  # noqa: E731
                                                     drop_remainder=config.drop_remainder, rows=rows, skip=skip)
        return train, (lambda: dataset.eval_batches(config.batch, rows=rows))
    batches, evaluate = custom.batches, custom.eval_batches
    given = batches if callable(batches) else (lambda seed, it=iter(batches): it)  # noqa: B008 - one iterator, shared by every call
    train = lambda seed, skip=0: itertools.islice(given(seed), skip, None)  # noqa: E731
    held_out = evaluate if callable(evaluate) or evaluate is None else (lambda b=evaluate: b)
    if share.whole:
        return train, held_out
    cut = lambda seed, skip=0: (share.take(batch) for batch in train(seed, skip))  # noqa: E731
    return cut, None if held_out is None else (lambda: (share.take(batch) for batch in held_out()))


def build_step(
    config: TrainConfig | ResolvedConfig, *, custom: CustomModel | None = None, modes: dict | None = None
) -> BuiltStep:
    """Build everything one training step needs from ``config`` (checked first; a bad value raises a
    WorkbenchError naming it before anything compiles).

    Args:
        config: the run's settings (or :meth:`~workbench.TrainConfig.resolved`'s record of them).
        custom: your own model, loss and batches instead of ``config.model`` and ``config.data``.
        modes: a dict kept between calls to reuse built modes (and their compiled steps) when only the
            learning rate, seed or schedule changed.

    Example:
        >>> config = TrainConfig(mode="fsdp", mesh="data=8", batch=64, precision="bf16", accum=2)
        >>> built = build_step(config)
        >>> built.mode.setup.precision, built.mode.setup.accum
        ('bf16', 2)
    """
    resolved = resolve_config(config)
    config = resolved.config
    validate_mesh_for_training(resolved)
    model_cfg, dataset = _data(config, custom)
    if model_cfg is not None:  # the data set's batches are made here: refuse one this host cannot hold
        unit = resolved.mode_class.batch_parts(resolved.mesh_shape) * config.accum
        validate_batch_fits_host(config.batch, batch_bytes(abstract_batch(model_cfg, 1)), unit)
    if custom is not None and custom.initial is not None:  # your own module (its initial split)
        graphdef, params = custom.initial
        model, loss, tp_rules = nnx.merge(graphdef, params), _own_loss(custom), custom.tp_rules
        options = dict(config.model_options)
    else:
        model_cfg = model_cfg or model_config(config.model, **config.model_options)
        model = model_cfg.build(seed=config.seed, remat=resolved.config.remat)
        loss, tp_rules = _registered_loss_and_rules(resolved.model_class, model_cfg)
        options = model_cfg.options
    optimizer = make_optimizer(config.optimizer, config.lr)
    graphdef, state = init_state(model, optimizer)
    mode = _mode(resolved, graphdef, state, loss, tp_rules, optimizer, modes)
    train, evaluate = _batch_sources(config, dataset, custom, mode.batch_share())
    whole = (train if jax.process_count() == 1
             else _batch_sources(config, dataset, custom, _whole_share(config.batch))[0])
    return BuiltStep(config, mode, state, model, loss, train, evaluate, dataset, options, whole)


def _whole_share(rows: int) -> ProcessShare:
    """Every row of each global batch, for this process (what the reference check trains on)."""
    return ProcessShare(jax.process_index(), jax.process_count(), slice(0, rows), rows)


def _registered_loss_and_rules(cls: type[RegisteredModel] | None, model_cfg) -> tuple[LossFn, tuple]:
    if cls is None:  # "custom:..." names no registered model; model_config refuses it before this
        raise WorkbenchError(f"model {model_cfg.name!r} is not a registered model: pass your own as custom")
    return cls.loss, tuple(cls.tensor_parallel_rules(options=model_cfg.options))


def _own_loss(custom: CustomModel) -> LossFn:
    """Your model's loss: the one given, else its class's (CustomModel checked that it has one)."""
    return custom.loss or cast("type[RegisteredModel]", type(custom.module)).loss


def _mode(resolved: ResolvedConfig, graphdef: Any, state: TrainState, loss: LossFn, tp_rules: tuple, optimizer: Any,
          modes: dict | None, devices: tuple | None = None, state_rules: RuleTable | None = None) -> ParallelMode:
    """The built mode for this step, reused from ``modes`` when nothing that decides its program changed."""
    config = resolved.config
    key = (config.mode, config.mesh, config.batch, config.accum, config.precision, config.optimizer, config.faults,
           str(graphdef), str(jax.tree.map(lambda x: (x.shape, str(x.dtype)), state)), id(loss), tp_rules, devices,
           id(state_rules))
    modes = {} if modes is None else modes
    if key not in modes:
        setup = StepSetup(graphdef, loss, optimizer, resolved.mesh_shape, config.batch, config.accum, config.precision,
                          tp_rules, config.faults, devices, state_rules)
        modes[key] = resolved.mode_class(setup)
    return modes[key]


@dataclasses.dataclass(frozen=True, eq=False)
class AbstractStep:
    """What :func:`build_abstract_step` made: the checked ``config``, the built ``mode`` (its mesh over the
    devices asked for), and the ``state`` and ``batch`` as ``jax.ShapeDtypeStruct`` leaves carrying the
    mode's shardings: nothing allocated. ``layers`` lists the model's submodule paths (``blocks/3/mlp``)."""

    config: TrainConfig
    mode: ShardedJitMode
    state: TrainState
    batch: dict[str, jax.ShapeDtypeStruct]
    layers: tuple[str, ...]

    def compile(self, compiler_options: dict[str, Any] | None = None):
        """The mode's step compiled for these shapes and shardings (``mode.compile_step``, with XLA's
        ``compiler_options`` for this compile): a ``jax.stages.Compiled``, never run. Modes that run several programs
        per step raise WorkbenchError."""
        return self.mode.compile_step(self.state, self.batch, compiler_options=compiler_options)


def validate_compiles_ahead(mode: str | type[ParallelMode]) -> None:
    """WorkbenchError unless mode ``mode`` (a name, or its class once resolved) is one jit program over a mesh,
    whose step can be compiled ahead of time for abstract inputs (``simulated`` loops in Python, ``dp-pmap``
    maps over local devices)."""
    cls = mode if isinstance(mode, type) else mode_class(mode)
    if not issubclass(cls, ShardedJitMode):
        raise WorkbenchError(
            f"mode {cls.name!r} ({cls.summary}) is not one jit program over a mesh, so its step cannot be compiled "
            "ahead of time: use 'dp' for the same data parallelism"
        )


def _with_shardings(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                        tree, shardings)


def build_abstract_step(config: TrainConfig | ResolvedConfig, *, seq_len: int | None = None, devices: Any = None,
                        custom: CustomModel | None = None, example_batch: Any = None,
                        state_rules: Any = None) -> AbstractStep:
    """The step :func:`build_step` builds for ``config`` (a registered model), with nothing allocated and no
    data read: parameters and optimizer state come from ``jax.eval_shape``, the batch is
    ``config.batch`` examples of the shapes the model's data holds (``seq_len`` tokens for the
    transformer; default its ``max_len``), all laid out as the mode lays them out.

    Args:
        config: the run's settings (or :meth:`~workbench.TrainConfig.resolved`'s record of them); ``data``
            is not read.
        seq_len: tokens per sequence (language models only).
        devices: the devices of the mesh, in mesh order (e.g. a TPU topology's); default the local ones;
            ``ABSTRACT_DEVICES`` (``"abstract"``): an abstract mesh of any size, to trace the step only.
        custom, example_batch: your own model (``custom.module``, real or abstract, and ``custom.loss``)
            instead of ``config.model``, and a batch of its input (arrays or ``ShapeDtypeStruct``s with
            any number of rows: ``config.batch`` rows are traced).
        state_rules: your own rule table (a :class:`~workbench.layout.rules.RuleTable` or ``(regex, spec)`` pairs)
            placing the whole state instead of the mode's placement (:class:`~.modes.StepSetup`'s
            ``state_rules``): the step :func:`~workbench.plan_training` plans with ``rules``.

    Example:
        >>> step = build_abstract_step(TrainConfig(model="mlp", mode="fsdp", mesh="data=8", batch=64))
        >>> step.batch["x"].shape, step.batch["x"].sharding.spec
        ((64, 64), P('data',))
    """
    resolved = resolve_config(config)
    config = resolved.config
    validate_compiles_ahead(resolved.mode_class)
    devices = tuple(devices) if devices is not None and devices != ABSTRACT_DEVICES else devices
    validate_mesh_for_training(resolved, devices)
    optimizer = make_optimizer(config.optimizer, config.lr)
    if custom is not None:
        if custom.module is None:
            raise WorkbenchError("build_abstract_step traces your own model: pass CustomModel(module=...)")
        module, loss, tp_rules = custom.module, _own_loss(custom), tuple(custom.tp_rules)
        graphdef, state = jax.eval_shape(lambda: init_state(module, optimizer))
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((config.batch, *x.shape[1:]), x.dtype), example_batch)
    else:
        model_cfg = model_config(config.model, **config.model_options)
        loss, tp_rules = _registered_loss_and_rules(resolved.model_class, model_cfg)
        model_of = lambda: model_cfg.build(seed=config.seed, remat=resolved.config.remat)  # noqa: E731
        graphdef, state = jax.eval_shape(lambda: init_state(model_of(), optimizer))
        batch = abstract_batch(model_cfg, config.batch, seq_len)
    # validate_compiles_ahead refused every mode that is not one jit program over a mesh.
    table = None if state_rules is None else RuleTable(state_rules)  # a table given as pairs is read once, here
    mode = cast(ShardedJitMode, _mode(resolved, graphdef, state, loss, tp_rules, optimizer, None, devices, table))
    batch = _with_shardings(batch, jax.tree.map(mode.batch_sharding, batch))
    layers = tuple(module_paths(nnx.merge(graphdef, state.params, state.other)))
    return AbstractStep(config, mode, _with_shardings(state, mode.state_shardings(state)), batch, layers)


__all__ = [
    "AbstractStep", "BuiltStep", "CustomModel", "build_abstract_step", "build_step", "validate_compiles_ahead",
    "validate_mesh_for_training",
]
