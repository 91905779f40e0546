"""The shape every parallel mode has, and the jit-with-shardings mode most of them are.

A mode is built from a :class:`StepPlan` (model graph, loss, optimizer, mesh, batch size, accumulation,
precision). Building checks the plan and raises before anything compiles. A built mode then offers:

* ``place_state(state)`` / ``place_batch(batch)``: put a host state or NumPy batch where it computes;
* ``step(state, batch, diagnostics=False) -> (state, metrics)``: one update, metrics left on the
  device: the loss, plus gradient norms with ``diagnostics`` (a second compiled variant, used by the
  trainer at logging steps only, so ordinary steps cost what a hand-written step costs);
* ``eval_sums(state, batch)``: weighted loss sums without gradients (see :mod:`.core`);
* ``export_state(state)``: the state in the plain form every mode shares (for comparison, saving);
* ``state_layout(state)``: the :class:`~workbench.layout.tree_layout.TreeLayout` of the placed state.

:class:`ShardedJitMode` implements all of it for modes that are one ``jax.jit`` with input and output
shardings: a subclass names its batch spec and state layout, nothing else. The compiled step is made once
per built mode: a trainer that keeps the mode keeps the compiled step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ...errors import MeshError, WorkbenchError, nearest_multiples
from ...layout.mesh import MeshShape, build_mesh, parse_mesh
from ...layout.tree_layout import TreeLayout, layout_tree
from .faults import check_faults
from .core import TrainState, accumulate, as_per_device, check_precision, finish_step, mean_loss_and_grads, means, weighted_sums

DATA_AXIS, MODEL_AXIS = "data", "model"


@dataclasses.dataclass(frozen=True, eq=False)
class StepPlan:
    """Everything that decides a mode's compiled step.

    Attributes:
        graphdef: the model's ``nnx`` graph definition (``nnx.split``).
        loss: ``(model, batch) -> (loss, aux)``.
        optimizer: an optax transformation.
        mesh: the mesh description, e.g. ``"data=8"`` (a ``MeshShape``, text, dict or ``Mesh``).
        global_batch: examples per step over all devices and microbatches.
        accum: microbatches per step (gradients summed, one synchronisation, one update).
        precision: ``"fp32"`` or ``"bf16"`` (bfloat16 compute, float32 master weights).
        tp_rules: ``(regex, spec)`` pairs splitting parameters over the model axis (tensor parallelism).
        faults: teaching faults to write into the step (see :mod:`.faults`); none unless asked for.
    """

    graphdef: Any
    loss: Any
    optimizer: Any
    mesh: Any = "data=8"
    global_batch: int = 256
    accum: int = 1
    precision: str = "fp32"
    tp_rules: tuple = ()
    faults: tuple = ()

    @property
    def mesh_shape(self) -> MeshShape:
        return parse_mesh(self.mesh)


def axis_size(plan: StepPlan, axis: str, mode: str, example: str) -> int:
    """The size of ``axis`` in the plan's mesh; a MeshError naming the mode when the mesh lacks it."""
    shape = plan.mesh_shape
    if axis not in shape.names:
        raise MeshError(
            f"mode {mode!r} needs a mesh axis {axis!r}, but mesh {shape} has {', '.join(shape.names)}: "
            f"use e.g. --mesh {example}"
        )
    return shape.axis_size(axis)


def only_axes(plan: StepPlan, allowed: tuple[str, ...], mode: str, instead: str) -> None:
    """MeshError when the mesh splits devices over an axis ``mode`` does not use (size > 1)."""
    extra = {n: s for n, s in plan.mesh_shape.axes.items() if n not in allowed and s > 1}
    if extra:
        name, size = next(iter(extra.items()))
        raise MeshError(
            f"mode {mode!r} uses only mesh axes {', '.join(repr(a) for a in allowed)}, but mesh {plan.mesh_shape} "
            f"also splits {size} devices over {name!r}: {instead}"
        )


def check_batch(plan: StepPlan, parts: int, what: str) -> None:
    """WorkbenchError unless the global batch splits into ``accum`` microbatches of ``parts`` equal shares."""
    if isinstance(plan.accum, bool) or not isinstance(plan.accum, int) or plan.accum < 1:
        raise WorkbenchError(f"accum={plan.accum!r} must be a whole number >= 1 (microbatches per step): use 1 for none")
    unit = parts * plan.accum
    if plan.global_batch % unit:
        nearest = nearest_multiples(plan.global_batch, unit)
        split = f"{plan.accum} microbatches x {what}" if plan.accum > 1 else what
        raise WorkbenchError(
            f"global batch {plan.global_batch} does not split into {split} ({unit} equal parts): "
            f"use a batch of {nearest} (a multiple of {unit})"
        )


