"""The tree families under exact fp32 products (TREEWY_DOT_PRECISION=ieee, the path of GPUs without tf32), timed
side by side (autotuned, previous commit folded in, CUDA-graph medians), one GDN layer of Qwen3.5-35B-A3B.

    python benchmarks/bench_exact_families.py --out DIR

Writes DIR/exact_families_<device>_<date>.json; ``select_kernel(exact=True)`` is set from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

os.environ["TREEWY_DOT_PRECISION"] = "ieee"   # before treewy reads it

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from treewy.ops.benchmark import MODELS, bench, make, step_fn  # noqa: E402
from treewy.tree import DraftTree  # noqa: E402

CASES = [("(3,3,3)", (3, 3, 3), 256, ("path", "path_split")), ("(3,3,3)", (3, 3, 3), 64, ("path", "path_split")),
         ("(2,2,2)", (2, 2, 2), 256, ("path", "path_split", "dense"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_exact_families.py times GPU kernels: it needs a CUDA GPU")
    dims = MODELS["35B-A3B"]
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    rows = []
    for name, widths, B, families in tqdm(CASES, desc="cases"):
        tree = DraftTree.from_widths(widths)
        x = make(B, tree.num_nodes, H, HV, K, V, torch.float32)
        us = {fam: bench(step_fn("treewy", x, tree, kernel=fam)) for fam in families}
        rows.append(dict(tree=name, B=B, us=us, fastest=min(us, key=us.get)))
        tqdm.write(f"{name} B = {B:3d} ieee: " + ", ".join(f"{f} {t:9.2f} us" for f, t in us.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()), torch=torch.__version__,
                precision="ieee (exact fp32 products)",
                note="one GDN layer per step, bf16 q/k/v, fp32 state, previous commit folded in, CUDA-graph medians")
    path = args.out / f"exact_families_{torch.cuda.get_device_name().split()[-1].lower()}_{datetime.date.today()}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
