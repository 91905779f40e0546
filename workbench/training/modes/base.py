"""The shape every parallel mode has: what it declares about itself, and what a built mode offers.

A mode class *declares* its facts as class attributes (see :class:`ParallelMode`): the mesh axes it
uses, where the batch and the state go, how gradients are combined, the collectives of a step and the
teaching faults it can carry. Everything else asks the class: the mesh and batch checks below, the
planner, the ledger's theory, the widgets and the reference check. A built mode (from a
:class:`StepSetup`) then places state and batches, runs steps and reports its layout.

:class:`ShardedJitMode` implements a built mode for modes that are one ``jax.jit`` with shardings.

Example:
    >>> from workbench.training.modes.dp import DataParallel
    >>> DataParallel.axes, DataParallel.state_placement, [c.kind for c in DataParallel.collectives]
    (('data',), 'replicate', ['all-reduce'])
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, ClassVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..process_share import ProcessShare, batch_share, global_arrays
from ...errors import MeshError, WorkbenchError, nearest_multiples
from ...devices import local_devices_text, more_devices_hint
from ...layout.mesh import DATA_AXIS, MeshShape, abstract_mesh, build_mesh, validate_device_list
from ...layout.rules import RuleTable
from ...layout.specs import without_axes
from ...layout.sharded_rules import ShardedRuleTable
from ...layout.tree_layout import TreeLayout, layout_tree
from .core import (TrainState, accumulate, as_per_device, validate_precision, finish_step, mean_loss_and_grads, means,
                   model_loss, weighted_sums, weighted_sums_of)
from .layout_pins import pinning_loss
from .declaration import OTHER_AXES, CollectiveNeed, MeshFit, example_shape, fit_mesh
from .faults import FAULTS, validate_faults
from .registry import mesh_fit

PLACEMENTS = ("replicate", "shard", "tensor-parallel", "shard-tensor-parallel")
# The placements that shard parameters over 'data' (gathered for the step), and those that split layers over
# 'model' by the model's tensor-parallel rules: "shard-tensor-parallel" does both (fsdp-tp).
DATA_SHARDED_PLACEMENTS = ("shard", "shard-tensor-parallel")
MODEL_SPLIT_PLACEMENTS = ("tensor-parallel", "shard-tensor-parallel")
# How a mode whose parameters are sharded over 'data' gathers them for the step.
PARAMETER_GATHERINGS = {
    "per-layer": "each layer's parameters when the layer is called, and again for its backward pass: one layer's "
                 "whole parameters and gradients are held at a time",
    "whole-tree": "the whole parameter tree at the start of the step, held with its whole gradients until they "
                  "are reduce-scattered",
}
GRADIENT_SYNCS = ("none", "loop", "compiler", "shard_map", "pmap")


@dataclasses.dataclass(frozen=True, eq=False)
class StepSetup:
    """Everything that decides a mode's compiled step.

    Attributes:
        graphdef: the model's ``nnx`` graph definition (``nnx.split``).
        loss: ``(model, batch) -> (loss, aux)``.
        optimizer: an optax transformation.
        mesh: the mesh as a :class:`~workbench.MeshShape` (``parse_mesh("data=8")``): text is read where it
            enters (:meth:`~workbench.TrainConfig.resolved`), never here.
        global_batch: examples per step over all devices and microbatches.
        accum: microbatches per step (gradients summed, one synchronisation, one update).
        precision: ``"fp32"`` or ``"bf16"`` (bfloat16 compute, float32 master weights).
        tp_rules: ``(regex, spec)`` pairs splitting parameters over the model axis (tensor parallelism).
        faults: teaching faults to write into the step (see :mod:`.faults`); none unless asked for.
        devices: the devices to build the mesh over, in mesh order (e.g. a TPU topology's, to compile for
            chips this machine does not have); None: the local devices.
        state_rules: your own rule table (a :class:`~workbench.layout.rules.RuleTable`) placing the whole state
            instead of the mode's declared placement, a leaf whose spec does not fit replicated: the layout
            :func:`~workbench.plan_training` plans with ``rules``, so its verification compiles that layout. None:
            the mode's own placement.
    """

    graphdef: Any
    loss: Any
    optimizer: Any
    mesh: MeshShape = MeshShape((DATA_AXIS,), (8,))
    global_batch: int = 256
    accum: int = 1
    precision: str = "fp32"
    tp_rules: tuple = ()
    faults: tuple = ()
    devices: tuple | None = None
    state_rules: RuleTable | None = None

    def __post_init__(self):
        if not isinstance(self.mesh, MeshShape):  # parsed where it entered, once: a setup holds the record
            raise WorkbenchError(f"StepSetup.mesh must be a MeshShape, not {type(self.mesh).__name__} {self.mesh!r}: "
                                 f"pass parse_mesh({self.mesh!r})")


def validate_batch(setup: StepSetup, parts: int, what: str) -> None:
    """WorkbenchError unless the global batch splits into ``accum`` microbatches of ``parts`` equal shares."""
    if isinstance(setup.accum, bool) or not isinstance(setup.accum, int) or setup.accum < 1:
        raise WorkbenchError(f"accum={setup.accum!r} must be a whole number >= 1 (microbatches per step): "
                             "use 1 for none")
    unit = parts * setup.accum
    if setup.global_batch % unit:
        nearest = nearest_multiples(setup.global_batch, unit)
        split = f"{setup.accum} microbatches x {what}" if setup.accum > 1 else what
        raise WorkbenchError(
            f"global batch {setup.global_batch} does not split into {split} ({unit} equal parts): "
            f"use a batch of {nearest} (a multiple of {unit})"
        )


# ``StepSetup.devices`` for a mode built over an abstract mesh of any size: its step can be traced (e.g. to
# simulate its memory, :mod:`workbench.analysis.step_memory`), not compiled or run.
ABSTRACT_DEVICES = "abstract"


def training_mesh(shape: MeshShape, devices: Any = None) -> Mesh | jax.sharding.AbstractMesh:
    """A mesh with Auto axes over the first ``shape.size`` local devices, or over ``devices`` (in mesh order),
    or an abstract one (``devices=ABSTRACT_DEVICES``) for tracing only.

    Auto, not Explicit: the compiler then chooses how to compute with sharded weights (e.g. the
    all-reduce after a row-parallel matmul), where Explicit axes refuse a sharded contraction.
    """
    if isinstance(devices, str) and devices == ABSTRACT_DEVICES:
        return abstract_mesh(shape, axis_types="auto")
    if devices is not None:
        return build_mesh(shape, axis_types="auto", devices=list(devices))
    validate_enough_devices(shape)
    return build_mesh(shape, axis_types="auto", devices=jax.devices()[: shape.size])


def validate_enough_devices(shape: MeshShape, devices: Any = None) -> None:
    """MeshError unless :func:`training_mesh` can lay ``shape`` over ``devices`` (exactly ``shape.size`` given),
    or over the first ``shape.size`` local devices (None); an abstract mesh (``ABSTRACT_DEVICES``) has any size.
    The messages are the ones building the mesh gives, without building it."""
    if isinstance(devices, str) and devices == ABSTRACT_DEVICES:
        return
    if devices is not None:
        validate_device_list(shape, devices)
        return
    if shape.size > len(jax.devices()):
        raise MeshError(
            f"mesh {shape} needs {shape.size} devices but JAX has {local_devices_text()}: use a smaller mesh, "
            f"{more_devices_hint(shape.size)}"
        )


def single_device_mesh(devices: Any = None) -> Mesh | jax.sharding.AbstractMesh:
    """A ``data=1`` mesh on the first device (of ``devices``, else the local ones): where ``single`` and
    ``simulated`` compute."""
    if isinstance(devices, str) and devices == ABSTRACT_DEVICES:
        return training_mesh(MeshShape((DATA_AXIS,), (1,)), devices)
    # This process's first device: across processes, jax.devices()[0] belongs to process 0 only.
    return build_mesh({DATA_AXIS: 1}, axis_types="auto", devices=list(devices or jax.local_devices())[:1])


def host_copy(state: Any) -> Any:
    """Every array of ``state`` copied to the host (NumPy; PRNG keys stay keys), so that placing it gives
    device buffers of its own: a step donates them, and must not delete the caller's arrays.

    Why not ``jax.device_put(..., may_alias=False)``: measured on JAX 0.10.2, placing a one-device array
    replicated over 4 devices that way still shared the first device's buffer with the source, and
    donating the placed array deleted the source.

    Example:
        >>> type(host_copy({"w": jax.numpy.ones(2)})["w"]).__name__
        'ndarray'
    """

    def copy(leaf):
        if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            # JAX annotates the key bits as a jax.Array; any uint32 array works, here a host (NumPy) copy.
            return jax.random.wrap_key_data(np.array(jax.random.key_data(leaf)),  # pyright: ignore[reportArgumentType]
                                            impl=jax.random.key_impl(leaf))
        return np.array(leaf, copy=True) if isinstance(leaf, (jax.Array, np.ndarray)) else leaf

    return jax.tree.map(copy, state)


def step_sums(setup: StepSetup, params: Any, other: Any, batch: Any) -> dict[str, Any]:
    """Weighted gradient and metric sums over the ``accum`` microbatches of ``batch`` (see :mod:`.core`).

    Each microbatch's loss is weighted before it is differentiated (:func:`~.core.weighted_sums_of`), as fsdp's are:
    weighted after, each gradient is multiplied by a broadcast of the weight, and XLA merges the broadcasts of one
    shape into one value, whose single layout libtpu then moved between the gradients split over ``model`` one way
    and the other (an all-to-all per kernel and microbatch in ``dp-tp``'s accumulation).
    """

    def sums_of(micro: Any) -> dict[str, Any]:
        return weighted_sums_of(lambda p: model_loss(setup.graphdef, setup.loss, setup.precision, p, other, micro),
                                params, micro)

    return accumulate(sums_of, batch, setup.accum)


def placement_argument(state_placement: str, tp_rules: Any) -> Any:
    """What :func:`~workbench.layout.tree_layout.layout_tree` takes to place a state as declared:
    ``"replicate"``, ``"shard"`` (largest divisible dimension over ``data``), the model's rule table, or that
    table with each leaf sharded over ``data`` too (``"shard-tensor-parallel"``).

    Example:
        >>> placement_argument("shard-tensor-parallel", [(r"kernel$", "None, model")])
        ShardedRuleTable([('kernel$', 'None, model')])
    """
    if state_placement == "shard-tensor-parallel":
        return ShardedRuleTable(list(tp_rules), data_axis=DATA_AXIS)
    return RuleTable(list(tp_rules)) if state_placement == "tensor-parallel" else state_placement


class ParallelMode(abc.ABC):
    """A parallel mode: its declaration (class attributes, the one place each fact is written) and
    the methods a built mode has. A new mode is one subclass in one file, plus its test.

    Declaration:
        name, summary: the mode's name and one line for menus and ``--help``.
        sharded: what is split over devices, in words.
        axes: the mesh axes it uses.
        mesh_example: a mesh it trains on, e.g. ``"data=8"`` (fixes are derived from it).
        one_device: it computes on one device (``single``, ``simulated``).
        other_axes: what it does with mesh axes it does not use: ``"replicate"`` (their devices hold
            copies and repeat the work: it trains, with a warning), ``"ignore"`` (one device) or ``"refuse"``.
        batch_axis: the axis the global batch is split over; None: every device sees the whole batch.
        state_placement: ``"replicate"``, ``"shard"`` (over ``data``), ``"tensor-parallel"`` (the model's rules)
            or ``"shard-tensor-parallel"`` (the model's rules, and each leaf over ``data`` too).
        parameter_gathering: for a placement that shards over ``data``, how parameters are gathered for the step: a key
            of :data:`PARAMETER_GATHERINGS` (``"per-layer"`` or ``"whole-tree"``); None otherwise.
        stacked_state: the placed state holds one stacked copy per device (``pmap``).
        gradient_sync: where gradients are combined: ``none``, ``loop``, ``compiler``, ``shard_map``, ``pmap``.
        collectives: the :class:`CollectiveNeed` of one step (what the compiled step must show).
        supported_faults: teaching faults it can carry; ``fault_reasons`` says, for every other fault,
            why it cannot.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    sharded: ClassVar[str]
    axes: ClassVar[tuple[str, ...]]
    mesh_example: ClassVar[str]
    one_device: ClassVar[bool] = False
    other_axes: ClassVar[str] = "replicate"
    batch_axis: ClassVar[str | None] = DATA_AXIS
    state_placement: ClassVar[str] = "replicate"
    parameter_gathering: ClassVar[str | None] = None
    stacked_state: ClassVar[bool] = False
    gradient_sync: ClassVar[str] = "compiler"
    collectives: ClassVar[tuple[CollectiveNeed, ...]] = ()
    supported_faults: ClassVar[tuple[str, ...]] = ("optimizer-reset", "same-shard")
    fault_reasons: ClassVar[dict[str, str]] = {}

    def __init__(self, setup: StepSetup):
        validate_precision(setup.precision)
        self.faults = validate_faults(setup.faults, self.name, self.supported_faults, self.fault_reasons)
        self.setup = dataclasses.replace(setup, faults=self.faults) if self.faults != setup.faults else setup
        self.validate(self.setup)

    # --- derived from the declaration ----------------------------------------------------------------

    @classmethod
    def fit_mesh(cls, mesh: Any, alternative: str | None = None) -> MeshFit:
        """Whether this mode trains on ``mesh``, with the fixes to offer when not (see :func:`.fit_mesh`)."""
        return fit_mesh(cls.name, cls.axes, other_axes=cls.other_axes, mesh=mesh, example=cls.mesh_example,
                        alternative=alternative)

    @classmethod
    def batch_parts(cls, mesh: MeshShape) -> int:
        """How many equal parts each (micro)batch is split into: the size of ``batch_axis``."""
        return mesh.axis_size(cls.batch_axis) if cls.batch_axis else 1

    @classmethod
    def validate(cls, setup: StepSetup) -> None:
        """Raise a WorkbenchError (before anything is compiled) if this mode cannot run ``setup``."""
        fit = mesh_fit(cls, setup.mesh)  # the registry knows which mode to offer instead
        if not fit.ok:
            raise MeshError(fit.message)
        if cls.state_placement in MODEL_SPLIT_PLACEMENTS and not setup.tp_rules:
            raise WorkbenchError(
                f"mode {cls.name!r} splits layers over the 'model' axis, but this model has no splittable layer pair "
                "(a single linear layer has none): choose mlp, cnn or transformer, or a data-parallel mode"
            )
        cls.validate_batch_split(setup)

    @classmethod
    def validate_batch_split(cls, setup: StepSetup) -> None:
        """WorkbenchError unless ``setup``'s global batch splits into its microbatches of this mode's parts."""
        parts = cls.batch_parts(setup.mesh)
        where = "1 device" if cls.batch_axis is None and cls.one_device else (
            "the whole batch on each device" if cls.batch_axis is None else f"{parts} parts over {cls.batch_axis!r}")
        validate_batch(setup, parts, where)

    @property
    def data_parallel_size(self) -> int:
        """How many parts each global batch is split into across devices (1: not split)."""
        return self.batch_parts(self.setup.mesh)

    def replica_devices(self) -> list[list[int]] | None:
        """The ids of the devices that hold each replica's rows of the batch, in replica order (replica ``r`` is
        coordinate ``r`` of the batch axis: on ``data=4,model=2``, replica 1 is devices 2 and 3); None when the
        replicas are not devices (one-device modes, which loop over shards).

        Example:
            >>> import optax
            >>> from flax import nnx
            >>> from workbench.training.models import abstract_model, model_class
            >>> from workbench.training.modes import build_mode
            >>> g, loss, tx = nnx.graphdef(abstract_model("mlp")), model_class("mlp").loss, optax.sgd(0.1)
            >>> from workbench.layout import parse_mesh
            >>> rules = tuple(model_class("mlp").tensor_parallel_rules())  # split hidden1 and hidden2 over 'model'
            >>> setup = StepSetup(g, loss, tx, parse_mesh("data=4,model=2"), 64, tp_rules=rules)
            >>> build_mode("dp-tp", setup).replica_devices()
            [[0, 1], [2, 3], [4, 5], [6, 7]]
        """
        mesh = getattr(self, "mesh", None)
        if self.one_device or self.batch_axis is None or mesh is None or self.batch_axis not in mesh.axis_names:
            return None
        axis = mesh.axis_names.index(self.batch_axis)
        devices = np.asarray(mesh.devices)
        rows = devices.swapaxes(0, axis).reshape(devices.shape[axis], -1)  # one row of devices per replica
        return [[int(device.id) for device in row] for row in rows]

    @property
    def batch_spec(self) -> PartitionSpec:
        return PartitionSpec(self.batch_axis) if self.batch_axis else PartitionSpec()

    # --- what a built mode does ------------------------------------------------------------------------

    @abc.abstractmethod
    def place_state(self, state: TrainState) -> TrainState:
        """A host state placed where this mode computes on it, in buffers of its own.

        :meth:`step` donates the state it is given (its buffers become the new state's, as production
        steps do, so a device never holds the old and the new state at once): the placed state is
        consumed by the step, and ``state`` itself stays usable, so one start state can be stepped twice.
        """

    @abc.abstractmethod
    def place_batch(self, batch: Any) -> Any:
        """This process's rows of a global NumPy batch (:meth:`batch_share`; in one process the whole
        batch) placed (or cut) as this mode reads it: one global batch across all processes."""

    def batch_share(self, process_index: int | None = None) -> ProcessShare:
        """The rows of each global batch process ``process_index`` (default: this one) loads: those its
        devices hold. With the ``same-shard`` teaching fault every process loads process 0's rows.

        Example:
            >>> import optax
            >>> from flax import nnx
            >>> from workbench.training.models import abstract_model, model_class
            >>> from workbench.training.modes import build_mode
            >>> g, loss, tx = nnx.graphdef(abstract_model("mlp")), model_class("mlp").loss, optax.sgd(0.1)
            >>> from workbench.layout import parse_mesh
            >>> mode = build_mode("dp", StepSetup(g, loss, tx, parse_mesh("data=8"), 256))
            >>> mode.batch_share().rows  # one process: every row
            slice(0, 256, None)
        """
        mesh = getattr(self, "mesh", None)
        if mesh is None:  # computes on one device, in one process: the whole batch
            return ProcessShare(0, 1, slice(0, self.setup.global_batch), self.setup.global_batch)
        if "same-shard" in self.faults:  # the fault: every process loads the rows of process 0
            own = batch_share(mesh, self.batch_axis, self.setup.global_batch, process_index)
            return dataclasses.replace(own, rows=batch_share(mesh, self.batch_axis, self.setup.global_batch, 0).rows)
        return batch_share(mesh, self.batch_axis, self.setup.global_batch, process_index)

    def _global_leading(self, local_rows: int) -> int:
        """The global batch size whose process part has ``local_rows`` rows (eval batches are as large)."""
        share = vars(self).get("_own_share")
        if share is None:  # fixed for a built mode: worked out once, not on every step
            share = vars(self)["_own_share"] = self.batch_share()
        return local_rows * share.global_rows // share.size

    @abc.abstractmethod
    def step(self, state: TrainState, batch: Any, diagnostics: bool = False) -> tuple[TrainState, dict[str, Any]]:
        """One update: ``(new_state, metrics)``, metrics left on the device. ``state`` is donated: its
        arrays are deleted, so keep only the new state (``mode.export_state`` it first to keep a copy)."""

    @abc.abstractmethod
    def eval_sums(self, state: TrainState, batch: Any) -> dict[str, Any]:
        """Weighted loss sums without gradients (see :mod:`.core`)."""

    @abc.abstractmethod
    def state_layout(self, state: TrainState) -> TreeLayout:
        """The :class:`~workbench.layout.TreeLayout` of the (exported) state as this mode places it."""

    def export_state(self, state: TrainState) -> TrainState:
        """The state in the plain form every mode shares (for comparison, saving)."""
        return state

    def restore_shardings(self, state: TrainState) -> Any:
        """The sharding of each leaf of a plain state, where a checkpoint is read into: by default this
        process's first device, and :meth:`place_restored` places it from there."""
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda _: device, state)

    def place_restored(self, state: TrainState) -> TrainState:
        """A state read into :meth:`restore_shardings`, placed as this mode computes on it."""
        return self.place_state(state)

    def compile_step(self, state: TrainState, batch: Any, diagnostics: bool = False,
                     compiler_options: dict[str, Any] | None = None):
        """The step compiled for these (placed) inputs, a ``jax.stages.Compiled``: its ``as_text()``
        is the optimised HLO (the collectives a step runs), ``memory_analysis()`` and ``cost_analysis()``
        the compiler's estimates. ``compiler_options``: XLA's options for this compile only (``Lowered.compile``'s),
        e.g. ``{"xla_gpu_memory_limit_slop_factor": 1000}``. Modes that run more than one program per step raise
        WorkbenchError.
        """
        raise WorkbenchError(
            f"mode {self.name!r} runs several programs per step, so there is no single compiled step to "
            "inspect: use 'dp' to see the collectives of the same data parallelism"
        )

    def precompile(self, state: TrainState, batch: Any) -> None:  # noqa: B027 - optional: by default, nothing
        """Compile the ordinary step (``diagnostics=False``) ahead of time, without running it.

        The trainer runs step 1 with diagnostics and calls this right after, so the second variant's
        compile time is reported with the first's instead of slowing the first logging interval.
        """


def validate_declaration(cls: type[ParallelMode]) -> None:
    """TypeError naming what a mode class leaves undeclared or declares wrongly (checked at registration)."""
    missing = [a for a in ("name", "summary", "sharded", "axes", "mesh_example") if not hasattr(cls, a)]
    problems = [f"declares no {a}" for a in missing]
    if cls.state_placement not in PLACEMENTS:
        problems.append(f"state_placement {cls.state_placement!r} is not one of {PLACEMENTS}")
    if cls.other_axes not in OTHER_AXES:
        problems.append(f"other_axes {cls.other_axes!r} is not one of {tuple(OTHER_AXES)}")
    if cls.state_placement in DATA_SHARDED_PLACEMENTS and cls.parameter_gathering not in PARAMETER_GATHERINGS:
        problems.append(f"shards its parameters but parameter_gathering {cls.parameter_gathering!r} is not one of "
                        f"{tuple(PARAMETER_GATHERINGS)}")
    if cls.state_placement not in DATA_SHARDED_PLACEMENTS and cls.parameter_gathering is not None:
        problems.append(f"declares parameter_gathering {cls.parameter_gathering!r} but does not shard its parameters")
    if cls.gradient_sync not in GRADIENT_SYNCS:
        problems.append(f"gradient_sync {cls.gradient_sync!r} is not one of {GRADIENT_SYNCS}")
    unexplained = [f for f in FAULTS if f not in cls.supported_faults and f not in cls.fault_reasons]
    if unexplained:
        problems.append(f"gives no reason in fault_reasons why it cannot carry {', '.join(unexplained)}")
    if not missing and cls.batch_axis is not None and cls.batch_axis not in cls.axes:
        problems.append(f"splits the batch over {cls.batch_axis!r}, which is not one of its axes {cls.axes}")
    if problems:
        raise TypeError(f"mode class {cls.__name__}: " + "; ".join(problems))
    example_shape(cls.mesh_example)  # a malformed example fails here; read once, every fit asks the record


class ShardedJitMode(ParallelMode):
    """A mode that is one ``jax.jit`` with shardings: the compiler inserts every collective.

    Its batch spec and state layout follow from the declaration (``batch_axis``, ``state_placement``);
    a subclass may override :meth:`compute_params` (what the forward pass uses) or ``_step_fn``.
    """

    def __init__(self, setup: StepSetup):
        super().__init__(setup)
        self.mesh = self.build_mesh(setup)
        self._steps: dict[bool, Any] = {}  # diagnostics -> compiled step
        self._eval = None

    def build_mesh(self, setup: StepSetup) -> Mesh | jax.sharding.AbstractMesh:
        return training_mesh(setup.mesh, setup.devices)

    def state_layout(self, state: TrainState) -> TreeLayout:
        if self.setup.state_rules is not None:  # laid out as the planner lays out your table: a misfit replicates
            return layout_tree(state, self.mesh, self.setup.state_rules, data_axis=DATA_AXIS, on_invalid="replicate")
        placement = placement_argument(self.state_placement, self.setup.tp_rules)
        return layout_tree(state, self.mesh, placement, data_axis=DATA_AXIS)

    def state_shardings(self, state: TrainState) -> Any:
        specs = iter(leaf.layout.spec for leaf in self.state_layout(state).leaves)
        return jax.tree.map(lambda _: NamedSharding(self.mesh, next(specs)), state)

    def batch_sharding(self, leaf: Any) -> NamedSharding:
        entries = tuple(self.batch_spec)[: np.ndim(leaf)]
        return NamedSharding(self.mesh, PartitionSpec(*entries))

    def place_state(self, state: TrainState) -> TrainState:
        return jax.device_put(host_copy(state), self.state_shardings(state))  # buffers the step may donate

    def restore_shardings(self, state: TrainState) -> Any:
        return self.state_shardings(state)  # read straight into this mode's layout: no copy on one device

    def place_restored(self, state: TrainState) -> TrainState:
        return state  # already laid out, in fresh buffers the step may donate

    def place_batch(self, batch: Any) -> Any:
        leading = self._global_leading(len(jax.tree.leaves(batch)[0]))
        return global_arrays(batch, jax.tree.map(self.batch_sharding, batch), leading)

    def compute_params(self, params: Any) -> Any:
        """The parameters as the forward pass uses them (identity; FSDP gathers them here)."""
        return params

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        params = self.compute_params(state.params)
        if self.setup.accum == 1:  # the loss's own mean over the sharded batch is exact: no weighting needed
            result = mean_loss_and_grads(self.setup.graphdef, self.setup.loss, self.setup.precision, params,
                                         state.other, batch)
        else:
            layout = jax.tree.map(lambda sharding: sharding.spec, self.state_shardings(state).params)
            result = means(self._accumulated_sums(params, state.other, batch, layout))
        return finish_step(self.setup.optimizer, state, result, diagnostics, self.faults)

    def _compiled_step(self, state: TrainState, diagnostics: bool):
        if diagnostics not in self._steps:
            shardings = self.state_shardings(state)
            self._steps[diagnostics] = jax.jit(  # the state is donated: the new state reuses its buffers
                self.step_function(diagnostics), out_shardings=(shardings, None), donate_argnums=0,
            )
        return self._steps[diagnostics]

    def step(self, state: TrainState, batch: Any, diagnostics: bool = False):
        return self._compiled_step(state, diagnostics)(state, batch)

    def step_function(self, diagnostics: bool = False):
        """The step as a plain function ``(state, batch) -> (state, metrics)``: what :meth:`step` jits (with the
        state's shardings out and the state donated), for a caller that jits it its own way (exporting it to
        compile in another process, :mod:`workbench.analysis.exported_step`)."""
        return functools.partial(self._step_fn, diagnostics=diagnostics)

    def _accumulated_sums(self, params: Any, other: Any, batch: Any, layout: Any) -> dict[str, Any]:
        """Weighted sums over the microbatches, synchronised ONCE over ``data``.

        Left to itself the compiler all-reduces every microbatch's gradient inside the scan (measured:
        4 all-reduces per step with accum=4). So the accumulation runs per device in a shard_map that is
        manual over ``data`` only (other axes, e.g. ``model``, stay the compiler's), and one psum follows.
        There the parameters are held to their layout ``layout`` (their specs) over those other axes
        (:mod:`.layout_pins`: why).
        """
        if DATA_AXIS not in self.batch_spec or self.mesh.shape.get(DATA_AXIS, 1) == 1:
            return step_sums(self.setup, params, other, batch)
        setup = self.setup
        if any(size > 1 for axis, size in self.mesh.shape.items() if axis != DATA_AXIS):
            kept = jax.tree.map(lambda spec: without_axes(spec, {DATA_AXIS}), layout,
                                is_leaf=lambda x: isinstance(x, PartitionSpec))
            setup = dataclasses.replace(setup, loss=pinning_loss(setup.loss, kept))

        def local(params, other, shard):
            params = as_per_device(params, DATA_AXIS)  # local gradients, summed once below
            return jax.lax.psum(step_sums(setup, params, other, shard), DATA_AXIS)

        return jax.shard_map(
            local, mesh=self.mesh, in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs=PartitionSpec(), axis_names={DATA_AXIS}, check_vma=True,
        )(params, other, batch)

    def compile_step(self, state: TrainState, batch: Any, diagnostics: bool = False,
                     compiler_options: dict[str, Any] | None = None):
        return self._compiled_step(state, diagnostics).lower(state, batch).compile(compiler_options)  # jit's cache

    def precompile(self, state: TrainState, batch: Any) -> None:
        self.compile_step(state, batch)

    def eval_sums(self, state: TrainState, batch: Any) -> dict[str, Any]:
        if self._eval is None:

            def evaluate(state, batch):
                params = self.compute_params(state.params)
                return weighted_sums(
                    self.setup.graphdef, self.setup.loss, self.setup.precision, params, state.other, batch,
                    with_grads=False,
                )

            self._eval = jax.jit(evaluate)
        return self._eval(state, batch)