def check_data_parallel(plan: StepPlan, mode: str, other_axes: str) -> int:
    """The checks every 1-D data-parallel mode makes; returns the ``data`` axis size.

    ``other_axes`` is the advice given when the mesh also splits devices over another axis.
    """
    size = axis_size(plan, DATA_AXIS, mode, "data=8")
    only_axes(plan, (DATA_AXIS,), mode, other_axes)
    check_batch(plan, size, f"{size} devices of 'data'")
    return size


def training_mesh(shape: MeshShape) -> Mesh:
    """A mesh with Auto axes over the first ``shape.size`` local devices.

    Auto, not Explicit: the compiler then chooses how to compute with sharded weights (e.g. the
    all-reduce after a row-parallel matmul), where Explicit axes refuse a sharded contraction.
    """
    available = len(jax.devices())
    if shape.size > available:
        raise MeshError(
            f"mesh {shape} needs {shape.size} devices but JAX has {available}: use a smaller mesh, or set "
            f"WORKBENCH_CPU_DEVICES={shape.size} before importing workbench (restart the kernel)"
        )
    return build_mesh(shape, axis_types="auto", devices=jax.devices()[: shape.size])


def single_device_mesh() -> Mesh:
    """A ``data=1`` mesh on the first device: where ``single`` and ``simulated`` compute."""
    return build_mesh({DATA_AXIS: 1}, axis_types="auto", devices=jax.devices()[:1])


def step_sums(plan: StepPlan, params: Any, other: Any, batch: Any) -> dict[str, Any]:
    """Weighted gradient and metric sums over the ``accum`` microbatches of ``batch`` (see :mod:`.core`)."""
    return accumulate(
        lambda micro: weighted_sums(plan.graphdef, plan.loss, plan.precision, params, other, micro), batch, plan.accum
    )


