"""Tidy polars frames for the charts: tree layouts, masks and vectors. No math beyond layout."""

from __future__ import annotations

import polars as pl
import torch

from treewy.tree import DraftTree


def tree_layout(tree: DraftTree) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(nodes, edges): leaves at consecutive x, parents centred over their children, y = depth."""
    parents, depth = tree.parents.tolist(), tree.depth.tolist()
    x = [0.0] * tree.num_nodes
    next_leaf = 0
    for t in reversed(range(tree.num_nodes)):  # children come after parents: fill bottom-up
        kids = tree.children(t)
        if kids:
            x[t] = sum(x[c] for c in kids) / len(kids)
        else:
            x[t] = -float(next_leaf)
            next_leaf += 1
    shift = min(x)
    x = [v - shift for v in x]
    nodes = pl.DataFrame({"node": list(range(tree.num_nodes)), "parent": parents, "depth": depth, "x": x,
                          "kind": ["root"] + ["draft"] * tree.num_drafts})
    edges = pl.DataFrame({"x": [x[p] for p in parents[1:]], "y": [depth[p] for p in parents[1:]],
                          "x2": x[1:], "y2": depth[1:]}, schema={"x": pl.Float64, "y": pl.Int64,
                                                                  "x2": pl.Float64, "y2": pl.Int64})
    return nodes, edges


def mask_frame(tree: DraftTree) -> pl.DataFrame:
    """The inclusive ancestor mask as its true cells only: (t, i, relation in {'self', 'ancestor'})."""
    t, i = torch.nonzero(tree.ancestor_mask(inclusive=True), as_tuple=True)
    return pl.DataFrame({"t": t.tolist(), "i": i.tolist(),
                         "relation": ["self" if a == b else "ancestor" for a, b in zip(t.tolist(), i.tolist())]})


def matrix_frame(m: torch.Tensor, row: str = "t", col: str = "i") -> pl.DataFrame:
    r, c = torch.meshgrid(torch.arange(m.shape[0]), torch.arange(m.shape[1]), indexing="ij")
    return pl.DataFrame({row: r.flatten().tolist(), col: c.flatten().tolist(),
                         "value": m.double().flatten().tolist()})


def vectors_frame(**series: torch.Tensor) -> pl.DataFrame:
    """Long frame (channel, series, value) from named 1-D tensors of equal length."""
    return pl.concat([pl.DataFrame({"channel": list(range(len(x))), "series": name,
                                    "value": x.double().tolist()}) for name, x in series.items()])


def blocks_frame(tree: DraftTree, layers: int = 1) -> pl.DataFrame:
    return pl.DataFrame({"mode": ["store_all", "reconstruct"],
                         "blocks": [tree.state_blocks("store_all") * layers, tree.state_blocks("reconstruct") * layers]})


def shape_costs_frame(shapes) -> pl.DataFrame:
    """N and state blocks per mode for each tree shape (long format: one row per shape and mode)."""
    rows = []
    for widths in shapes:
        tree = DraftTree.from_widths(widths)
        for mode in ("store_all", "reconstruct"):
            rows.append({"shape": str(widths), "N": tree.num_drafts, "depth": tree.max_depth, "mode": mode,
                         "blocks": tree.state_blocks(mode)})
    return pl.DataFrame(rows)


def serving_curves_frame(df: pl.DataFrame, source: str) -> pl.DataFrame:
    """Long (concurrency, mode, source, metric, value) from a serving table, one workload's points."""
    from treewy_lab.charts import SERVING_METRICS

    return (df.filter(pl.col("concurrency").is_not_null())
            .select("concurrency", "mode", *SERVING_METRICS)
            .with_columns(pl.col(m).cast(pl.Float64) for m in SERVING_METRICS)
            .unpivot(index=["concurrency", "mode"], variable_name="metric", value_name="value")
            .with_columns(source=pl.lit(source)))


