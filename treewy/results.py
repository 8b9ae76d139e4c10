"""The measured tables the package reads, and where they are.

Kernel targets (``targets_<device>_<date>.json`` from ``benchmarks/bench_kernels.py``), the tiny checkpoint's
acceptance sweeps and the committed simulator sweep ship as package data in ``treewy/data/``, so an installed
package reads them without the repository. In a source checkout ``benchmarks/results/`` (committed runs) and
``results/`` (your own ``treewy bench-serve`` runs) are searched too. Among files of one kind the newest wins,
by the ISO date in the file name, so a newer table takes over as soon as it is committed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
_REPO = DATA_DIR.parent.parent
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def checkout_dirs() -> tuple[Path, ...]:
    """``benchmarks/results`` and ``results`` of the source checkout this package runs from (none when installed)."""
    if not (_REPO / "pyproject.toml").is_file() or not (_REPO / "benchmarks").is_dir():
        return ()
    return _REPO / "benchmarks" / "results", _REPO / "results"


def search_dirs() -> tuple[Path, ...]:
    return (DATA_DIR, *checkout_dirs())


def file_date(path: str | Path) -> str:
    """The ISO date in a file name ('' when it has none)."""
    m = _DATE.search(Path(path).name)
    return m.group(0) if m else ""


def find(pattern: str, dirs=None) -> list[Path]:
    """Files matching a glob in the search folders, oldest first (by the date in the name, then the name)."""
    found = [p for d in (search_dirs() if dirs is None else dirs) if Path(d).is_dir() for p in Path(d).glob(pattern)]
    return sorted(found, key=lambda p: (file_date(p), p.name))


def newest(pattern: str, dirs=None) -> Path | None:
    found = find(pattern, dirs)
    return found[-1] if found else None


def newest_targets(dirs=None) -> Path | None:
    """The newest kernel targets table (``targets_*.json``), or None."""
    return newest("targets_*.json", dirs)


def kernel_table(path: str | Path) -> dict:
    """A kernel benchmark file as {"name", "device", "date", "rows"}: a targets table (rows keyed by case) or a
    full ``kernels_*.json`` (a list of rows). Each row gains ``case`` (its key, or provider and tree)."""
    path = Path(path)
    data = json.loads(path.read_text())
    rows = data.get("rows", data if isinstance(data, list) else [])
    if isinstance(rows, dict):
        rows = [{**_with_provider(r, data), "case": case} for case, r in rows.items()]
    else:
        rows = [{**r, "case": f"{r.get('provider')} {r.get('tree')} B{r.get('B')}"} for r in rows]
    meta = data if isinstance(data, dict) else {}
    return {"name": path.name, "device": meta.get("device", "unknown device"), "date": meta.get("date", file_date(path)),
            "rows": [r for r in rows if r.get("us") is not None]}


#: Tree shapes of the windows the targets tables time, by node count.
TREES_BY_NODES = {4: "(1, 1, 1)", 15: "(2, 2, 2)", 40: "(3, 3, 3)"}


def _with_provider(row: dict, data: dict) -> dict:
    """Rows of targets tables from 2026-11-30 on name the kernel only ("chain", "wy", "fla", "store_all") and
    the window size T; give them the provider / tree / num_nodes / model / HV fields the older tables carry
    (every target row is at Qwen3.5-35B-A3B's GDN shapes, which the table's header states)."""
    if "provider" in row:
        return row
    kernel = row.get("kernel")
    return {**row, "provider": kernel if kernel in ("fla", "store_all") else "treewy", "num_nodes": row.get("T"),
            "fits": True,   # a timed row ran, so its state (store-all: its snapshots) fitted on the device
            "tree": TREES_BY_NODES.get(row.get("T")), "model": data.get("model", "35B-A3B"), "HV": data.get("HV", 32)}


def fastest_rows(rows: list[dict]) -> list[dict]:
    """One row per (provider, model, tree, B, state dtype): the fastest kernel measured for it, as the engine picks
    (rows timed with reduced-precision tf32 products, which the engine does not ship, are left out)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get("dot_precision") == "tf32" or r.get("precision") == "tf32":
            continue
        key = (r["provider"], r.get("model"), r.get("num_nodes"), r["B"], r.get("state_dtype"), r.get("HV"))
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return list(best.values())
