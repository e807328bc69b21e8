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


CHECK_NMC_LAST_TABLE = """
table = _
assert set(table["model"]) == {"bert-base", "bert-large"}, table
speedups = study.sweep_models(("bert-base", "bert-large"), temp_storage_scales=(1, 4), workers=1, progress=False)
own = speedups.set_index(["model", "temp_storage"])["speedup"]
for row in table.itertuples():
    assert abs(row.lamb_speedup / own[(row.model, row.temp_storage)] - 1) < 1e-9, row
"""


@pytest.mark.slow
def test_the_nmc_notebook_compares_each_model_with_its_own_lamb_speedup(tmp_path, monkeypatch):
    """The last table of nmc_optimizer.ipynb says which model every row is for and takes that
    model's LAMB speedup (it once applied BERT-base's speedups to BERT-Large).  Runs the notebook's
    cells that compute (not those that draw), then checks the table the last one shows."""
    notebook = nbformat.read(NOTEBOOKS[0].parent / "nmc_optimizer.ipynb", as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    keep = [cell for cell in code[:-1] if "plot." not in cell.source and "plt." not in cell.source]
    notebook.cells = keep + [code[-1], nbformat.v4.new_code_cell(CHECK_NMC_LAST_TABLE)]
    monkeypatch.chdir(tmp_path)
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
