"""The measured tables the package reads: curated tables shipped in ``treewy/data/``, named by one index.

``treewy/data/index.json`` names, per kind, the current table (``KINDS[kind]`` False: the kernel targets, the batch
crossover, ...) or every table on show (True: the measured serving sweeps, the tiny checkpoint's sweeps, ...).
Nothing is chosen by the date in a file name or by looking around a folder, and nothing is read from
``benchmarks/``: a benchmark script that writes a table curated for the package calls ``publish(kind, path)``,
which copies the table into ``treewy/data/`` and names it in the index, so the index changes only when a run says
so. Besides the index, your own ``treewy bench-serve`` runs are read from a source checkout's ``results/``
(``checkout_dirs``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
INDEX_NAME = "index.json"
_REPO = DATA_DIR.parent.parent
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

#: The kinds of table the index names: False where it names the current table, True where it lists every table
#: on show (``publish`` replaces the one, adds to the other).
KINDS = {
    "kernel_targets": False,        # benchmarks/bench_kernels.py: targets_<device>_<date>.json
    "batch_crossover": False,       # benchmarks/bench_batch_crossover.py: path vs dense over batch sizes
    "simulated_serving": False,     # the committed simulator sweep (SIMULATED)
    "serving": True,                # measured serving sweeps in treewy.schema's layout (treewy bench-serve)
    "acceptance_sweeps": True,      # the tiny checkpoint's acceptance sweeps (treewy sweep) on held-out windows
    "real_prompt_sweeps": True,     # the same on real prompt sets
    "temperature_sweeps": True,     # benchmarks/temperature_sweep.py
    "server_fits": False,           # fixed step costs fitted to a measured serving sweep (treewy.sim.calibrated)
    "engine_steps": True,           # benchmarks/engine_step_gpu.py: the engine's decode step per device and path
}


def _kind(kind) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind = {kind!r}: expected one of {', '.join(KINDS)} (treewy.results.KINDS)")
    return kind


def read_index(data_dir=None) -> dict:
    """The index of ``data_dir`` (default ``DATA_DIR``): kind -> file name, or list of file names."""
    path = Path(data_dir or DATA_DIR) / INDEX_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: it names the current table of each kind; restore it from git "
                                "or publish a table with treewy.results.publish(kind, path)")
    return json.loads(path.read_text())


def tables(kind: str, data_dir=None) -> list[Path]:
    """The tables the index names for ``kind``, in the order they were published ([] when it names none). A name
    whose file is not in the folder is an error, not skipped: the index is stale."""
    folder = Path(data_dir or DATA_DIR)
    entry = read_index(folder).get(_kind(kind), [])
    paths = [folder / name for name in ([entry] if isinstance(entry, str) else entry)]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"{folder / INDEX_NAME} names {p.name} for {kind!r}, which is not in {folder}: "
                                    f"publish the table again (treewy.results.publish({kind!r}, path)) or remove "
                                    "the entry")
    return paths


def table(kind: str, data_dir=None) -> Path:
    """The current table of ``kind``; an error naming the kind and how to publish one when the index names none."""
    found = tables(kind, data_dir)
    if not found:
        raise LookupError(f"{Path(data_dir or DATA_DIR) / INDEX_NAME} names no {kind!r} table: run the benchmark "
                          f"that writes one, or treewy.results.publish({kind!r}, path)")
    return found[-1]


def publish(kind: str, src, name: str | None = None, data_dir=None) -> Path:
    """Copy the table ``src`` into ``treewy/data/`` (as ``name``, default its own name) and name it in the index:
    the current table of ``kind``, or one more on show for a listed kind. Returns the shipped path."""
    _kind(kind)
    src = Path(src)
    if not src.is_file():
        raise ValueError(f"src = {str(src)!r}: no such file; pass the table the benchmark wrote")
    name = src.name if name is None else name
    if not name or Path(name).name != name or name == INDEX_NAME:
        raise ValueError(f"name = {name!r}: expected a plain file name for treewy/data/ (not {INDEX_NAME})")
    folder = Path(data_dir or DATA_DIR)
    index = read_index(folder)
    dest = folder / name
    if src.resolve() != dest.resolve():
        shutil.copyfile(src, dest)
    if KINDS[kind]:
        entry = index.get(kind, [])
        index[kind] = [n for n in ([entry] if isinstance(entry, str) else entry) if n != name] + [name]
    else:
        index[kind] = name
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".json")   # a reader never sees half an index
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, folder / INDEX_NAME)
    return dest


def find(pattern: str, data_dir=None) -> list[Path]:
    """The indexed tables whose name matches a glob, in index order (each kind's tables as published)."""
    folder = Path(data_dir or DATA_DIR)
    found = [p for kind in read_index(folder) if kind in KINDS for p in tables(kind, folder)]
    return [p for p in dict.fromkeys(found) if fnmatch.fnmatch(p.name, pattern)]


def newest(pattern: str, data_dir=None) -> Path | None:
    """The last-published indexed table whose name matches a glob (a full name finds that table), or None."""
    found = find(pattern, data_dir)
    return found[-1] if found else None


def newest_targets(data_dir=None) -> Path | None:
    """The current kernel targets table (kind ``kernel_targets``), or None when the index names none."""
    found = tables("kernel_targets", data_dir)
    return found[-1] if found else None


def checkout_dirs() -> tuple[Path, ...]:
    """``results/`` of the source checkout this package runs from, where ``treewy bench-serve`` writes your own
    runs (none when installed)."""
    if not (_REPO / "pyproject.toml").is_file() or not (_REPO / "setup.py").is_file():
        return ()
    return (_REPO / "results",)


def search_dirs() -> tuple[Path, ...]:
    """``treewy/data/`` and your own runs' folder (``checkout_dirs``): where measured serving rows are read."""
    return (DATA_DIR, *checkout_dirs())


def file_date(path: str | Path) -> str:
    """The ISO date in a file name ('' when it has none): a label for tables that do not state their date."""
    m = _DATE.search(Path(path).name)
    return m.group(0) if m else ""


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
    """Rows of the newer targets tables name the kernel only ("chain", "wy", "fla", "store_all") and the window
    size T; give them the provider / tree / num_nodes / model / HV fields the older tables carry (every target row
    is at Qwen3.5-35B-A3B's GDN shapes, which the table's header states)."""
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
