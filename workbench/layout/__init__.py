"""Where arrays live: meshes, specs, shapes, the layout of one array and of a tree, rule tables, the linter.

Every public name of the layer, re-exported from the module that owns it (``wb.layout.MeshShape``); the ones a
user reaches for first are also on ``workbench`` itself (``wb.layout_array``).
"""

from .array_layout import ArrayLayout as ArrayLayout
from .array_layout import DeviceSlice as DeviceSlice
from .array_layout import layout_array as layout_array
from .lint import lint_layout as lint_layout
from .lint import lint_text as lint_text
from .mesh import MeshShape as MeshShape
from .mesh import abstract_mesh as abstract_mesh
from .mesh import build_mesh as build_mesh
from .mesh import parse_mesh as parse_mesh
from .paths import leaves_with_paths as leaves_with_paths
from .paths import path_to_str as path_to_str
from .rules import RuleTable as RuleTable
from .sharded_rules import ShardedRuleTable as ShardedRuleTable
from .shapes import parse_dtype as parse_dtype
from .shapes import parse_shape as parse_shape
from .specs import format_spec as format_spec
from .specs import parse_spec as parse_spec
from .specs import spec_from_json as spec_from_json
from .specs import spec_to_json as spec_to_json
from .specs import validate_spec as validate_spec
from .tree_layout import LeafLayout as LeafLayout
from .tree_layout import TreeLayout as TreeLayout
from .tree_layout import layout_tree as layout_tree
from .tree_layout import shard_largest_dim as shard_largest_dim

__all__ = [
    # meshes, specs, shapes
    "MeshShape", "abstract_mesh", "build_mesh", "parse_mesh",
    "format_spec", "parse_spec", "spec_from_json", "spec_to_json", "validate_spec",
    "parse_dtype", "parse_shape",
    # the layout of one array, of a tree, by rule table; the linter
    "ArrayLayout", "DeviceSlice", "layout_array",
    "LeafLayout", "TreeLayout", "layout_tree", "shard_largest_dim",
    "leaves_with_paths", "path_to_str",
    "RuleTable", "ShardedRuleTable",
    "lint_layout", "lint_text",
]
