"""The simulator's predictions for the served tree-width sweep, written before it runs (CPU, about a minute).

    python -m benchmarks.sim_width_predictions --out benchmarks/results/predictions_width_35b_h200_tp1_<date>

The sweep (issue 30's measured width curve): the 35B architecture with dummy weights on one H200, TP1, generation-short,
concurrency 1..256, both modes, the chain and the trees (2, 2, 1), (2, 2, 2), (3, 3, 3), gmu 0.9 and 0.6, at both
sources of per-depth acceptance (``--acceptance paper-35b`` and ``tiny``), each tree as ``vllm_serve_gpu.py sweep
--tree W`` serves it (``treewy.sim.predict``: the same requests per point, graphs up to max_num_seqs x (1 + N), ``server_for``).
Writes OUT.parquet (SIMULATED rows with ``acceptance_source``), OUT.json (the grid, the fit, the simulator's commit
and the date) and OUT.txt: per gmu, acceptance and mode, each tree's throughput over the chain's at every load, then
the decode-bound identity's terms behind it (tokens per step, step time, running requests).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

TREES = ((1, 1, 1), (2, 2, 1), (2, 2, 2), (3, 3, 3))
GMUS = (0.9, 0.6)
ACCEPTANCES = ("paper-35b", "tiny")
WORKLOAD = "generation-short"


def predict_width(gmus=GMUS, acceptances=ACCEPTANCES, trees=TREES, concurrency=None, seed: int = 0, on_tree=None):
    """SIMULATED rows of every (acceptance, tree) at every gmu and load, both modes; on_tree(done, total)."""
    import polars as pl

    from treewy.sim import predict as P

    concurrency = P.CONCURRENCIES if concurrency is None else concurrency
    frames, total = [], len(acceptances) * len(trees)
    for acceptance in acceptances:
        for tree in trees:
            df = P.predict(gmus=gmus, workloads=(WORKLOAD,), concurrency=concurrency, seed=seed, tree=tree,
                           acceptance=P.served_acceptance(tree, acceptance))
            frames.append(df.with_columns(acceptance_source=pl.lit(acceptance)))
            if on_tree:
                on_tree(len(frames), total)
    return pl.concat(frames, how="diagonal_relaxed")


def text_table(df, meta) -> str:
    import polars as pl

    lines = [f"SIMULATED predictions of the served tree-width sweep, {meta['model']} TP1 on one H200 (simulator gpu "
             f"'h200'), {meta['workload']}, made {meta['date']} by the simulator at commit {meta['commit']}, before "
             "the GPU sweep", f"server fit: {meta['fit']}; graphs up to max_num_seqs x (1 + N) tokens per tree "
             f"({meta['graph_max_tokens']})", ""]
    trees = [str(tuple(t)) for t in meta["trees"]]
    chain = trees[0]
    for gmu in meta["gmus"]:
        for acceptance in meta["acceptances"]:
            part = df.filter((pl.col("gmu") == gmu) & (pl.col("acceptance_source") == acceptance))
            lengths = {t: part.filter(pl.col("tree") == t)["acceptance_length"].mean() for t in trees}
            lines += [f"gmu {gmu}, acceptance {acceptance} (tokens per step: "
                      + ", ".join(f"{t} {v:.2f}" for t, v in lengths.items()) + ")", ""]
            for mode in ("store_all", "reconstruct"):
                m = part.filter(pl.col("mode") == mode)
                base = {r["concurrency"]: r["output_throughput"] for r in m.filter(pl.col("tree") == chain)
                        .iter_rows(named=True)}
                concs = sorted(base)
                lines.append(f"  {mode}: throughput / the chain's [step ms, running]")
                lines.append("  " + f"{'tree':11s}" + "".join(f"{c:>22d}" for c in concs))
                for t in trees:
                    rows = {r["concurrency"]: r for r in m.filter(pl.col("tree") == t).iter_rows(named=True)}
                    cells = "".join(f"{rows[c]['output_throughput'] / base[c]:>8.2f} [{_step_ms(rows[c]):6.1f}, "
                                    f"{rows[c]['peak_running']:3d}]" for c in concs)
                    lines.append(f"  {t:11s}{cells}")
                lines.append("")
    return "\n".join(lines)


def _step_ms(row) -> float:
    """The decode-bound identity's step time: TPOT x tokens per step."""
    return row["mean_tpot_ms"] * row["acceptance_length"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="path without suffix: OUT.parquet, OUT.json and OUT.txt are written")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from benchmarks.sim_predictions import write_predictions
    from treewy.sim import predict as P
    from treewy.sim.calibrated import fit_record

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": "qwen3.5-35b-a3b", "gpu": "h200", "tp": 1, "date": dt.date.today().isoformat(),
            "commit": P.sim_commit(), "gmus": list(GMUS), "workload": WORKLOAD, "trees": [list(t) for t in TREES],
            "acceptances": list(ACCEPTANCES), "concurrency": list(P.CONCURRENCIES),
            "requests_per_point": {str(c): P.requests_per_point(c) for c in P.CONCURRENCIES},
            "graph_max_tokens": {str(t): P.graph_max_tokens(t) for t in TREES},
            "conditional_rates": {a: {str(t): P.served_acceptance(t, a) for t in TREES} for a in ACCEPTANCES},
            "fit": P.DEFAULT_FIT, "fitted_to": fit_record(P.DEFAULT_FIT)["fitted_to"], "seed": args.seed}
    with tqdm(total=len(ACCEPTANCES) * len(TREES), desc="trees simulated") as bar:
        df = predict_width(seed=args.seed, on_tree=lambda done, total: bar.update(1))
    write_predictions(out, df, meta, text_table(df, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
