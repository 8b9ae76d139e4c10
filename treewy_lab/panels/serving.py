"""Notebooks 05 and 06: the serving simulator behind widgets — where store-all's pool fills and TreeWY keeps
admitting — with measured vLLM rows of exactly the same configuration overlaid."""

from __future__ import annotations

from dataclasses import replace

import ipywidgets as w
import polars as pl

from treewy_lab.charts import MODE_NAMES, ratio_chart, ratio_charts_by_gmu, serving_curves_chart
from treewy_lab.frames import (measured_matching, measured_runs, paper_ratios_frame, ratios_frame,
                               serving_curves_frame)
from treewy_lab.panels.base import Panel
from treewy_lab.setup import RESULTS_DIRS
from treewy.memory import GPU, ModelSpec, ServerConfig
from treewy.schema import load_measured
from treewy.paper import SERVING_RATIOS, SHAPES
from treewy.sim import CONCURRENCIES, knee, ratio_table, simulate, simulate_many
from treewy.sim.calibrated import (H200_DEFAULT, H200_DEFAULT_FIT, H200_VLLM026_DECODE_GRAPHS,
                                   H200_VLLM026_GRAPHS1024_ACCEPTED, H200_VLLM026_GRAPHS1024_LONGSTEPS, fitted)
from treewy.workloads import CATALOGUE

MODELS = ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b", "qwen3-next-80b-a3b"]
GPUS = ["b200", "h200", "h100"]
TREES = {str(s): s for s in SHAPES} | {f"chain {k}": (1,) * k for k in (1, 2, 4, 5, 6)}
#: What the drafts achieve: the paper's acceptance, or none at all (a server with dummy weights accepts nothing).
ACCEPTANCE = {"paper's": None, "none (dummy weights)": 1.0}
#: The measured runs each choice overlays (frames.measured_matching): those whose drafts were accepted at the
#: paper's rate (vLLM's synthetic sampler) or by real weights, or dummy weights' runs that accepted nothing.
MEASURED_ACCEPTANCE = {"paper's": "paper", "none (dummy weights)": "none"}
#: The step's fixed costs: assumed, or fitted to a measured sweep (treewy.sim.calibrated).
STEP_COSTS = {"assumed": ServerConfig(), "fitted: H200, vLLM 0.26, decode graphs": H200_VLLM026_DECODE_GRAPHS,
              "refitted: H200, vLLM 0.26, graphs to 1024, accepted drafts": H200_VLLM026_GRAPHS1024_ACCEPTED,
              "long-step fit: the refit, eager steps priced as measured": H200_VLLM026_GRAPHS1024_LONGSTEPS,
              "long-step fit over gmu 0.6 and 0.75 (the default for accepted drafts)": H200_DEFAULT}
DUMMY_NOTE = ("dummy weights: acceptance is meaningless there; memory, admission, preemptions, TTFT and throughput "
              "are real")


