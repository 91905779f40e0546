"""The package's layers: imports point one way (layout <- training <- analysis <- views <- cli), the top-level
modules keep to theirs, the engine never imports the UI, and `import workbench` stays free of ipywidgets and
plotly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "workbench"
# What each layer may import from the engine, besides itself and the top-level helper modules.
BASE = {"errors", "devices", "formatting", "compile_cache", "child_processes", "servers", "compat", "renamed"}
ALLOWED = {
    "layout": BASE,
    "training": BASE | {"layout"},
    "analysis": BASE | {"layout", "training"},
    # Views draw the records of every layer below, so they sit above analysis and take its records by their types
    # (a profile's Timeline, a MemoryComparison, a PlanComparison), rather than as Any or with those records moved
    # down: the records are computed by analysis and belong with it. Nothing below draws: analysis and training
    # write their records' text with `formatting`, never with a view.
    "views": BASE | {"layout", "training", "analysis"},
    "distributed": BASE | {"layout", "training", "analysis"},
    # The command line sits on top: it may use every layer, and no layer uses it.
    "cli": BASE | {"layout", "views", "training", "analysis", "distributed"},
}
# The top-level modules. The helpers import only each other; the package's top tier and the workshop's exercises
# use the layers but never the command line (``import workbench`` stays free of it); ``python -m workbench`` is
# the command line.
LAYERS = {"layout", "views", "training", "analysis"}
TOP_LEVEL = {
    **{helper: BASE for helper in BASE},
    "__init__": BASE | LAYERS,
    "workshop": BASE | LAYERS,
    "__main__": {"cli"},
}


def _engine_imports(path: Path) -> set[str]:
    """The top-level workbench parts (``layout``, ``training``, ...) a module imports, also lazily."""
    package = path.relative_to(ENGINE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = list(package[: len(package) - (node.level - 1)])
                target = base + (node.module.split(".") if node.module else [])
                names = [target[0]] if target else [alias.name for alias in node.names]
            elif node.module and node.module.split(".")[0] == "workbench":
                parts = node.module.split(".")[1:]
                names = parts[:1] or [alias.name for alias in node.names]
            else:
                continue
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("workbench."))
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_what_is_below_them(layer):
    wrong = {}
    for path in sorted((ENGINE / layer).rglob("*.py")):
        bad = _engine_imports(path) - ALLOWED[layer] - {layer}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert wrong == {}


def test_top_level_modules_import_only_what_they_may():
    modules = {path.stem for path in ENGINE.glob("*.py")}
    assert modules == set(TOP_LEVEL), "a new top-level module: say in TOP_LEVEL what it may import"
    wrong = {}
    for name in sorted(modules):
        bad = _engine_imports(ENGINE / f"{name}.py") - TOP_LEVEL[name] - {name}
        if bad:
            wrong[f"workbench/{name}.py"] = sorted(bad)
    assert wrong == {}


def test_the_engine_never_imports_the_ui():
    for path in ENGINE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert not {m for m in modules if m.split(".")[0] in ("ipywidgets", "widgets")}, path


def test_import_workbench_loads_no_ipywidgets_and_no_plotly():
    code = ("import sys, workbench; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'ipywidgets', 'plotly', 'widgets'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
