"""benchmarks/notebooks_gpu.sh: every notebook in two passes and the start-up phases in one call, the summaries
copied out under a tag: once for real on the CPU (one notebook), once with python3 stubbed (the wheels' unpacking,
the passes, the exit status)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "notebooks_gpu.sh"


def _python3_on_path(tmp_path, body: str = "") -> dict:
    """A PATH whose python3 is this interpreter, or a stub running ``body`` when given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f"#!{sys.executable}\n{body}" if body else f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


def test_one_notebook_on_the_cpu_comes_back_as_a_tagged_summary(tmp_path):
    env = {**_python3_on_path(tmp_path), "DEVICE": "cpu", "SITE_TAR": "", "PASSES": "once", "LAB_STARTUP": "0"}
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "cpu", "--notebooks", "00_start_here"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "notebooks_gpu rc=0" in r.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary_cpu_once.json", "summary_cpu_once.txt"]
    summary = json.loads((tmp_path / "out" / "summary_cpu_once.json").read_text())
    assert summary["device"].startswith("CPU")
    assert [(n["notebook"], n["ok"]) for n in summary["notebooks"]] == [("00_start_here.ipynb", True)]


STUB = """import json, os, pathlib, subprocess, sys
with open(os.environ["CALLS"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + " | " + os.environ.get("PYTHONPATH", "") + "\\n")
if sys.argv[1:3] == ["-m", "compileall"]:
    sys.exit(subprocess.call([sys.executable, *sys.argv[1:]]))
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True)
name = "summary" if "run_notebooks_gpu" in sys.argv[2] else "lab_startup"
for ext in ("json", "txt"):
    (out / f"{name}.{ext}").write_text(json.dumps({"out": out.name, "argv": sys.argv[1:]}))
if "--profile" in sys.argv:
    (out / "lab_startup_profile.txt").write_text(" ".join(sys.argv[1:]))
sys.exit(5 if out.name == "warm" else 0)
"""


def test_the_wheels_are_unpacked_and_compiled_and_the_worst_status_is_the_exit_status(tmp_path):
    site_tar, site = tmp_path / "site.tar.xz", tmp_path / "site"
    with tarfile.open(site_tar, "w:xz") as tar:
        data = b"VALUE = 1\n"
        info = tarfile.TarInfo("wheelmod.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    calls = tmp_path / "calls.txt"
    env = {**_python3_on_path(tmp_path, STUB), "SITE_TAR": str(site_tar), "SITE": str(site), "CALLS": str(calls)}
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "h100", "--notebooks", "04_acceptance_sweeps"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 5 and "notebooks_gpu rc=5" in r.stdout, r.stdout + r.stderr
    assert (site / "wheelmod.py").is_file() and list((site / "__pycache__").glob("wheelmod.*.pyc"))
    lines = calls.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["compileall", "benchmarks.run_notebooks_gpu",
                                                   "benchmarks.run_notebooks_gpu", "benchmarks.lab_startup",
                                                   "benchmarks.lab_startup"]
    for line in lines[1:]:
        argv, pythonpath = line.split(" | ")
        assert pythonpath.split(":")[:2] == [str(site), str(ROOT)]
        assert "--device cuda" in argv
    assert lines[1].split(" | ")[0].endswith("--notebooks 04_acceptance_sweeps")
    assert "--profile" not in lines[3] and lines[4].split(" | ")[0].endswith("--profile 1.0")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "lab_startup_h100.json", "lab_startup_h100.txt", "lab_startup_profile_h100.txt", "summary_h100_cold.json",
        "summary_h100_cold.txt", "summary_h100_warm.json", "summary_h100_warm.txt"]
    assert json.loads((tmp_path / "out" / "summary_h100_warm.json").read_text())["out"] == "warm"


def test_a_missing_tag_is_a_usage_error(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "usage: notebooks_gpu.sh OUT TAG" in r.stderr
