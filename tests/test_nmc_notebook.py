"""notebooks/nmc_optimizer.ipynb runs from top to bottom (its default is a small model)."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "nmc_optimizer.ipynb"


def test_nmc_optimizer_notebook_runs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # committed clean
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in cell) for cell in outputs)
    assert any(o.get("output_type") == "execute_result" for o in outputs[-1])
