"""Notebook 06: where draft-tree width pays in serving. Each tree's output throughput against the chain's at every
load, SIMULATED for the 35B architecture on one H200 as ``benchmarks/vllm_serve_gpu.py sweep --tree`` serves it
(``treewy.sim.predict``'s grid: decode-only CUDA graphs up to max_num_seqs x (1 + N) tokens, max(c, 16) requests per
point; the rows ``benchmarks/sim_width_predictions.py`` commits before a run) at one acceptance per tree, the sweep's
``--acceptance``: the paper's Table 2 length (``paper-35b``) or the tiny checkpoint's measured per-depth rates
(``tiny``), with the measured rows of any tree sweep on disk at the same acceptance overlaid; and the decode-bound
identity behind each point: output tokens per second = running requests x tokens per step / step time, so a wider
tree pays only where its extra accepted tokens per step outgrow what its larger step costs (and, for store-all, the
N + 1 state blocks it takes)."""

from __future__ import annotations

import polars as pl

from treewy_lab.frames import measured_matching, measured_runs
from treewy_lab.setup import RESULTS_DIRS
from treewy.schema import load_measured
from treewy.serve.acceptance import parse_acceptance
from treewy.sim.calibrated import H200_DEFAULT
from treewy.sim.predict import predict_calls, served_acceptance
from treewy.sim.sweep import simulate_many

TREES = ((1, 1, 1), (2, 2, 1), (2, 2, 2), (3, 3, 3))
CONCURRENCY = (1, 8, 32, 64, 128, 256)
#: --acceptance of the sweep -> (measured_matching's acceptance, what the chart calls it)
ACCEPTANCES = {"paper-35b": ("paper", "the paper's Table 2 acceptance per tree (geometric over depths)"),
               "tiny": ("tiny", "the tiny checkpoint's measured acceptance per depth")}
#: (column, what the chart calls it)
METRICS = {"vs_chain": "throughput / the chain's", "tokens_per_step": "tokens per step per request",
           "step_ms": "step time, ms", "running": "running requests"}


def acceptance_table(trees=TREES) -> pl.DataFrame:
    """Per tree and acceptance source: P(accepted depth >= d) for d = 1..3 and tokens per step (1 + their sum), as
    the served sampler is asked for them (treewy.serve.acceptance)."""
    rows = []
    for tree in trees:
        for acceptance, (_, label) in ACCEPTANCES.items():
            a = parse_acceptance(acceptance, len(tree), dummy=True, tree=tuple(tree)).rates
            rows.append({"tree": str(tuple(tree)), "acceptance": acceptance, "source": label,
                         **{f"P(depth >= {d})": round(x, 3) for d, x in enumerate(a, 1)},
                         "tokens per step": round(1 + sum(a), 3)})
    return pl.DataFrame(rows)


def identity(rows: pl.DataFrame) -> pl.DataFrame:
    """The decode-bound identity's terms per row: tokens per step (acceptance length), step time (TPOT x tokens per
    step), running requests; and throughput over the chain's of the same source, mode and load."""
    chain = rows.filter(pl.col("tree") == str(TREES[0])).select(
        "source", "mode", "concurrency", chain=pl.col("output_throughput"))
    return (rows.join(chain, on=["source", "mode", "concurrency"], how="left")
            .with_columns(vs_chain=pl.col("output_throughput") / pl.col("chain"),
                          tokens_per_step=pl.col("acceptance_length"),
                          step_ms=pl.col("mean_tpot_ms") * pl.col("acceptance_length"),
                          running=pl.col("peak_running").cast(pl.Float64)))


def width_frame(gmu: float = 0.9, workload: str = "generation-short", trees=TREES, concurrency=CONCURRENCY,
                measured_dirs=RESULTS_DIRS, on_point=None, acceptance: str = "paper-35b") -> pl.DataFrame:
    """Long (source, mode, tree, concurrency, metric, value): every tree SIMULATED in both modes at ``acceptance``
    (a key of ACCEPTANCES), then the measured tree rows of the same model, GPU, gmu, workload and acceptance on disk
    (one source per run). on_point(done, total)."""
    if acceptance not in ACCEPTANCES:
        raise ValueError(f"acceptance = {acceptance!r}: expected one of {', '.join(ACCEPTANCES)}")
    calls = [call for tree in trees
             for call in predict_calls(gmus=(gmu,), workloads=(workload,), concurrency=concurrency, tree=tree,
                                       acceptance=served_acceptance(tree, acceptance))]
    sims = [frame.with_columns(source=pl.lit("SIMULATED")) for frame in simulate_many(calls, on_point=on_point)]
    on_disk = load_measured(*measured_dirs)
    measured = pl.concat([measured_matching(on_disk, model="qwen3.5-35b-a3b", gpu="h200", tp=1, gmu=gmu, tree=str(t),
                                            workload=workload, max_num_seqs=H200_DEFAULT.max_num_seqs,
                                            acceptance=ACCEPTANCES[acceptance][0])
                          for t in trees]).filter(pl.col("concurrency").is_not_null())
    runs = [part.with_columns(source=pl.lit(label)) for label, part in measured_runs(measured)
            if part["tree"].n_unique() > 1]          # a run that served one tree has nothing to compare it with
    cols = ["source", "mode", "tree", "concurrency", "output_throughput", "mean_tpot_ms", "acceptance_length",
            "peak_running"]
    rows = pl.concat([f.with_columns(tree=pl.col("tree").cast(pl.String)).select(cols) for f in sims + runs])
    return identity(rows).unpivot(index=["source", "mode", "tree", "concurrency"], on=list(METRICS),
                                  variable_name="metric", value_name="value").drop_nulls("value")


def width_figure(gmu: float = 0.9, workload: str = "generation-short", acceptance: str = "paper-35b", **kw) -> dict:
    """{"chart", "frame", "vs_chain"}: the width chart (both modes, the identity's terms), the long frame, and the
    throughput-over-the-chain table (tree x concurrency) of each source and mode."""
    from treewy_lab.charts import width_chart

    frame = width_frame(gmu, workload, acceptance=acceptance, **kw)
    measured = sorted(set(frame["source"].to_list()) - {"SIMULATED"})
    notes = [f"Qwen3.5-35B-A3B · H200 TP1 · gmu {gmu:.2f} · {workload} · max seqs 256 · "
             f"{ACCEPTANCES[acceptance][1]} · decode graphs up to 256 x (1 + N) tokens",
             "SIMULATED (solid); measured tree sweeps on disk (dashed): " + ("; ".join(measured) or "none yet")]
    vs_chain = (frame.filter(pl.col("metric") == "vs_chain").sort("concurrency")
                .pivot(on="concurrency", index=["source", "mode", "tree"], values="value").sort("source", "mode", "tree"))
    return {"chart": width_chart(frame, METRICS, "Draft-tree width against the chain in serving", notes),
            "frame": frame, "vs_chain": vs_chain}