class ParallelMode:
    """Base of every mode: the plan, checked; subclasses fill in the methods listed in the module doc."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for menus and --help
    # Teaching faults this mode can write into its step; losing the optimizer state is possible anywhere.
    supported_faults: ClassVar[tuple[str, ...]] = ("optimizer-reset",)
    # Where the gradient is combined: "none" (one device), "loop", "compiler", "shard_map" or "pmap".
    # The reference check uses it to rank causes (a double count under check_vma needs shard_map).
    gradient_sync: ClassVar[str] = "compiler"

    def __init__(self, plan: StepPlan):
        check_precision(plan.precision)
        self.faults = check_faults(plan.faults, self.name, self.supported_faults)
        self.plan = dataclasses.replace(plan, faults=self.faults) if self.faults != plan.faults else plan
        self.check(plan)

    @classmethod
    def check(cls, plan: StepPlan) -> None:
        """Raise a WorkbenchError (before anything is compiled) if this mode cannot run ``plan``."""

    @property
    def data_parallel_size(self) -> int:
        """How many parts each global batch is split into across devices (1: not split)."""
        return 1

    def export_state(self, state: TrainState) -> TrainState:
        return state

    def compile_step(self, state: TrainState, batch: Any, diagnostics: bool = False):
        """The step compiled for these (placed) inputs, a ``jax.stages.Compiled``: its ``as_text()``
        is the optimised HLO (the collectives a step runs), ``memory_analysis()`` and ``cost_analysis()``
        the compiler's estimates. Modes that run more than one program per step raise WorkbenchError.
        """
        raise WorkbenchError(
            f"mode {self.name!r} runs several programs per step, so there is no single compiled step to "
            "inspect: use 'dp' to see the collectives of the same data parallelism"
        )

    def precompile(self, state: TrainState, batch: Any) -> None:
        """Compile the ordinary step (``diagnostics=False``) ahead of time, without running it.

        The trainer runs step 1 with diagnostics and calls this right after, so the second variant's
        compile time is reported with the first's instead of slowing the first logging interval.
        """

    def eval_sums(self, state: TrainState, batch: Any) -> dict[str, Any]:
        raise NotImplementedError


class ShardedJitMode(ParallelMode):
    """A mode that is one ``jax.jit`` with shardings: the compiler inserts every collective.

    Subclasses set ``batch_spec`` and ``state_placement`` (any ``specs`` argument of
    :func:`~workbench.layout.tree_layout.layout_tree`), and may override :meth:`compute_params` (FSDP gathers).
    """

    batch_spec: ClassVar[PartitionSpec] = PartitionSpec(DATA_AXIS)
    state_placement: ClassVar[Any] = "replicate"

    def __init__(self, plan: StepPlan):
        super().__init__(plan)
        self.mesh = self.build_mesh(plan)
        self._steps: dict[bool, Any] = {}  # diagnostics -> compiled step
        self._eval = None

    def build_mesh(self, plan: StepPlan) -> Mesh:
        return training_mesh(plan.mesh_shape)

    @property
    def data_parallel_size(self) -> int:
        axes = [a for a in self.batch_spec if a is not None]
        return math.prod(self.mesh.shape[a] for a in axes)

    def placement(self) -> Any:
        """The ``layout_tree`` argument that places the state."""
        return self.state_placement

    def state_layout(self, state: TrainState) -> TreeLayout:
        return layout_tree(state, self.mesh, self.placement(), data_axis=DATA_AXIS)

    def state_shardings(self, state: TrainState) -> Any:
        specs = iter(leaf.layout.spec for leaf in self.state_layout(state).leaves)
        return jax.tree.map(lambda _: NamedSharding(self.mesh, next(specs)), state)

    def batch_sharding(self, leaf: Any) -> NamedSharding:
        entries = tuple(self.batch_spec)[: np.ndim(leaf)]
        return NamedSharding(self.mesh, PartitionSpec(*entries))

    def place_state(self, state: TrainState) -> TrainState:
        return jax.device_put(state, self.state_shardings(state))

    def place_batch(self, batch: Any) -> Any:
        return jax.device_put(batch, jax.tree.map(self.batch_sharding, batch))

    def compute_params(self, params: Any) -> Any:
        """The parameters as the forward pass uses them (identity; FSDP gathers them here)."""
        return params

    def _step_fn(self, state: TrainState, batch: Any, diagnostics: bool):
        params = self.compute_params(state.params)
        if self.plan.accum == 1:  # the loss's own mean over the sharded batch is exact: no weighting needed
            result = mean_loss_and_grads(self.plan.graphdef, self.plan.loss, self.plan.precision, params, state.other, batch)
        else:
            result = means(self._accumulated_sums(params, state.other, batch))
        return finish_step(self.plan.optimizer, state, result, diagnostics, self.faults)

    def _compiled_step(self, state: TrainState, diagnostics: bool):
        if diagnostics not in self._steps:
            shardings = self.state_shardings(state)
            self._steps[diagnostics] = jax.jit(
                functools.partial(self._step_fn, diagnostics=diagnostics), out_shardings=(shardings, None)
            )
        return self._steps[diagnostics]

    def step(self, state: TrainState, batch: Any, diagnostics: bool = False):
        return self._compiled_step(state, diagnostics)(state, batch)

    def _accumulated_sums(self, params: Any, other: Any, batch: Any) -> dict[str, Any]:
        """Weighted sums over the microbatches, synchronised ONCE over ``data``.

        Left to itself the compiler all-reduces every microbatch's gradient inside the scan (measured:
        4 all-reduces per step with accum=4). So the accumulation runs per device in a shard_map that is
        manual over ``data`` only (other axes, e.g. ``model``, stay the compiler's), and one psum follows.
        """
        if DATA_AXIS not in self.batch_spec or self.mesh.shape.get(DATA_AXIS, 1) == 1:
            return step_sums(self.plan, params, other, batch)

        def local(params, other, shard):
            params = as_per_device(params, DATA_AXIS)  # local gradients, summed once below
            return jax.lax.psum(step_sums(self.plan, params, other, shard), DATA_AXIS)

        return jax.shard_map(
            local, mesh=self.mesh, in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(DATA_AXIS)),
            out_specs=PartitionSpec(), axis_names={DATA_AXIS}, check_vma=True,
        )(params, other, batch)

    def compile_step(self, state: TrainState, batch: Any, diagnostics: bool = False):
        return self._compiled_step(state, diagnostics).lower(state, batch).compile()  # shares jit's cache

    def precompile(self, state: TrainState, batch: Any) -> None:
        self.compile_step(state, batch)

    def eval_sums(self, state: TrainState, batch: Any) -> dict[str, Any]:
        if self._eval is None:

            def evaluate(state, batch):
                params = self.compute_params(state.params)
                return weighted_sums(
                    self.plan.graphdef, self.plan.loss, self.plan.precision, params, state.other, batch, with_grads=False
                )

            self._eval = jax.jit(evaluate)
        return self._eval(state, batch)
