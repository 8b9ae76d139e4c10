"""The shape every panel shares: controls, charts, a status line and an Output that shows errors."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import altair as alt
import ipywidgets as w
import polars as pl
from IPython.display import display

from treewy_lab.setup import EMBED_OPTIONS


class Panel:
    """Subclasses build ``self.controls`` (name -> widget) and ``self.charts`` (name -> JupyterChart),
    wire them in ``__init__`` and implement ``update()``; ``set(**values)`` drives the panel headless (tests)
    exactly as a user would.

    The one rule every panel keeps (notebook 00 states it for readers): a panel whose update takes under a
    second redraws on every change (``redraw_on_change``); a slower one has a Run button, and a changed control
    only says in the status line that the charts are out of date until Run recomputes (``wait_for_run``). A slow
    panel is on screen before its first run (``first_run``), so its progress and status show while it works."""

    title = ""

    def __init__(self):
        self.controls: dict[str, w.ValueWidget] = {}
        self.charts: dict[str, alt.JupyterChart] = {}
        self.frames: dict[str, pl.DataFrame] = {}
        self.status = w.HTML()
        self.out = w.Output()
        self.error: Exception | None = None
        self._cache: dict[Hashable, object] = {}
        self._chart_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self._shown_early = False

    def cached(self, key: Hashable, compute: Callable[[], object]):
        """Compute once per key (tree shape, model, budget...)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def refresh(self, *_):
        """Run ``update()`` inside the Output, so a failing callback shows its traceback there."""
        self.error = None
        with self.out:
            self.out.clear_output()
            try:
                self.update()
            except Exception as e:  # shown in the status line and (in a kernel) as a traceback in self.out
                self.error = e
                self.status.value = f"<span style='color:#b00020'>error: {e}</span>"
                raise

    def update(self) -> None:
        raise NotImplementedError

    def redraw_on_change(self) -> None:
        """For panels whose update takes under a second: every changed control redraws."""
        for c in self.controls.values():
            c.observe(self.refresh, names="value")

    def wait_for_run(self) -> None:
        """For panels whose update takes over a second: a changed control only says so in the status line, and
        the Run button (``self.run_button``) recomputes."""
        def stale(_):
            self.status.value = STALE

        for c in self.controls.values():
            c.observe(stale, names="value")
        self.run_button.on_click(self.refresh)

    def first_run(self) -> None:
        """The first update of a slow panel: in a notebook the panel is displayed first, so its status line and
        progress bar show while it works (the cell's own display of the panel then adds nothing)."""
        if _in_kernel():
            display(self.layout())
            self._shown_early = True
        self.refresh()

    def set(self, **values) -> Panel:
        """Set controls by name (each change runs the panel as the widget would); then refresh once."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown controls {sorted(unknown)}; this panel has {sorted(self.controls)}")
        for name, value in values.items():
            self.controls[name].value = value
        return self

    def show_chart(self, name: str, chart: alt.TopLevelMixin) -> None:
        """Create the named JupyterChart or update it in place."""
        if name in self.charts:
            self.charts[name].chart = chart
        else:
            self.charts[name] = alt.JupyterChart(chart, embed_options=EMBED_OPTIONS)
            self._chart_box.children = tuple(self.charts.values())

    def layout(self) -> w.Widget:
        """Title, controls (with the Run button and progress bar of panels that have them), charts, status, Output."""
        header = [w.HTML(f"<b>{self.title}</b>")] if self.title else []
        extras = [x for x in (getattr(self, "run_button", None), getattr(self, "progress", None)) if x is not None]
        wrap = w.Layout(flex_flow="row wrap")
        return w.VBox([*header, w.HBox([*self.controls.values(), *extras], layout=wrap), self._chart_box,
                       self.status, self.out])

    def _ipython_display_(self):
        if self._shown_early:   # first_run displayed it already, in the same cell
            self._shown_early = False
            return
        display(self.layout())


#: The status line of a slow panel whose controls changed since its last run.
STALE = "settings changed: press <b>Run</b> to update the charts"


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (a notebook), False in a plain interpreter or a test."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
