"""Every notebook runs top to bottom headless, with no error output, and is stored without outputs.
How long each takes is a bench figure (bench/bench_notebooks.py: a workshop's 3-minute budget)."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # a bounded wait per cell: a hung cell fails the test instead of hanging it


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    stored = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stored, f"{path.name} cells {stored} are stored with outputs: clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_starts_with_a_parameters_cell(path):
    """The first code cell holds the knobs (small defaults), tagged for papermill-style tools."""
    notebook = nbformat.read(path, as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert "parameters" in first.metadata.get("tags", []), f"{path.name}: tag the first code cell 'parameters'"
    assert first.source.lstrip().startswith("# Parameters"), f"{path.name}: the first code cell is not the parameters"
    assert "import" not in first.source, f"{path.name}: the parameters cell should hold values only"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_top_to_bottom(path, monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    notebook = nbformat.read(path, as_version=4)
    # The kernel works in a folder of its own: the runs a notebook writes (RUN_ROOT, relative) stay out of the clone.
    # Every output is waited for (nbclient drops a cell's late ones after 4 s, as Voila did on CI's busy 2 cores),
    # so the check below reads all of them.
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", iopub_timeout=60,
                            raise_on_iopub_timeout=True, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{path.name}: {output.get('ename')}: {output.get('evalue')}"
            if output.output_type == "stream" and output.name == "stderr":
                assert "Traceback" not in output.text and "Error" not in output.text, output.text
