"""Every chart fits the output area (treewy_lab.charts.MAX_WIDTH), rendered to SVG by vl-convert as a browser would,
fed the widest frames the notebooks give it; legends say "TreeWY" and "store-all"."""

import re

import polars as pl
import pytest

from treewy_lab import charts
from treewy_lab.frames import (acceptance_frame, blocks_frame, kernel_results_frame, mask_frame, node_errors_frame,
                        paper_acceptance_frame, paper_ratios_frame, shape_costs_frame, tree_layout)
from treewy.paper import ACCEPTANCE, CONCURRENCIES, SERVING_RATIOS, SHAPES
from treewy.results import DATA_DIR
from treewy.tree import DraftTree

vlc = pytest.importorskip("vl_convert")


def svg_of(chart) -> str:
    return vlc.vegalite_to_svg(chart.to_json())


def width_of(chart) -> float:
    return float(re.search(r'<svg[^>]* width="([\d.]+)"', svg_of(chart)).group(1))


def _serving_panel_charts():
    from treewy_lab.panels import ServingPanel

    p = ServingPanel(concurrency=(8, 128))
    return {name: c.chart for name, c in p.charts.items()}


def _charts():
    wide = DraftTree.from_widths((8, 8))
    errors = node_errors_frame([dict(node=t, depth=1, o_err=1e-7, state_err=1e-7, o_tol=1e-5, state_tol=1e-5)
                                for t in range(40)])
    sweep = pl.read_parquet(DATA_DIR / "2026-11-29_h200_tiny_sweep_full.parquet")
    acc = pl.concat([acceptance_frame(sweep, "tiny, NVIDIA H200, 2026-11-29 (committed)"),
                     paper_acceptance_frame(ACCEPTANCE)], how="vertical_relaxed")
    ratios = paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES)
    kernels = kernel_results_frame().filter(pl.col("B") == 256, pl.col("model") == "35B-A3B")
    return {
        "tree (8, 8)": charts.tree_chart(*tree_layout(wide)),
        "mask (8, 8)": charts.mask_chart(mask_frame(wide)),
        "blocks": charts.blocks_chart(blocks_frame(wide)),
        "blocks vs N": charts.blocks_vs_n_chart(shape_costs_frame(SHAPES)),
        "node errors, 40 nodes": charts.node_errors_chart(errors, "(3, 3, 3): B = 4, H = 2, HV = 8, K = V = 16"),
        "acceptance": charts.acceptance_chart(acc, "mtp drafts: tokens per step"),
        "ratios": charts.ratio_chart(ratios, "TreeWY / store-all: simulated vs the paper"),
        "kernel timing": charts.kernel_timing_chart(kernels, "NVIDIA H200, 2026-11-29, B = 256"),
        **{f"serving panel: {k}": v for k, v in _serving_panel_charts().items()},
    }


CHARTS = _charts()


@pytest.mark.parametrize("name", list(CHARTS))
def test_chart_fits_the_output_area(name):
    assert width_of(CHARTS[name]) <= charts.MAX_WIDTH


def test_legends_use_the_prose_names_of_the_modes():
    texts = re.findall(r">([^<]+)</text>", svg_of(CHARTS["blocks vs N"]) + svg_of(CHARTS["serving panel: curves"]))
    assert "TreeWY" in texts and "store-all" in texts
    assert "reconstruct" not in texts and "store_all" not in texts


def test_serving_chart_says_which_kernel_table_priced_the_step():
    from treewy.results import newest_targets

    texts = " ".join(re.findall(r">([^<]+)</(?:text|tspan)>", svg_of(CHARTS["serving panel: curves"])))
    assert f"measured in {newest_targets().name}" in texts


def test_full_table_shows_every_row_and_whole_names():
    from treewy_lab.frames import kernel_targets_frame
    from treewy_lab.tables import full_table

    df = kernel_targets_frame()
    html = full_table(df).data
    assert df.height > 10 and html.split("<tbody>")[1].count("<tr>") == df.height   # polars alone stops at ten rows
    assert all(target.replace("<", "&lt;") in html for target in df["target"])


def _ratios():
    from treewy_lab.frames import PAPER_SOURCE, measured_label

    measured = measured_label("H200", "2026-11-30", "dummy", None)
    sim = paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES).with_columns(
        source=pl.lit("SIMULATED"), ratio=pl.col("ratio") * 1.1)
    meas = paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES).with_columns(source=pl.lit(measured))
    return pl.concat([sim, meas, paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES)]), measured, PAPER_SOURCE


