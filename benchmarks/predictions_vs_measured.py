"""The simulator's committed predictions against the sweep that ran after them, point by point (CPU, a second).

    python -m benchmarks.predictions_vs_measured benchmarks/results/predictions_35b_h200_tp1_2026-12-02.parquet \
        treewy/data/serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-12-02.parquet \
        --out benchmarks/results/predictions_vs_measured_35b_h200_2026-12-02.txt

Joins the SIMULATED rows of the predictions with the measured rows of the given tables on (gmu, workload, mode,
concurrency, tree; and the acceptance asked for where the predictions name it, as the width predictions of
``sim_width_predictions.py`` do) and prints, per point, each metric measured, predicted and their ratio (measured /
predicted); then per mode and metric the geometric mean of that ratio and its range; then per gmu (and tree) the
paper's Tables 1 and 3 in shape (TreeWY / store-all per metric and concurrency, measured, the prediction, the
paper's). A measured point with no prediction, or a failed one, is listed apart. The predictions are not recomputed:
the file holds what the simulator said before the run (the commit is in its .json).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

KEYS = ["gmu", "workload", "mode", "concurrency"]
#: A row without a tree serves the chain
CHAIN = "(1, 1, 1)"
#: (column, label, format) of each compared metric
METRICS = [("output_throughput", "tok/s", ".0f"), ("mean_tpot_ms", "TPOT ms", ".2f"),
           ("p99_ttft_ms", "p99 TTFT ms", ".0f"), ("peak_running", "running", "d")]


def good_points(measured):
    """The measured rows of points that ran: no error, no failed request."""
    import polars as pl

    return measured.filter(pl.col("error").is_null() & (pl.col("failed").fill_null(0) == 0))


def point_keys(predicted) -> list[str]:
    """What a measured point is matched on: KEYS and the tree, and the acceptance asked for (``acceptance_source``)
    where the predictions name one (the width predictions hold a row per tree and source at each point)."""
    named = "acceptance_source" in predicted.columns and predicted["acceptance_source"].null_count() < predicted.height
    return KEYS + ["tree"] + (["acceptance_source"] if named else [])


def _columns(df, cols):
    """``df``'s ``cols`` (a column an older table lacks is null), the chain's label where a row names no tree."""
    import polars as pl

    return df.with_columns(pl.lit(None).alias(c) for c in cols if c not in df.columns).select(cols).with_columns(
        pl.col("tree").cast(pl.String).fill_null(CHAIN))


def compare(predicted, measured):
    """(one row per matched point with metric, metric_predicted and metric_ratio columns; the measured rows that
    matched no prediction or failed)."""
    import polars as pl

    keys = point_keys(predicted)
    good = _columns(good_points(measured), keys + [c for c, _, _ in METRICS] + ["date", "device"])
    pred = _columns(predicted, keys + [c for c, _, _ in METRICS]).select(
        keys + [pl.col(c).alias(f"{c}_predicted") for c, _, _ in METRICS])
    joined = good.join(pred, on=keys, how="left").with_columns(
        (pl.col(c).cast(pl.Float64) / pl.col(f"{c}_predicted").cast(pl.Float64)).alias(f"{c}_ratio")
        for c, _, _ in METRICS)
    matched = joined.filter(pl.col("output_throughput_predicted").is_not_null()).sort(keys)
    failed = _columns(measured, keys).join(good.select(keys), on=keys, how="anti")
    unmatched = pl.concat([joined.filter(pl.col("output_throughput_predicted").is_null()).select(keys), failed])
    return matched, unmatched


def _point(r) -> str:
    """A point's tree and acceptance, where it has them beyond the chain's."""
    extra = ([] if r["tree"] == CHAIN else [f"tree {r['tree']}"]) + (
        [r["acceptance_source"]] if r.get("acceptance_source") not in (None, "paper-35b") else [])
    return "".join(f" {x}" for x in extra)


def log_error(ratios) -> tuple[float, float]:
    """(geomean, RMS of the natural log) of measured / predicted ratios, over the positive ones; NaN when none."""
    x = ratios.drop_nulls()
    x = x.filter(x > 0).log()
    if not len(x):
        return math.nan, math.nan
    return math.exp(x.mean()), math.sqrt((x ** 2).mean())


def text_report(matched, unmatched, sources, tables=()) -> str:
    lines = ["Committed predictions (SIMULATED) against the measured sweep: measured / predicted (ratio)",
             "sources: " + ", ".join(sources), ""]
    head = f"{'gmu':>4s} {'workload':17s} {'mode':11s} {'conc':>4s} | " + " | ".join(
        f"{label:>25s}" for _, label, _ in METRICS)
    lines += [head, "-" * len(head)]
    for r in matched.iter_rows(named=True):
        cells = []
        for c, _, fmt in METRICS:
            cells.append(f"{format(r[c], fmt)} / {format(r[f'{c}_predicted'], fmt)} ({r[f'{c}_ratio']:.2f})".rjust(25))
        lines.append(f"{r['gmu']:4.2f} {r['workload']:17s} {r['mode']:11s} {r['concurrency']:4d} | " + " | ".join(cells)
                     + _point(r))
    lines += ["", "measured / predicted per mode: geomean [min, max] over the matched points, then the RMS of its log "
              "(0.10: about 10 % off per point)", ""]
    for (mode,), part in list(matched.group_by("mode", maintain_order=True)) + [(("all",), matched)]:
        cells = []
        for c, label, _ in METRICS:
            g, rms = log_error(part[f"{c}_ratio"])
            x = part[f"{c}_ratio"].drop_nulls()
            cells.append(f"{label} {g:.2f} [{x.min():.2f}, {x.max():.2f}] rms {rms:.3f}")
        lines.append(f"{mode:11s} ({part.height} points): " + "; ".join(cells))
    if unmatched.height:
        lines += ["", "not compared (failed, or no prediction for the point): "
                  + ", ".join(f"{r['workload']} {r['mode']} c{r['concurrency']} gmu {r['gmu']}{_point(r)}"
                              for r in unmatched.iter_rows(named=True))]
    lines += list(tables)
    dates = sorted(set(matched["date"].to_list())) if matched.height else []
    lines += ["", f"measured on {', '.join(sorted(set(matched['device'].to_list())))} on {', '.join(dates)}"
              if dates else "no measured point matched a prediction"]
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def ratio_tables(predicted, measured) -> list[str]:
    """Per gmu measured, the paper's Tables 1 and 3 in shape: TreeWY / store-all per metric and concurrency, geomean
    over the workloads both modes finished at that load, as measured (SIMULATED prediction over the same workloads)
    [the paper's B200 figure, a geomean over its five workloads]."""
    import polars as pl

    from treewy.paper import CONCURRENCIES
    from treewy.sim.paper_tables import PAPER_TABLES
    from treewy.sim.sweep import ratio_table

    keys = point_keys(predicted)
    groups = keys[len(KEYS):]                     # one table per tree (and acceptance) as well as per gmu
    good = _columns(good_points(measured), list(measured.columns) + ["tree"] * ("tree" not in measured.columns))
    predicted = _columns(predicted, list(predicted.columns))
    lines = []
    for (gmu, *group), meas in sorted(good.group_by(["gmu", *groups]), key=lambda g: tuple(map(str, g[0]))):
        which = dict(zip(groups, group))
        part = predicted.filter(pl.col("gmu") == gmu, *(pl.col(k) == v for k, v in which.items()))
        pairs = meas.group_by("workload", "concurrency").agg(pl.col("mode").n_unique().alias("n")).filter(
            pl.col("n") == 2).select("workload", "concurrency")
        if not pairs.height:
            continue
        m = ratio_table(meas.join(pairs, on=["workload", "concurrency"]))
        p = ratio_table(part.join(pairs, on=["workload", "concurrency"]))
        paper = PAPER_TABLES.get(("qwen3.5-35b-a3b", 1, gmu), {}) if which["tree"] == CHAIN else {}  # chains
        concs = m["concurrency"].to_list()
        label = _point({"tree": which["tree"], "acceptance_source": which.get("acceptance_source")})
        lines += ["", f"gmu {gmu}{label}: TreeWY / store-all, measured (SIMULATED prediction) [paper, B200], "
                  "geomean over " + ", ".join(sorted(set(pairs["workload"].to_list()))), "",
                  f"| {'':24s}|" + "".join(f"{c:>21d} |" for c in concs)]
        for metric in [c for c in m.columns if c != "concurrency"]:
            cells = []
            for c in concs:
                mv = m.filter(pl.col("concurrency") == c)[metric].item()
                pv = p.filter(pl.col("concurrency") == c)[metric]
                pv = pv.item() if pv.len() else None
                ref = paper[metric][CONCURRENCIES.index(c)] if paper and c in CONCURRENCIES else None
                cells.append(f"{_num(mv)} ({_num(pv)})" + (f" [{ref:4.2f}]" if ref is not None else "       "))
            lines.append(f"| {metric:24s}|" + "".join(f" {x:>20s} |" for x in cells))
        every = set(pairs["workload"].to_list())
        for c in concs:
            some = set(pairs.filter(pl.col("concurrency") == c)["workload"].to_list())
            if some != every:
                lines.append(f"(at {c}: {', '.join(sorted(some))} alone: the other workloads lack a mode there)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("predictions", help="the predictions' parquet (benchmarks/sim_predictions.py)")
    ap.add_argument("measured", nargs="+", help="measured serving tables (treewy.schema)")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args(argv)

    import polars as pl

    predicted = pl.read_parquet(args.predictions)
    if not predicted["simulated"].all():
        print(f"{args.predictions}: holds measured rows; expected the simulator's predictions", file=sys.stderr)
        return 2
    cols = KEYS + [c for c, _, _ in METRICS] + ["peak_kv_usage", "error", "failed", "date", "device", "simulated",
                                                "tree", "acceptance_source"]
    frames = []
    for path in map(Path, args.measured):
        if not path.is_file():
            print(f"{path}: no such table", file=sys.stderr)
            return 2
        frames.append(_columns(pl.read_parquet(path), cols).filter(~pl.col("simulated")))
    measured = pl.concat(frames)
    report = text_report(*compare(predicted, measured), [args.predictions, *args.measured],
                         ratio_tables(predicted, measured))
    print(report, end="")
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