class ServingPanel(Panel):
    title = "Serving simulator (SIMULATED): store-all vs TreeWY; change the settings, then press Run"

    def __init__(self, measured_dirs=RESULTS_DIRS, concurrency=CONCURRENCIES, **values):
        super().__init__()
        self.measured_dirs = measured_dirs
        self.controls = {
            "model": w.Dropdown(options=MODELS, value="qwen3.5-35b-a3b", description="model"),
            "gpu": w.Dropdown(options=GPUS, value="b200", description="GPU"),
            "tp": w.Dropdown(options=[1, 2, 4, 8], value=1, description="TP"),
            "gmu": w.FloatSlider(value=0.6, min=0.3, max=0.95, step=0.05, description="gpu mem util",
                                 continuous_update=False, style={"description_width": "initial"}),
            "workload": w.Dropdown(options=list(CATALOGUE), value="generation-heavy", description="workload"),
            "tree": w.Dropdown(options=list(TREES), value="(1, 1, 1)", description="draft tree"),
            "max_num_seqs": w.Dropdown(options=[256, 1024], value=1024, description="max seqs"),
            "acceptance": w.Dropdown(options=list(ACCEPTANCE), value="paper's", description="acceptance"),
            "step_costs": w.Dropdown(options=list(STEP_COSTS), value="assumed", description="fixed costs"),
            "concurrency": w.SelectionRangeSlider(options=list(concurrency), index=(0, len(concurrency) - 1),
                                                  description="concurrency", continuous_update=False),
        }
        self.run_button = w.Button(description="Run", icon="play", button_style="primary")
        self.progress = w.IntProgress(min=0, max=1, description="points")
        self.wait_for_run()  # a simulation takes seconds
        self.set(**values).first_run()

    def key(self) -> tuple:
        return tuple(c.value for c in self.controls.values())

    def points(self) -> list[int]:
        lo, hi = self.controls["concurrency"].value
        return [c for c in self.controls["concurrency"].options if lo <= c <= hi]

    def _simulate(self) -> pl.DataFrame:
        v = {k: c.value for k, c in self.controls.items()}
        points = self.points()
        self.progress.max, self.progress.value = 2 * len(points), 0
        self.status.value = f"simulating both modes at {len(points)} concurrencies…"

        def on_point(done: int, total: int) -> None:
            self.progress.value = done
            self.status.value = f"simulated {done} of {total} points…"

        return simulate(model=v["model"], gpu=v["gpu"], tp=v["tp"], gmu=v["gmu"], mode=["store_all", "reconstruct"],
                        tree=TREES[v["tree"]], workload=v["workload"], concurrency=points,
                        acceptance=ACCEPTANCE[v["acceptance"]],
                        server=replace(STEP_COSTS[v["step_costs"]], max_num_seqs=v["max_num_seqs"]), on_point=on_point)

    def update(self) -> None:
        v = {k: c.value for k, c in self.controls.items()}
        try:  # a configuration that cannot serve (weights do not fit, ...) is an answer, not a crash
            sim = self.cached(self.key(), self._simulate)
        except ValueError as e:
            self.status.value = f"<span style='color:#b00020'>{e}</span>"
            return
        self.frames["simulated"] = sim
        curves = serving_curves_frame(sim, "SIMULATED")
        measured = measured_matching(load_measured(*self.measured_dirs), model=v["model"], gpu=v["gpu"], tp=v["tp"],
                                     gmu=v["gmu"], tree=str(TREES[v["tree"]]), workload=v["workload"],
                                     max_num_seqs=v["max_num_seqs"],
                                     acceptance=MEASURED_ACCEPTANCE[v["acceptance"]])
        self.frames["measured"] = measured
        runs = list(measured_runs(measured))
        for label, part in runs:
            curves = pl.concat([curves, serving_curves_frame(part, label)])
        self.frames["curves"] = curves
        k = knee(sim)
        title = [f"SIMULATED · {v['model']} · {v['gpu'].upper()} TP{v['tp']} · gmu {v['gmu']:.2f} · {v['workload']}",
                 f"tree {v['tree']} · max seqs {v['max_num_seqs']} · {v['acceptance']} acceptance"]
        notes = [cost_note(sim), f"fixed step costs: {v['step_costs']}"]
        if "dummy" in measured["weights"].to_list():
            notes.append(f"measured with {DUMMY_NOTE}")
        self.show_chart("curves", serving_curves_chart(curves, k, title, notes))
        ratios = pl.concat([ratios_frame(ratio_table(sim), "SIMULATED"),
                            *(ratios_frame(ratio_table(part), label) for label, part in runs)])
        if paper_applies(v["model"], v["tp"], v["gmu"], v["tree"]):
            ratios = pl.concat([ratios, paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES)])
        self.frames["ratios"] = ratios
        self.show_chart("ratios", ratio_chart(ratios, f"TreeWY / store-all, {v['workload']}: simulated, measured "
                                                      "where it matches, the paper where it applies",
                                              [title[0], "each panel has its own (log) scale"]))
        model, gpu = ModelSpec.from_name(v["model"]), GPU.from_name(v["gpu"])
        admitted = sim.group_by("mode").agg(pl.col("peak_running").max()).sort("mode")
        self.status.value = (
            f"simulated {sim.height} points · store-all pool full from concurrency {k if k else '— (never)'} · "
            f"peak admitted: " + ", ".join(f"{MODE_NAMES[m]} {n}" for m, n in admitted.iter_rows())
            + f" · {model.name} weights {model.weight_bytes(v['tp']) / 2**30:.1f} GiB per GPU on {gpu.name}")


def cost_note(sim: pl.DataFrame) -> str:
    """Which kernel table priced TreeWY's GDN step in a simulated frame (its ``cost_source`` column)."""
    sources = set(sim.filter(pl.col("mode") == "reconstruct")["cost_source"].to_list())
    measured = sorted(s.removeprefix("measured:") for s in sources if s.startswith("measured:"))
    if measured:
        return (f"GDN step: TreeWY / store-all kernel ratio measured in {', '.join(measured)}; "
                "store-all priced by the bytes it moves")
    return "GDN step: both modes priced by the bytes they move (no measured kernel rows for this tree)"


def paper_applies(model: str, tp: int, gmu: float, tree: str) -> bool:
    """The paper's serving ratios (treewy.paper.SERVING_RATIOS) are the 35B at TP1, gmu 0.6, depth-3 chain."""
    return model == "qwen3.5-35b-a3b" and tp == 1 and abs(gmu - 0.6) < 0.005 and tree == "(1, 1, 1)"


def _gpu_key(device: str) -> str | None:
    """The simulator's GPU key named by a measured device ("NVIDIA H200" -> "h200"), or None."""
    words = device.lower().replace("-", " ").split()
    return next((g for g in GPUS if g in words), None)


def captured_graphs(rows: pl.DataFrame) -> dict:
    """{"graph_max_tokens": N} where a measured run's rows record the one CUDA graph size its server captured up to
    (cudagraph_max_size), so its simulated twin runs eagerly where the server did; {} where they record none."""
    if "cudagraph_max_size" not in rows.columns:
        return {}
    sizes = rows["cudagraph_max_size"].drop_nulls().unique().to_list()
    return {"graph_max_tokens": int(sizes[0])} if len(sizes) == 1 else {}


