"""The simulator's predictions for the 35B H200 serving sweep, written before the sweep runs (CPU, about a minute).

    python -m benchmarks.sim_predictions --out benchmarks/results/predictions_35b_h200_tp1_2026-12-02

writes OUT.parquet (the tidy serving table, SIMULATED rows), OUT.json (the grid, the requests per point, the
simulator's git commit and the date) and OUT.txt (per point, then the ratio table per gmu beside the paper's B200
figures). The grid and the server are ``treewy.sim.predict``'s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path



def text_table(df, meta) -> str:
    import polars as pl

    from treewy.sim.paper_tables import PAPER_TABLES
    from treewy.sim.sweep import ratio_table

    lines = [f"SIMULATED predictions, {meta['model']} TP1 on one H200 (simulator gpu 'h200'), made {meta['date']} by "
             f"the simulator at commit {meta['commit']}, before the GPU sweep",
             f"server fit: {meta['fit']} (fitted to {meta['fitted_to']}: its own points are in-sample)",
             f"acceptance: {meta['acceptance']}; server: {meta['server']}",
             f"requests per point: max({meta['requests_per_concurrency']} x concurrency, {meta['min_requests']}); "
             f"workloads: {', '.join(meta['workloads'])}", ""]
    for gmu in meta["gmus"]:
        sub = df.filter(pl.col("gmu") == gmu)
        lines += [f"gmu {gmu}: store-all / TreeWY per point", "",
                  f"{'workload':17s} {'conc':>4s} {'req':>5s} | {'output tok/s':>13s} | {'p99 TTFT ms':>15s} | "
                  f"{'mean TTFT ms':>15s} | {'TPOT ms':>11s} | {'peak KV':>9s} | {'running':>7s} | {'preempt':>9s}"]
        for wl in meta["workloads"]:
            for c in meta["concurrency"]:
                p = {r["mode"]: r for r in sub.filter((pl.col("workload") == wl) & (pl.col("concurrency") == c))
                     .iter_rows(named=True)}
                s, t = p["store_all"], p["reconstruct"]
                f = lambda k, fmt: f"{format(s[k], fmt)}/{format(t[k], fmt)}"  # noqa: E731
                lines.append(f"{wl:17s} {c:4d} {s['completed']:5d} | {f('output_throughput', '.0f'):>13s} | "
                             f"{f('p99_ttft_ms', '.0f'):>15s} | {f('mean_ttft_ms', '.0f'):>15s} | "
                             f"{f('mean_tpot_ms', '.1f'):>11s} | {f('peak_kv_usage', '.2f'):>9s} | "
                             f"{f('peak_running', 'd'):>7s} | {f('preemptions', 'd'):>9s}")
        table = ratio_table(sub)
        paper = PAPER_TABLES[(meta["model"], 1, gmu)]
        lines += ["", f"gmu {gmu}: SIMULATED TreeWY / store-all, geomean over the {len(meta['workloads'])} workloads "
                  "[paper, B200, geomean over its 5 workloads]", "",
                  f"| {'concurrency':24s}|" + "".join(f"{c:>14d} |" for c in table["concurrency"])]
        for m in paper:
            cells = "".join(f"{v:7.2f} [{paper[m][i]:.2f}] |" for i, v in enumerate(table[m].to_list()))
            lines.append(f"| {m:24s}|" + cells)
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="path without suffix: OUT.parquet, OUT.json and OUT.txt are written")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fit", help="the server fit to predict with (a name in the server fits table, "
                    "treewy.sim.calibrated.fitted); default: treewy.sim.predict.DEFAULT_FIT")
    args = ap.parse_args(argv)

    from treewy.sim import predict as P
    from treewy.sim.calibrated import fit_record
    from treewy.sim.sweep import acceptance_rates

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rates, source = acceptance_rates((1, 1, 1))
    fit = args.fit or P.DEFAULT_FIT
    server = P.server_from_fit(fit)
    meta = {"model": "qwen3.5-35b-a3b", "gpu": "h200", "tp": 1, "date": dt.date.today().isoformat(),
            "commit": P.sim_commit(), "gmus": list(P.GMUS), "workloads": list(P.WORKLOADS),
            "concurrency": list(P.CONCURRENCIES), "min_requests": P.MIN_REQUESTS,
            "requests_per_concurrency": P.REQUESTS_PER_CONCURRENCY,
            "requests_per_point": {str(c): P.requests_per_point(c) for c in P.CONCURRENCIES},
            "acceptance": f"{source}: per-depth rates {[round(float(x), 4) for x in rates]}, "
                          f"{1 + sum(float(x) for x in __import__('numpy').cumprod(rates)):.2f} tokens per step",
            "server": repr(server), "fit": fit, "fitted_to": fit_record(fit)["fitted_to"], "seed": args.seed}
    df = P.predict(seed=args.seed, server=server)
    write_predictions(out, df, meta, text_table(df, meta))
    return 0


def write_predictions(out: Path, df, meta: dict, text: str) -> None:
    """OUT.parquet (the rows), OUT.json (meta) and OUT.txt (text), which is printed too."""
    df.write_parquet(out.with_suffix(".parquet"))
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    print(text)
    print(f"wrote {out}.parquet, .json, .txt ({df.height} rows)")


if __name__ == "__main__":
    sys.exit(main())
