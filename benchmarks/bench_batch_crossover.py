"""Where trees should leave the one-launch path kernel for the dense kernel: both timed (autotuned, previous
commit folded in, CUDA-graph medians) over batch sizes between 1 and 64, one GDN layer of Qwen3.5-35B-A3B.

    python benchmarks/bench_batch_crossover.py --out DIR

Writes DIR/batch_crossover_<device>_<date>.json and prints one line per (tree, B) as measured;
``select.DENSE_MIN_BATCH`` is set from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
from tqdm import tqdm

from treewy.ops.benchmark import MODELS, bench, make, step_fn
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
    dims = MODELS["35B-A3B"]
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    device = torch.cuda.get_device_name().split()[-1].lower()
    rows = []
    jobs = [(name, B) for name in TREES for B in BATCHES]
    for name, B in tqdm(jobs, desc="tree x batch"):
        tree = TREES[name]
        x = make(B, tree.num_nodes, H, HV, K, V, torch.float32)
        us = {fam: bench(step_fn("treewy", x, tree, kernel=fam)) for fam in FAMILIES}
        rows.append(dict(tree=name, B=B, **{f"{fam}_us": t for fam, t in us.items()},
                         fastest=min(us, key=us.get)))
        tqdm.write(f"{name} B = {B:3d}: " + ", ".join(f"{fam} {t:8.2f} us" for fam, t in us.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()), torch=torch.__version__,
                note="one GDN layer per step, bf16 q/k/v, fp32 state, previous commit folded in, CUDA-graph medians")
    path = args.out / f"batch_crossover_{device}_{datetime.date.today()}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
