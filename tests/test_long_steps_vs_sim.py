"""benchmarks/long_steps_vs_sim.py: measured long steps beside the simulator's eager steps, on one real row."""

import gzip
import json

import polars as pl
import pytest

from benchmarks import long_steps_vs_sim
from treewy.results import DATA_DIR

FIT = "H200_VLLM026_GRAPHS1024_ACCEPTED"


@pytest.fixture
def sweep(tmp_path):
    """A sweep folder: one measured row of 2026-12-02 (summarize-short, store-all, 8 requests) and a record whose
    engine steps are 20 ms apart but for one of 300 ms."""
    table = pl.read_parquet(DATA_DIR / "serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-12-02.parquet")
    row = table.filter(pl.col("workload") == "summarize-short", pl.col("mode") == "store_all",
                       pl.col("concurrency") == 8)
    assert row.height == 1
    row.write_parquet(tmp_path / "serve35b_store_all.parquet")
    (tmp_path / "results").mkdir()
    with gzip.open(tmp_path / "results" / "summarize-short-store_all-c8.json.gz", "wt") as f:
        json.dump({"start_times": [0.0], "ttfts": [0.1], "itls": [[0.02, 0.02, 0.3, 0.02]]}, f)
    return tmp_path


def test_each_point_gets_its_measured_and_simulated_long_steps(sweep, capsys):
    (got,) = long_steps_vs_sim.compare(sweep, FIT)
    assert (got["workload"], got["mode"], got["concurrency"]) == ("summarize-short", "store_all", 8)
    assert got["stalls"] == 1 and got["stall_mean_ms"] == pytest.approx(300.0)
    assert got["stall_share"] == pytest.approx(0.3 / 0.36)
    # decode-only graphs: the prefills of 16 requests at 8 at a time run eagerly, in a few steps
    assert 2 <= got["sim_eager_steps"] <= 16 and got["sim_eager_mean_ms"] > 0 and 0 < got["sim_eager_share"] < 1
    out = sweep / "table.md"
    assert long_steps_vs_sim.main([str(sweep), "--fit", FIT, "--out", str(out)]) == 0
    assert "| summarize-short | store_all | 8 | 1 | 300 | 83 % |" in out.read_text()
    assert capsys.readouterr().out == out.read_text()


def test_a_folder_without_measured_rows_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no measured closed-loop rows"):
        long_steps_vs_sim.compare(tmp_path, FIT)
