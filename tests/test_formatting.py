"""The formatting module: standard library only, one column aligner for every text table, and the layering
it allows (layout, training and analysis never import the views)."""

import ast
import pathlib
import subprocess
import sys

import pytest

import workbench as wb
from workbench.formatting import align_columns, format_bytes, format_bytes_exact, format_seconds, format_shape

PACKAGE = pathlib.Path(wb.__file__).parent
FORMATTING = PACKAGE / "formatting.py"


def _imported_modules(source: str, package: str) -> list[str]:
    """Every module ``source`` (a file of ``package``) imports, relative imports made absolute.

    ``from .. import views`` counts as importing ``workbench.views``: each imported name is listed too.
    """
    parts = package.split(".")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return found


def _imports_of(path: pathlib.Path) -> list[str]:
    return _imported_modules(path.read_text(), ".".join(["workbench", *path.relative_to(PACKAGE).parts[:-1]]))


def test_formatting_loads_neither_jax_nor_numpy_in_a_fresh_interpreter():
    # Loaded from its file, not as workbench.formatting: the package's __init__ starts JAX on purpose,
    # and what is checked here is the module's own imports.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('formatting', {str(FORMATTING)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.format_bytes(2048), 'jax' in sys.modules, 'numpy' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2.0", "KiB", "False", "False"]


def test_formatting_imports_only_the_standard_library():
    tree = ast.parse(FORMATTING.read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports  # the checks below would pass vacuously on an unreadable file
    assert all(getattr(node, "level", 0) == 0 for node in imports), "formatting.py must not import workbench modules"
    for module in _imports_of(FORMATTING):
        assert module.split(".")[0] in sys.stdlib_module_names | {"__future__"}, module


@pytest.mark.parametrize("subpackage", ["layout", "training", "analysis"])
def test_engine_subpackages_never_import_the_views(subpackage):
    # The views draw the engine's records: an engine module formatting its text through the views would tie
    # every layer to them. Text helpers that every layer needs live in workbench.formatting.
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in sorted((PACKAGE / subpackage).rglob("*.py"))
        for module in _imports_of(path)
        if module == "workbench.views" or module.startswith("workbench.views.")
    ]
    assert offenders == []


def test_the_layering_check_reads_relative_imports():
    # The scan above must see through the dots, or it would pass for want of finding anything.
    source = ("from ..views.text import tiling_picture\nfrom .. import views\nfrom .specs import format_spec\n"
              "import jax\n")
    found = _imported_modules(source, "workbench.layout")
    assert {"workbench.views.text", "workbench.views", "workbench.layout.specs", "jax"} <= set(found)
    assert "workbench.formatting" in _imports_of(PACKAGE / "layout" / "lint.py")


def test_format_bytes_shape_and_seconds():
    assert [format_bytes(n) for n in (0, 1023, 1024, 5 * 2**20 + 2**19, 3 * 2**30)] == [
        "0 B", "1023 B", "1.0 KiB", "5.5 MiB", "3.0 GiB"
    ]
    assert format_bytes(2**60) == "1024.0 PiB"  # the largest unit keeps counting
    assert format_bytes_exact(2048) == "2.0 KiB (2,048 B)" and format_bytes_exact(12) == "12 B"
    assert format_shape((4, 16, 8)) == "[4, 16, 8]" and format_shape(()) == "[]"
    assert ([format_seconds(s) for s in (0, 4.56, 0.0123, 7.89e-4, 3.2e-8)]
            == ["0 s", "4.56 s", "12.3 ms", "789 us", "32 ns"])


def test_align_columns_pads_aligns_and_strips():
    lines = align_columns(["name", "count", "note"], [["a", "1", ""], ["longer", "123", "x"]], right=[1])
    assert lines == [
        "name    count  note",
        "------  -----  ----",
        "a           1",  # the empty last cell leaves no trailing spaces
        "longer    123  x",
    ]
    assert align_columns(["a", "b"], []) == ["a  b", "-  -"]


def test_align_columns_rejects_ragged_rows_and_unknown_columns():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells \['x'\] but there are 2 headers"):
        align_columns(["a", "b"], [["1", "2"], ["x"]])
    with pytest.raises(ValueError, match=r"right-aligned column\(s\) \[2\] do not exist"):
        align_columns(["a", "b"], [["1", "2"]], right=[2])


def test_flat_namespace_keeps_the_formatters():
    assert wb.format_bytes is format_bytes and wb.formatting.format_seconds is format_seconds
    assert wb.formatting.align_columns is align_columns
