"""One call at the top of every notebook: offline charts, a theme and the environment banner.

Importing this module is instant; ``setup()`` loads the heavy libraries (torch, altair, polars, the panels)
with a progress line, so the first cell of a notebook never sits silent for seconds.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
import time
from pathlib import Path

#: SVG (inspectable in the DOM, crisp when zoomed) and no action menu (its links leave the machine).
EMBED_OPTIONS = {"renderer": "svg", "actions": False}

#: What ``setup()`` loads, in order, with what the progress line says meanwhile.
_LOADS = (("torch", "torch"), ("treewy", "treewy"), ("polars", "polars"), ("altair", "altair (charts)"),
          ("ipywidgets", "ipywidgets"), ("treewy_lab.panels", "the lab's panels"))


def __getattr__(name: str):
    """``RESULTS_DIRS``: where measured serving rows are read from (the package's data, then, in a source checkout,
    your own runs in results/); ``USER_RESULTS``: where ``treewy bench-serve`` writes (results/)."""
    if name not in ("RESULTS_DIRS", "USER_RESULTS"):   # checked first: the import system asks for __path__, and
        raise AttributeError(f"module 'treewy_lab.setup' has no attribute {name!r}")   # treewy imports torch
    from treewy.results import checkout_dirs, search_dirs

    if name == "RESULTS_DIRS":
        return search_dirs()
    return checkout_dirs()[0] if checkout_dirs() else Path("results")


def setup(banner: bool = True, load: tuple[str, ...] = (), simulator: bool = False) -> dict:
    """Load the libraries (a progress line says which), render charts offline (nothing loads from the internet),
    set the theme, show what is live. ``load``: further modules the notebook imports next (their loading time
    then shows on the same line instead of in a blank cell). ``simulator``: start the serving simulator's worker
    server now, for a notebook that simulates (it loads in its own process while the notebook goes on)."""
    from IPython.display import HTML, display

    stop_simulator_at_kernel_shutdown()
    if simulator:
        from treewy.sim.pool import start_early

        start_early()

    line = display(HTML(""), display_id=True) if banner else None
    t0 = time.perf_counter()
    loads = (*_LOADS, *((m, m) for m in load))
    for i, (module, what) in enumerate(loads):
        if line is not None:
            line.update(HTML(f"<progress max='{len(loads)}' value='{i}'></progress> loading {what}… "
                             f"({time.perf_counter() - t0:.1f} s)"))
        importlib.import_module(module)
    import altair as alt

    from treewy.env import describe

    offline = importlib.util.find_spec("vl_convert") is not None   # it bundles Vega's JavaScript for offline use
    if offline:
        enable_offline_charts()
    alt.renderers.enable("jupyter", offline=offline, embed_options=EMBED_OPTIONS)  # inline charts: offline too
    alt.theme.register("lab", enable=True)(_theme)
    info = describe()
    if not offline:
        info["features"]["offline charts"] = "no: vl-convert-python is not installed, so charts load Vega from the internet"
    freeze_loaded_libraries()
    from treewy_lab import BYTECODE_CACHE
    if BYTECODE_CACHE is not None:
        info["features"]["bytecode cache"] = (f"{BYTECODE_CACHE}: this Python keeps no bytecode beside torch or "
                                              "transformers, so the first kernel compiles their modules and later ones "
                                              "read them there (TREEWY_LAB_BYTECODE=0 turns this off)")
    if line is not None:
        line.update(environment_banner(info, time.perf_counter() - t0))
    return info


def stop_simulator_at_kernel_shutdown() -> None:
    """Have this Jupyter kernel's shutdown (or restart) end the serving simulator's worker processes first
    (``treewy.sim.pool.stop``). Without it ipykernel signals them, waits on a worker server it cannot reap, and is
    killed by its client seconds later (notebook 05's kernel took 2.6 s to shut down on the 2-core CPU, 1.1 s with
    this hook). Nothing outside a kernel, or where it is already done."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or getattr(kernel.do_shutdown, "stops_simulator", False):
        return
    do_shutdown = kernel.do_shutdown

    def stop_simulator_then_shut_down(restart):
        pool = sys.modules.get("treewy.sim.pool")   # imported only where something simulated or started it
        if pool is not None:
            pool.stop()
        return do_shutdown(restart)

    stop_simulator_then_shut_down.stops_simulator = True
    kernel.do_shutdown = stop_simulator_then_shut_down


def freeze_loaded_libraries() -> bool:
    """In a Jupyter kernel, once: hand every object alive now (mostly the libraries ``setup()`` just loaded, which
    live as long as the kernel) to ``gc.freeze``, so that Python's full garbage collections and the kernel's exit
    stop walking them. On the 2-core CPU notebook 04's kernel tracks about 460,000 objects, 280,000 of them loaded
    by ``setup()``; frozen, its full collections took 0.55 s instead of 0.80 s, and its exit after the last cell
    0.6 s instead of 1.4 s (a restart waits on that exit). Objects made later are collected as before; nothing is
    frozen outside a kernel, or a second time (a later ``setup()`` would freeze the notebook's own objects: a model
    frozen in a reference cycle would never be freed). That is why ``setup()`` belongs in a notebook's first cell:
    what earlier cells made is frozen with the libraries. Returns whether it froze."""
    from IPython import get_ipython

    if getattr(get_ipython(), "kernel", None) is None or gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def enable_offline_charts(cache_dir: Path | None = None) -> Path:
    """``alt.JupyterChart.enable_offline()``, whose JavaScript bundle (vl-convert builds it, about 1 s) is kept on
    disk per altair and vl-convert release and read back in later notebooks. Returns the bundle's file."""
    import os

    import altair as alt
    import vl_convert

    chart = alt.JupyterChart
    root = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "treewy_lab"
    path = root / f"jupyterchart_altair-{alt.__version__}_vl-convert-{vl_convert.__version__}.js"
    if chart._is_offline:           # setup() run again in the same kernel: nothing to build or write
        return path
    if path.is_file():
        chart._esm, chart._is_offline = path.read_text(), True     # what enable_offline() sets
        return path
    chart.enable_offline()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(chart._esm)
        tmp.replace(path)           # whole or not at all: a notebook never reads half a bundle
    except OSError:
        pass                        # a read-only home: the next notebook builds the bundle again
    return path


def _theme() -> dict:
    return {"config": {"view": {"stroke": None}, "axis": {"labelFontSize": 11, "titleFontSize": 12},
                       "legend": {"labelFontSize": 11}, "title": {"fontSize": 13, "anchor": "start"}}}


def environment_banner(info: dict, seconds: float | None = None):
    import ipywidgets as w

    versions = " · ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    took = f" · loaded in {seconds:.1f} s" if seconds is not None else ""
    note = "".join(f"<br>{key}: {info['features'][key]}" for key in ("offline charts", "bytecode cache")
                   if key in info["features"])
    return w.HTML(f"<b>TreeWY lab</b> on <b>{info['device']}</b> — {versions}{took}{note}")
