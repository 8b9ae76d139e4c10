"""Where notebook 04's first seconds go in a new process (the kernel a notebook starts), phase by phase.

    python -m benchmarks.lab_startup --out $OUT                  # the GPU with the kernels live (TREEWY_DEVICE)
    python -m benchmarks.lab_startup --out DIR --device cpu      # the same on a CPU
    python -m benchmarks.lab_startup --out $OUT --engine-only    # without the lab: torch, transformers, the engine

The two cells that took 18.6 of notebook 04's 30.2 s warm on the H200 and 7.3 s on the 2-core CPU (2026-12-04,
``benchmarks/results/notebooks_h200_2026-12-04/``), split in the order they run: every module ``treewy_lab.setup``
loads, one at a time with the notebook's ``load=`` modules after them (each row: what importing it added), the
environment banner's ``describe()``, the device's first use, ``load("tiny")``, then the plain and the (3, 3, 3)
decode of the cell, each twice (the first captures its CUDA graph on a GPU, the second replays it). Writes
lab_startup.json and lab_startup.txt (device, date, versions, seconds per phase). ``--engine-only`` leaves out
``treewy_lab``'s setup and the modules it loads (polars, altair, ipywidgets: a GPU host without the lab's wheels):
after the lab's bytecode cache (``treewy_lab.bytecode``, as importing the lab runs it) it imports torch first, and the
phases then say what torch, transformers, the engine and ``load("tiny")`` cost there.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import importlib
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

#: The modules notebook 04's first cell has ``treewy_lab.setup`` load after its own list (``setup(load=...)``).
NOTEBOOK_LOADS = ("transformers", "treewy.models", "treewy.decode", "treewy_lab.panels.sweep")
PROMPT = "def fibonacci(n):\n    "


def phases(device: str, new_tokens: int, lab: bool = True):
    """(name, thunk) in the order notebook 04 runs them, yielded one at a time: the module list comes from
    ``treewy_lab.setup`` once the first phase has imported it (``lab`` False: torch and the engine's modules alone),
    and a later thunk uses an earlier one's result."""
    got = {}
    if lab:
        yield "import treewy_lab", lambda: importlib.import_module("treewy_lab")
        from treewy_lab.setup import _LOADS
        modules = (*(m for m, _ in _LOADS), *NOTEBOOK_LOADS)
    else:
        yield "treewy_lab's bytecode cache", lambda: importlib.import_module("treewy_lab.bytecode")
        modules = ("torch", *(m for m in NOTEBOOK_LOADS if not m.startswith("treewy_lab")))
    for module in modules:
        yield f"import {module}", lambda m=module: importlib.import_module(m)
    import torch
    torch.set_num_threads(1)   # as the notebook's first cell sets it

    def describe():
        from treewy.env import describe
        describe()

    def first_use():
        torch.zeros(1, device=device).add_(1).cpu()

    def load():
        from treewy.models import load
        got["model"] = load("tiny", device=device)

    def decode(**kw):
        from treewy.decode import generate
        from treewy.models.tokenizer import encode
        return lambda: generate(got["model"], [encode(PROMPT)], max_new_tokens=new_tokens, **kw)

    yield "describe() (the banner)", describe
    yield f"first use of {device}", first_use
    yield 'load("tiny")', load
    plain, spec = decode(drafter=None), decode(drafter="mtp", tree=(3, 3, 3), commit="reconstruct")
    for name, thunk in (("plain", plain), ("(3, 3, 3)", spec)):
        yield f"{name} decode, first", thunk
        yield f"{name} decode, again", thunk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--new-tokens", type=int, default=48, help="tokens per decode (the notebook's 48)")
    ap.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                    help="run every phase under cProfile (its times then include the profiler's) and write, for each "
                         "phase at least this long, its top functions by cumulative time to lab_startup_profile.txt")
    ap.add_argument("--engine-only", action="store_true",
                    help="leave out treewy_lab and what its setup loads (for a host without the lab's wheels)")
    args = ap.parse_args(argv)
    if not args.out:
        ap.error("--out: give an output folder (or set $OUT)")
    if args.new_tokens < 1:
        ap.error(f"--new-tokens {args.new_tokens}: decode at least one token")
    if "treewy_lab" in sys.modules or "torch" in sys.modules:
        ap.error("run it as its own process (python -m benchmarks.lab_startup): the imports are what it times")
    os.environ["TREEWY_DEVICE"] = args.device
    t_start = time.perf_counter()
    rows = []
    profiles = []
    for name, thunk in phases(args.device, args.new_tokens, lab=not args.engine_only):
        prof = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.runcall(thunk)
        else:
            thunk()
        rows.append({"phase": name, "seconds": round(time.perf_counter() - t0, 3)})
        print(f"{rows[-1]['seconds']:8.3f} s  {name}", flush=True)
        if prof and rows[-1]["seconds"] >= args.profile:
            profiles.append(f"== {name}: {rows[-1]['seconds']:.3f} s (profiled)\n{top_functions(prof)}")
    import torch

    from benchmarks.run_notebooks_gpu import versions
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.machine()})"
    report = {"device": device, "date": datetime.date.today().isoformat(), "versions": versions(),
              "engine_only": args.engine_only, "new_tokens": args.new_tokens, "bytecode_prefix": sys.pycache_prefix,
              "total_s": round(time.perf_counter() - t_start, 3), "phases": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lab_startup.json").write_text(json.dumps(report, indent=1) + "\n")
    head = f"{device}, {report['date']}; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    what = "the engine's part of " if args.engine_only else ""
    lines = [head, f"{what}notebook 04's first two cells in a new process, phase by phase ({args.new_tokens} tokens "
             f"per decode); bytecode prefix: {sys.pycache_prefix}",
             *(f"{r['seconds']:8.3f} s  {r['phase']}" for r in rows), f"{report['total_s']:8.3f} s  in all"]
    (out / "lab_startup.txt").write_text("\n".join(lines) + "\n")
    if args.profile:
        (out / "lab_startup_profile.txt").write_text(f"{head}\n\n" + "\n".join(profiles))
    return 0


#: Frames every phase passes through (the import machinery, exec, this script): left out of the tables.
PLUMBING = r"^(?!.*(<frozen importlib|built-in method builtins\.(exec|__import__)|importlib/__init__|lab_startup\.py))"


def top_functions(prof: cProfile.Profile, n: int = 30) -> str:
    """The profile's n functions of largest cumulative time (pstats' table), the import plumbing left out."""
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(PLUMBING, n)
    return "\n".join(line for line in text.getvalue().strip().splitlines()
                     if not line.strip().startswith("List reduced")) + "\n"


if __name__ == "__main__":
    sys.exit(main())
