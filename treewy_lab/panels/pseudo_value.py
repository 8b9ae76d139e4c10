"""Notebook 01: how the pseudo-value u = beta (v - alpha S k) differs from the raw value v."""

from __future__ import annotations

import math

import ipywidgets as w
import torch

from treewy_lab.charts import vectors_chart
from treewy_lab.frames import vectors_frame
from treewy_lab.panels.base import Panel
from treewy.ops import gdn_step, gdn_step_textbook
from treewy.tree import as_int


class PseudoValuePanel(Panel):
    title = "One gated delta rule step: raw value v, what the decayed state already predicts, pseudo-value u"

    def __init__(self, V: int = 12, K: int = 16, seed: int = 0):
        super().__init__()
        for name, n in (("V", V), ("K", K)):
            if as_int(n) is None or n < 1:
                raise ValueError(f"{name} = {n!r}: the value size V and key size K are positive integers, "
                                 "e.g. V=12, K=16")
        gen = torch.Generator().manual_seed(seed)
        self.S = torch.randn(V, K, generator=gen, dtype=torch.float64) * 0.3   # the parent's state
        self.k = torch.nn.functional.normalize(torch.randn(K, generator=gen, dtype=torch.float64), dim=0)
        self.v = torch.randn(V, generator=gen, dtype=torch.float64)
        self.S = self.S + 0.8 * torch.outer(self.v, self.k)  # the state has seen a similar key before
        self.controls = {
            "alpha": w.FloatSlider(value=0.9, min=0.02, max=1.0, step=0.02, description="decay α"),
            "beta": w.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05, description="write β"),
        }
        self.redraw_on_change()   # an update takes milliseconds
        self.refresh()

    def update(self) -> None:
        alpha, beta = self.controls["alpha"].value, self.controls["beta"].value
        g, b = torch.tensor(math.log(alpha), dtype=torch.float64), torch.tensor(beta, dtype=torch.float64)
        S_new, u = gdn_step(self.S, self.k, self.v, g, b)
        err = float((S_new - gdn_step_textbook(self.S, self.k, self.v, g, b)).norm() / S_new.norm())
        self.frames["vectors"] = vectors_frame(**{"v (raw value)": self.v, "α S k (already predicted)":
                                                  alpha * self.S @ self.k, "u (pseudo-value)": u})
        self.show_chart("vectors", vectors_chart(self.frames["vectors"], f"α = {alpha:.2f}, β = {beta:.2f}"))
        self.status.value = (f"|u| = {float(u.norm()):.3f} vs |β v| = {float((b * self.v).norm()):.3f}; "
                             f"α S + u kᵀ equals α S (I − β k kᵀ) + β v kᵀ to {err:.1e} (relative)")
