"""Simulated load points on every core: each point's scheduler run (``treewy.sim.scheduler.run``) is independent and
draws from its own seeded generator, so a sweep's points run in worker processes and give the same rows, to the
bit, as one after another in this process.

The workers come from a forkserver that imports the scheduler once; they are kept for the session and reused by
every later sweep (a notebook's first sweep pays about a second to start them); ``stop()`` ends them, the server
and multiprocessing's resource tracker (a Jupyter kernel's shutdown must: ``treewy_lab.setup`` sees to it).
``TREEWY_SIM_WORKERS`` (or ``simulate(..., workers=...)``) sets how many; 1 runs every point here.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import types
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from treewy.memory.specs import _positive
from treewy.sim.scheduler import run

#: Fewer points than this run in this process: starting workers would cost more than the points.
MIN_PARALLEL = 4
#: The most workers a sweep starts (past this a sweep's longest point, not the core count, bounds its time).
MAX_WORKERS = 16
WORKERS_ENV = "TREEWY_SIM_WORKERS"

_executor: ProcessPoolExecutor | None = None
_executor_size = 0


def _count(name: str, value) -> int:
    """A positive integer, or its decimal digits (an environment variable's text); anything else names ``name``."""
    text = value.strip() if isinstance(value, str) else ""
    if text.isdigit() and not text.startswith("0"):
        value = int(text)
    return _positive(name, value, "1 runs every simulated point in this process", integer=True)


def resolve_workers(workers: int | None = None) -> int:
    """``workers`` if given, else ``TREEWY_SIM_WORKERS``, else the cores this process may use (at most MAX_WORKERS)."""
    if workers is not None:
        return _count("workers", workers)
    if os.environ.get(WORKERS_ENV, "").strip():
        return _count(WORKERS_ENV, os.environ[WORKERS_ENV])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, MAX_WORKERS)


@contextlib.contextmanager
def _main_left_alone():
    """While worker processes start, ``__main__`` is a bare module: a spawned or forkserver worker otherwise runs the
    caller's script again as ``__mp_main__`` (a script without an ``if __name__ == "__main__"`` guard would start
    its sweep again there; ``python -`` has no file to run). The workers need nothing from it: they run
    ``treewy.sim.scheduler.run``."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _drop_pool(kill: bool = False) -> None:
    """Forget the pool (the next sweep starts a new one); ``kill``: end its workers now, points running or not, and
    wait for them and the pool's thread."""
    global _executor, _executor_size
    if _executor is not None:
        workers = list(_executor._processes.values()) if kill else []
        for proc in workers:
            proc.kill()
        _executor.shutdown(wait=kill, cancel_futures=True)
    _executor, _executor_size = None, 0


def stop() -> None:
    """End the workers (points still running or queued are dropped), the forkserver and multiprocessing's resource
    tracker, and wait for each to exit; the next sweep starts them again. A Jupyter kernel calls it as it shuts
    down: ipykernel signals every process left in its group until none is, the tracker ignores the signals and a
    killed forkserver stays a zombie child, so the kernel never finishes on its own and its client kills it seconds
    later."""
    if _executor is not None:
        _drop_pool(kill=True)   # a point still running (a sweep interrupted just before) would hold the shutdown
        gc.collect()   # the pool's queues: their semaphores unregister from the tracker before it stops
    fork_server = multiprocessing.forkserver._forkserver
    if fork_server._forkserver_pid is not None:
        # it only forks, so nothing is lost; its own exit took 0.4 s on the 2-core CPU
        os.kill(fork_server._forkserver_pid, signal.SIGKILL)
    fork_server._stop()   # closes its alive pipe and reaps it
    multiprocessing.resource_tracker._resource_tracker._stop()   # closes its pipe (it then exits) and reaps it


def _context():
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["treewy.sim.scheduler"])
    return context


def start_early() -> None:
    """Start the forkserver now, where a sweep is coming (``treewy_lab.setup(simulator=True)`` calls it): it imports
    the scheduler in its own process, about a second, while the caller goes on, and the first sweep's workers fork
    from a server that is ready. Nothing where points run here (``TREEWY_SIM_WORKERS=1``) or without a forkserver."""
    if resolve_workers() > 1 and _context().get_start_method() == "forkserver":
        with _main_left_alone():
            multiprocessing.forkserver.ensure_running()


def _ignore_interrupts() -> None:
    """A worker's first step: a Jupyter kernel's interrupt signals its whole process group, and a worker it killed
    would break the pool for the next sweep. The interrupt reaches the sweep in the caller, which ends the workers
    only if points were still under way (``run_points``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool(size: int) -> ProcessPoolExecutor:
    global _executor, _executor_size
    if _executor is None or _executor_size != size:
        _drop_pool()
        _executor = ProcessPoolExecutor(max_workers=size, mp_context=_context(), initializer=_ignore_interrupts)
        _executor_size = size
    return _executor


def run_points(tasks: Sequence[tuple[tuple, dict]], workers: int | None = None,
               on_point: Callable[[int, int], None] | None = None) -> list:
    """``[run(*args, **kwargs) for args, kwargs in tasks]``, across worker processes when there are enough points.

    on_point(done, total) is called as each point finishes (in finishing order)."""
    size = resolve_workers(workers)
    total, results = len(tasks), [None] * len(tasks)
    if size <= 1 or total < MIN_PARALLEL:
        for i, (args, kwargs) in enumerate(tasks):
            results[i] = run(*args, **kwargs)
            if on_point:
                on_point(i + 1, total)
        return results
    # the longest points first (by output tokens: run's 4th argument), so none starts last on an idle pool
    order = sorted(range(total), key=lambda i: -int(tasks[i][0][3].sum()))
    pool, futures = _pool(size), {}   # one pool for every sweep: no more processes start than it has points
    try:
        with _main_left_alone():   # the pool starts its processes in these submits
            for i in order:
                futures[pool.submit(run, *tasks[i][0], **tasks[i][1])] = i
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                results[futures[f]] = f.result()
            if on_point:
                on_point(total - len(pending), total)
    except BrokenProcessPool:   # a worker died (killed, out of memory): the next sweep starts a new pool
        _drop_pool()
        raise
    except BaseException:   # an error in a point, or an interrupt: the other points are not wanted any more
        for f in futures:
            f.cancel()
        if not all(f.done() for f in futures):   # points under way hold the workers for as long as they take
            _drop_pool(kill=True)                 # (a 4096-request point: 11 s on the 2-core CPU)
        raise
    return results
