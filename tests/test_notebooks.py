"""Every notebook executes top to bottom on CPU (small sizes), headless."""

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("TREEWY_SMALL", "1")
    monkeypatch.setenv("TREEWY_DEVICE", "cpu")
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    # cells tagged needs-gpu (or needs-vllm) only run where that exists; CI has neither
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                   skip_cells_with_tag="needs-gpu").execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")
