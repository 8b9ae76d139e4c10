"""Notebook 03: the Triton kernels against the fp64 reference, live; timings where a GPU is present."""

from __future__ import annotations

import ipywidgets as w
import polars as pl
import torch

from treewy_lab.charts import kernel_timing_chart, node_errors_chart
from treewy_lab.frames import node_errors_frame
from treewy_lab.panels.base import Panel
from treewy.env import MISSING_TRITON, has_triton
from treewy.bench.parity import node_errors
from treewy.paper import SHAPES
from treewy.tree import DraftTree

TREES = {f"chain {k}": (1,) * k for k in (1, 3, 7)} | {str(s): s for s in SHAPES[1:]}


def _tree(name: str) -> DraftTree:
    return DraftTree.from_widths(TREES[name])


class ParityPanel(Panel):
    """Run tree_verify + tree_commit on random inputs and compare every node with the fp64 recurrence.
    On a GPU at Qwen3.5 shapes (K = V = 128); on CPU under the Triton interpreter at K = V = 16."""

    title = "Kernel parity, live: tree_verify + tree_commit vs the fp64 recurrence, per node"

    def __init__(self, **values):
        super().__init__()
        self.on_gpu = torch.cuda.is_available()
        self.controls = {
            "tree": w.Dropdown(options=list(TREES), value="(2, 2, 1)", description="tree"),
            "batch": w.IntSlider(value=2, min=1, max=256 if self.on_gpu else 4, description="batch B",
                                 continuous_update=False),
            "gva": w.Dropdown(options=[("HV = H", 1), ("HV = 2H", 2), ("HV = 4H", 4)], value=2, description="heads"),
            "dtype": w.Dropdown(options=["float32", "bfloat16"] if self.on_gpu else ["float32"], value="float32",
                                description="inputs"),
        }
        self.run_button = w.Button(description="Run", icon="play", button_style="primary", disabled=not has_triton())
        if has_triton():
            self.wait_for_run()   # a run under the interpreter takes seconds
            self.set(**values).first_run()
        else:
            self.set(**values)
            self.status.value = MISSING_TRITON

    def update(self) -> None:
        v = {k: c.value for k, c in self.controls.items()}
        H, K = (16, 128) if self.on_gpu else (2, 16)
        tree = _tree(v["tree"])
        where = "GPU" if self.on_gpu else "CPU, Triton interpreter"
        self.status.value = f"running on {where}…"
        self.ran_on = "cuda" if self.on_gpu else "cpu"
        rows = self.cached(tuple(v.values()), lambda: node_errors(tree, B=v["batch"], H=H, HV=H * v["gva"], K=K, V=K,
                                                                  dtype=getattr(torch, v["dtype"]), device=self.ran_on))
        self.frames["errors"] = node_errors_frame(rows)
        self.show_chart("errors", node_errors_chart(
            self.frames["errors"], f"{v['tree']}: B = {v['batch']}, H = {H}, HV = {H * v['gva']}, K = V = {K}, "
                                   f"{v['dtype']} inputs ({where}); red ticks: tolerance"))
        worst = self.frames["errors"].group_by("quantity").agg(pl.col("error").max(), pl.col("tol").min())
        ok = bool((self.frames["errors"]["error"] <= self.frames["errors"]["tol"]).all())
        self.status.value = ("worst " + "; ".join(f"{q}: {e:.1e} (tol {t:.0e})" for q, e, t in worst.sort("quantity").iter_rows())
                             + f" — {'PASS' if ok else 'FAIL'} on {where}")


class TimingPanel(Panel):
    """Time one GDN layer's step on this GPU: treewy (verify + commit), store-all, fla (chains)."""

    title = "Kernel timing on this GPU (one GDN layer of Qwen3.5-35B-A3B, bf16 inputs, fp32 state)"

    def __init__(self):
        super().__init__()
        self.controls = {
            "tree": w.Dropdown(options=list(TREES), value="chain 3", description="tree"),
            "batch": w.Dropdown(options=[1, 8, 64, 256], value=64, description="batch B"),
        }
        live = torch.cuda.is_available() and has_triton()
        self.run_button = w.Button(description="Run", icon="play", button_style="primary", disabled=not live)
        if live:
            self.wait_for_run()   # timing compiles and runs kernels: seconds
            self.first_run()
        elif not has_triton():
            self.status.value = MISSING_TRITON
        else:
            self.status.value = "timings need a CUDA GPU; the committed H200 results are plotted below"

    def update(self) -> None:
        from treewy.bench.timing import MODELS, run_case

        v = {k: c.value for k, c in self.controls.items()}
        total = torch.cuda.get_device_properties(0).total_memory
        providers = ["treewy", "store_all"] + (["fla"] if v["tree"].startswith("chain") else [])
        rows = []
        for p in providers:
            self.status.value = f"timing {p}…"
            rows.append(run_case(p, "35B-A3B", MODELS["35B-A3B"], v["tree"], _tree(v["tree"]), v["batch"],
                                 torch.float32, total))
        df = pl.DataFrame(rows, infer_schema_length=None).filter(pl.col("us").is_not_null())
        self.frames["timing"] = df
        self.show_chart("timing", kernel_timing_chart(df, f"{torch.cuda.get_device_name()} (measured now), B = {v['batch']}"))
        self.status.value = " · ".join(f"{r['provider']}: {r['us']:.1f} µs ({r['gbps']:.0f} GB/s)" for r in df.iter_rows(named=True))