def h200_twin_fit(accepted: float | None) -> str:
    """The server fit (``treewy.sim.calibrated``) that prices an H200 run's simulated twin: the fit made on runs like
    it. Runs whose drafts were accepted (synthetic or real acceptance, more than 1.05 tokens per step) take
    ``H200_DEFAULT_FIT``; runs on dummy weights that accepted nothing, the fit made on those (2026-11-30)."""
    return H200_DEFAULT_FIT if accepted is not None and accepted > 1.05 else "H200_VLLM026_DECODE_GRAPHS"


#: A simulated ratio and a measured one "part" where one is more than this many times the other.
PART_FACTOR = 1.5


def measured_ratio_figure(measured_dirs=RESULTS_DIRS, on_point=None) -> dict:
    """The measured TreeWY / store-all ratios of every measured run on disk, one chart per gmu, over the simulated
    twin of each run (same model, GPU, TP, gmu, tree, max seqs, workloads and concurrencies; acceptance as the run
    had it; the H200 fit of the fixed costs on an H200, with the CUDA graphs the run's server captured) and the
    paper's where they apply. Ratios are the geomean
    over the run's workloads. Returns {"chart", "ratios", "parting"}: parting lists each (gmu, metric,
    concurrency) where a run's simulated and measured ratios differ by more than PART_FACTOR either way.
    on_point(done, total): progress over the simulated points."""
    measured = load_measured(*measured_dirs).filter(
        pl.col("concurrency").is_not_null() & (pl.col("failed").fill_null(0) == 0) & pl.col("error").is_null())
    keys = ["model", "gpu", "tp", "gmu", "tree", "max_num_seqs"]
    runs = [(cfg, label, part) for cfg, rows in measured.group_by(*keys, maintain_order=True)
            for label, part in measured_runs(rows)]
    twins, calls = [], []   # every run's twin in one batch across the simulator's workers
    for (model, gpu, tp, gmu, tree, seqs), label, part in runs:
        key = _gpu_key(gpu)
        if key is None:
            continue   # no simulator preset for this GPU: nothing to compare with
        widths = tuple(int(x) for x in tree.strip("()").split(","))
        accepted = part["acceptance_length"].mean() if part["acceptance_length"].is_not_null().any() else None
        fit = h200_twin_fit(accepted) if key == "h200" else None
        server = replace(fitted(fit) if fit else ServerConfig(),
                         max_num_seqs=seqs or ServerConfig().max_num_seqs, **captured_graphs(part))
        workloads = part["workload"].unique(maintain_order=True)
        twins.append(((model, gpu, tp, gmu, tree, seqs), label, part, fit, len(workloads)))
        calls += [dict(model=model, gpu=key, tp=tp, gmu=gmu, mode=["store_all", "reconstruct"], tree=widths,
                       workload=workload, concurrency=sorted(part.filter(workload=workload)["concurrency"].unique()),
                       acceptance=accepted, server=server) for workload in workloads]
    frames, parting, notes = [], [], {}
    sims_of_runs = iter(simulate_many(calls, on_point=on_point))
    for (model, gpu, tp, gmu, tree, seqs), label, part, fit, n_workloads in twins:
        sims = [next(sims_of_runs) for _ in range(n_workloads)]
        sim_label = (f"SIMULATED twin of the {gpu} run of {part['date'][0]} (same settings, "
                     f"{f'fixed costs {fit}' if fit else 'assumed fixed costs'})")
        pair = pl.concat([ratios_frame(ratio_table(pl.concat(sims)), sim_label),
                          ratios_frame(ratio_table(part), label)])
        both = pair.pivot(on="source", index=["concurrency", "metric"], values="ratio").drop_nulls()
        parting.append(both.select("concurrency", "metric", simulated=pl.col(sim_label), measured=pl.col(label))
                       .with_columns(gmu=pl.lit(gmu), run=pl.lit(label),
                                     factor=(pl.col("simulated") / pl.col("measured")))
                       .filter((pl.col("factor") > PART_FACTOR) | (pl.col("factor") < 1 / PART_FACTOR)))
        if paper_applies(model, tp, gmu, tree):
            pair = pl.concat([pair, paper_ratios_frame(SERVING_RATIOS, CONCURRENCIES)]).unique(maintain_order=True)
        frames.append(pair.with_columns(gmu=pl.lit(gmu)))
        notes.setdefault(gmu, []).append(
            f"{model} · {gpu} TP{tp} · tree {tree} · max seqs {seqs} · workloads "
            + ", ".join(part["workload"].unique(maintain_order=True)) + " (geomean)")
    if not frames:
        return {"chart": None, "ratios": pl.DataFrame(), "parting": pl.DataFrame()}
    ratios = pl.concat(frames).unique(maintain_order=True)
    return {"chart": ratio_charts_by_gmu(ratios, "TreeWY / store-all: measured on vLLM vs simulated", notes),
            "ratios": ratios,
            "parting": pl.concat(parting).select("gmu", "metric", "concurrency", "simulated", "measured", "factor",
                                                 "run").sort("gmu", "metric", "concurrency")}
