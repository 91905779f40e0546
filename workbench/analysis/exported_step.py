"""Your own model's step, traced here and compiled for the target in the verification's child process.

The child cannot rebuild a module defined in a notebook (nothing crosses processes but JSON, and a module's
code is not data), so this process traces the step itself, on an abstract mesh of the target's size (no
devices needed), and lowers it with :mod:`jax.export` for the target's platform (``cpu``, ``tpu`` or ``cuda``).
The serialized program (StableHLO in JAX's versioned export format, base64 in the JSON request: no pickle, no
Python code) goes to the child, which compiles it for the target's devices exactly as it compiles a registered
model's step. What was measured, and the alternatives: docs/design/recommend.md.

Example:
    >>> import jax, numpy as np
    >>> from flax import nnx
    >>> class Tiny(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.w = nnx.Linear(4, 1, rngs=rngs)
    ...     def loss(self, batch):
    ...         return ((self.w(batch["x"]) - batch["y"]) ** 2).mean(), {}
    >>> own = OwnModel(lambda: Tiny(nnx.Rngs(0)), example_batch={"x": np.zeros((2, 4), np.float32),
    ...                "y": np.zeros((2, 1), np.float32)})
    >>> step = own.step_config("fsdp", "data=16", 32)
    >>> exported = export_step(step, own, "cpu")
    >>> exported.mesh, exported.platform, exported.layers
    ('data=16', 'cpu', ('w',))
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import jax

from ..errors import VerificationError, WorkbenchError
from ..layout.mesh import MeshShape, build_mesh, parse_mesh
from ..layout.rules import RuleTable
from ..training.config import ResolvedConfig
from ..training.models import model_class
from ..training.modes import mode_class
from ..training.modes.base import ABSTRACT_DEVICES
from ..training.step import CustomModel, build_abstract_step
from .compile_target import CompileTarget
from .planned_model import own_model
from .planned_step import step_config

# The platform jax.export lowers for, by the target's kind of compiler.
EXPORT_PLATFORMS = {"cpu": "cpu", "tpu": "tpu", "gpu": "cuda"}


class OwnModelError(WorkbenchError):
    """What a verification of your own model needs is missing or malformed (its example batch, its loss, the plan it
    is for): the message names the value and what to pass instead."""


class ExportError(VerificationError):
    """Your own model's step could not be exported for the target's platform: the message names the step and why."""


@dataclasses.dataclass(frozen=True, eq=False)
class OwnModel:
    """What a verification needs of a model the workbench cannot rebuild in another process: the module (an
    instance, real or from ``nnx.eval_shape``, or a builder of no arguments, only ever traced), its ``loss``
    (default: the module's ``loss`` method), an ``example_batch`` (arrays or ``ShapeDtypeStruct``s, any number
    of rows) and your ``rules`` (a rule table placing the whole state, as :func:`~workbench.plan_training` plans
    it; None: each mode's own placement). A registered model's name with ``rules`` is one too.

    Raises :class:`OwnModelError` naming what is missing or malformed (the example batch, the loss).
    """

    model: Any
    loss: Any = None
    example_batch: Any = None
    rules: Any = None
    module: Any = dataclasses.field(init=False, repr=False)  # the abstract module (a registered model: None)
    table: RuleTable | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        registered = isinstance(self.model, str)
        module = None if registered else own_model(self.model, None)
        name = self.model if registered else type(module).__name__
        if not registered:
            _validate_example_batch(self.example_batch, name)
            if self.loss is None and not hasattr(type(module), "loss"):
                raise OwnModelError(f"your {name} has no loss method: pass loss=fn with fn(model, batch) -> "
                                    "(loss, aux) to verify its step")
            if self.loss is not None and not callable(self.loss):
                raise OwnModelError(f"loss={self.loss!r} is not a function: pass loss=fn with fn(model, batch) -> "
                                    "(loss, aux)")
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "table", None if self.rules is None else RuleTable(self.rules))

    @property
    def name(self) -> str:
        return self.model if self.module is None else type(self.module).__name__

    @property
    def described(self) -> str:
        """How messages name it: ``your TwoLayer``, or ``mlp with your rule table``."""
        return f"{self.model} with your rule table" if self.module is None else f"your {self.name}"

    def step_config(self, mode: str, mesh: Any, batch: int, precision: str = "bf16", optimizer: str = "adamw",
                    accum: int = 1, model_options: dict | None = None, remat: str = "none") -> ResolvedConfig:
        """The resolved config of this model's step in ``mode`` on ``mesh`` (the record the child is told)."""
        declared, shape = mode_class(mode), parse_mesh(mesh)
        if self.module is None:  # a registered model laid out by your table
            return step_config(self.model, dict(model_options or {}), declared, shape, batch, precision, optimizer,
                               model_class(self.model), accum, remat)
        return step_config(f"custom:{self.name}", {}, declared, shape, batch, precision, optimizer, None, accum)


def _validate_example_batch(batch: Any, name: str) -> None:
    """OwnModelError unless ``batch`` is a tree of arrays (or ShapeDtypeStructs) with a leading batch dimension."""
    if batch is None:
        raise OwnModelError(f"verifying your {name} traces its step, which needs the shapes of its input: pass "
                            "example_batch=<a batch of its input> (arrays or jax.ShapeDtypeStructs, any rows)")
    leaves = jax.tree_util.tree_leaves_with_path(batch)
    if not leaves:
        raise OwnModelError(f"example_batch={batch!r} holds no arrays: pass a batch of your {name}'s input, e.g. "
                            "{'x': np.zeros((8, 16)), 'y': np.zeros((8, 1))}")
    for path, leaf in leaves:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) or len(leaf.shape) < 1:
            where = jax.tree_util.keystr(path) or "the batch"
            raise OwnModelError(f"example_batch{jax.tree_util.keystr(path)} is {leaf!r}, not an array with rows: "
                                f"give {where} as an array (or jax.ShapeDtypeStruct) whose first dimension is the "
                                "batch's rows, e.g. np.zeros((8, 16))")


