"""Chart builders: pure functions from tidy polars frames to altair charts. No I/O, no globals."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

MODE_COLORS = alt.Scale(domain=["store_all", "reconstruct"], range=["#d95f02", "#1b9e77"])
#: Commit modes in prose: the data keeps the code identifiers, legends and axes say "store-all" and "TreeWY".
MODE_NAMES = {"store_all": "store-all", "reconstruct": "TreeWY"}
MODE_LABELS = "datum.label == 'reconstruct' ? 'TreeWY' : datum.label == 'store_all' ? 'store-all' : datum.label"
#: No chart is wider than this (px): JupyterLab's output area on a laptop screen with the file browser open.
MAX_WIDTH = 760


def tree_chart(nodes: pl.DataFrame, edges: pl.DataFrame, title: str = "draft tree") -> alt.LayerChart:
    """Nodes by depth (downwards), edges from parent to child."""
    width = max(160, 18 * (nodes["x"].max() + 1))
    y = alt.Y("depth:Q", scale=alt.Scale(reverse=True), axis=alt.Axis(tickMinStep=1, title="depth"))
    rules = alt.Chart(edges).mark_rule(color="#999").encode(
        x=alt.X("x:Q", axis=None), y=alt.Y("y:Q", scale=alt.Scale(reverse=True)), x2="x2:Q", y2="y2:Q")
    dots = alt.Chart(nodes).mark_circle(size=220, opacity=1).encode(
        x=alt.X("x:Q", axis=None), y=y,
        color=alt.Color("kind:N", scale=alt.Scale(domain=["root", "draft"], range=["#444", "#1b9e77"]), legend=None),
        tooltip=["node:Q", "parent:Q", "depth:Q"])
    labels = alt.Chart(nodes).mark_text(color="white", fontSize=9).encode(x="x:Q", y=y, text="node:Q")
    return (rules + dots + labels).properties(width=min(width, MAX_WIDTH - 60), height=60 * (nodes["depth"].max() + 1),
                                              title=title)


def mask_chart(mask: pl.DataFrame, title: str = "ancestor mask: row t sees column i") -> alt.Chart:
    """Heatmap of the true cells of a mask frame (t, i, relation); everything else is blank."""
    T = mask["t"].max() + 1
    size = min(360, max(120, 9 * T))
    axis = alt.Axis(labels=T <= 40, ticks=T <= 40)
    return alt.Chart(mask).mark_rect().encode(
        x=alt.X("i:O", axis=axis, scale=alt.Scale(domain=list(range(T))), title="i"),
        y=alt.Y("t:O", axis=axis, scale=alt.Scale(domain=list(range(T))), title="t"),
        color=alt.Color("relation:N", scale=alt.Scale(domain=["self", "ancestor"], range=["#444", "#1b9e77"])),
        tooltip=["t:O", "i:O", "relation:N"],
    ).properties(width=size, height=size, title=title)


def matrix_chart(m: pl.DataFrame, title: str) -> alt.Chart:
    T = m["t"].max() + 1
    size = min(300, max(120, 14 * T))
    return alt.Chart(m).mark_rect().encode(
        x="i:O", y="t:O", color=alt.Color("value:Q", scale=alt.Scale(scheme="blueorange", domainMid=0)),
        tooltip=["t:O", "i:O", alt.Tooltip("value:Q", format=".3g")],
    ).properties(width=size, height=size, title=title)


def vectors_chart(vectors: pl.DataFrame, title: str) -> alt.Chart:
    return alt.Chart(vectors).mark_line(point=True).encode(
        x=alt.X("channel:O", title="value channel"), y=alt.Y("value:Q", title=None),
        color=alt.Color("series:N", title=None), tooltip=["series:N", "channel:O", alt.Tooltip("value:Q", format=".3f")],
    ).properties(width=360, height=200, title=title)


def blocks_chart(blocks: pl.DataFrame, title: str = "GDN state blocks per request per layer") -> alt.LayerChart:
    base = alt.Chart(blocks).encode(y=alt.Y("mode:N", title=None, sort=["store_all", "reconstruct"],
                                            axis=alt.Axis(labelExpr=MODE_LABELS)),
                                    x=alt.X("blocks:Q", title="state blocks"))
    bars = base.mark_bar().encode(color=alt.Color("mode:N", scale=MODE_COLORS, legend=None))
    text = base.mark_text(align="left", dx=4).encode(text="blocks:Q")
    return (bars + text).properties(width=260, height=70, title=title)


def blocks_vs_n_chart(costs: pl.DataFrame, title: str = "state blocks per request per GDN layer") -> alt.LayerChart:
    base = alt.Chart(costs).encode(x=alt.X("N:Q", title="draft nodes N"), y=alt.Y("blocks:Q", title="state blocks"),
                                   color=alt.Color("mode:N", scale=MODE_COLORS, title=None,
                                                   legend=alt.Legend(labelExpr=MODE_LABELS)))
    return (base.mark_line() + base.mark_point(filled=True).encode(tooltip=["shape:N", "N:Q", "mode:N", "blocks:Q"])
            ).properties(width=320, height=200, title=title)


SERVING_METRICS = {"peak_kv_usage": "peak KV-pool usage", "peak_running": "admitted requests (peak running)",
                   "output_throughput": "output throughput (tok/s)", "p99_ttft_ms": "p99 TTFT (ms)"}


def _dash_scale(sources) -> alt.Scale:
    """Dashes by role (``ROLE_STYLES``) for the curves' ``source`` ("SIMULATED", "vLLM measured ...")."""
    return _role_scales(sources)[1]


