"""A status line for a slow notebook cell: what is running and for how long, so no cell sits blank while it works."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

#: How often the elapsed time on the line moves (s).
TICK_S = 0.5


@contextmanager
def working(what: str):
    """Show "<what>… <seconds> s" under the cell while the block runs (a widget, updated from a thread, so it moves
    while the block holds the kernel), then "<what>: done in <seconds> s" (or "failed after ...")."""
    import ipywidgets as w
    from IPython.display import display

    line = w.HTML(f"⏳ {what}…")
    display(line)
    t0 = time.perf_counter()
    done = threading.Event()

    def tick():
        while not done.wait(TICK_S):
            line.value = f"⏳ {what}… {time.perf_counter() - t0:.1f} s"

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield line
    except BaseException:
        done.set()
        ticker.join()
        line.value = f"<span style='color:#b00020'>{what}: failed after {time.perf_counter() - t0:.1f} s</span>"
        raise
    done.set()
    ticker.join()
    line.value = f"✓ {what}: done in {time.perf_counter() - t0:.1f} s"