@dataclasses.dataclass(frozen=True)
class ExportedStep:
    """A training step lowered for a platform, ready to compile anywhere that platform's compiler is.

    Attributes:
        payload: ``jax.export``'s serialization (StableHLO and its shardings, over ``mesh``'s device positions).
        mesh: the mesh it was traced for, as text (the child builds it over the target's devices).
        platform: what it was lowered for: ``cpu``, ``tpu`` or ``cuda``.
        layers: the model's submodule paths, for naming each collective's layer.
        state_leaves: how many of its (flat) arguments are the training state, which the step donates.
    """

    payload: bytes
    mesh: str
    platform: str
    layers: tuple[str, ...]
    state_leaves: int

    def to_json(self) -> dict[str, Any]:
        return {"payload": base64.b64encode(self.payload).decode("ascii"), "mesh": self.mesh,
                "platform": self.platform, "layers": list(self.layers), "state_leaves": self.state_leaves}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExportedStep:
        return cls(base64.b64decode(data["payload"]), str(data["mesh"]), str(data["platform"]),
                   tuple(str(layer) for layer in data["layers"]), int(data["state_leaves"]))


def export_step(config: ResolvedConfig, own: OwnModel, target: CompileTarget | str,
                seq_len: int | None = None) -> ExportedStep:
    """``config``'s step for ``own``'s model, traced on an abstract mesh (any size, no devices) and exported
    for ``target``'s platform. Raises :class:`ExportError` naming the step when JAX cannot lower it."""
    kind = target if isinstance(target, str) else target.kind
    platform = EXPORT_PLATFORMS[kind]
    # Your table is also the tensor-parallel rules a mode that splits over 'model' asks for (the same layout).
    pairs = () if own.table is None else tuple((rule.pattern, rule.spec) for rule in own.table.rules)
    custom = None if own.module is None else CustomModel(own.module, own.loss, batches=(), tp_rules=pairs)
    step = build_abstract_step(config, seq_len=seq_len, devices=ABSTRACT_DEVICES, custom=custom,
                               example_batch=own.example_batch, state_rules=own.table)
    what = f"the {config.config.mode} step of {own.described} on {config.mesh_shape}"
    state, state_tree = jax.tree.flatten(step.state)
    batch, batch_tree = jax.tree.flatten(step.batch)
    step_function = step.mode.step_function()

    # Flat arrays in, flat arrays out: jax.export serializes no nnx types. The mode's step function itself, jitted
    # here as the mode jits it: a jit nested in this one compiled 64 bytes above the trainer's step (dp-tp, 16 CPUs).
    def flat_step(*leaves):
        new_state, metrics = step_function(jax.tree.unflatten(state_tree, leaves[:len(state)]),
                                           jax.tree.unflatten(batch_tree, leaves[len(state):]))
        return jax.tree.leaves(new_state), metrics

    jitted = jax.jit(flat_step, out_shardings=([leaf.sharding for leaf in state], None))
    try:
        exported = jax.export.export(jitted, platforms=[platform])(*state, *batch)
        payload = bytes(exported.serialize())
    except Exception as error:  # noqa: BLE001 - JAX raises many kinds; the message names the step and the reason
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise ExportError(f"{what} could not be exported for {platform}: {type(error).__name__}: {first[:300]}; "
                          "plan it without verify") from None
    return ExportedStep(payload, str(config.mesh_shape), platform, step.layers, len(state))


def exported_mesh(exported: ExportedStep, devices: list) -> Any:
    """The mesh ``exported`` is compiled on: its axes, over ``devices`` in mesh order (Auto axes, as exported)."""
    shape: MeshShape = parse_mesh(exported.mesh)
    return build_mesh(shape, axis_types="auto", devices=list(devices))


def compile_exported(exported: ExportedStep, devices: list,
                     compiler_options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(the compiled step, its mesh): ``exported`` compiled for ``devices`` (in mesh order), its state donated as
    the trainer's step donates it, with XLA's ``compiler_options`` for this compile. Nothing is allocated. Runs in
    the verification's child process."""
    try:
        program = jax.export.deserialize(bytearray(exported.payload))
    except Exception as error:  # noqa: BLE001 - a payload from another JAX version, or damaged
        raise VerificationError(f"the exported step could not be read ({type(error).__name__}: {error}): the parent "
                                "and the child must run the same JAX") from None
    mesh = exported_mesh(exported, devices)
    inputs = [jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding)
              for aval, sharding in zip(program.in_avals, program.in_shardings_jax(mesh), strict=True)]
    args, kwargs = jax.tree.unflatten(program.in_tree, inputs)
    outputs = jax.tree.unflatten(program.out_tree, list(program.out_shardings_jax(mesh)))
    # The trainer's step donates its state (the first arguments): the new state reuses their buffers, here too.
    step = jax.jit(program.call, donate_argnums=tuple(range(exported.state_leaves)), out_shardings=outputs)
    return step.lower(*args, **kwargs).compile(compiler_options), mesh


__all__ = ["EXPORT_PLATFORMS", "ExportError", "ExportedStep", "OwnModel", "OwnModelError", "compile_exported",
           "export_step", "exported_mesh"]