def serving_curves_chart(curves: pl.DataFrame, knee: int | None, title: str | list[str],
                         notes: Sequence[str] = ()) -> alt.VConcatChart:
    """Four panels against offered concurrency, one line per (mode, source); the knee as a rule; legends below.

    curves: long frame (concurrency, mode, source, metric, value); ``source`` says simulated or measured;
    ``title``: one line or several; ``notes``: lines under it (which kernel table priced the step, what the
    measured rows are)."""
    charts = []
    for metric, label in SERVING_METRICS.items():
        data = curves.filter(pl.col("metric") == metric)
        base = alt.Chart(data).encode(
            x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrent requests"),
            y=alt.Y("value:Q", title=label, scale=alt.Scale(type="log") if metric == "p99_ttft_ms" else alt.Scale()),
            color=alt.Color("mode:N", scale=MODE_COLORS, title="mode",
                            legend=alt.Legend(labelExpr=MODE_LABELS, orient="bottom")),
            strokeDash=alt.StrokeDash("source:N", title="source", scale=_dash_scale(data["source"].to_list()),
                                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0,
                                                        symbolType="stroke", symbolStrokeWidth=2, symbolSize=400,
                                                        symbolStrokeColor="#444", labelExpr=_DASH_LABEL)),
            tooltip=["source:N", "mode:N", "concurrency:Q", alt.Tooltip("value:Q", format=",.3g")],
        )
        layer = base.mark_line() + base.mark_point(filled=True, size=40)
        if knee is not None:
            rule = alt.Chart(pl.DataFrame({"knee": [knee], "label": [f"store-all pool full at {knee}"]}))
            layer = layer + rule.mark_rule(color="#666", strokeDash=[2, 2]).encode(x="knee:Q", tooltip=["label:N"])
        charts.append(layer.properties(width=280, height=160))
    return alt.vconcat(alt.hconcat(*charts[:2]), alt.hconcat(*charts[2:])).properties(
        title=alt.Title(title, subtitle=list(notes)))


#: Ratio charts: the source's role (its label's start) fixes its colour and dash, whatever else is drawn. No role
#: takes the modes' colours (store-all orange, TreeWY green): these lines are ratios of the two.
ROLE_STYLES = {"SIMULATED": (["#7570b3", "#a6a1d6"], [1, 0], "solid"),
               "vLLM measured": (["#222222", "#e7298a", "#a6761d"], [6, 3], "dashed"),
               "paper": (["#999999"], [2, 2], "dotted")}
RATIO_METRICS = ("output throughput", "peak KV usage reduction", "p99 TTFT speedup", "TPOT speedup",
                 "peak admitted requests")


def role_of(source: str) -> str:
    """The role of a ratio source label: its start, one of ROLE_STYLES (a label that fits none is refused)."""
    for role in ROLE_STYLES:
        if source.startswith(role):
            return role
    raise ValueError(f"source = {source!r}: a ratio source label starts with one of {list(ROLE_STYLES)}")


