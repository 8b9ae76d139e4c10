"""The served sweep's long steps beside the simulator's eager steps, point by point (CPU, a minute).

    python -m benchmarks.long_steps_vs_sim benchmarks/results/serve35b_h200_gmu0.6_2026-12-02 \
        --fit H200_VLLM026_GRAPHS1024_ACCEPTED --out benchmarks/results/long_steps_vs_sim_35b_h200_gmu0.6_2026-12-02.txt

Measured (``benchmarks.itl_gaps.stalls_row``): the engine steps longer than ``--slow-ms`` in which no request
received a token, from vllm bench serve's per-request records in the folder's ``results/``: how many, their mean,
and the share of the point's wall time. SIMULATED: the twin of the same row (``simulate_measured_point`` under the
named server fit): its steps run without CUDA graphs (a prefill chunk under decode-only graphs, or more tokens than
the largest captured graph), their mean seconds, and their share of the simulated run. Where the two counts agree
and the means do not, the fit prices an eager step wrongly; where the counts differ, the scheduler places prefill
chunks in other steps than vLLM does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.itl_gaps import load_record, stalls_row, write_and_print


def result_file(folder: Path, row: dict) -> Path | None:
    """The vllm bench serve record of one measured row in ``folder`` (plain or gzipped), or None."""
    stem = f"{row['workload']}-{row['mode']}-c{row['concurrency']}.json"
    return next((p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file()), None)


def compare(sweep: Path, fit: str, gpu: str = "h200", slow_ms: float = 100.0) -> list[dict]:
    """One dict per measured closed-loop row of ``sweep``'s serve35b_*.parquet tables that has its record."""
    import polars as pl
    from tqdm.auto import tqdm

    from treewy.sim.calibrated import fitted
    from treewy.sim.sweep import simulate_measured_point

    server = fitted(fit)
    rows = []
    for table in sorted(sweep.glob("serve35b_*.parquet")):
        rows += pl.read_parquet(table).filter(pl.col("error").is_null(), pl.col("concurrency").is_not_null(),
                                              ~pl.col("simulated")).to_dicts()
    if not rows:
        raise SystemExit(f"{sweep}: no measured closed-loop rows in serve35b_*.parquet there")
    out = []
    for row in tqdm(sorted(rows, key=lambda r: (r["workload"], r["mode"], r["concurrency"])), desc="points"):
        path = result_file(sweep / "results", row)
        if path is None:
            continue
        measured = stalls_row(load_record(path), slow_ms / 1e3)
        _, point = simulate_measured_point(row, gpu, server, with_point=True)
        out.append({"workload": row["workload"], "mode": row["mode"], "concurrency": row["concurrency"],
                    **measured, "sim_eager_steps": point.eager_steps,
                    "sim_eager_mean_ms": point.eager_time / point.eager_steps * 1e3 if point.eager_steps else None,
                    "sim_eager_share": point.eager_time / point.duration if point.duration > 0 else None})
    return out


def render(rows: list[dict], header: str, slow_ms: float) -> str:
    def ms(x):
        return "—" if x is None or x != x else f"{x:.0f}"

    def pct(x):
        return "—" if x is None or x != x else f"{100 * x:.0f} %"

    lines = [header, "",
             f"| workload | mode | concurrency | measured steps > {slow_ms:g} ms | their mean ms | share of time | "
             "SIMULATED eager steps | their mean ms | share of time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['mode']} | {r['concurrency']} | {r['stalls']} | {ms(r['stall_mean_ms'])} "
                     f"| {pct(r['stall_share'])} | {r['sim_eager_steps']} | {ms(r['sim_eager_mean_ms'])} "
                     f"| {pct(r['sim_eager_share'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="a results folder: serve35b_<mode>.parquet tables and results/ with the records")
    ap.add_argument("--fit", required=True, help="a server fit's name (treewy.sim.calibrated)")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--slow-ms", type=float, default=100.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sweep = Path(args.sweep)
    rows = compare(sweep, args.fit, args.gpu, args.slow_ms)
    write_and_print(render(rows, f"Long steps measured ({sweep}) beside the SIMULATED eager steps of the same "
                                 f"points (fit {args.fit}, gpu {args.gpu})", args.slow_ms), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
