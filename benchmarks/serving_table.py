"""The tidy serving table (``treewy.schema``) from sweep checkpoints written on a machine without polars (CPU).

    python -m benchmarks.serving_table OUT.parquet A.points.jsonl [B.points.jsonl ...] [--set max_num_seqs=256 ...]

Each checkpoint's last record per point wins (as ``treewy bench-serve`` resumes); ``--set`` fills columns the
rows do not carry (for example ``max_num_seqs`` and ``weights`` for rows written before those columns existed),
typed as the schema says. Prints the rows it wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path



def main(argv=None) -> int:
    from treewy.results import publish
    from treewy.schema import SERVING_SCHEMA, serving_frame
    from treewy.serve.sweep import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--set", action="append", default=[], metavar="COLUMN=VALUE")
    args = ap.parse_args(argv)
    fill = {}
    for item in args.set:
        col, _, value = item.partition("=")
        if col not in SERVING_SCHEMA:
            raise SystemExit(f"--set {item!r}: {col!r} is not a serving column ({', '.join(SERVING_SCHEMA)})")
        fill[col] = int(value) if SERVING_SCHEMA[col].is_integer() else value
    rows = [{**rec["row"], **{k: v for k, v in fill.items() if rec["row"].get(k) is None}}
            for path in args.checkpoints for rec in load_checkpoint(Path(path)).values()]
    frame = serving_frame(rows)
    frame.write_parquet(args.out)
    print(frame.select("workload", "mode", "concurrency", "completed", "output_throughput", "p99_ttft_ms",
                       "mean_tpot_ms", "peak_running", "peak_kv_usage", "error"))
    print(f"wrote {frame.height} rows to {args.out}; published {publish('serving', args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
