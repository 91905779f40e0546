"""The test suite's own layout: test files share code through helpers.py (functions, constants) and conftest.py
(fixtures), never by importing one another, so each runs alone, in any order, on any pytest-xdist worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_FILES = sorted(TESTS.glob("test_*.py"))
SHARED = [TESTS / "conftest.py", TESTS / "helpers.py"]


def imported_modules(source: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` names, at any depth (inside functions too); a relative
    import keeps its dots (``.test_x``), and ``from tests import x`` / ``from . import x`` name ``tests.x`` / ``.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.append(module)
            if node.module in (None, "tests"):  # a package's names may be its modules
                found += [f"{module.rstrip('.')}.{alias.name}" if node.module else f"{module}{alias.name}"
                          for alias in node.names]
    return found


def imported_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports, however it spells them."""
    return [module for module in imported_modules(source) if module.rsplit(".", 1)[-1].startswith("test_")]


def top_level_functions(path: Path) -> set[str]:
    """The names of the functions and classes ``path`` defines at its top level."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("imports", [
    "from test_trainer import TwoLayer",
    "import test_trainer",
    "from tests.test_trainer import TwoLayer",
    "from tests import test_trainer",
    "from .test_trainer import TwoLayer",
    "from . import test_trainer",
    "def f():\n    from test_trainer import TwoLayer\n",
])
def test_the_guard_sees_every_way_of_importing_a_test_module(imports):
    assert imported_test_modules(imports), imports


def test_the_guard_lets_helpers_and_the_engine_through():
    source = ("from helpers import poll\nimport workbench as wb\nfrom widgets.common import Selection\n"
              "from gpu_compile_child import OWN_EXAMPLE\n")
    assert imported_modules(source) == ["helpers", "workbench", "widgets.common", "gpu_compile_child"]
    assert imported_test_modules(source) == []


def test_no_test_file_imports_another():
    assert len(TEST_FILES) >= 40, TEST_FILES  # the glob found the suite, not an empty folder
    offenders = {path.name: found for path in TEST_FILES + SHARED if (found := imported_test_modules(path.read_text()))}
    assert offenders == {}, "share code through tests/helpers.py (functions) or tests/conftest.py (fixtures)"


def test_a_shared_helper_is_written_once():
    shared = top_level_functions(TESTS / "helpers.py") | top_level_functions(TESTS / "conftest.py")
    assert {"poll", "TwoLayer", "make_dashboard"} <= shared
    copies = {path.name: sorted(shared & top_level_functions(path)) for path in TEST_FILES}
    assert {name: found for name, found in copies.items() if found} == {}, "import it from helpers.py instead"
