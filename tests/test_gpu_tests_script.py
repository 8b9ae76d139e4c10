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
