"""Execute every notebook headless on this machine's GPU (TREEWY_DEVICE=cuda), with the kernels live.

    PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.run_notebooks_gpu --out "$OUT"

Writes into --out (default: $OUT): each executed notebook (outputs kept, `<name>.ipynb`), `summary.json` and
`summary.txt` with the device, date, library versions, each notebook's wall time split into the kernel's start, its
cells' own time and the kernel's shutdown, and its slowest cells (from nbclient's per-cell timestamps: the cell's
number, first line and seconds); exits 1 if any notebook
failed (its executed copy shows where). Needs nbclient and ipykernel (benchmarks/gpu_wheels.txt lists the wheels).
`--device cpu` runs the same on a CPU (small sizes), for a check anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "transformers", "polars", "altair", "ipywidgets", "nbclient", "ipykernel"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def timed_cells(nb) -> list[dict]:
    """Every code cell of an executed notebook with nbclient's execute_input and execute_reply timestamps:
    [{cell (its number among all cells), line (its first line), start (epoch seconds), seconds}]."""
    from datetime import datetime

    def epoch(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    timed = []
    for i, cell in enumerate(nb.cells):
        t = cell.get("metadata", {}).get("execution", {})
        start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            timed.append({"cell": i, "line": (cell.source.strip().splitlines() or [""])[0][:60],
                          "start": epoch(start), "seconds": epoch(end) - epoch(start)})
    return timed


def slowest_cells(timed: list[dict], n: int = 4) -> list[dict]:
    """The n of ``timed_cells`` that took longest: [{cell, line, seconds}]."""
    return [{"cell": c["cell"], "line": c["line"], "seconds": round(c["seconds"], 1)}
            for c in sorted(timed, key=lambda c: -c["seconds"])[:n]]


def split_wall_time(timed: list[dict], started: float, ended: float) -> dict:
    """A notebook's wall time (``started`` before the client starts the kernel, ``ended`` when it has shut it down;
    epoch seconds) in parts: kernel_start_s up to the first cell's execute_input, cells_s the cells' own seconds
    summed, shutdown_s from the last cell's reply to the end (no reader waits for it in JupyterLab); the rest is the
    client's round trips between cells. ``timed``: the notebook's ``timed_cells``."""
    if not timed:
        return {"kernel_start_s": None, "cells_s": 0.0, "shutdown_s": None}
    return {"kernel_start_s": round(min(c["start"] for c in timed) - started, 1),
            "cells_s": round(sum(c["seconds"] for c in timed), 1),
            "shutdown_s": round(ended - max(c["start"] + c["seconds"] for c in timed), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--notebooks", nargs="*", default=None, help="names (default: every numbered notebook)")
    parser.add_argument("--dir", default=str(ROOT / "notebooks"), help="where the notebooks are")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out: give an output folder (or set $OUT)")
    import nbformat
    import torch
    from nbclient import NotebookClient
    from tqdm import tqdm

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device here; use --device cpu for a CPU run", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["TREEWY_DEVICE"] = args.device
    if args.device == "cpu":
        os.environ["TREEWY_SMALL"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)
    paths = sorted(Path(args.dir).glob("[0-9][0-9]_*.ipynb"))
    if args.notebooks:
        paths = [p for p in paths if p.stem in args.notebooks or p.name in args.notebooks]
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    summary = {"device": device, "date": datetime.date.today().isoformat(), "versions": versions(), "notebooks": []}
    failed = 0
    for path in tqdm(paths, desc="notebooks", unit="nb"):
        nb = nbformat.read(path, as_version=4)
        t0, started = time.perf_counter(), time.time()
        error = None
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except Exception as e:  # noqa: BLE001 - a failed notebook is a row of the summary and the exit code
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            failed += 1
        seconds, ended = time.perf_counter() - t0, time.time()
        nb.metadata["treewy_run"] = {"device": device, "date": summary["date"], "seconds": round(seconds, 1)}
        nbformat.write(nb, out / path.name)
        timed = timed_cells(nb)
        summary["notebooks"].append({"notebook": path.name, "seconds": round(seconds, 1), "ok": error is None,
                                     "error": error, **split_wall_time(timed, started, ended),
                                     "slowest_cells": slowest_cells(timed)})
        tqdm.write(f"{path.name}: {'ok' if error is None else 'FAILED'} in {seconds:.1f} s" + (f" ({error})" if error else ""))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"{device}, {summary['date']}; " + ", ".join(f"{k} {v}" for k, v in summary["versions"].items() if v), ""]
    for r in summary["notebooks"]:
        parts = (f"  (kernel start {r['kernel_start_s']:.1f} s, cells {r['cells_s']:.1f} s, "
                 f"shutdown {r['shutdown_s']:.1f} s)"
                 if r["kernel_start_s"] is not None else "")
        status = "ok" if r["ok"] else "FAILED: " + r["error"]
        lines.append(f"{r['notebook']:<36} {r['seconds']:>8.1f} s  {status}{parts}")
        lines += [f"    cell {c['cell']:>3} {c['seconds']:>7.1f} s  {c['line']}" for c in r["slowest_cells"]]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
