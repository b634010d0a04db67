"""Run-All twice in one kernel: what a student does after changing a cell near the top.

Slow (every notebook, twice), so it is deselected in the default run (``-m "not slow"`` in
pyproject.toml) and run on its own with::

    python -m pytest -m slow tests/test_notebooks_rerun.py

Each notebook's code cells run top to bottom, then again in the same kernel; any cell that raises
(except cells tagged ``raises-exception``) fails the test, and the root conftest fails it if a worker,
kernel or Ray process is left behind.
"""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_run_all_twice_in_one_kernel(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    with client.setup_kernel():
        for _ in range(2):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type == "code":
                    client.execute_cell(cell, index)  # raises CellExecutionError on an unexpected error
