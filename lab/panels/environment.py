"""Notebook 00: what this machine runs — device, versions, live features — and the map of notebooks."""

from __future__ import annotations

import html

import ipywidgets as w

from lab.panels.base import Panel
from treewy.env import describe

NOTEBOOKS = [
    ("01_pseudo_value_rewrite", "the gated delta rule, the pseudo-value form and the triangular system, checked step by step"),
    ("02_tree_construction", "draft trees from branching factors, ancestor masks, state blocks per mode"),
    ("03_kernel_parity_live", "the Triton kernels against the fp64 reference, live; benchmark results"),
    ("04_acceptance_sweeps", "tree width vs acceptance length on the tiny checkpoint; the paper's Table 2"),
    ("05_serving_curves", "the serving simulator: where freed state memory turns into throughput"),
    ("06_serving_with_vllm", "running the real thing with vLLM, store-all vs reconstruct"),
]


class EnvironmentPanel(Panel):
    title = "Environment"

    def __init__(self, notebooks_dir: str | None = None):
        super().__init__()
        self.notebooks_dir = notebooks_dir
        self.controls = {"refresh": w.Button(description="refresh", icon="refresh")}
        self.controls["refresh"].on_click(self.refresh)
        self.table = w.HTML()
        self.refresh()

    def set(self, **values):  # a button has no value to set: refreshing is the only action
        if values:
            raise ValueError(f"unknown controls {sorted(values)}; this panel has only a refresh button")
        self.refresh()
        return self

    def update(self) -> None:
        info = describe()
        self.info = info
        rows = [("device", info["device"])] + [(k, v or "not installed") for k, v in info["versions"].items()]
        rows += [(f"feature: {k}", v) for k, v in info["features"].items()]
        cells = "".join(f"<tr><td style='padding-right:1em'>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                        for k, v in rows)
        links = "".join(f"<li><a href='{name}.ipynb'>{name}</a> — {html.escape(what)}</li>" for name, what in NOTEBOOKS)
        self.table.value = f"<table>{cells}</table><p><b>Notebooks</b></p><ol start='0'><li>this one</li>{links}</ol>"
        self.status.value = f"running on {info['device']}"

    def layout(self) -> w.Widget:
        return w.VBox([w.HTML(f"<b>{self.title}</b>"), self.table, self.controls["refresh"], self.status, self.out])
