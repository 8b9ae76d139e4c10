"""Notebook 04: tree width and temperature against acceptance length, on the tiny checkpoint (live, and
the committed sweeps); one decode at a chosen temperature."""

from __future__ import annotations

import ipywidgets as w
import polars as pl

from treewy_lab.charts import acceptance_chart, blocks_vs_n_chart, temperature_chart
from treewy_lab.frames import acceptance_frame, paper_acceptance_frame, temperature_frame
from treewy_lab.panels.base import Panel
from treewy.accept import RULES
from treewy.env import default_device, small
from treewy.paper import ACCEPTANCE, SHAPES
from treewy.tree import DraftTree

N_OF = {DraftTree.from_widths(s).num_drafts: s for s in SHAPES}
TREES = {"chain (1, 1, 1)": (1, 1, 1), "tree (2, 2, 1)": (2, 2, 1), "tree (3, 3, 3)": (3, 3, 3)}


def _sweep_controls(panel: Panel, few: bool, prompts: int) -> dict:
    """The prompts and new-tokens sliders of a sweep panel; also gives it a Run button and a progress bar."""
    panel.run_button = w.Button(description="Run", icon="play", button_style="primary")
    panel.progress = w.IntProgress(min=0, max=1, description="sweep")
    return {"prompts": w.IntSlider(value=2 if few else prompts, min=1, max=32, description="prompts",
                                   continuous_update=False),
            "tokens": w.IntSlider(value=16 if few else 48, min=8, max=128, step=8, description="new tokens",
                                  continuous_update=False)}


def _committed_sweeps(kind: str, to_frame) -> pl.DataFrame:
    """Every committed sweep of ``kind`` (``treewy.results.tables``), each through ``to_frame(df, label)``."""
    from treewy.results import tables

    frames = []
    for path in tables(kind):
        df = pl.read_parquet(path)
        frames.append(to_frame(df, f"tiny, {df['device'][0]}, {df['date'][0]} (committed)"))
    return pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()


def _model(panel: Panel):
    """The tiny checkpoint, loaded once per panel."""
    from treewy.models import load

    return panel.cached("model", lambda: load("tiny", device=default_device()))


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
            **_sweep_controls(self, few, prompts=16),
        }
        self.wait_for_run()   # a sweep takes seconds
        self.set(**values).first_run()

    def _committed(self) -> pl.DataFrame:
        return _committed_sweeps("acceptance_sweeps", acceptance_frame)

    def _sweep(self, v: dict) -> pl.DataFrame:
        from treewy.models.corpus import heldout_prompts
        from treewy.experiments.acceptance import sweep

        model = _model(self)
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


class DecodePanel(Panel):
    """One speculative decode of a prompt at a chosen temperature: the text, the steps it took and the
    tokens per step, with a progress bar over the tokens."""

    title = "One decode on the tiny checkpoint at a temperature (0 = greedy)"

    def __init__(self, **values):
        super().__init__()
        self.controls = {
            "prompt": w.Text(value="def fibonacci(n):\n    ", description="prompt"),
            "temperature": w.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.05, description="temperature",
                                         continuous_update=False),
            "drafter": w.Dropdown(options=["mtp", "ngram"], value="mtp", description="drafter"),
            "tree": w.Dropdown(options=list(TREES), value="tree (3, 3, 3)", description="tree"),
            "rule": w.Dropdown(options=list(RULES), value="match", description="rule"),
            "seed": w.IntText(value=0, description="seed"),
            "tokens": w.IntSlider(value=48, min=8, max=128, step=8, description="new tokens", continuous_update=False),
        }
        self.text = w.HTML()
        self.run_button = w.Button(description="Run", icon="play", button_style="primary")
        self.progress = w.IntProgress(min=0, max=1, description="tokens")
        self.wait_for_run()   # a decode takes seconds on a CPU
        self.set(**values).first_run()

    def _tick(self, done: int, total: int) -> None:
        self.progress.max, self.progress.value = total, done

    def update(self) -> None:
        import html

        from treewy.decode import generate
        from treewy.tokenizer import decode, encode

        v = {k: c.value for k, c in self.controls.items()}
        self.status.value = f"decoding at temperature {v['temperature']:.2f}…"
        res = self.cached(tuple(v.values()), lambda: generate(
            _model(self), [encode(v["prompt"])], drafter=v["drafter"], tree=TREES[v["tree"]],
            max_new_tokens=v["tokens"], temperature=v["temperature"], seed=v["seed"], rule=v["rule"],
            progress=self._tick))
        self.result = res
        self.text.value = (f"<pre style='white-space:pre-wrap;margin:0'><b>{html.escape(v['prompt'])}</b>"
                           f"{html.escape(decode(res.tokens[0]))}</pre>")
        how = "greedy" if res.sampling is None else f"sampled ({v['rule']}, seed {v['seed']})"
        self.status.value = (f"{len(res.tokens[0])} tokens in {len(res.steps)} steps: "
                             f"{res.acceptance_length:.2f} tokens per step, {how}, {v['drafter']} drafts on a "
                             f"{v['tree']}")

    def layout(self) -> w.Widget:
        box = super().layout()
        box.children = (*box.children[:-2], self.text, *box.children[-2:])
        return box