def test_ratio_chart_gives_each_metric_its_own_log_scale_and_no_empty_panel():
    ratios, _, _ = _ratios()
    spec = charts.ratio_chart(ratios, "t").to_dict()
    panels = [p for row in spec["vconcat"] for p in row["hconcat"]]
    assert [p["title"] for p in panels] == list(charts.RATIO_METRICS)          # five, in order: no sixth
    for p in panels:
        assert p["layer"][1]["encoding"]["y"]["scale"]["type"] == "log"
    svg = svg_of(charts.ratio_chart(ratios, "t"))
    ticks = [re.findall(r">([\d.]+)</text>", part) for part in svg.split("TreeWY / store-all")[1:]]
    assert len({tuple(t) for t in ticks if t}) > 1       # the panels' y ticks differ: the scales are their own


def test_ratio_chart_tells_simulated_measured_and_paper_apart():
    ratios, measured, paper = _ratios()
    chart = charts.ratio_chart(ratios, "t")
    enc = chart.to_dict()["vconcat"][0]["hconcat"][0]["layer"][1]["encoding"]
    colours = dict(zip(enc["color"]["scale"]["domain"], enc["color"]["scale"]["range"]))
    dashes = dict(zip(enc["strokeDash"]["scale"]["domain"], enc["strokeDash"]["scale"]["range"]))
    assert len(set(colours.values())) == 3 and not set(colours.values()) & set(charts.MODE_COLORS.range)
    assert len({tuple(d) for d in dashes.values()}) == 3
    texts = re.findall(r">([^<]+)</text>", svg_of(chart))
    assert "solid: SIMULATED" in texts and f"dashed: {measured}" in texts and f"dotted: {paper}" in texts
    with pytest.raises(ValueError, match="a ratio source label starts with one of"):
        charts.ratio_chart(ratios.with_columns(source=pl.lit("simulated")), "t")


def test_serving_curves_legend_names_the_dash_of_each_source():
    from treewy_lab.frames import measured_label, serving_curves_frame
    from treewy.schema import load_measured

    measured = load_measured(DATA_DIR).filter(pl.col("workload") == "generation-short")
    label = measured_label("H200", "2026-11-30", "dummy", None)
    curves = pl.concat([serving_curves_frame(measured, "SIMULATED"), serving_curves_frame(measured, label)])
    texts = re.findall(r">([^<]+)</text>", svg_of(charts.serving_curves_chart(curves, 64, "t")))
    assert "solid: SIMULATED" in texts and f"dashed: {label}" in texts


def test_acceptance_chart_draws_trees_as_circles_and_chains_as_squares():
    for kinds in (["chain", "tree"], ["tree", "chain"]):   # whatever order the frame holds them in
        acc = pl.DataFrame({"drafter": "mtp", "kind": kinds, "shape": ["(1,)", "(2,)"], "N": [1, 2],
                            "acceptance": 2.0, "acceptance_lo": 1.9, "acceptance_hi": 2.1, "source": "x (live)"})
        shape = charts.acceptance_chart(acc, "t").to_dict()["layer"][-1]["encoding"]["shape"]["scale"]
        assert dict(zip(shape["domain"], shape["range"])) == {"tree": "circle", "chain": "square"}


def test_the_offline_chart_bundle_is_built_once_and_read_back(tmp_path):
    """setup()'s offline charts: the first call builds JupyterChart's bundle with vl-convert and keeps it on disk,
    a later one (a new notebook) reads the same bundle back without building it."""
    import altair as alt

    from treewy_lab.setup import enable_offline_charts

    chart = alt.JupyterChart
    saved = chart._esm, chart._is_offline
    try:
        chart._is_offline = False
        path = enable_offline_charts(tmp_path)
        built = chart._esm
        assert chart._is_offline and path.read_text() == built and "vega" in built.lower()
        assert [p.name for p in tmp_path.iterdir()] == [path.name]          # no temporary file left behind
        chart._esm, chart._is_offline = "", False
        assert enable_offline_charts(tmp_path) == path and chart._esm == built and chart._is_offline
    finally:
        chart._esm, chart._is_offline = saved
