"""Notebook 00: what this machine runs — device, versions, live features. (The map of notebooks is a markdown
cell of notebook 00, so its links open inside JupyterLab.)"""

from __future__ import annotations

import html

import ipywidgets as w

from treewy_lab.panels.base import Panel
from treewy.env import describe


class EnvironmentPanel(Panel):
    title = "Environment"

    def __init__(self):
        super().__init__()
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
        self.table.value = f"<table>{cells}</table>"
        self.status.value = f"running on {info['device']}"

    def layout(self) -> w.Widget:
        return w.VBox([w.HTML(f"<b>{self.title}</b>"), self.table, self.controls["refresh"], self.status, self.out])
