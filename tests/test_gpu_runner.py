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
    row = rows["00_start_here.ipynb"]
    assert row["ok"] and row["seconds"] > 0
    parts = (row["kernel_start_s"], row["cells_s"], row["shutdown_s"])
    assert all(0 <= p < row["seconds"] for p in parts) and row["cells_s"] > 0
    assert sum(parts) <= row["seconds"] + 0.3   # rounding
    text = (out / "summary.txt").read_text()
    assert f"(kernel start {parts[0]:.1f} s, cells {parts[1]:.1f} s, shutdown {parts[2]:.1f} s)" in text
    slow = rows["00_start_here.ipynb"]["slowest_cells"]
    assert 0 < len(slow) <= 4 and slow == sorted(slow, key=lambda c: -c["seconds"]) and slow[0]["line"]
    assert f"    cell {slow[0]['cell']:>3}" in (out / "summary.txt").read_text()
    assert not rows["01_broken.ipynb"]["ok"] and "ZeroDivisionError" in rows["01_broken.ipynb"]["error"]
    executed = nbformat.read(out / "00_start_here.ipynb", as_version=4)
    assert any(c.get("outputs") for c in executed.cells) and executed.metadata["treewy_run"]["device"].startswith("CPU")


def test_lab_startup_times_notebook_04s_first_cells_phase_by_phase_in_a_new_process(tmp_path):
    """benchmarks/lab_startup.py on the CPU, as its own process: one row per module the lab's setup loads, the banner,
    the device's first use, the checkpoint's load and each decode twice; in-process (torch already imported) it
    refuses, since the imports are what it times."""
    import subprocess
    import sys

    import pytest

    from benchmarks import lab_startup

    run = subprocess.run([sys.executable, "-m", "benchmarks.lab_startup", "--device", "cpu", "--new-tokens", "2",
                          "--out", str(tmp_path), "--profile", "0.3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "lab_startup.json").read_text())
    names = [r["phase"] for r in report["phases"]]
    assert names[0] == "import treewy_lab" and "import transformers" in names and "import treewy.decode" in names
    assert names[-7:] == ["describe() (the banner)", "first use of cpu", 'load("tiny")', "plain decode, first",
                          "plain decode, again", "(3, 3, 3) decode, first", "(3, 3, 3) decode, again"]
    assert all(r["seconds"] >= 0 for r in report["phases"]) and report["total_s"] >= sum(
        r["seconds"] for r in report["phases"]) - 0.01
    assert report["device"].startswith("CPU") and report["new_tokens"] == 2
    assert (tmp_path / "lab_startup.txt").read_text().splitlines()[-1].endswith("in all")
    # --profile: the phases of at least 0.3 s with their top functions, the import plumbing left out
    profile = (tmp_path / "lab_startup_profile.txt").read_text()
    slow = [r["phase"] for r in report["phases"] if r["seconds"] >= 0.3]
    assert 'load("tiny")' in slow and [line[3:].split(":")[0] for line in profile.splitlines()
                                        if line.startswith("== ")] == slow
    assert "treewy/models/__init__.py" in profile and "<frozen importlib" not in profile
    with pytest.raises(SystemExit):
        lab_startup.main(["--device", "cpu", "--out", str(tmp_path)])
    # --engine-only: of the lab only its bytecode cache (no polars, altair, panels), then torch first, the same engine
    # phases after
    probe = ("import sys; from benchmarks.lab_startup import main; main(sys.argv[1:]); "
             "assert not any(m.startswith(('treewy_lab.panels', 'polars', 'altair', 'ipywidgets')) for m in sys.modules)")
    run = subprocess.run([sys.executable, "-c", probe,
                          "--device", "cpu", "--new-tokens", "2", "--out", str(tmp_path / "e"), "--engine-only"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "e" / "lab_startup.json").read_text())
    names = [r["phase"] for r in report["phases"]]
    assert names[:5] == ["treewy_lab's bytecode cache", "import torch", "import transformers", "import treewy.models",
                         "import treewy.decode"]
    from treewy_lab.bytecode import cache_dir, missing_bytecode
    assert report["bytecode_prefix"] == (str(cache_dir()) if missing_bytecode() else None)
    assert names[-7:] == ['describe() (the banner)', "first use of cpu", 'load("tiny")', "plain decode, first",
                          "plain decode, again", "(3, 3, 3) decode, first", "(3, 3, 3) decode, again"]
    assert report["engine_only"] is True
