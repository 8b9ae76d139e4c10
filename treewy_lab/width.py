"""Notebook 06: where draft-tree width pays in serving. Each tree's output throughput against the chain's at every
load, SIMULATED for the 35B architecture on one H200 as ``benchmarks/vllm_serve_gpu.py sweep --tree`` serves it
(decode-only CUDA graphs up to max_num_seqs x (1 + N) tokens, the paper's Table 2 acceptance per tree), with the
measured rows of any tree sweep on disk overlaid; and the decode-bound identity behind each point: output tokens
per second = running requests x tokens per step / step time, so a wider tree pays only where its extra accepted
tokens per step outgrow what its larger step costs (and, for store-all, the N + 1 state blocks it takes)."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from treewy_lab.frames import measured_matching, measured_runs
from treewy_lab.setup import RESULTS_DIRS
from treewy.schema import load_measured
from treewy.serve.launcher_command import ServeOptions, capture_plan
from treewy.sim import simulate
from treewy.sim.calibrated import H200_DEFAULT
from treewy.tree import DraftTree

TREES = ((1, 1, 1), (2, 2, 1), (2, 2, 2), (3, 3, 3))
CONCURRENCY = (1, 8, 32, 64, 128, 256)
#: (column, what the chart calls it)
METRICS = {"vs_chain": "throughput / the chain's", "tokens_per_step": "tokens per step per request",
           "step_ms": "step time, ms", "running": "running requests"}


def sweep_server(tree):
    """The simulator's H200 server as the sweep launches it for ``tree``: graphs as large as the launcher asks vLLM
    for (``capture_plan``: max_num_seqs x (1 + N))."""
    opts = ServeOptions(model="qwen3.5-35b-a3b", max_num_seqs=H200_DEFAULT.max_num_seqs,
                        num_speculative_tokens=DraftTree.from_widths(tree).num_drafts, tree=tuple(tree))
    return replace(H200_DEFAULT, graph_max_tokens=capture_plan(opts).max_size)


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
                measured_dirs=RESULTS_DIRS, on_point=None) -> pl.DataFrame:
    """Long (source, mode, tree, concurrency, metric, value): every tree SIMULATED in both modes, then the measured
    tree rows of the same model, GPU, gmu and workload on disk (one source per run). on_point(done, total)."""
    sims, total = [], len(trees)
    for i, tree in enumerate(trees):
        sims.append(simulate("qwen3.5-35b-a3b", "h200", 1, gmu, mode=["store_all", "reconstruct"], tree=tree,
                             workload=workload, concurrency=list(concurrency), server=sweep_server(tree))
                    .with_columns(source=pl.lit("SIMULATED")))
        if on_point:
            on_point(i + 1, total)
    on_disk = load_measured(*measured_dirs)
    measured = pl.concat([measured_matching(on_disk, model="qwen3.5-35b-a3b", gpu="h200", tp=1, gmu=gmu, tree=str(t),
                                            workload=workload, max_num_seqs=H200_DEFAULT.max_num_seqs)
                          for t in trees]).filter(pl.col("concurrency").is_not_null())
    runs = [part.with_columns(source=pl.lit(label)) for label, part in measured_runs(measured)
            if part["tree"].n_unique() > 1]          # a run that served one tree has nothing to compare it with
    cols = ["source", "mode", "tree", "concurrency", "output_throughput", "mean_tpot_ms", "acceptance_length",
            "peak_running"]
    rows = pl.concat([f.with_columns(tree=pl.col("tree").cast(pl.String)).select(cols) for f in sims + runs])
    return identity(rows).unpivot(index=["source", "mode", "tree", "concurrency"], on=list(METRICS),
                                  variable_name="metric", value_name="value").drop_nulls("value")


def width_figure(gmu: float = 0.9, workload: str = "generation-short", **kw) -> dict:
    """{"chart", "frame", "vs_chain"}: the width chart (both modes, the identity's terms), the long frame, and the
    throughput-over-the-chain table (tree x concurrency) of each source and mode."""
    from treewy_lab.charts import width_chart

    frame = width_frame(gmu, workload, **kw)
    measured = sorted(set(frame["source"].to_list()) - {"SIMULATED"})
    notes = [f"Qwen3.5-35B-A3B · H200 TP1 · gmu {gmu:.2f} · {workload} · max seqs 256 · the paper's Table 2 "
             "acceptance per tree · decode graphs up to 256 x (1 + N) tokens",
             "SIMULATED (solid); measured tree sweeps on disk (dashed): " + ("; ".join(measured) or "none yet")]
    vs_chain = (frame.filter(pl.col("metric") == "vs_chain").sort("concurrency")
                .pivot(on="concurrency", index=["source", "mode", "tree"], values="value").sort("source", "mode", "tree"))
    return {"chart": width_chart(frame, METRICS, "Draft-tree width against the chain in serving", notes),
            "frame": frame, "vs_chain": vs_chain}
