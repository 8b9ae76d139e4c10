"""The measured tables ship with the package, the newest wins by the date in its name, and the simulator prices
TreeWY's GDN step with the newest kernel targets table."""

import json
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from treewy.results import DATA_DIR, checkout_dirs, fastest_rows, find, kernel_table, newest, newest_targets
from treewy.sim import simulate
from treewy.sim.cost import measured_ratio_table

ROOT = DATA_DIR.parent.parent
TARGETS_1129 = DATA_DIR / "targets_h200_2026-11-29.json"


def test_newest_by_the_date_in_the_name(tmp_path):
    for name in ("targets_h200_2026-12-01.json", "targets_a100_2026-11-30.json", "targets_h200_2026-11-29.json",
                 "targets_undated.json", "kernels_h200_2026-12-31.json"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in find("targets_*.json", [tmp_path])] == [
        "targets_undated.json", "targets_h200_2026-11-29.json", "targets_a100_2026-11-30.json",
        "targets_h200_2026-12-01.json"]
    assert newest_targets([tmp_path]).name == "targets_h200_2026-12-01.json"
    assert newest("nothing_*.json", [tmp_path]) is None


def test_the_newest_targets_table_of_the_checkout_ships_with_the_package():
    in_checkout = newest_targets(checkout_dirs())
    shipped = newest_targets([DATA_DIR])
    assert shipped is not None, "treewy/data/ has no targets_*.json"
    assert in_checkout is None or in_checkout.name <= shipped.name or (DATA_DIR / in_checkout.name).is_file(), (
        f"{in_checkout} is newer than the targets table shipped in treewy/data/: git mv it (the .json) into "
        "treewy/data/ so an installed package reads it too")


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
    name = newest_targets([DATA_DIR]).name
    assert out.stdout.split() == ["()", name, f"measured:{name}"]


def test_kernel_table_reads_both_formats(tmp_path):
    rows = [{"provider": "treewy", "tree": "(1, 1, 1)", "num_nodes": 4, "B": 8, "us": 2.0}]
    path = tmp_path / "kernels_x_2026-01-02.json"
    path.write_text(json.dumps({"device": "X", "date": "2026-01-02", "rows": rows}))
    table = kernel_table(path)
    assert (table["device"], table["date"], table["rows"][0]["case"]) == ("X", "2026-01-02", "treewy (1, 1, 1) B8")
    assert np.isclose(kernel_table(TARGETS_1129)["rows"][0]["us"], 698.576, atol=1e-3)