class TemperaturePanel(Panel):
    """Acceptance length against temperature for a chain and a tree, every acceptance rule: the committed
    sweep (both drafters) beside a live one for the chosen drafter."""

    title = "Acceptance against temperature on the tiny checkpoint: committed sweep (solid) and live (dashed)"

    def __init__(self, **values):
        super().__init__()
        few = small()
        self.controls = {
            "drafter": w.Dropdown(options=["mtp", "ngram"], value="mtp", description="drafter"),
            "temperatures": w.SelectMultiple(options=[0.0, 0.25, 0.5, 0.75, 1.0, 1.25],
                                             value=(0.0, 1.0) if few else (0.0, 0.5, 1.0), description="temperatures",
                                             rows=6),
            **_sweep_controls(self, few, prompts=8),
        }
        self.wait_for_run()   # a sweep takes seconds
        self.set(**values).first_run()

    def _committed(self) -> pl.DataFrame:
        return _committed_sweeps("temperature_sweeps", temperature_frame)

    def _sweep(self, v: dict) -> pl.DataFrame:
        from treewy.models.corpus import heldout_prompts
        from treewy.experiments.sampling_sweep import temperature_sweep

        def on_job(i, n, job):
            self.progress.max, self.progress.value = n, i
            self.status.value = f"run {i + 1} of {n}: {job[0]} drafts, {job[1]}, rule {job[2]}, temperature {job[3]}…"

        df = temperature_sweep(_model(self), heldout_prompts(v["prompts"], 96, seed=0), drafters=[v["drafter"]],
                               temperatures=sorted(v["temperatures"]), max_new_tokens=v["tokens"], progress=False,
                               on_job=on_job)
        self.progress.value = self.progress.max
        return df

    def update(self) -> None:
        v = {k: c.value for k, c in self.controls.items()}
        if not v["temperatures"]:
            raise ValueError("temperatures: select at least one (ctrl/shift-click for several)")
        live = self.cached(tuple(v.values()), lambda: self._sweep(v))
        self.frames["live"] = live
        acc = temperature_frame(live, f"tiny, {live['device'][0]}, now (live)")
        committed = self.committed = self.cached("committed", self._committed)
        if not committed.is_empty():
            acc = pl.concat([committed.filter(pl.col("drafter") == v["drafter"]), acc], how="vertical_relaxed")
        self.frames["temperature"] = acc
        self.show_chart("temperature", temperature_chart(acc, f"{v['drafter']} drafts: tokens per step"))
        hot = live.filter(pl.col("temperature") == live["temperature"].max())
        best = hot.sort("acceptance").tail(1).row(0, named=True)
        self.status.value = (f"{live.height} live rows on {live['device'][0]}; at temperature {best['temperature']} "
                             f"the most tokens per step: {best['acceptance']:.2f} ({best['shape']}, rule "
                             f"{best['rule']})" + ("" if not committed.is_empty() else
                                                    "; no committed sweep found (benchmarks/temperature_sweep.py)"))