def _role_scales(sources) -> tuple[alt.Scale, alt.Scale]:
    domain, colors, dashes = [], [], []
    for role, (palette, dash, _) in ROLE_STYLES.items():
        mine = sorted(s for s in set(sources) if role_of(s) == role)
        domain += mine
        colors += [palette[i % len(palette)] for i in range(len(mine))]
        dashes += [dash] * len(mine)
    return alt.Scale(domain=domain, range=colors), alt.Scale(domain=domain, range=dashes)


#: The legend spells out each line's dash: colour alone does not tell a printed page's lines apart.
_DASH_LABEL = "(" + " : ".join(f"indexof(datum.label, '{role}') == 0 ? '{name}: '" for role, (_, _, name) in
                               ROLE_STYLES.items()) + " : '') + datum.label"


def ratio_chart(ratios: pl.DataFrame, title: str | list[str], subtitle: Sequence[str] = ()) -> alt.VConcatChart:
    """TreeWY / store-all against concurrency, one small chart per metric in RATIO_METRICS order (three a row),
    each with its own log y scale (a TTFT gain of 100 and a TPOT ratio of 1.02 both stay readable); one line per
    source, coloured and dashed by role (``ROLE_STYLES``: simulated solid, measured dashed, the paper dotted), the
    legend below saying which is which. ratios: (concurrency, metric, ratio, source)."""
    color, dash = _role_scales(ratios["source"].to_list())
    legend = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title="> 1 favours TreeWY",
                        symbolType="stroke", symbolStrokeWidth=2, symbolSize=400, labelExpr=_DASH_LABEL)
    data = ratios.filter(pl.col("ratio").is_not_null() & (pl.col("ratio") > 0))   # a log scale has no 0
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrent requests",
              axis=alt.Axis(values=sorted(set(data["concurrency"].to_list()))))   # every point labelled, 256 too
    charts = []
    for metric in (m for m in RATIO_METRICS if m in set(data["metric"])):
        part = data.filter(pl.col("metric") == metric)
        line = alt.Chart(part).mark_line(point=True, strokeWidth=1.5).encode(
            x=x, y=alt.Y("ratio:Q", title="TreeWY / store-all", scale=alt.Scale(type="log", nice=False, padding=8)),
            color=alt.Color("source:N", scale=color, legend=legend),
            strokeDash=alt.StrokeDash("source:N", scale=dash, legend=legend),
            tooltip=["source:N", "metric:N", "concurrency:Q", alt.Tooltip("ratio:Q", format=".3g")])
        one = alt.Chart(part).mark_rule(color="#bbb").encode(y=alt.datum(1.0))
        charts.append((one + line).properties(width=170, height=120, title=metric))
    rows = [alt.hconcat(*charts[i:i + 3]) for i in range(0, len(charts), 3)]
    return alt.vconcat(*rows).properties(title=alt.Title(title, subtitle=list(subtitle)))


def ratio_charts_by_gmu(ratios: pl.DataFrame, title: str, notes: dict[float, Sequence[str]] | None = None
                        ) -> alt.VConcatChart:
    """One ``ratio_chart`` per gpu-memory-utilization in ratios' ``gmu`` column, lowest first; ``notes[gmu]``:
    lines under that chart's title (the configuration, which rows are measured)."""
    charts = [ratio_chart(part.drop("gmu"), f"{title} · gmu {gmu:.2f}", (notes or {}).get(gmu, ()))
              for (gmu,), part in ratios.sort("gmu").group_by("gmu", maintain_order=True)]
    return alt.vconcat(*charts, spacing=30)


PROVIDER_COLORS = alt.Scale(domain=["treewy", "store_all", "fla"], range=["#1b9e77", "#d95f02", "#7570b3"])


