"""Every notebook in notebooks/ executes from top to bottom without error and its last cell shows something
(CI runs them on their small defaults; they are committed without outputs)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_exploration_notebooks_are_there():
    names = {path.stem for path in NOTEBOOKS}
    assert {"quickstart", "t3_explore", "nmc_optimizer", "concurrent_gemms"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not any(cell.get("outputs") for cell in code), f"{path.name} is committed with outputs; strip them"
    monkeypatch.chdir(tmp_path)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    assert not any(output.get("output_type") == "error" for cell in code for output in cell.outputs)
    assert code[-1].outputs, f"{path.name}: the last cell should show its result"
    draws = any("plot." in cell.source or "plt." in cell.source for cell in code)
    images = [output for cell in code for output in cell.outputs if "image/png" in output.get("data", {})]
    assert images or not draws, f"{path.name} draws figures but shows none (is the backend forced to Agg?)"
