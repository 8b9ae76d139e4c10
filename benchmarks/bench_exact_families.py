"""The tree families under exact fp32 products (dot precision "ieee", the path of GPUs without tf32), timed side
by side (autotuned, previous commit folded in, CUDA-graph medians), one GDN layer of Qwen3.5-35B-A3B.

    python -m benchmarks.bench_exact_families --out DIR

Writes DIR/exact_families_<device>_<date>.json; ``select_kernel(exact=True)`` is set from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import time_families, write_measured
from treewy.tree import DraftTree

T333, T222 = DraftTree.from_widths((3, 3, 3)), DraftTree.from_widths((2, 2, 2))
CASES = [("(3,3,3)", T333, 256, ("path", "path_split")), ("(3,3,3)", T333, 64, ("path", "path_split")),
         ("(2,2,2)", T222, 256, ("path", "path_split", "dense"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_exact_families.py times GPU kernels: it needs a CUDA GPU")
    rows = [dict(tree=name, B=B, us=us, fastest=min(us, key=us.get))
            for name, B, us in time_families(CASES, dot_precision="ieee")]
    write_measured(args.out, "exact_families", rows, precision="ieee (exact fp32 products)",
                   note="one GDN layer per step, bf16 q/k/v, fp32 state, previous commit folded in, CUDA-graph medians")


if __name__ == "__main__":
    main()
