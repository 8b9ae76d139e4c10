"""Notebook 02: build a draft tree from branching factors; draw it, its ancestor mask and its cost."""

from __future__ import annotations

from collections.abc import Iterable

import ipywidgets as w
import torch

from treewy_lab.charts import blocks_chart, mask_chart, tree_chart
from treewy_lab.frames import blocks_frame, mask_frame, tree_layout
from treewy_lab.panels.base import Panel
from treewy.check import parity_row
from treewy.tree import DraftTree, as_int


LEVELS, MAX_WIDTH = 4, 8  # the level sliders


def _fit_sliders(widths) -> tuple[tuple, tuple[int, ...]]:
    """(widths as given, the tree the sliders show for them): at most LEVELS levels, each clamped to
    1..MAX_WIDTH, cut at a 0."""
    if isinstance(widths, str) or not isinstance(widths, Iterable):
        raise ValueError(f"widths = {widths!r}: expected a tuple of branching factors such as (3, 2, 2)")
    given = tuple(widths)
    for d, x in enumerate(given):
        if as_int(x) is None:
            raise ValueError(f"widths[{d}] = {x!r}: branching factors are integers, e.g. (3, 2, 2)")
    shown: list[int] = []
    for x in map(as_int, given[:LEVELS]):
        if x < 1 and shown:
            break
        shown.append(min(max(x, 1), MAX_WIDTH))
    return given, tuple(shown) or (1,)


class TreePanel(Panel):
    title = "Draft tree from branching factors per level (0 ends the tree)"

    def __init__(self, widths: tuple[int, ...] = (3, 2, 2)):
        super().__init__()
        given, shown = _fit_sliders(widths)
        padded = list(shown) + [0] * (LEVELS - len(shown))
        self.controls = {
            f"level{d + 1}": w.IntSlider(value=padded[d], min=1 if d == 0 else 0, max=MAX_WIDTH,
                                         description=f"level {d + 1}", continuous_update=False)
            for d in range(LEVELS)
        }
        self.redraw_on_change()   # an update takes milliseconds
        # the sliders cannot show every tree: say which one they show instead, until a slider moves
        self._note = "" if shown == given else (
            f"widths {given} do not fit the {LEVELS} level sliders (1..{MAX_WIDTH} each; 0 ends the tree): "
            f"showing {shown}. ")
        self.refresh()
        self._note = ""

    @property
    def widths(self) -> tuple[int, ...]:
        out = []
        for d in range(LEVELS):
            v = self.controls[f"level{d + 1}"].value
            if v == 0:
                break
            out.append(v)
        return tuple(out)

    def update(self) -> None:
        widths = self.widths
        try:
            tree = DraftTree.from_widths(widths)
        except ValueError as e:  # too many nodes for the kernels: say so, keep the last good charts
            self.status.value = f"<span style='color:#b00020'>{self._note}{e}</span>"
            return
        self.tree = tree
        nodes, edges = tree_layout(tree)
        self.frames.update(nodes=nodes, edges=edges, mask=mask_frame(tree), blocks=blocks_frame(tree))
        self.show_chart("tree", tree_chart(nodes, edges, title=f"widths {widths}: N = {tree.num_drafts} drafts"))
        self.show_chart("mask", mask_chart(self.frames["mask"]))
        self.show_chart("blocks", blocks_chart(self.frames["blocks"]))
        rows = self.cached(widths, lambda: [parity_row(str(widths), tree, 2, 4, 16, 16, dtype=dt)
                                           for dt in (torch.float64, torch.float32)])
        self.frames["parity"] = rows
        errs = ", ".join(f"{r['dtype']}: outputs {r['o_err']:.1e}, states {r['state_err']:.1e}" for r in rows)
        self.status.value = (f"{self._note}N = {tree.num_drafts} drafts, depth {tree.max_depth}, "
                             f"{len(tree.leaves)} leaves; "
                             f"store-all holds {tree.state_blocks('store_all')} state blocks, TreeWY 1. "
                             f"Closed form vs recurrence (relative): {errs} — "
                             f"{'PASS' if all(r['ok'] for r in rows) else 'FAIL'}")
