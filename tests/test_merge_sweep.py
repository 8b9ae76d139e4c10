"""benchmarks/merge_sweep.py: a sweep call's files merged into the committed results, on real checkpoint records."""

import gzip
import io
import json
import shutil
import tarfile

import polars as pl
import pytest

from benchmarks import merge_sweep
from treewy.results import DATA_DIR, INDEX_NAME, read_index
from treewy.schema import serving_frame

SWEEP = DATA_DIR.parent.parent / "benchmarks" / "results" / "serve35b_h200_gmu0.6_2026-12-02"
CKPT = "serve35b_store_all.points.jsonl"


def _add(tar, name, data: bytes):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def call(tmp_path):
    """Committed: two points (their parquet rows carry a median TPOT the records lack); the call: those two and a
    third, its record and server log packed, its log and capacity report."""
    lines = (SWEEP / CKPT).read_text().splitlines()[:3]
    dest, src, data = tmp_path / "dest", tmp_path / "src", tmp_path / "data"
    for d in (dest, src, data):
        d.mkdir()
    (dest / CKPT).write_text("\n".join(lines[:2]) + "\n")
    committed = serving_frame([json.loads(x)["row"] for x in lines[:2]]).with_columns(median_tpot_ms=pl.lit(9.5))
    committed.write_parquet(dest / "serve35b_store_all.parquet")
    (dest / "sweep_store_all_gmu0.6.log").write_text("first call\n")
    shutil.copy(DATA_DIR / INDEX_NAME, data / INDEX_NAME)
    committed.write_parquet(data / "pkg.parquet")
    third = json.loads(lines[2])["point"]
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as t:
        _add(t, f"./{third}.json", b'{"itls": []}')
        _add(t, "./server-store_all.log", b"server output")
    with tarfile.open(src / "store_all.tar.gz", "w:gz") as t:
        _add(t, f"store_all/{CKPT}", ("\n".join(lines) + "\n").encode())
        _add(t, "store_all/results.tar.gz", packed.getvalue())
        _add(t, "store_all/capacity_store_all_tp1.json", b"{}")
        _add(t, "store_all/sweep_store_all_gmu0.6.log", b"second call\n")
    return src, dest, data, third


def test_a_calls_new_point_joins_the_committed_ones_everywhere(call, capsys):
    src, dest, data, third = call
    assert merge_sweep.main([str(src), str(dest), "--package", "pkg.parquet", "--data-dir", str(data)]) == 0
    assert "1 new point(s)" in capsys.readouterr().out
    assert len((dest / CKPT).read_text().splitlines()) == 3
    for table in (dest / "serve35b_store_all.parquet", data / "pkg.parquet"):
        frame = pl.read_parquet(table)
        assert frame.height == 3 and frame["median_tpot_ms"].to_list().count(9.5) == 2   # committed rows kept
    assert "pkg.parquet" in read_index(data)["serving"]
    record = dest / "results" / f"{third}.json.gz"
    assert gzip.decompress(record.read_bytes()) == b'{"itls": []}'
    assert record.read_bytes()[4:8] == b"\0\0\0\0"                                       # no time in the header
    assert sorted(p.name for p in (dest / "results").iterdir()) == [record.name]          # no server log
    assert (dest / "capacity_store_all_tp1.json").is_file()
    log = (dest / "sweep_store_all_gmu0.6.log").read_text()
    assert log.startswith("first call\n# merged ") and log.endswith("second call\n")


def test_a_call_that_did_not_resume_the_committed_points_is_refused(call):
    src, dest, data, _ = call
    lines = (SWEEP / CKPT).read_text().splitlines()
    (dest / CKPT).write_text("\n".join(lines[3:5]) + "\n")       # points the call's checkpoint lacks
    with pytest.raises(SystemExit, match="lacks 2 point"):
        merge_sweep.main([str(src), str(dest), "--package", "pkg.parquet", "--data-dir", str(data)])


def test_a_folder_without_sweep_output_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no sweep output there"):
        merge_sweep.main([str(tmp_path), str(tmp_path / "dest"), "--package", "p.parquet"])


def test_without_a_package_only_the_results_folder_changes(call, capsys):
    src, dest, data, _ = call
    before = (data / "pkg.parquet").read_bytes(), (data / INDEX_NAME).read_bytes()
    assert merge_sweep.main([str(src), str(dest), "--data-dir", str(data)]) == 0
    assert "package's table left as it is" in capsys.readouterr().out
    assert pl.read_parquet(dest / "serve35b_store_all.parquet").height == 3
    assert ((data / "pkg.parquet").read_bytes(), (data / INDEX_NAME).read_bytes()) == before


def test_the_same_point_at_another_acceptance_is_a_new_row():
    """A chain swept at the tiny checkpoint's rates joins a package table that holds the chain at the paper's."""
    rows = [json.loads(x)["row"] for x in (SWEEP / CKPT).read_text().splitlines()[:1]]
    paper = serving_frame(rows)
    assert paper["acceptance_source"].to_list() == ["paper-35b"]
    tiny = paper.with_columns(acceptance_source=pl.lit("tiny"))
    assert merge_sweep.new_rows(tiny, paper).height == 1
    assert merge_sweep.new_rows(paper, paper).height == 0
    older = paper.drop("acceptance_source")    # a table written before rows named their acceptance
    assert merge_sweep.new_rows(paper, older).height == 0
