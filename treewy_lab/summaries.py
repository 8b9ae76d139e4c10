"""What a notebook's "What we saw" rests on, computed from the frame shown beside it: the figures the prose would
otherwise type by hand."""

from __future__ import annotations

import polars as pl


def temperature_summary(sweep: pl.DataFrame) -> pl.DataFrame:
    """Per (drafter, shape, rule) of a temperature sweep: tokens per step at temperature 0 (greedy), at the
    temperature where it peaks, its lowest at a temperature above 0, at the hottest temperature, and whether it ever rose above greedy by more than
    its 95 % interval allows (the peak's lower bound above greedy's upper bound)."""
    keys = ["drafter", "shape", "rule"]
    hottest = sweep["temperature"].max()
    greedy = sweep.filter(pl.col("temperature") == 0).select(   # one greedy run per (drafter, shape), any rule
        "drafter", "shape", greedy="acceptance", greedy_hi="acceptance_hi").unique(["drafter", "shape"])
    hot = sweep.filter(pl.col("temperature") == hottest).select(*keys, hottest="acceptance")
    peak = (sweep.sort("acceptance", descending=True).group_by(keys, maintain_order=True).first()
            .select(*keys, peak="acceptance", peak_lo="acceptance_lo", at_temperature="temperature"))
    low = (sweep.filter(pl.col("temperature") > 0).sort("acceptance").group_by(keys, maintain_order=True).first()
           .select(*keys, lowest_sampled="acceptance", lowest_at="temperature"))
    return (peak.join(greedy, on=["drafter", "shape"]).join(low, on=keys).join(hot, on=keys)
            .with_columns(rise_beyond_interval=pl.col("peak_lo") > pl.col("greedy_hi"),
                          hottest_temperature=pl.lit(hottest))
            .select(*keys, "greedy", "peak", "at_temperature", "lowest_sampled", "lowest_at", "hottest",
                    "hottest_temperature", "rise_beyond_interval")
            .with_columns(pl.col("greedy", "peak", "lowest_sampled", "hottest").round(2))
            .sort(keys))


def simulated_sweep_summary(ratios: pl.DataFrame) -> str:
    """One sentence from treewy.sim.ratio_table's frame: below the knee (every concurrency at which TreeWY admits
    no more requests than store-all) the range of the TPOT and KV-usage ratios; past it the admitted and p99 TTFT
    ratios at each point."""
    below = ratios.filter(pl.col("peak admitted requests").round(2) <= 1.0)
    above = ratios.filter(pl.col("peak admitted requests").round(2) > 1.0)

    def span(df, metric):
        lo, hi = df[metric].min(), df[metric].max()
        return f"{lo:.2f}-{hi:.2f}"

    text = (f"SIMULATED. Below the knee (concurrency {', '.join(map(str, below['concurrency']))}): TPOT ratio "
            f"{span(below, 'TPOT speedup')}, peak KV usage {span(below, 'peak KV usage reduction')}x lower.")
    if above.height:
        text += " Past it: " + "; ".join(
            f"at {r['concurrency']} TreeWY admits {r['peak admitted requests']:.2f}x the requests, p99 TTFT "
            f"{r['p99 TTFT speedup']:.2f}x lower" for r in above.iter_rows(named=True)) + "."
    return text


def parting_summary(parting: pl.DataFrame, factor: float) -> str:
    """One sentence over treewy_lab.panels.serving.measured_ratio_figure's ``parting`` frame."""
    if parting.is_empty():
        return f"Every simulated ratio is within {factor}x of the measured one."
    return (f"Simulated and measured ratios part by more than {factor}x at: "
            + "; ".join(f"gmu {r['gmu']:.2f}, {r['metric']} at {r['concurrency']} (simulated {r['simulated']:.3g}, "
                        f"measured {r['measured']:.3g})" for r in parting.iter_rows(named=True)) + ".")
