"""The measured tables ship with the package, named by treewy/data/index.json (a benchmark run publishes a table
explicitly; nothing is chosen by date), and the simulator prices TreeWY's GDN step with the current kernel
targets table."""

import json
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from treewy.results import (DATA_DIR, KINDS, fastest_rows, find, kernel_table, newest, newest_targets, publish,
                            read_index, search_dirs, table, tables)
from treewy.sim import simulate
from treewy.sim.cost import measured_ratio_table

ROOT = DATA_DIR.parent.parent
TARGETS_1129 = DATA_DIR / "targets_h200_2026-11-29.json"


def _data(tmp_path, index: dict, *names: str):
    for name in names:
        (tmp_path / name).write_text("{}")
    (tmp_path / "index.json").write_text(json.dumps(index))
    return tmp_path


def test_the_index_names_a_shipped_table_for_every_kind_it_lists():
    index = read_index()
    assert set(index) <= set(KINDS), f"treewy/data/index.json names kinds treewy.results.KINDS does not: {index}"
    for kind in KINDS:
        for path in tables(kind):   # a stale entry raises
            assert path.parent == DATA_DIR and path.stat().st_size > 0
    assert newest_targets() == table("kernel_targets") == DATA_DIR / index["kernel_targets"]
    assert all("benchmarks" not in p.parts for p in search_dirs()), search_dirs()


def test_a_kind_the_index_does_not_name_is_refused_in_words(tmp_path):
    data = _data(tmp_path, {"serving": []})
    assert tables("kernel_targets", data) == [] and newest_targets(data) is None
    with pytest.raises(LookupError, match=r"names no 'kernel_targets' table.*publish\('kernel_targets', path\)"):
        table("kernel_targets", data)
    with pytest.raises(ValueError, match=r"kind = 'kernel_target': expected one of kernel_targets"):
        tables("kernel_target", data)
    with pytest.raises(FileNotFoundError, match="index.json is missing"):
        read_index(tmp_path / "nowhere")


def test_a_stale_entry_naming_a_missing_file_is_an_error_not_skipped(tmp_path):
    data = _data(tmp_path, {"kernel_targets": "targets_h200_2026-12-01.json",
                            "serving": ["here.parquet", "gone.parquet"]}, "here.parquet")
    with pytest.raises(FileNotFoundError, match=r"names targets_h200_2026-12-01\.json for 'kernel_targets'.*publish"):
        newest_targets(data)
    with pytest.raises(FileNotFoundError, match=r"names gone\.parquet for 'serving'"):
        tables("serving", data)
    with pytest.raises(FileNotFoundError, match="targets_h200_2026-12-01.json"):   # any stale entry, any pattern
        newest("*.parquet", data)


def test_publish_copies_the_table_and_names_it_in_the_index(tmp_path):
    (tmp_path / "data").mkdir()
    data = _data(tmp_path / "data", {"serving": ["a.parquet"]}, "a.parquet")
    runs = tmp_path / "run"
    runs.mkdir()
    for name, text in (("targets_h200_2026-12-02.json", '{"date": "2026-12-02"}'),
                       ("targets_h200_2026-11-01.json", '{"date": "2026-11-01"}'), ("b.parquet", "b")):
        (runs / name).write_text(text)
    shipped = publish("kernel_targets", runs / "targets_h200_2026-12-02.json", data_dir=data)
    assert shipped == data / "targets_h200_2026-12-02.json" and shipped.read_text() == '{"date": "2026-12-02"}'
    assert table("kernel_targets", data) == shipped
    publish("kernel_targets", runs / "targets_h200_2026-11-01.json", data_dir=data)   # the call decides, not the date
    assert table("kernel_targets", data).name == "targets_h200_2026-11-01.json"
    assert (data / "targets_h200_2026-12-02.json").is_file()   # an earlier table stays shipped, no longer current
    publish("serving", runs / "b.parquet", data_dir=data)
    publish("serving", data / "a.parquet", data_dir=data)   # published again: moves to the end, not listed twice
    publish("serving", runs / "b.parquet", name="c.parquet", data_dir=data)
    assert [p.name for p in tables("serving", data)] == ["b.parquet", "a.parquet", "c.parquet"]
    assert read_index(data) == {"serving": ["b.parquet", "a.parquet", "c.parquet"],
                                "kernel_targets": "targets_h200_2026-11-01.json"}
    assert [p.name for p in find("*.parquet", data)] == ["b.parquet", "a.parquet", "c.parquet"]
    assert newest("targets_*.json", data).name == "targets_h200_2026-11-01.json"
    with pytest.raises(ValueError, match="src = .*no such file"):
        publish("serving", runs / "missing.parquet", data_dir=data)
    with pytest.raises(ValueError, match="name = 'x/y.parquet': expected a plain file name"):
        publish("serving", runs / "b.parquet", name="x/y.parquet", data_dir=data)
    with pytest.raises(ValueError, match="kind = 'servings'"):
        publish("servings", runs / "b.parquet", data_dir=data)
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet", "b.parquet", "c.parquet", "index.json",
                                                      "targets_h200_2026-11-01.json", "targets_h200_2026-12-02.json"]


