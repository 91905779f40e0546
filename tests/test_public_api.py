"""The two tiers of the public API: ``import workbench as wb`` holds the names the README, the design notes and
the notebooks use (at most 60, under ``__all__``); ``wb.layout``, ``wb.training``, ``wb.analysis`` and ``wb.views``
hold every public name of their layer. The widgets and the benchmarks reach the engine through these tiers only."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import workbench as wb

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("layout", "training", "analysis", "views")
# Top-level helper modules, each its own tier (no __all__: every name without an underscore is public).
HELPER_MODULES = ("devices", "errors", "formatting", "compile_cache")
MAX_TOP_TIER_NAMES = 60
USER_TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "notebooks").glob("*.ipynb")])
ENGINE_USERS = sorted([*(ROOT / "widgets").glob("*.py"), *(ROOT / "bench").glob("*.py")])


def names_after_wb(text: str) -> set[str]:
    """The names a text reads from ``wb.`` (``wb.layout_array(...)`` gives ``layout_array``)."""
    return {chain[0] for chain in chains_after_wb(text)}


def chains_after_wb(text: str) -> set[tuple[str, ...]]:
    """The attribute chains a text reads from ``wb.`` (``wb.training.RunFollower`` gives
    ``("training", "RunFollower")``)."""
    return {tuple(chain.split(".")[1:]) for chain in re.findall(r"(?<![\w.])wb(?:\.[A-Za-z_]\w*)+", text)}


def workbench_paths(text: str) -> set[str]:
    """The dotted paths a text names under ``workbench`` (``workbench.workshop.process_rows``), code or prose."""
    return set(re.findall(r"(?<![\w./-])(workbench(?:\.[A-Za-z_]\w*)+)", text))


def imported_from_workbench(text: str) -> set[tuple[str, str]]:
    """The ``(module, name)`` pairs of every ``from workbench... import name`` line in a text."""
    pairs = set()
    for module, names in re.findall(r"from (workbench(?:\.\w+)*) import ([\w ,]+)", text):
        pairs |= {(module, name.split(" as ")[0].strip()) for name in names.split(",") if name.strip()}
    return pairs


def resolve(path: str) -> object:
    """The object at a dotted path under ``workbench``, importing modules on the way and stopping at the first
    object that is not a module (what follows is that object's own attributes or a method call's)."""
    parts = path.split(".")
    found: object = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if not isinstance(found, types.ModuleType):
            break
        if not hasattr(found, part):  # a submodule not imported yet
            importlib.import_module(".".join(parts[:depth]))
        found = getattr(found, part)
    return found


def public_names(module: types.ModuleType) -> set[str]:
    """A tier's public names: its ``__all__``, or for a helper module every name without an underscore."""
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {name for name in vars(module) if not name.startswith("_")}


def wb_chains(tree: ast.AST) -> set[tuple[str, ...]]:
    """Every attribute chain read from ``wb`` in a parsed file (``wb.layout.MeshShape`` gives
    ``("layout", "MeshShape")``), longest first, prefixes included."""
    chains = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if parts and isinstance(node, ast.Name) and node.id == "wb":
            chains.add(tuple(reversed(parts)))
    return chains


def chain_problem(chain: tuple[str, ...]) -> str | None:
    """What is wrong with reading ``chain`` from ``wb`` through the tiers, or None: each step from a module must be
    one of that tier's public names (a tier or helper module itself, from the top)."""
    found: object = wb
    for depth, part in enumerate(chain):
        if not isinstance(found, types.ModuleType):
            return None
        allowed = public_names(found) | (set(TIERS + HELPER_MODULES) if found is wb else set())
        if part not in allowed:
            return f"wb.{'.'.join(chain[:depth + 1])}: {found.__name__} does not export {part!r}"
        found = getattr(found, part)
    return None


