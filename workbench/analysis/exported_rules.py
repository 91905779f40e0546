"""The rule table a plan exports: its layout as ``(regex, PartitionSpec)`` pairs that reproduce it, compact where
a pattern over layer numbers does, exact paths where one would reach too far.

Example:
    >>> from flax import nnx
    >>> from workbench.layout.tree_layout import layout_tree
    >>> from workbench.training.models import abstract_model
    >>> params = nnx.state(abstract_model("mlp"), nnx.Param)
    >>> table = export_table("shard", [], [(params, layout_tree(params, "data=8", "shard"))], "data=8")
    >>> table.rules[-1].pattern
    '.*'
"""

from __future__ import annotations

import re
from typing import Any

from jax.sharding import PartitionSpec

from ..errors import WorkbenchError
from ..layout.rules import RuleTable
from ..layout.tree_layout import TreeLayout, layout_tree


def export_table(placement: str, tp_rules: list, trees: list[tuple[Any, TreeLayout]], mesh: Any,
                 custom: RuleTable | None = None) -> RuleTable:
    """The plan's layout as a rule table that reproduces it (leaves that did not fit: as planned, replicated).

    ``placement``: the mode's state placement, or ``"custom"`` for your own table ``custom``; ``trees``: each
    laid-out tree (the parameters first) beside its layout.
    """
    valid = all(leaf.problem is None for _, layout in trees for leaf in layout.leaves)
    if placement == "custom" and valid and custom is not None:
        catch_all = custom.rules and custom.rules[-1].pattern in (".*", "")
        if catch_all:
            return custom
        return RuleTable([(r.pattern, r.spec) for r in custom.rules] + [(".*", PartitionSpec())])
    if placement == "replicate":
        return RuleTable([(".*", PartitionSpec())])
    if placement == "tensor-parallel" and valid:
        return RuleTable(list(tp_rules) + [(".*", PartitionSpec())])
    params_layout = trees[0][1]
    for generalise in (True, False):  # compact first; exact paths if a pattern reaches too far
        table = _rules_for_specs(params_layout, generalise)
        if _same_specs(table, trees, mesh):
            return table
    raise WorkbenchError(  # not reached for the registered models: exact paths reproduce any layout
        "could not express the plan's layout as a rule table (optimizer state paths clash with parameter "
        "paths): lay out with layout_tree(state, mesh, 'shard') instead"
    )


def _pattern(path: str, generalise: bool) -> str:
    """A regex matching ``path`` from a path boundary; with ``generalise``, any layer number."""
    parts = [r"\d+" if generalise and part.isdigit() else re.escape(part) for part in path.split("/")]
    return "(^|/)" + "/".join(parts) + "$"


def _rules_for_specs(layout: TreeLayout, generalise: bool) -> RuleTable:
    """Exact-path rules (``\\d+`` for layer numbers where every layer agrees) for the chosen specs.

    Longer paths come first, so a path whose tail is another parameter's path still meets its own rule
    first; every parameter gets a rule (replicated ones ``P()`` too), and ``.*`` replicates the rest
    (optimizer counters and the like).
    """
    groups: dict[str, list] = {}
    for leaf in layout.leaves:
        groups.setdefault(_pattern(leaf.path, True), []).append(leaf)
    rules = []
    for key, leaves in groups.items():
        specs = {leaf.layout.spec for leaf in leaves}
        if generalise and len(specs) == 1:
            rules.append((key.count("/"), key, leaves[0].layout.spec))
        else:
            for leaf in leaves:
                exact = _pattern(leaf.path, False)
                rules.append((exact.count("/"), exact, leaf.layout.spec))
    rules.sort(key=lambda rule: -rule[0])  # stable: tree order within one depth
    return RuleTable([(pattern, spec) for _, pattern, spec in rules] + [(".*", PartitionSpec())])


def _same_specs(table: RuleTable, trees: list[tuple[Any, TreeLayout]], mesh: Any) -> bool:
    return all(layout_tree(tree, mesh, table).specs == layout.specs for tree, layout in trees)


__all__ = ["export_table"]
