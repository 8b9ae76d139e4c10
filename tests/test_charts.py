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