def measured_matching(measured: pl.DataFrame, *, model: str, gpu: str, tp: int, gmu: float, tree: str,
                      workload: str, max_num_seqs: int | None = None, acceptance: str = "any") -> pl.DataFrame:
    """The good measured serving rows of exactly one configuration: the same model preset, GPU (``gpu`` is a
    simulator key such as "h200", matched as a word of the measured device name, "NVIDIA H200"), TP, memory
    budget (to 0.005), tree, workload, where both sides know it max_num_seqs (it sizes vLLM's sampler reserve, so
    the pool), and the acceptance: "any"; "paper" (runs that asked vLLM's synthetic sampler for the paper's,
    treewy.serve.acceptance's "paper-35b", or real weights drafting on their own); "tiny" (runs that asked for the
    tiny checkpoint's measured rates); "none" (dummy weights that asked for nothing, so accepted nothing). Failed
    points (failed > 0 or an error) are left out."""
    if acceptance not in ("any", "paper", "tiny", "none"):
        raise ValueError(f"acceptance = {acceptance!r}: expected 'any', 'paper', 'tiny' or 'none'")
    gpu_words = pl.col("gpu").str.to_lowercase().str.replace_all("-", " ").str.split(" ")
    seqs = pl.lit(True) if max_num_seqs is None else (pl.col("max_num_seqs").is_null()
                                                      | (pl.col("max_num_seqs") == max_num_seqs))
    asked = pl.col("acceptance_source").fill_null("none")
    dummy = pl.col("weights").fill_null("") == "dummy"
    acc = {"any": pl.lit(True), "paper": (asked == "paper-35b") | ((asked == "none") & ~dummy),
           "tiny": asked == "tiny", "none": (asked == "none") & dummy}[acceptance]
    return measured.filter(
        (pl.col("model") == model) & gpu_words.list.contains(gpu.lower()) & (pl.col("tp") == tp)
        & ((pl.col("gmu") - gmu).abs() < 0.005) & (pl.col("tree") == tree) & (pl.col("workload") == workload)
        & seqs & acc & (pl.col("failed").fill_null(0) == 0) & pl.col("error").is_null())


def ratios_frame(ratios: pl.DataFrame, source: str) -> pl.DataFrame:
    """Long (concurrency, metric, ratio, source) from treewy.sim.ratio_table's wide frame."""
    return ratios.unpivot(index="concurrency", variable_name="metric", value_name="ratio").with_columns(
        source=pl.lit(source))


PAPER_SOURCE = "paper: B200, measured, geomean of five full-length workloads"


def paper_ratios_frame(paper: dict[str, tuple[float, ...]], concurrencies) -> pl.DataFrame:
    return pl.DataFrame([{"concurrency": c, "metric": m, "ratio": v, "source": PAPER_SOURCE}
                         for m, vals in paper.items() for c, v in zip(concurrencies, vals)])


def acceptance_label(weights: str | None, acceptance_source: str | None) -> str:
    """What decided a measured run's acceptance, in words: vLLM's synthetic acceptance (treewy.serve.acceptance)
    or the drafts' real one, which with dummy weights accepts nothing."""
    if acceptance_source not in (None, "none"):
        return f"acceptance: synthetic ({acceptance_source})"
    return "acceptance: real (dummy weights: none accepted)" if weights == "dummy" else "acceptance: real"


def measured_label(device: str, date: str, weights: str | None, acceptance_source: str | None = None) -> str:
    """A measured serving series' legend label: device, date, weights and acceptance."""
    said = {"dummy": "dummy weights", "real": "real weights", None: "weights not recorded"}.get(weights, weights)
    return f"vLLM measured: {device}, {date}, {said}, {acceptance_label(weights, acceptance_source)}"


#: What identifies one measured run of a serving table; the acceptance column is absent from older tables.
RUN_KEYS = ("device", "date", "weights", "acceptance_source")


