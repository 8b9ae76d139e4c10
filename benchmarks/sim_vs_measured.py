"""The simulator beside a measured serving sweep, and the fit of its fixed step costs (CPU, a few seconds).

    python benchmarks/sim_vs_measured.py treewy/data/serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-11-30.parquet \
        --gpu h200 --out benchmarks/results/sim_vs_measured_qwen3.5-35b-a3b_h200_2026-11-30.txt

For every good measured point (closed loop), simulates the same model, GPU, gmu, workload, mode, requests sent
and max_num_seqs with acceptance fixed at the measured one (dummy weights accept nothing)
(``treewy.sim.sweep.simulate_measured_point``), first with the assumed fixed costs (``ServerConfig``'s defaults), then fits
``measured TPOT - simulated TPOT = a + b x running requests`` by least squares and simulates again with
host_overhead_s += a and host_per_request_s = b. Prints and writes one table: measured, assumed, fitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def simulate_like(rows, gpu: str, server):
    from tqdm.auto import tqdm

    from treewy.sim.sweep import simulate_measured_point

    return [simulate_measured_point(r, gpu, server) for r in tqdm(rows, desc="simulating", leave=False)]


def main(argv=None) -> int:
    import numpy as np
    import polars as pl

    from treewy.memory import ServerConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured")
    ap.add_argument("--gpu", required=True, help="the simulator's GPU key for the measured device (h200, ...)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    meas = pl.read_parquet(args.measured).filter(pl.col("error").is_null(), pl.col("concurrency").is_not_null())
    rows = list(meas.iter_rows(named=True))
    seqs = {r["max_num_seqs"] for r in rows}
    if len(seqs) != 1 or None in seqs:
        raise SystemExit(f"{args.measured}: expected one known max_num_seqs, found {seqs}")
    assumed = ServerConfig(max_num_seqs=seqs.pop())
    first = simulate_like(rows, args.gpu, assumed)
    y = np.array([r["mean_tpot_ms"] - s["mean_tpot_ms"] for r, s in zip(rows, first)])
    running = np.array([r["peak_running"] for r in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(y), running], 1), y, rcond=None)
    fitted = dataclasses.replace(assumed, host_overhead_s=assumed.host_overhead_s + a * 1e-3, host_per_request_s=b * 1e-3)
    second = simulate_like(rows, args.gpu, fitted)
    r0 = rows[0]
    lines = [f"Simulator vs measured: {r0['model']}, {r0['device']} ({r0['date']}, measured) vs '{args.gpu}' (SIMULATED), "
             f"gmu {r0['gmu']}, tp {r0['tp']}, max_num_seqs {assumed.max_num_seqs}, weights {r0['weights']}",
             f"fit: measured TPOT - assumed TPOT = {a:.3f} ms + {b:.4f} ms x running requests "
             f"(host_overhead_s {assumed.host_overhead_s:.2e} -> {fitted.host_overhead_s:.2e}, "
             f"host_per_request_s 0 -> {fitted.host_per_request_s:.2e})", "",
             "columns: measured / simulated with assumed fixed costs / simulated with fitted fixed costs", "",
             f"{'workload':18s} {'mode':11s} {'conc':>4s} | {'running':>14s} | {'KV usage':>17s} | {'TPOT ms':>17s} | "
             f"{'output tok/s':>20s} | {'p99 TTFT ms':>23s}"]
    for r, s0, s1 in zip(rows, first, second):
        f = lambda k, fmt: "/".join(format(x[k], fmt) for x in (r, s0, s1))  # noqa: E731
        lines.append(f"{r['workload']:18s} {r['mode']:11s} {r['concurrency']:4d} | {f('peak_running', 'd'):>14s} | "
                     f"{f('peak_kv_usage', '.2f'):>17s} | {f('mean_tpot_ms', '.1f'):>17s} | "
                     f"{f('output_throughput', '.0f'):>20s} | {f('p99_ttft_ms', '.0f'):>23s}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
