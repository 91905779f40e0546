"""A model's whole training state laid out on a mesh of any size: parameters, optimizer state and a batch.

This is the record the sharding inspector draws and the spec editor edits. It is computed on an
abstract mesh from abstract (shape-only) arrays, so a mesh larger than the machine works and nothing
is allocated. A parallel mode decides the standard specs (:func:`standard_rules`): replicated for
``dp``, sharded by largest divisible dimension for ``fsdp``, the model's Megatron rules for ``tp``;
a rule table of your own replaces them (:func:`model_layout` with ``rules=``).

Example:
    >>> layout = model_layout("mlp", "data=8", "fsdp")
    >>> layout.params.leaf("hidden1/kernel").layout.spec
    P(None, 'data')
    >>> layout.batch.leaf("x").layout.shard_shape
    (32, 64)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from flax import nnx

from ..errors import WorkbenchError
from ..layout.mesh import MeshShape, abstract_mesh, parse_mesh
from ..layout.rules import RuleReport, RuleTable
from ..layout.tree_layout import TreeLayout, layout_tree
from ..training.config import make_optimizer
from ..training.data import load_dataset
from ..training.models import abstract_batch, abstract_model, model_class, model_config_for_data
from ..training.modes import mode_class
from .planning import plan_training

DEFAULT_DATA = {"regression": "regression", "classification": "digits", "language": "text"}


def default_data(model: str) -> str:
    """The data set a registered model trains on by default (``digits`` for ``mlp``).

    Example:
        >>> default_data("transformer")
        'text'
    """
    return DEFAULT_DATA[model_class(model).DATA_KIND]


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    """Where every array of a training step lives.

    Attributes:
        model, model_options, mode, optimizer: what was laid out (options as resolved from the data).
        mesh: the mesh's axis names and sizes.
        rules: the rule table applied to the parameters (and, through their paths, the optimizer state).
        rule_report: which parameter paths each rule matched (:class:`~workbench.layout.rules.RuleReport`).
        params, opt_state, batch: one :class:`~workbench.layout.tree_layout.TreeLayout` each.
    """

    model: str
    model_options: dict[str, Any]
    mode: str
    optimizer: str
    mesh: MeshShape
    rules: RuleTable
    rule_report: RuleReport
    params: TreeLayout
    opt_state: TreeLayout
    batch: TreeLayout

    def trees(self) -> dict[str, TreeLayout]:
        """``{"params": ..., "opt_state": ..., "batch": ...}``."""
        return {"params": self.params, "opt_state": self.opt_state, "batch": self.batch}

    def combined(self) -> TreeLayout:
        """Every leaf of the three trees in one tree, paths prefixed by their tree (``params/...``), e.g.
        for memory bars stacked by tree with ``group_bytes_per_device()``."""
        leaves = tuple(dataclasses.replace(leaf, path=f"{name}/{leaf.path}")
                       for name, tree in self.trees().items() for leaf in tree.leaves)
        return TreeLayout(self.mesh, leaves)

    def bytes_per_device(self) -> dict[str, int]:
        """Bytes every device holds, per tree (shards are even, so every device holds the same)."""
        return {name: tree.bytes_per_device for name, tree in self.trees().items()}

    def rule_matches(self) -> list[list[str]]:
        """For each rule, in order, the parameter paths it matched (a rule that matched none: ``[]``)."""
        out: list[list[str]] = [[] for _ in self.rules.rules]
        for path, index in self.rule_report.matches.items():
            if index is not None:
                out[index].append(path)
        return out

    def device_slices(self, device: int) -> list[dict[str, Any]]:
        """Device ``device``'s slice of every array: ``{"tree", "path", "shape", "index", "bytes"}`` rows.

        ``index`` is ``[start, stop)`` per dimension; ``device`` is a mesh position (row-major).
        """
        if not 0 <= device < self.mesh.size:
            raise WorkbenchError(f"device {device} is not on mesh {self.mesh} (devices 0..{self.mesh.size - 1})")
        rows = []
        for tree_name, tree in self.trees().items():
            for leaf in tree.leaves:
                piece = leaf.layout.device_slice(device)  # this device alone: cheap on any mesh
                rows.append({
                    "tree": tree_name, "path": leaf.path, "shape": list(leaf.layout.shape),
                    "index": [list(interval) for interval in piece.index],
                    "bytes": leaf.layout.bytes_per_device,
                })
        return rows


def standard_rules(model: str, mesh: Any, mode: str, model_options: dict | None = None,
                   optimizer: str = "adam") -> RuleTable:
    """The rule table mode ``mode`` applies to ``model``'s parameters on ``mesh``.

    Example:
        >>> print(standard_rules("mlp", "data=8", "dp").to_text())
        .* => P()
    """
    mesh_shape = parse_mesh(mesh)  # read once, here: the planner below takes the records
    return _plan(model, mesh_shape, mode_class(mode), _options_key(model_options), optimizer).rule_table


def _options_key(options: dict | None) -> tuple:
    return tuple(sorted((options or {}).items()))


@functools.lru_cache(maxsize=64)
def _plan(model: str, mesh: MeshShape, mode: type, options: tuple, optimizer: str):
    return plan_training(model, dict(options), mesh, mode, optimizer=optimizer, hardware="cpu", precision="fp32")


@functools.lru_cache(maxsize=8)
def _data_shapes(model: str, batch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(options the data decides, one batch's leaves as ShapeDtypeStructs) for ``model``'s default data."""
    # Shapes only: a batch of a billion examples is laid out without allocating one.
    fitted = model_config_for_data(model, load_dataset(default_data(model)))
    return fitted.options, abstract_batch(fitted, batch)


