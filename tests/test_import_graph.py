"""Imports sit at the top of each module, so the module-level import graph says who needs whom, and it has no cycle.

An import inside a function is allowed only where :data:`LAZY_IMPORTS` lists it, with the reason: a heavy
optional backend that most processes never use, or a private JAX module imported under ``try`` (a JAX without
it loses only a hint). Nothing needs JAX itself imported late: importing JAX does not start its backend, and the
device count, ``PJRT_NPROC``, the platforms and the compilation cache are set through ``jax.config`` or the
environment before the first JAX operation (``devices.py``, ``compile_cache.py``); the child processes
(``analysis/compile_child.py``, ``distributed/worker.py``) get their environment from the parent before they
start. libtpu and XLA:GPU's CUDA plugin are never imported by name (JAX loads them when a topology is asked for;
``compile_target.py`` looks for libtpu with ``find_spec``), and plotly's figures are loaded by ``importlib`` on
first use (``views/__init__.py``'s ``_FIGURES``, ``widgets/__init__.py``'s ``_EXPORTS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workbench", "widgets")

# module -> {what it imports inside functions (a module or package): why}
LAZY_IMPORTS = {
    "workbench/training/checkpoints.py": {
        "orbax": "orbax-checkpoint takes about 0.5 s to import; only saving and restoring a checkpoint need it",
    },
    "workbench/views/jax_picture.py": {
        "rich": "JAX's own picture is drawn with rich: only capture_visualize_sharding needs it",
    },
    "workbench/cli/train.py": {
        "rich": "the progress bar of `workbench train`, drawn only when stderr is a terminal",
    },
    "workbench/devices.py": {
        "jax._src": "a private JAX module, imported under try: a JAX without it keeps its own platform choice",
    },
    "workbench/training/data_parallel.py": {
        "jax._src": "private JAX modules, imported under try: a JAX without them loses only an error message's hint",
    },
    "workbench/analysis/compile_child.py": {
        "resource": "Unix only: the fallback where /proc/self/status is missing",
    },
}


def _python_files():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, in_functions: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports run when the module loads (``in_functions=False``: not in a function nor under
    ``if TYPE_CHECKING``), or those inside functions (``in_functions=True``)."""
    found = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if inside == in_functions:
                    found.append(child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                continue  # never run: annotations only
            else:
                visit(child, inside)

    visit(tree, False)
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [_absolute(node, module, is_package)]


def test_function_local_imports_are_only_the_listed_ones():
    unlisted, used = [], set()
    for path in _python_files():
        name, file = _module_name(path), path.relative_to(ROOT).as_posix()
        allowed = LAZY_IMPORTS.get(file, {})
        for node in _imports(ast.parse(path.read_text()), in_functions=True):
            for imported in _imported_names(node, name, path.name == "__init__.py"):
                matches = [prefix for prefix in allowed if imported == prefix or imported.startswith(prefix + ".")]
                used.update((file, prefix) for prefix in matches)
                if not matches:
                    unlisted.append(f"{file}:{node.lineno} imports {imported} inside a function")
    assert unlisted == [], ("import these at the top of the module, or add the module to LAZY_IMPORTS with the reason:"
                            "\n" + "\n".join(unlisted))
    stale = sorted({(file, prefix) for file, entries in LAZY_IMPORTS.items() for prefix in entries} - used)
    assert stale == [], f"LAZY_IMPORTS lists imports no function makes any more: {stale}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` that loading it loads first, from its module-level imports.

    ``import a.b.c`` and ``from a.b import c`` load ``a``, ``a.b`` (and ``a.b.c``); a package that contains the
    importing module is already loading and adds no edge, except where a name is read from it
    (``from . import name``, where ``name`` is no submodule: it must be defined by then).
    """
    files = {_module_name(path): path for path in _python_files()}
    graph = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _imports(ast.parse(path.read_text()), in_functions=False):
            targets = _imported_names(node, module, is_package)
            if isinstance(node, ast.ImportFrom):
                source = targets[0]
                submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in files]
                if len(submodules) < len(node.names) and source in files and source != module:
                    edges.add(source)  # names read from the module itself: it must have run
                targets = [source, *submodules]
            for target in targets:
                parts = target.split(".")
                for depth in range(1, len(parts) + 1):
                    ancestor = ".".join(parts[:depth])
                    if ancestor in files and ancestor != module and not module.startswith(ancestor + "."):
                        edges.add(ancestor)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every module below it is checked
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_module_level_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_a_cycle_through_a_package():
    graph = import_graph()
    assert "workbench.training.modes.registry" in graph["workbench.training.modes.base"]
    assert "workbench.analysis.verification" in graph["workbench.analysis.planning"]
    # what `from . import mesh_fit` in modes/base.py made: the package imports base, base reads from the package
    graph["workbench.training.modes.base"].add("workbench.training.modes")
    cycle = find_cycle(graph)
    assert cycle is not None and {"workbench.training.modes", "workbench.training.modes.base"} <= set(cycle)
