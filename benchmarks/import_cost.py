"""Why importing torch and transformers' Qwen3.5 model takes seconds longer on one host than another.

    python -m benchmarks.import_cost --out $OUT       # writes import_cost.json and import_cost.txt

Notebook 04's two first cells spend most of their time importing torch and transformers' model stack (on an H100
host 10.5 of 16.0 s warm against 2.8 s on a 2-core CPU: ``results/lab_startup_h100_2026-12-06/``). This measures
the import alone, each time in a new process (``-X importtime``), twice as the host comes (the second run on a warm
page cache), then twice with ``PYTHONPYCACHEPREFIX`` pointing at an empty folder and bytecode writing on (the first
run writes the bytecode there, the second reads it), then twice importing ``treewy_lab`` first as a notebook does,
with an empty cache folder (``treewy_lab.bytecode``: on a Python that keeps no bytecode the first run compiles into
the lab's cache and the second reads it; elsewhere the lab changes nothing). Beside the times it records what decides
them: whether the packages' source folders hold compiled bytecode for this interpreter and can take it,
``sys.dont_write_bytecode``, and which optional packages transformers' import pulls in (scikit-learn, sympy, scipy).
The slowest modules of each run by their own time are listed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from treewy_lab.bytecode import beside_source

TARGET = "import torch; import transformers.models.qwen3_5.modeling_qwen3_5"
PACKAGES = ("torch", "transformers", "sklearn", "scipy", "sympy")


def bytecode_coverage(package: str) -> dict:
    """Share of the package's .py files with bytecode for this interpreter beside them, and whether it can write."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {"installed": spec is not None}
    root = Path(next(iter(spec.submodule_search_locations)))
    sources = list(root.rglob("*.py"))
    cached = sum(beside_source(str(p)).exists() for p in sources)
    return {"installed": True, "root": str(root), "py_files": len(sources), "with_bytecode": cached,
            "writable": os.access(root, os.W_OK)}


def timed_import(env: dict, target: str = TARGET) -> dict:
    """One new interpreter importing ``target`` under -X importtime: total seconds and the slowest modules."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", target], env=env, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"the import failed:\n{run.stderr[-2000:]}")
    rows = []
    for line in run.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        own, total, name = line[len("import time:"):].split("|")
        rows.append((int(own), int(total), name.strip()))
    imported = {name for _, _, name in rows}
    return {"seconds": sum(own for own, _, _ in rows) / 1e6, "modules": len(rows),
            "optional_imported": [p for p in PACKAGES[2:] if p in imported],
            "slowest_own": [(name, own / 1e6) for own, _, name in sorted(rows, reverse=True)[:15]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    writing = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    runs = {}
    with tempfile.TemporaryDirectory() as prefix, tempfile.TemporaryDirectory() as cache:
        conditions = [("as installed", base, TARGET),
                      ("PYTHONPYCACHEPREFIX", {**writing, "PYTHONPYCACHEPREFIX": prefix}, TARGET),
                      ("treewy_lab first", {**base, "XDG_CACHE_HOME": cache}, "import treewy_lab; " + TARGET)]
        for label, env, target in conditions:
            for i in (1, 2):
                name = f"{label}, run {i}"
                runs[name] = timed_import(env, target)
                print(f"{name}: {runs[name]['seconds']:.2f} s", flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "python": sys.version.split()[0], "target": TARGET,
              "dont_write_bytecode": sys.dont_write_bytecode,
              "packages": {p: bytecode_coverage(p) for p in PACKAGES}, "runs": runs}
    (args.out / "import_cost.json").write_text(json.dumps(report, indent=1))
    lines = [f"{report['date']}  python {report['python']}  `{TARGET}`",
             f"sys.dont_write_bytecode: {report['dont_write_bytecode']}", ""]
    for p, c in report["packages"].items():
        lines.append(f"{p}: " + (f"{c['with_bytecode']}/{c['py_files']} .py files with bytecode, "
                                 f"writable {c['writable']} ({c['root']})" if "root" in c
                                 else ("installed" if c["installed"] else "not installed")))
    for name, r in runs.items():
        lines += ["", f"{name}: {r['seconds']:.2f} s over {r['modules']} modules; optional packages imported: "
                      f"{', '.join(r['optional_imported']) or 'none'}"]
        lines += [f"    {s:7.3f} s  {m}" for m, s in r["slowest_own"]]
    (args.out / "import_cost.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