@pytest.mark.parametrize("path", USER_TEXTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_name_the_readme_docs_and_notebooks_use_resolves(path):
    text = path.read_text()
    # The top tier's names, or a tier's (wb.training.RunFollower); prose may name wb.__all__ itself.
    missing = sorted(name for name in names_after_wb(text) - {"__all__", "__version__"}
                     if name not in wb.__all__ and name not in TIERS)
    assert missing == [], f"{path.name} uses wb.{missing}, which are not in workbench.__all__"
    chains = {chain for chain in chains_after_wb(text) if not chain[0].startswith("__")}
    assert sorted(filter(None, map(chain_problem, chains))) == []
    for dotted in workbench_paths(text):
        resolve(dotted)  # raises if a name or module is gone
    for module, name in imported_from_workbench(text):
        resolve(f"{module}.{name}")  # a name, or a module not imported yet (from workbench import workshop)


def test_the_readme_and_notebooks_use_names_so_the_check_above_bites():
    used = set().union(*(names_after_wb(path.read_text()) for path in USER_TEXTS))
    assert {"layout_array", "Trainer", "TrainConfig", "plan_training", "layout_figure"} <= used


def test_the_top_tier_is_short_public_and_resolves():
    assert 30 <= len(wb.__all__) <= MAX_TOP_TIER_NAMES
    assert len(set(wb.__all__)) == len(wb.__all__)
    assert [name for name in wb.__all__ if name.startswith("_")] == []
    for name in wb.__all__:
        getattr(wb, name)  # the plotly figures are imported here, on first use


def test_the_top_tier_holds_the_user_errors():
    assert {"WorkbenchError", "MeshError", "SpecError", "ShapeError"} <= set(wb.__all__)
    for name in ("MeshError", "SpecError", "RunError"):
        assert issubclass(getattr(wb, name), wb.WorkbenchError)


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_exports_its_public_names(tier):
    module = importlib.import_module(f"workbench.{tier}")
    assert len(module.__all__) >= 10
    assert len(set(module.__all__)) == len(module.__all__)
    assert [name for name in module.__all__ if name.startswith("_")] == []
    for name in module.__all__:
        value = getattr(module, name)
        assert not isinstance(value, types.ModuleType), f"workbench.{tier}.{name} is a module, not a name"
        if callable(value):  # its own name, not one it imported from another layer
            assert value.__module__.startswith(f"workbench.{tier}."), (name, value.__module__)


@pytest.mark.parametrize("tier", TIERS)
def test_no_tier_name_hides_one_of_its_modules(tier):
    # `from .profile_text import profile_text` would make wb.views.profile_text the function, and
    # `import workbench.views.profile_text as module` and monkeypatch's dotted paths would get it too.
    package = importlib.import_module(f"workbench.{tier}")
    modules = {path.stem for path in Path(package.__file__).parent.iterdir()
               if path.suffix == ".py" or (path / "__init__.py").exists()}
    assert modules & set(package.__all__) == set()


def test_every_name_the_top_tier_has_is_also_in_its_tier():
    tiers = [importlib.import_module(f"workbench.{name}") for name in TIERS + HELPER_MODULES]
    in_tiers = set().union(*map(public_names, tiers))
    named_like_their_modules = {"model_layout", "reference_check", "profile_text", "comparison_figure"}
    assert set(wb.__all__) - in_tiers == named_like_their_modules


def test_the_plotly_figures_are_the_same_function_on_both_tiers():
    assert wb.views.layout_figure is wb.layout_figure
    assert wb.views.timeline_figure is wb.timeline_figure
    with pytest.raises(AttributeError, match="no_such_figure"):
        _ = wb.views.no_such_figure


def test_import_workbench_and_its_tiers_load_no_plotly():
    code = ("import sys, workbench, workbench.views, workbench.layout.mesh, workbench.training.step; "
            "print('plotly' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_the_version_is_the_one_pyproject_declares():
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert wb.__version__ == declared


@pytest.mark.parametrize("path", ENGINE_USERS, ids=lambda path: str(path.relative_to(ROOT)))
def test_widgets_and_benchmarks_reach_names_through_the_tiers(path):
    chains = wb_chains(ast.parse(path.read_text(), filename=str(path)))
    problems = sorted(filter(None, map(chain_problem, chains)))
    assert problems == []


def test_the_widgets_read_both_tiers_so_the_check_above_bites():
    chains = set().union(*(wb_chains(ast.parse(path.read_text())) for path in (ROOT / "widgets").glob("*.py")))
    assert {("TrainConfig",), ("layout", "RuleTable"), ("analysis", "TrainingPlan")} <= chains


def test_a_chain_outside_the_tiers_is_named():
    assert chain_problem(("layout", "mesh", "MeshShape")) == "wb.layout.mesh: workbench.layout does not export 'mesh'"
    assert chain_problem(("varying_axes",)) == "wb.varying_axes: workbench does not export 'varying_axes'"
    assert chain_problem(("training", "varying_axes")) is None
    assert chain_problem(("TrainConfig", "mesh")) is None  # past a name, its own attributes


def test_a_name_that_left_the_top_tier_still_resolves_and_says_where_it_lives():
    moved = wb._MOVED
    assert len(moved) >= 100 and set(moved).isdisjoint(wb.__all__)
    for name, layer in moved.items():
        with pytest.warns(DeprecationWarning, match=rf"workbench\.{name} moved to workbench\.{layer}\.{name}"):
            value = getattr(wb, name)
        assert value is getattr(importlib.import_module(f"workbench.{layer}"), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        wb.no_such_name  # noqa: B018


def test_a_renamed_name_still_resolves_under_its_old_name_and_says_the_new_one():
    assert wb.renamed.RENAMED  # every entry is checked at every tier that exports its new name
    for old, new in wb.renamed.RENAMED.items():
        homes = [module for module in (wb.training, wb.training.modes, wb.analysis) if new in vars(module)]
        assert homes, f"{new} is exported nowhere"
        for module in homes:
            with pytest.warns(DeprecationWarning, match=rf"{module.__name__}\.{old} was renamed {new}"):
                assert getattr(module, old) is getattr(module, new)
        with pytest.warns(DeprecationWarning, match=rf"workbench\.{old} was renamed {new}: use workbench\.\w+\.{new}"):
            assert getattr(wb, old) is getattr(homes[0], new)
    with pytest.raises(AttributeError, match="'workbench.training' has no attribute 'no_such_name'"):
        wb.training.no_such_name  # noqa: B018
