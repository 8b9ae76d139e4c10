"""Claims as data: every measured number the README's "Measured so far" and the notebooks' "What we saw" quote is
found, at the precision quoted, in the committed results files that text draws on (SOURCES: kernel targets, the
tiny checkpoint's sweeps, the simulator's committed sweep, the paper's figures in treewy/paper.py). A number that
none of them holds fails, with the sentence it came from."""

import json
import math
import re
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).parent.parent
NUMBER = re.compile(r"(?<![\w.(,])(\d+(?:\.\d+)?(?:e-\d+)?)\s?(µs|us|ms|GiB|MiB|%|×|x)?(?![\w.]*\))")


def _numbers_in_text(text: str):
    for m in re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text):
        yield float(m.group(0))


def _numbers_in_json(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers_in_json(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers_in_json(v)
    elif isinstance(value, str):
        yield from _numbers_in_text(value)


KERNELS = ("treewy/data/targets_*.json", "benchmarks/results/targets_*.txt",
           "benchmarks/results/batch_crossover_*.json", "benchmarks/results/exact_families_*.json")
TINY = ("treewy/data/*tiny*sweep*.parquet", "benchmarks/results/*tiny*sweep*.parquet")
SIM = ("treewy/data/sim_*.parquet", "benchmarks/results/sim_*.txt", "treewy/paper.py")
VLLM = ("benchmarks/results/vllm_h200_*/tiny_*.json", "benchmarks/results/vllm_h200_*/*/tiny_*.json",
        "benchmarks/results/vllm_h200_*/capacity_*.log", "benchmarks/results/vllm_h200_*/*/fault/fault.json")
SERVING = ("benchmarks/results/vllm_h200_*/*/serve35b/*.jsonl", "benchmarks/results/vllm_h200_*/*/serve35b/*.log",
           "benchmarks/results/sim_vs_measured_*.txt")
SOURCES = {
    "README.md: Measured so far": KERNELS + TINY + VLLM + SERVING + ("treewy/paper.py",),
    "03_kernel_parity_live": KERNELS,
    "04_acceptance_sweeps": TINY + ("treewy/paper.py",),
    "05_serving_curves": SIM + SERVING,
    "06_serving_with_vllm": VLLM + SERVING + SIM,
}


def _result_values(globs) -> set[float]:
    values: set[float] = set()
    for path in sorted({p for g in globs for p in ROOT.glob(g) if p.is_file()}):
        if path.suffix == ".json":
            values.update(_numbers_in_json(json.loads(path.read_text())))
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                values.update(_numbers_in_json(json.loads(line)))
        elif path.suffix == ".parquet":
            df = pl.read_parquet(path)
            for col, dtype in df.schema.items():   # of a sweep, its acceptance columns (not its timings)
                if dtype.is_numeric() and ("acceptance" in col or "acceptance" not in df.columns):
                    values.update(float(v) for v in df[col].drop_nulls())
        elif path.suffix in (".txt", ".log", ".py"):
            values.update(_numbers_in_text(path.read_text()))
    scaled = set()
    for v in values:   # the units prose uses: percent, ms from us, MiB / GiB from bytes
        scaled.update((v, v * 100, v / 1000, v / 2**20, v / 2**30))
    return {v for v in scaled if math.isfinite(v)}


VALUES = {where: _result_values(globs) for where, globs in SOURCES.items()}


def _matches(quoted: str, where: str) -> bool:
    values = VALUES[where.split(":")[0] if where.startswith("0") else where]
    x = float(quoted)
    if "e-" in quoted:
        mantissa = quoted.split("e-")[0]
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exp = int(quoted.split("e-")[1])
        return any(v > 0 and math.isclose(float(f"{v:.{digits}e}"), x, rel_tol=1e-9) and
                   int(f"{v:e}".split("e")[1]) == -exp for v in values)
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    half = 0.5 * 10 ** -digits
    return any(x - half - 1e-9 <= v < x + half - 1e-12 for v in values)


def _claims():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Measured so far", 1)[1].split("\n## ", 1)[0]
    yield "README.md: Measured so far", section
    for name in ("03_kernel_parity_live", "04_acceptance_sweeps", "05_serving_curves", "06_serving_with_vllm"):
        nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and "## What we saw" in text:
                yield name, text.split("## What we saw", 1)[1].split("## Try this", 1)[0]


def _quoted(text: str):
    """Measured-looking numbers: decimals, powers of ten, and integers with a unit (us, ms, GiB, %, ×)."""
    for line in text.splitlines():
        line = re.sub(r"\(\d+(?:, \d+)+\)|B = \d+|k = \d+|T = \d+|N \+ 1|\d{4}-\d{2}-\d{2}|\b\d+ (?:layers|requests|"
                      r"snapshots|targets|concurrent|steps|folded|blocks)\b", " ", line)
        for m in NUMBER.finditer(line):
            number, unit = m.group(1), m.group(2)
            if "." in number or "e-" in number or unit:
                yield number, line.strip()


CLAIMS = [(where, number, line) for where, text in _claims() for number, line in _quoted(text)]


def test_claims_were_found():
    assert len(CLAIMS) > 30


def test_a_number_from_an_older_run_is_caught():
    assert not _matches("9.87e-6", "README.md: Measured so far")   # a number no committed results file holds
    assert not _matches("873", "03_kernel_parity_live")             # the first kernels' decode step
    assert _matches("447", "03_kernel_parity_live") and _matches("6.51", "05_serving_curves")


@pytest.mark.parametrize("where, number, line", CLAIMS, ids=[f"{w}: {n}" for w, n, _ in CLAIMS])
def test_quoted_number_is_in_a_results_file(where, number, line):
    assert _matches(number, where), f"{where}: {number} (in: {line!r}) is in no committed results file"