def model_layout(
    model: str,
    mesh: Any,
    mode: str = "dp",
    *,
    rules: RuleTable | list | str | None = None,
    model_options: dict | None = None,
    optimizer: str = "adam",
    batch: int = 256,
) -> ModelLayout:
    """Lay out ``model``'s parameters, optimizer state and one global batch on ``mesh`` for ``mode``.

    ``rules`` (a :class:`RuleTable`, ``(regex, spec)`` pairs or ``regex => spec`` text) replaces the
    mode's :func:`standard_rules`; the batch is always split as the mode splits it (over ``data``, if
    the mode is data-parallel and the mesh has that axis). Raises a WorkbenchError (e.g. a spec that
    does not divide a dimension, naming the leaf) for a layout that cannot exist.

    Example:
        >>> model_layout("mlp", "data=4,model=2", "dp-tp").params.leaf("hidden1/kernel").layout.spec
        P(None, 'model')
    """
    mesh_shape = parse_mesh(mesh)  # read once, here: the planner below takes the records
    data_options, batch_shapes = _data_shapes(model, batch)
    declared = mode_class(mode)
    options = {**data_options, **(model_options or {})}
    plan = _plan(model, mesh_shape, declared, _options_key(options), optimizer)
    table = plan.rule_table if rules is None else (
        RuleTable.parse(rules) if isinstance(rules, str) else RuleTable(rules))
    params = nnx.state(abstract_model(model, **options), nnx.Param)
    opt_state = jax.eval_shape(make_optimizer(optimizer, 1e-3).init, params)
    target = abstract_mesh(mesh_shape)
    params_layout = layout_tree(params, target, table)
    opt_layout = layout_tree(opt_state, target, table)
    batch_axis = declared.batch_axis if plan.data_parallel_size > 1 else None  # as the mode splits it
    batch_layout = layout_tree(
        batch_shapes, target, {name: ((batch_axis,) if batch_axis else ()) for name in batch_shapes}
    )
    paths = [leaf.path for leaf in params_layout.leaves]
    return ModelLayout(
        model=model, model_options=options, mode=mode, optimizer=optimizer, mesh=mesh_shape, rules=table,
        rule_report=table.assign(paths), params=params_layout, opt_state=opt_layout, batch=batch_layout,
    )