def node_errors_chart(errors: pl.DataFrame, title: str) -> alt.LayerChart:
    """Relative error per node (log scale) against its tolerance."""
    base = alt.Chart(errors).encode(x=alt.X("node:O", title="node"))
    points = base.mark_point(filled=True).encode(
        y=alt.Y("error:Q", scale=alt.Scale(type="log"), title="relative RMS error vs fp64"),
        color=alt.Color("quantity:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["node:O", "depth:Q", "quantity:N", alt.Tooltip("error:Q", format=".2e")])
    tol = base.mark_tick(color="#b00020", thickness=1).encode(y="tol:Q", tooltip=[alt.Tooltip("tol:Q", format=".1e")])
    return (points + tol).properties(width=min(MAX_WIDTH - 80, max(220, 16 * errors["node"].n_unique())), height=200,
                                     title=title)


def drift_chart(history: pl.DataFrame, tol: float, title: str) -> alt.LayerChart:
    """Committed-state error (log scale) after each checkpoint of folded steps, with the tolerance rule."""
    base = alt.Chart(history).encode(x=alt.X("step:Q", title="folded steps"))
    line = base.mark_line(point=True, color="#1b9e77").encode(
        y=alt.Y("state_err:Q", scale=alt.Scale(type="log", domain=[1e-9, 10 * tol]),
                title="state error vs fp64 recurrence"),
        tooltip=["step:Q", alt.Tooltip("state_err:Q", format=".2e")])
    rule = alt.Chart(pl.DataFrame({"tol": [tol]})).mark_rule(color="#b00020", strokeDash=[4, 3]).encode(y="tol:Q")
    return (line + rule).properties(width=420, height=200, title=title)


def kernel_timing_chart(results: pl.DataFrame, title: str) -> alt.LayerChart:
    """Microseconds per provider and tree (ordered by nodes), with the roofline as a dashed line."""
    order = results.sort("num_nodes")["tree"].unique(maintain_order=True).to_list()
    x = alt.X("tree:N", sort=order, title="draft tree")
    bars = alt.Chart(results).mark_point(filled=True, size=60).encode(
        x=x, y=alt.Y("us:Q", scale=alt.Scale(type="log"), title="µs per layer step"),
        color=alt.Color("provider:N", scale=PROVIDER_COLORS, title=None,
                        legend=alt.Legend(labelExpr=MODE_LABELS.replace("reconstruct", "treewy"))),
        tooltip=["provider:N", "kernel:N", "tree:N", "B:Q", alt.Tooltip("us:Q", format=",.1f"),
                 alt.Tooltip("gbps:Q", format=",.0f"), alt.Tooltip("roofline_us:Q", format=",.1f"), "fits:N"])
    roof = alt.Chart(results.filter(pl.col("provider") == "treewy")).mark_line(color="#444", strokeDash=[3, 3]).encode(
        x=x, y="roofline_us:Q", tooltip=[alt.Tooltip("roofline_us:Q", format=",.1f", title="roofline µs")])
    return (roof + bars).properties(width=520, height=240, title=title)


SOURCE_PALETTES = {"(live)": ["#1b9e77", "#66c2a5"], "(committed)": ["#7570b3", "#a6a1d6", "#4b4785"],
                   "": ["#d95f02", "#e6ab02", "#666666"]}
INTERVAL_NOTE = "bars: 95 % interval of the mean over prompts (normal approximation)"


def source_scale(sources) -> alt.Scale:
    """Colours by role, so a series keeps its colour whichever others are shown: live runs green, committed
    runs purple, anything else (the paper) orange."""
    domain, colors = [], []
    for suffix, palette in SOURCE_PALETTES.items():
        mine = sorted(s for s in set(sources) if s not in domain and s.endswith(suffix))
        domain += mine
        colors += [palette[i % len(palette)] for i in range(len(mine))]
    return alt.Scale(domain=domain, range=colors)


def source_legend() -> alt.Legend:
    """Below the chart, one source per line, labels never cut."""
    return alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title=None)


def acceptance_chart(acc: pl.DataFrame, title: str) -> alt.LayerChart:
    """Acceptance length per step against draft nodes N, one colour per source (by role, see
    ``source_scale``), 95 % intervals as rules."""
    color = alt.Color("source:N", scale=source_scale(acc["source"].to_list()), legend=source_legend())
    base = alt.Chart(acc).encode(x=alt.X("N:Q", title="draft nodes N"), color=color)
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("acceptance:Q", title="tokens per step (acceptance length)", scale=alt.Scale(zero=False)),
        shape=alt.Shape("kind:N", title=None, scale=alt.Scale(domain=["tree", "chain"], range=["circle", "square"])),
        tooltip=["source:N", "drafter:N", "shape:N", "N:Q", alt.Tooltip("acceptance:Q", format=".2f"),
                 alt.Tooltip("acceptance_lo:Q", format=".2f"), alt.Tooltip("acceptance_hi:Q", format=".2f")])
    lines = base.mark_line(opacity=0.5).encode(y="acceptance:Q", detail="kind:N")
    bars = base.mark_rule().encode(y="acceptance_lo:Q", y2="acceptance_hi:Q")
    return (lines + bars + points).properties(
        width=380, height=240, title=alt.Title(title, subtitle=INTERVAL_NOTE + "; the paper reports none"))