def test_select_thresholds_follow_the_current_batch_crossover_table():
    """select.DENSE_MIN_BATCH is the smallest batch from which the dense kernel was the faster, per tree, in the
    current batch crossover table: publishing a new table that moves the crossover fails here until it is set."""
    from treewy.ops.verify.select import dense_min_batch
    from treewy.tree import DraftTree

    rows = json.loads(table("batch_crossover").read_text())["rows"]
    for tree in sorted({r["tree"] for r in rows}):
        mine = sorted((r["B"], r["fastest"]) for r in rows if r["tree"] == tree)
        from_b = next(b for i, (b, _) in enumerate(mine) if all(f == "dense" for _, f in mine[i:]))
        T = DraftTree.from_widths(tuple(int(c) for c in tree.strip("()").split(","))).num_drafts + 1
        assert dense_min_batch(T) == from_b, (tree, mine)


def test_the_family_select_picks_is_the_fastest_in_the_current_targets_table():
    """select_kernel's choice for every case the current kernel targets table times beside its rivals is the
    fastest family there (the figures behind select.py's thresholds live in that table, not in its comments)."""
    from treewy.ops.verify.select import select_kernel

    nodes = {"333": 40, "222": 15, "chain3": 4}
    cases: dict[str, dict[str, float]] = {}
    for key, row in json.loads(table("kernel_targets").read_text())["rows"].items():
        if key.endswith("]"):
            case, family = key[:-1].split(" [")
            cases.setdefault(case, {})[family] = row["us"]
    assert len(cases) >= 6, sorted(cases)
    for case, us in cases.items():
        tree, b, *dtype = case.split()
        chosen = select_kernel(nodes[tree], int(b.removeprefix("B")), tree.startswith("chain"), dtype == ["bf16"])
        assert chosen == min(us, key=us.get), (case, chosen, us)


def test_fastest_kernel_stands_for_a_case_and_tf32_rows_are_left_out():
    rows = kernel_table(TARGETS_1129)["rows"]
    best = {(r["provider"], r["num_nodes"], r["B"], r["state_dtype"], r["HV"]): r for r in fastest_rows(rows)}
    chain = best[("treewy", 4, 256, "float32", 32)]
    assert chain["kernel"] == "chain" and chain["us"] == pytest.approx(447.17, abs=0.01)
    wide = best[("treewy", 40, 256, "float32", 32)]
    assert wide.get("dot_precision") != "tf32" and wide["kernel"] == "dot_head"


def test_simulator_prices_treewy_with_the_newest_targets_table():
    bs, ratio = measured_ratio_table(TARGETS_1129, (1, 1, 1), "float32", 32)
    assert bs.tolist() == [256.0] and ratio[0] == pytest.approx(447.168 / 690.7, abs=1e-3)   # today's kernels: 0.65
    bs, ratio = measured_ratio_table(TARGETS_1129, (3, 3, 3), "float32", 32)
    assert bs.tolist() == [59.0] and ratio[0] == pytest.approx(930.0 / 1666.5, abs=1e-3)
    assert measured_ratio_table(TARGETS_1129, (1, 1, 1, 1), "float32", 32) is None   # no chain of 4 measured
    kw = dict(mode="reconstruct", workload="spec-bench", concurrency=[32], num_prompts=32)
    auto = simulate(tree=(1, 1, 1), **kw)
    assert auto["cost_source"].item() == f"measured:{newest_targets().name}"
    assert simulate(tree=(2, 2, 1), **kw)["cost_source"].item() == "analytic"   # no (2, 2, 1) rows: the bytes decide
    store_all = simulate(tree=(1, 1, 1), **{**kw, "mode": "store_all"})
    assert auto["mean_tpot_ms"].item() < store_all["mean_tpot_ms"].item()   # today's kernels: TreeWY's step is faster


def test_an_installed_package_reads_its_tables_without_the_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src)
    for name in ("treewy", "treewy_lab", "notebooks", "tools"):   # what pyproject.toml packages
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("treewy-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    shipped = {p.name for p in DATA_DIR.iterdir()}
    assert shipped <= {p.name for p in (site / "treewy" / "data").iterdir()}
    code = ("import treewy.results as r, treewy.sim as s; "
            "print(r.checkout_dirs(), r.newest_targets().name, "
            "s.simulate(mode='reconstruct', workload='spec-bench', concurrency=[8], num_prompts=16)['cost_source'][0])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    name = table("kernel_targets").name
    assert out.stdout.split() == ["()", name, f"measured:{name}"]


def test_kernel_table_reads_both_formats(tmp_path):
    rows = [{"provider": "treewy", "tree": "(1, 1, 1)", "num_nodes": 4, "B": 8, "us": 2.0}]
    path = tmp_path / "kernels_x_2026-01-02.json"
    path.write_text(json.dumps({"device": "X", "date": "2026-01-02", "rows": rows}))
    table = kernel_table(path)
    assert (table["device"], table["date"], table["rows"][0]["case"]) == ("X", "2026-01-02", "treewy (1, 1, 1) B8")
    assert np.isclose(kernel_table(TARGETS_1129)["rows"][0]["us"], 698.576, atol=1e-3)
