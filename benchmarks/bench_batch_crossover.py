"""Where trees should leave the one-launch path kernel for the dense kernel: both timed (autotuned, previous
commit folded in, CUDA-graph medians) over batch sizes between 1 and 64, one GDN layer of Qwen3.5-35B-A3B.

    python -m benchmarks.bench_batch_crossover --out DIR

Writes DIR/batch_crossover_<device>_<date>.json and prints one line per (tree, B) as measured;
``select.DENSE_MIN_BATCH`` is set from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import time_families, write_measured
from treewy.results import publish
from treewy.tree import DraftTree

TREES = {"(2,2,2)": DraftTree.from_widths((2, 2, 2)), "(3,3,3)": DraftTree.from_widths((3, 3, 3))}
BATCHES = (1, 4, 8, 16, 32, 64)
FAMILIES = ("path", "dense")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_batch_crossover.py times GPU kernels: it needs a CUDA GPU")
    cases = [(name, tree, B, FAMILIES) for name, tree in TREES.items() for B in BATCHES]
    rows = [dict(tree=name, B=B, **{f"{f}_us": t for f, t in us.items()}, fastest=min(us, key=us.get))
            for name, B, us in time_families(cases)]
    path = write_measured(args.out, "batch_crossover", rows, note="one GDN layer per step, bf16 q/k/v, fp32 state, "
                          "previous commit folded in, CUDA-graph medians")
    print(f"published {publish('batch_crossover', path)}")   # select.DENSE_MIN_BATCH is checked against it


if __name__ == "__main__":
    main()
