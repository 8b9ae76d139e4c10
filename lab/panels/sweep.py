"""Notebook 04: tree width against acceptance length, swept live on the tiny checkpoint."""

from __future__ import annotations

import ipywidgets as w
import polars as pl

from lab.charts import acceptance_chart, blocks_vs_n_chart
from lab.frames import acceptance_frame, paper_acceptance_frame
from lab.panels.base import Panel
from lab.setup import RESULTS_DIRS
from treewy.env import default_device, small
from treewy.paper import ACCEPTANCE, SHAPES
from treewy.tree import DraftTree

N_OF = {DraftTree.from_widths(s).num_drafts: s for s in SHAPES}


class SweepPanel(Panel):
    """Greedy tree speculation on the tiny checkpoint for the paper's shapes up to a size, and chains,
    over held-out prompts; plotted beside the committed H200 sweep and the paper's Table 2."""

    title = "Acceptance sweep on the tiny checkpoint (live), beside the committed H200 sweep and the paper"

    def __init__(self, **values):
        super().__init__()
        few = small()
        self.controls = {
            "drafter": w.Dropdown(options=["mtp", "ngram"], value="mtp", description="drafter"),
            "largest": w.SelectionSlider(options=list(N_OF), value=14 if few else 39, description="trees up to N",
                                         continuous_update=False, style={"description_width": "initial"}),
            "chains": w.IntRangeSlider(value=(1, 3) if few else (1, 6), min=1, max=6, description="chains k",
                                       continuous_update=False),
            "prompts": w.IntSlider(value=2 if few else 16, min=1, max=32, description="prompts",
                                   continuous_update=False),
            "tokens": w.IntSlider(value=16 if few else 48, min=8, max=128, step=8, description="new tokens",
                                  continuous_update=False),
        }
        self.run_button = w.Button(description="Run", icon="play", button_style="primary")
        self.progress = w.IntProgress(min=0, max=1, description="sweep")
        self.run_button.on_click(self.refresh)
        self.set(**values).refresh()  # controls have no observers: a sweep starts on Run only

    def _model(self):
        from treewy.models import load

        return self.cached("model", lambda: load("tiny", device=default_device()))

    def _committed(self) -> pl.DataFrame:
        frames = []
        for d in RESULTS_DIRS:
            for path in sorted(d.glob("*_tiny_sweep*.parquet")) if d.is_dir() else []:
                df = pl.read_parquet(path)
                device, date = df["device"][0], df["date"][0]
                frames.append(acceptance_frame(df, f"tiny, {device}, {date} (committed)"))
        return pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()

    def _sweep(self, v: dict) -> pl.DataFrame:
        from treewy.models.corpus import heldout_prompts
        from treewy.sweep import sweep

        model = self._model()
        prompts = heldout_prompts(v["prompts"], 96, seed=0)
        jobs = [("tree", s) for n, s in N_OF.items() if n <= v["largest"]]
        jobs += [("chain", (1,) * k) for k in range(v["chains"][0], v["chains"][1] + 1)]
        self.progress.max, self.progress.value = len(jobs), 0
        frames = []
        for kind, widths in jobs:
            self.status.value = f"decoding with {v['drafter']} drafts, {kind} {widths}…"
            frames.append(sweep(model, prompts, drafters=[v["drafter"]], shapes=[widths] if kind == "tree" else [],
                                chains=[len(widths)] if kind == "chain" else [], modes=("reconstruct", "store_all"),
                                max_new_tokens=v["tokens"], baseline=False, progress=False))
            self.progress.value += 1
        return pl.concat(frames, how="vertical_relaxed")

    def update(self) -> None:
        v = {k: c.value for k, c in self.controls.items()}
        live = self.cached(tuple(v.values()), lambda: self._sweep(v))
        self.frames["live"] = live
        device = live["device"][0]
        acc = acceptance_frame(live, f"tiny, {device}, now (live)")
        committed = self._committed()
        if not committed.is_empty():
            acc = pl.concat([acc, committed.filter(pl.col("drafter") == v["drafter"])], how="vertical_relaxed")
        if v["drafter"] == "mtp":
            acc = pl.concat([acc, paper_acceptance_frame(ACCEPTANCE)], how="vertical_relaxed")
        self.frames["acceptance"] = acc
        self.show_chart("acceptance", acceptance_chart(acc, f"{v['drafter']} drafts: tokens per step"))
        blocks = live.select("shape", "N", "mode", blocks="state_blocks")
        self.frames["blocks"] = blocks
        self.show_chart("blocks", blocks_vs_n_chart(blocks, "GDN state blocks per request per layer (measured)"))
        best = acc.filter(pl.col("source").str.ends_with("(live)")).sort("acceptance").tail(1).row(0, named=True)
        per_mode = live.pivot(on="mode", index=["kind", "shape"], values="acceptance")
        same = bool((per_mode["store_all"] == per_mode["reconstruct"]).all())
        self.status.value = (f"{live.height} runs on {device}; best live: {best['shape']} (N = {best['N']}) at "
                             f"{best['acceptance']:.2f} tokens per step; store-all and reconstruct emitted "
                             f"{'the same' if same else 'DIFFERENT'} tokens per step on every shape")
