"""The widgets use workbench's public API only: what a widget can do, a script or the CLI can do too, and
the engine's sub-packages can be rearranged without breaking the UI."""

from __future__ import annotations

import ast
import pathlib

import pytest

import workbench as wb

WIDGETS = sorted((pathlib.Path(__file__).resolve().parent.parent / "widgets").glob("*.py"))


def workbench_imports(tree: ast.AST) -> list[str]:
    """Every module under ``workbench`` that ``tree`` imports, as written (``workbench`` itself included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "workbench"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "workbench":
            found.append(node.module)
    return found


def names_used_from(tree: ast.AST, alias: str) -> set[str]:
    """The attributes read from module alias ``alias`` (``wb.model_layout`` gives ``model_layout``)."""
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == alias}


@pytest.mark.parametrize("path", WIDGETS, ids=lambda path: path.name)
def test_widgets_import_only_the_top_level_workbench_package(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    deeper = [module for module in workbench_imports(tree) if module != "workbench"]
    assert deeper == [], f"{path.name} imports {deeper}: use `import workbench as wb` and wb.<name>"
    missing = sorted(name for name in names_used_from(tree, "wb") if not hasattr(wb, name))
    assert missing == [], f"{path.name} uses wb.{missing}, which workbench does not export"


def test_the_check_sees_a_sub_package_import():
    tree = ast.parse("import workbench as wb\nfrom workbench.views.text import format_shape\nimport workbench.layout\n")
    assert workbench_imports(tree) == ["workbench", "workbench.views.text", "workbench.layout"]