def measured_runs(measured: pl.DataFrame):
    """(label, rows) per measured run (device, date, weights, acceptance) in ``measured``, in table order."""
    if "acceptance_source" not in measured.columns:
        measured = measured.with_columns(acceptance_source=pl.lit(None, pl.String))
    for (device, date, weights, acc), part in measured.group_by(*RUN_KEYS, maintain_order=True):
        yield measured_label(device, date, weights, acc), part


def node_errors_frame(rows: list[dict]) -> pl.DataFrame:
    """Long (node, depth, quantity, error, tol) from treewy.ops.parity.node_errors rows."""
    df = pl.DataFrame(rows)
    return pl.concat([
        df.select("node", "depth", quantity=pl.lit("output o_t"), error="o_err", tol="o_tol"),
        df.select("node", "depth", quantity=pl.lit("committed state S_t"), error="state_err", tol="state_tol"),
    ])


def kernel_results_frame(path=None, fastest: bool = True) -> pl.DataFrame:
    """The timed cases of a kernel benchmark file (default: the current targets table, ``treewy.results``), each
    row labelled with its device and date; ``fastest``: one row per case, the fastest kernel measured for it."""
    from treewy.results import fastest_rows, kernel_table
    from treewy.results import table as current_table

    table = kernel_table(path or current_table("kernel_targets"))
    rows = fastest_rows(table["rows"]) if fastest else table["rows"]
    df = pl.DataFrame(rows, infer_schema_length=None)
    if "kernel" not in df.columns:
        df = df.with_columns(kernel=pl.lit(None, pl.String))
    return df.with_columns(source=pl.lit(f"{table['device']}, {table['date']} (measured)"))


def kernel_targets_frame(path=None) -> pl.DataFrame:
    """The kernel performance targets of a targets_<device>_<date>.json (benchmarks/bench_kernels.py; default: the
    current one, ``treewy.results``) as a frame: target, measured, unit, bar, result, source."""
    import json
    from pathlib import Path

    from treewy.bench.timing import target_result
    from treewy.results import table

    path = Path(path or table("kernel_targets"))
    data = json.loads(path.read_text())
    rows = [dict(target=t["target"].strip(), measured=float(t["measured"]), unit=t["unit"], bar=t["bar"],
                 result=target_result(t)) for t in data["targets"]]
    return pl.DataFrame(rows).with_columns(source=pl.lit(f"{data['device']}, {data['date']} (measured)"))


def acceptance_frame(sweep: pl.DataFrame, source: str) -> pl.DataFrame:
    """(drafter, kind, shape, N, acceptance, acceptance_lo, acceptance_hi, source) from a treewy.sweep frame,
    one row per shape (the commit modes accept the same nodes, so reconstruct rows stand for both)."""
    spec = sweep.filter(pl.col("drafter") != "none")
    if "reconstruct" in spec["mode"].to_list():
        spec = spec.filter(pl.col("mode") == "reconstruct")
    return spec.select("drafter", "kind", "shape", "N", "acceptance", "acceptance_lo", "acceptance_hi",
                       source=pl.lit(source))


def paper_acceptance_frame(acceptance: dict) -> pl.DataFrame:
    rows = [{"drafter": "mtp", "kind": "tree", "shape": str(s), "N": DraftTree.from_widths(s).num_drafts, "acceptance": a,
             "acceptance_lo": None, "acceptance_hi": None, "source": "paper: Qwen3.5-35B-A3B, B200 (measured)"}
            for s, a in acceptance.items()]
    return pl.DataFrame(rows, schema_overrides={"acceptance_lo": pl.Float64, "acceptance_hi": pl.Float64})



def temperature_frame(sweep: pl.DataFrame, source: str) -> pl.DataFrame:
    """(drafter, shape, rule, temperature, acceptance, acceptance_lo, acceptance_hi, source) from a
    treewy.sampling.sweep frame."""
    return sweep.select("drafter", "shape", "rule", "temperature", "acceptance", "acceptance_lo", "acceptance_hi",
                        source=pl.lit(source))
