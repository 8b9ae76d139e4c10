"""benchmarks/itl_gaps.py on made-up result files: counts, median and the long gaps' share and mean per point."""

import gzip
import json

import pytest

from benchmarks import itl_gaps


def test_gaps_per_point_from_plain_and_gzipped_results(tmp_path, capsys):
    (tmp_path / "a-store_all-c2.json").write_text(json.dumps({"itls": [[0.02, 0.03, 0.3], [0.02], []]}))
    with gzip.open(tmp_path / "b-reconstruct-c1.json.gz", "wt") as f:
        json.dump({"itls": [[0.01, 0.01]]}, f)
    out = tmp_path / "gaps.txt"
    assert itl_gaps.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.read_text().splitlines()[2:]}
    assert rows["a-store_all-c2"] == ["4", "25.0", "25.0%", "300.0"]
    assert rows["b-reconstruct-c1"] == ["2", "10.0", "0.0%", "nan"]
    assert capsys.readouterr().out == out.read_text()
    r = itl_gaps.gaps_row({"itls": [[0.2, 0.4]]}, 0.1)
    assert r == pytest.approx({"gaps": 2, "median_ms": 300.0, "slow_share": 1.0, "slow_mean_ms": 300.0})


def test_a_folder_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no vllm bench serve result files"):
        itl_gaps.main([str(tmp_path)])
