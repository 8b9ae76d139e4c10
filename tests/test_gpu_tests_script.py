"""benchmarks/gpu_tests.sh, the GPU test run, against the test files it names."""

from __future__ import annotations


def test_the_gpu_test_run_names_test_files_that_exist():
    """benchmarks/gpu_tests.sh lists the GPU test files by name: each must exist (a renamed file would silently
    drop out of the GPU run), and the spec step's among them."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    named = re.findall(r"tests/(test_\w+\.py)", (root / "benchmarks" / "gpu_tests.sh").read_text())
    assert "test_serve_spec_step.py" in named and len(named) >= 10
    assert [n for n in named if not (root / "tests" / n).is_file()] == []


def test_an_unknown_part_is_refused_before_anything_runs(tmp_path):
    """GPU_TESTS_PART names one of the run's parts; anything else stops with the choices, writing nothing."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_tests.sh"
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(script), str(out), "10"], capture_output=True, text=True,
                       env={**os.environ, "GPU_TESTS_PART": "kernel"})
    assert r.returncode == 2 and "expected kernels, engines or all" in r.stderr
    assert not out.exists()


def test_the_kernels_run_on_twelve_workers_and_the_engines_in_one_process(tmp_path):
    """Host-bound engine tests slow down many times over beside other processes on the GPU: `all` runs the
    kernels' files on 12 workers that take each other's queued tests, then the engines' files without xdist
    (python3 and nvidia-smi stubbed)."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_tests.sh"
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    for name in ("python3", "nvidia-smi"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        stub.chmod(0o755)
    r = subprocess.run(["bash", str(script), str(tmp_path / "out"), "60"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    runs = [line.split() for line in calls.read_text().splitlines() if " pytest " in line]
    assert len(runs) == 2
    kernels, engines = runs
    assert kernels[kernels.index("-n") + 1] == "12" and "tests/test_verify.py" in kernels
    assert kernels[kernels.index("--dist") + 1] == "worksteal"   # the long property tests spread over workers
    assert "-n" not in engines and "tests/test_decode_graph.py" in engines
    assert "tests/test_decode_graph.py" not in kernels and "tests/test_verify.py" not in engines
