"""One call at the top of every notebook: offline charts, a theme and the environment banner."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import ipywidgets as w
from IPython.display import display

from treewy.env import describe
from treewy.results import checkout_dirs, search_dirs

#: Where measured tables are read from: the package's data, then (in a source checkout) benchmarks/results/
#: and results/, where `treewy bench-serve` writes.
RESULTS_DIRS = search_dirs()
#: Where `treewy bench-serve` writes its tables: results/ of the checkout, else ./results.
USER_RESULTS = checkout_dirs()[1] if checkout_dirs() else Path("results")

#: SVG (inspectable in the DOM, crisp when zoomed) and no action menu (its links leave the machine).
EMBED_OPTIONS = {"renderer": "svg", "actions": False}


def setup(banner: bool = True) -> dict:
    """Render charts offline (nothing loads from the internet), set the theme, show what is live."""
    alt.JupyterChart.enable_offline()
    alt.renderers.enable("jupyter", offline=True, embed_options=EMBED_OPTIONS)  # inline charts: offline too
    alt.theme.enable("lab")
    info = describe()
    if banner:
        display(environment_banner(info))
    return info


@alt.theme.register("lab", enable=False)
def _theme() -> alt.theme.ThemeConfig:
    return {"config": {"view": {"stroke": None}, "axis": {"labelFontSize": 11, "titleFontSize": 12},
                       "legend": {"labelFontSize": 11}, "title": {"fontSize": 13, "anchor": "start"}}}


def environment_banner(info: dict) -> w.HTML:
    versions = " · ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    return w.HTML(f"<b>TreeWY lab</b> on <b>{info['device']}</b> — {versions}")
