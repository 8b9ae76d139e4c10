"""The inter-token gaps of a serving sweep's points, from vllm bench serve's per-request ``itls`` (CPU, a second).

    python -m benchmarks.itl_gaps benchmarks/results/serve35b_h200_gmu0.6_2026-12-02/results \
        --out benchmarks/results/itl_gaps_35b_h200_gmu0.6_2026-12-02.txt

Per point: how many gaps (one per step that emitted a request's tokens), their median, the share longer than
``--slow-ms`` and the mean of those. A decode step replayed from a CUDA graph takes about the median; a long gap is
a step that took far longer, such as one run without a graph (a prefill chunk beside the decodes: what the
simulator's ``eager_step_s`` prices). Then the engine's own long steps: every request's token arrivals on one
clock (``start_times`` + TTFT + the gaps), arrivals within ``MERGE_S`` of each other taken as one step's outputs,
and the gaps longer than ``--slow-ms`` in which no request received anything: how many, their mean, and the share
of the point's wall time they took.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np


def load_record(path: Path) -> dict:
    """A vllm bench serve result file, plain (*.json) or gzipped (*.json.gz)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def gaps_row(result: dict, slow_s: float) -> dict:
    """(gaps, median_ms, slow_share, slow_mean_ms) of one point's results."""
    itl = np.concatenate([np.asarray(x, dtype=float) for x in result["itls"] if len(x)] or [np.zeros(0)])
    slow = itl[itl > slow_s]
    return {"gaps": int(itl.size), "median_ms": float(np.median(itl) * 1e3) if itl.size else float("nan"),
            "slow_share": float(slow.size / itl.size) if itl.size else float("nan"),
            "slow_mean_ms": float(slow.mean() * 1e3) if slow.size else float("nan")}


#: token arrivals closer than this belong to one engine step (steps take >= 10 ms; the client reads a step's
#: outputs within about 2 ms)
MERGE_S = 2e-3


def engine_gaps(result: dict, merge_s: float = MERGE_S) -> tuple[np.ndarray, float]:
    """(the gaps in seconds between the engine's consecutive output steps, the span from the first output to the
    last) of one point's results: every request's arrivals on one clock, an arrival within ``merge_s`` of the one
    before it in the same step, a step's time its first arrival's."""
    times = [start + ttft + np.concatenate([[0.0], np.cumsum(np.asarray(itl, dtype=float))])
             for start, ttft, itl in zip(result["start_times"], result["ttfts"], result["itls"])
             if ttft is not None and ttft > 0]
    if not times:
        return np.zeros(0), 0.0
    t = np.sort(np.concatenate(times))
    starts = t[np.concatenate([[True], np.diff(t) >= merge_s])]    # each step's first arrival
    return np.diff(starts), float(t[-1] - t[0])


def stalls_row(result: dict, slow_s: float) -> dict:
    """(count, mean_ms, share of the span) of the engine gaps longer than ``slow_s`` in one point's results."""
    gaps, span = engine_gaps(result)
    slow = gaps[gaps > slow_s]
    return {"stalls": int(slow.size), "stall_mean_ms": float(slow.mean() * 1e3) if slow.size else float("nan"),
            "stall_share": float(slow.sum() / span) if span > 0 else float("nan")}


def write_and_print(text: str, out: str | None) -> None:
    """The report on stdout, and into ``out`` when given."""
    if out:
        Path(out).write_text(text)
    print(text, end="")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a folder of vllm bench serve result files (*.json or *.json.gz)")
    ap.add_argument("--slow-ms", type=float, default=100.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    files = sorted(p for p in Path(args.results).iterdir() if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise SystemExit(f"{args.results}: no vllm bench serve result files (*.json, *.json.gz) there")
    slow = f"> {args.slow_ms:g} ms"
    lines = [f"inter-token gaps per point ({args.results}): one gap per step that emitted a request's tokens; then "
             f"the engine's steps {slow} in which no request received a token (count, mean, share of the wall time)",
             f"{'point':40s} {'gaps':>6s} {'median ms':>9s} {slow:>9s} {'their mean ms':>13s} | "
             f"{'steps ' + slow:>15s} {'mean ms':>8s} {'of time':>7s}"]
    for path in files:
        result = load_record(path)
        r, e = gaps_row(result, args.slow_ms / 1e3), stalls_row(result, args.slow_ms / 1e3)
        name = path.name.removesuffix(".gz").removesuffix(".json")
        lines.append(f"{name:40s} {r['gaps']:6d} {r['median_ms']:9.1f} {r['slow_share'] * 100:8.1f}% "
                     f"{r['slow_mean_ms']:13.1f} | {e['stalls']:15d} {e['stall_mean_ms']:8.1f} "
                     f"{e['stall_share'] * 100:6.1f}%")
    write_and_print("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
