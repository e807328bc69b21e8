"""notebooks/concurrent_gemms.ipynb runs from top to bottom (its default is one small application)."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "concurrent_gemms.ipynb"


def test_concurrent_gemms_notebook_runs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # committed clean
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in cell) for cell in outputs)
    assert any(o.get("output_type") == "execute_result" for o in outputs[-1])
