"""The engine's measured decode-step times per device (``benchmarks/engine_step_gpu.py``, published as
``engine_steps`` in ``treewy/data/index.json``) as one tidy frame, and its chart."""

from __future__ import annotations

import json
from pathlib import Path

import altair as alt
import polars as pl

from treewy import results

#: How each path runs a step: the readable eager loop, the static-buffer step without capture (CPU), one CUDA graph.
PATHS = {"eager": "eager loop", "static": "static step (no capture)", "captured": "one CUDA graph"}
PATH_COLORS = alt.Scale(domain=list(PATHS.values()), range=["#d95f02", "#7570b3", "#1b9e77"])
PATH_SHAPES = alt.Scale(domain=list(PATHS.values()), range=["circle", "triangle-up", "square"])


def step_times_frame(paths=None) -> pl.DataFrame:
    """One row per (device, case, B, path) of every published engine-step table (or of ``paths``): the median
    wall time per step, the GPU kernels' time per step where traced, and the table's device and date."""
    frames = []
    for path in paths if paths is not None else results.tables("engine_steps"):
        data = json.loads(Path(path).read_text())
        rows = pl.DataFrame(data["rows"], infer_schema_length=None)
        frames.append(rows.select(
            pl.lit(f"{data['device']}, {data['date']}").alias("measured on"),
            pl.lit(data["model"]).alias("model"), pl.lit(data["dtype"]).alias("dtype"),
            "case", "B", pl.col("path").replace_strict(PATHS).alias("path"), "steps", "acceptance",
            "step_ms", pl.col("gpu_ms").cast(pl.Float64), "first_decode_s"))
    if not frames:
        raise LookupError("no engine-step table is published: run benchmarks/engine_step_gpu.py and publish its "
                          "engine_step.json with treewy.results.publish('engine_steps', path, name)")
    return pl.concat(frames, how="vertical_relaxed")


def step_times_chart(frame: pl.DataFrame) -> alt.FacetChart:
    """Milliseconds per decode step (log scale) for each case and batch, one colour per path, one row per device."""
    df = frame.with_columns(what=pl.col("case") + pl.lit(", B = ") + pl.col("B").cast(pl.Utf8))
    order = df["what"].unique(maintain_order=True).to_list()
    return alt.Chart(df).mark_point(filled=True, size=70).encode(
        x=alt.X("step_ms:Q", scale=alt.Scale(type="log"), title="ms per decode step (median wall time)"),
        y=alt.Y("what:N", sort=order, title=None),
        color=alt.Color("path:N", scale=PATH_COLORS, title=None, legend=alt.Legend(orient="top")),
        shape=alt.Shape("path:N", scale=PATH_SHAPES, title=None, legend=alt.Legend(orient="top")),
        tooltip=["measured on:N", "case:N", "B:Q", "path:N", alt.Tooltip("step_ms:Q", format=",.2f"),
                 alt.Tooltip("gpu_ms:Q", format=",.3f", title="GPU kernels ms per step"),
                 alt.Tooltip("first_decode_s:Q", format=",.1f", title="first decode s (compile, capture)"),
                 alt.Tooltip("acceptance:Q", format=".2f", title="tokens per step")],
    ).properties(width=480, height=150).facet(
        row=alt.Row("measured on:N", title=None, header=alt.Header(labelAngle=0, labelOrient="top",
                                                                     labelAnchor="start", labelFontWeight="bold")),
    ).properties(title=["The tiny checkpoint's decode step per device (measured)",
                        "MTP drafts, reconstruct commit; hover a point for the GPU time and first-decode cost"])
