"""The widgets use workbench's public API only: what a widget can do, a script or the CLI can do too, and
the engine's modules can be rearranged without breaking the UI. The API has two tiers: ``workbench`` and its
layers ``workbench.layout``, ``.training``, ``.analysis``, ``.views`` (and the helper modules ``.formatting``,
...); that each name a widget reads through
``wb.`` is exported there is checked in test_public_api.py."""

from __future__ import annotations

import ast
import pathlib

import pytest

WIDGETS = sorted((pathlib.Path(__file__).resolve().parent.parent / "widgets").glob("*.py"))
# The top tier, the layers' tiers, and the helper modules that are tiers of their own.
TIERS = {"workbench", "workbench.layout", "workbench.training", "workbench.analysis", "workbench.views",
         "workbench.devices", "workbench.errors", "workbench.formatting", "workbench.compile_cache"}


def workbench_imports(tree: ast.AST) -> list[str]:
    """Every module under ``workbench`` that ``tree`` imports, as written (``workbench`` itself included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "workbench"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "workbench":
            found.append(node.module)
    return found


@pytest.mark.parametrize("path", WIDGETS, ids=lambda path: path.name)
def test_widgets_import_only_workbench_and_its_tiers(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    deeper = [module for module in workbench_imports(tree) if module not in TIERS]
    assert deeper == [], f"{path.name} imports {deeper}: use `import workbench as wb` and wb.<name> or wb.<tier>.<name>"


def test_the_check_sees_a_sub_package_import():
    tree = ast.parse("import workbench as wb\nfrom workbench.views.text import format_shape\nimport workbench.layout\n")
    assert workbench_imports(tree) == ["workbench", "workbench.views.text", "workbench.layout"]