RULE_COLORS = alt.Scale(domain=["match", "rrs", "rrs_wor"], range=["#1b9e77", "#d95f02", "#7570b3"])


def temperature_chart(acc: pl.DataFrame, title: str) -> alt.FacetChart:
    """Acceptance length against temperature, one colour per acceptance rule, one panel per tree shape;
    ``source`` as the stroke (committed solid, live dashed); 95 % intervals as rules."""
    base = alt.Chart().encode(
        x=alt.X("temperature:Q", title="temperature (0 = greedy)"),
        color=alt.Color("rule:N", scale=RULE_COLORS, legend=alt.Legend(orient="bottom", title="rule")),
        strokeDash=alt.StrokeDash("source:N", legend=alt.Legend(
            orient="bottom", direction="vertical", labelLimit=0, title=None, symbolOpacity=0,
            labelExpr="(indexof(datum.label, '(live)') >= 0 ? 'dashed: ' : 'solid: ') + datum.label"),
                                  sort=sorted(acc["source"].unique().to_list(), key=lambda s: s.endswith("(live)"))))
    y = alt.Y("acceptance:Q", title="tokens per step (acceptance length)", scale=alt.Scale(zero=False))
    lines = base.mark_line(point=True).encode(
        y=y, tooltip=["source:N", "drafter:N", "shape:N", "rule:N", "temperature:Q",
                      alt.Tooltip("acceptance:Q", format=".2f"), alt.Tooltip("acceptance_lo:Q", format=".2f"),
                      alt.Tooltip("acceptance_hi:Q", format=".2f")])
    bars = base.mark_rule(opacity=0.6).encode(y="acceptance_lo:Q", y2="acceptance_hi:Q")
    return alt.layer(lines, bars, data=acc).properties(width=260, height=220).facet(
        column=alt.Column("shape:N", title="tree shape")).properties(
        title=alt.Title(title, subtitle=INTERVAL_NOTE))


TREE_COLORS = ["#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]


def width_chart(frame: pl.DataFrame, metrics: dict[str, str], title: str | list[str],
                notes: Sequence[str] = ()) -> alt.VConcatChart:
    """One row per commit mode, one small chart per metric (``metrics``: column -> title, each with its own y
    scale), against concurrency (log 2); one colour per tree, simulated solid and measured dashed (``ROLE_STYLES``
    by the ``source`` label). frame: long (source, mode, tree, concurrency, metric, value)."""
    trees = sorted(set(frame["tree"].to_list()), key=lambda t: (len(t), t))
    color = alt.Color("tree:N", scale=alt.Scale(domain=trees, range=TREE_COLORS[:len(trees)]), title="tree",
                      legend=alt.Legend(orient="bottom"))
    dash = alt.StrokeDash("source:N", scale=_dash_scale(frame["source"].to_list()), title="source",
                          legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0, symbolType="stroke",
                                            symbolStrokeWidth=2, symbolSize=400, labelExpr=_DASH_LABEL))
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrent requests",
              axis=alt.Axis(values=sorted(set(frame["concurrency"].to_list()))))
    rows = []
    for mode in ("store_all", "reconstruct"):
        charts = []
        for metric, label in metrics.items():
            part = frame.filter((pl.col("mode") == mode) & (pl.col("metric") == metric))
            line = alt.Chart(part).mark_line(point=True, strokeWidth=1.5).encode(
                x=x, y=alt.Y("value:Q", title=label, scale=alt.Scale(zero=False)), color=color, strokeDash=dash,
                tooltip=["source:N", "tree:N", "concurrency:Q", alt.Tooltip("value:Q", format=".3g")])
            charts.append(line.properties(width=140, height=120, title=f"{MODE_NAMES[mode]}: {label}"))
        rows.append(alt.hconcat(*charts))
    return alt.vconcat(*rows).properties(title=alt.Title(title, subtitle=list(notes)))
