"""benchmarks/run_notebooks_gpu.py, run on the CPU: executed copies with outputs, a summary with device, date and
wall times, and a non-zero exit when a notebook fails."""

import json
import shutil
from pathlib import Path

import nbformat

from benchmarks import run_notebooks_gpu

ROOT = Path(__file__).parent.parent


def test_runner_writes_executed_notebooks_and_fails_on_an_error(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_start_here.ipynb", nbs)
    broken = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    nbformat.write(broken, nbs / "01_broken.ipynb")
    out = tmp_path / "out"
    assert run_notebooks_gpu.main(["--device", "cpu", "--dir", str(nbs), "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"].startswith("CPU") and summary["date"] and summary["versions"]["torch"]
    rows = {r["notebook"]: r for r in summary["notebooks"]}
    assert rows["00_start_here.ipynb"]["ok"] and rows["00_start_here.ipynb"]["seconds"] > 0
    slow = rows["00_start_here.ipynb"]["slowest_cells"]
    assert 0 < len(slow) <= 4 and slow == sorted(slow, key=lambda c: -c["seconds"]) and slow[0]["line"]
    assert f"    cell {slow[0]['cell']:>3}" in (out / "summary.txt").read_text()
    assert not rows["01_broken.ipynb"]["ok"] and "ZeroDivisionError" in rows["01_broken.ipynb"]["error"]
    executed = nbformat.read(out / "00_start_here.ipynb", as_version=4)
    assert any(c.get("outputs") for c in executed.cells) and executed.metadata["treewy_run"]["device"].startswith("CPU")
