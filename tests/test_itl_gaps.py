"""benchmarks/itl_gaps.py on made-up result files: counts, median and the long gaps' share and mean per point."""

import gzip
import json

import pytest

from benchmarks import itl_gaps


def test_gaps_per_point_from_plain_and_gzipped_results(tmp_path, capsys):
    # request 0 from t = 1.0: tokens at 1.1, 1.12, 1.15, 1.45; request 1 from t = 1.0: 1.1, 1.12; request 2 failed
    (tmp_path / "a-store_all-c2.json").write_text(json.dumps({
        "itls": [[0.02, 0.03, 0.3], [0.02], []], "start_times": [1.0, 1.0, 1.0], "ttfts": [0.1, 0.1, 0.0]}))
    with gzip.open(tmp_path / "b-reconstruct-c1.json.gz", "wt") as f:
        json.dump({"itls": [[0.01, 0.01]], "start_times": [0.0], "ttfts": [0.05]}, f)
    out = tmp_path / "gaps.txt"
    assert itl_gaps.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.read_text().splitlines()[2:]}
    # engine steps at 1.1, 1.12, 1.15, 1.45: gaps 20, 30, 300 ms; the one > 100 ms is 300 of the 350 ms span
    assert rows["a-store_all-c2"] == ["4", "25.0", "25.0%", "300.0", "|", "1", "300.0", "85.7%"]
    assert rows["b-reconstruct-c1"] == ["2", "10.0", "0.0%", "nan", "|", "0", "nan", "0.0%"]
    assert capsys.readouterr().out == out.read_text()
    r = itl_gaps.gaps_row({"itls": [[0.2, 0.4]]}, 0.1)
    assert r == pytest.approx({"gaps": 2, "median_ms": 300.0, "slow_share": 1.0, "slow_mean_ms": 300.0})


def test_engine_gaps_merge_one_steps_arrivals_and_skip_failed_requests():
    result = {"start_times": [0.0, 0.0005, 0.0], "ttfts": [0.010, 0.0105, None], "itls": [[0.02], [0.0201], []]}
    gaps, span = itl_gaps.engine_gaps(result)
    # arrivals 10, 11 ms (one step), 30, 31.1 ms (the next): one gap of 20 ms, then the 1.1 ms is merged
    assert gaps == pytest.approx([0.020]) and span == pytest.approx(0.0211)
    assert itl_gaps.stalls_row(result, 0.015) == pytest.approx({"stalls": 1, "stall_mean_ms": 20.0,
                                                                "stall_share": 0.020 / 0.0211})


def test_a_folder_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no vllm bench serve result files"):
        itl_gaps.main([str(tmp_path)])
