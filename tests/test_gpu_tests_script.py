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
