"""The inter-token gaps of a serving sweep's points, from vllm bench serve's per-request ``itls`` (CPU, a second).

    python -m benchmarks.itl_gaps benchmarks/results/serve35b_h200_gmu0.6_2026-12-02/results \
        --out benchmarks/results/itl_gaps_35b_h200_gmu0.6_2026-12-02.txt

Per point: how many gaps (one per step that emitted a request's tokens), their median, the share longer than
``--slow-ms`` and the mean of those. A decode step replayed from a CUDA graph takes about the median; a long gap is
a step that took far longer, such as one run without a graph (a prefill chunk beside the decodes: what the
simulator's ``eager_step_s`` prices).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np


def gaps_row(result: dict, slow_s: float) -> dict:
    """(gaps, median_ms, slow_share, slow_mean_ms) of one point's results."""
    itl = np.concatenate([np.asarray(x, dtype=float) for x in result["itls"] if len(x)] or [np.zeros(0)])
    slow = itl[itl > slow_s]
    return {"gaps": int(itl.size), "median_ms": float(np.median(itl) * 1e3) if itl.size else float("nan"),
            "slow_share": float(slow.size / itl.size) if itl.size else float("nan"),
            "slow_mean_ms": float(slow.mean() * 1e3) if slow.size else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a folder of vllm bench serve result files (*.json or *.json.gz)")
    ap.add_argument("--slow-ms", type=float, default=100.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    files = sorted(p for p in Path(args.results).iterdir() if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise SystemExit(f"{args.results}: no vllm bench serve result files (*.json, *.json.gz) there")
    lines = [f"inter-token gaps per point ({args.results}): one gap per step that emitted a request's tokens",
             f"{'point':40s} {'gaps':>6s} {'median ms':>9s} {f'> {args.slow_ms:g} ms':>9s} {'their mean ms':>13s}"]
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            r = gaps_row(json.load(f), args.slow_ms / 1e3)
        name = path.name.removesuffix(".gz").removesuffix(".json")
        lines.append(f"{name:40s} {r['gaps']:6d} {r['median_ms']:9.1f} {r['slow_share'] * 100:8.1f}% "
                     f"{r['slow_mean_ms']:13.1f}")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
