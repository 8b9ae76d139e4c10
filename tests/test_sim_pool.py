"""The simulator's points across processes (treewy.sim.pool): the same rows as in one process, progress as points
finish, bad worker counts refused, and a caller's unguarded script not run again in the workers."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from treewy.sim import simulate
from treewy.sim.pool import MIN_PARALLEL, WORKERS_ENV, resolve_workers

ROOT = Path(__file__).resolve().parent.parent
POINTS = dict(mode=["store_all", "reconstruct"], workload=["generation-short", "summarize-short"],
              concurrency=[1, 3, 8, 19])


def test_workers_give_the_rows_of_one_process_to_the_bit():
    one = simulate(**POINTS, workers=1)
    assert 2 * 2 * 4 >= MIN_PARALLEL
    assert one.equals(simulate(**POINTS, workers=2))


def test_simulate_many_gives_each_calls_frame_to_the_bit_in_one_batch():
    from treewy.sim import simulate_many

    calls = [dict(mode=["store_all", "reconstruct"], workload="generation-short", concurrency=[1, 8]),
             dict(mode="reconstruct", workload=["summarize-short", "generation-short"], concurrency=[3], gmu=0.75,
                  tree=(2, 2, 1)),
             dict(gpu="h200", mode=["store_all", "reconstruct"], workload="balanced-short", concurrency=[5, 19],
                  seed=7)]
    alone = [simulate(**kw, workers=1) for kw in calls]
    seen = []
    batched = simulate_many(calls, workers=2, on_point=lambda done, total: seen.append((done, total)))
    assert len(batched) == len(calls) and all(a.equals(b) for a, b in zip(alone, batched))
    assert seen[-1] == (4 + 2 + 4, 4 + 2 + 4) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert simulate_many([]) == []
    with pytest.raises(ValueError, match=r"\['workers'\] apply to the whole batch"):
        simulate_many([dict(concurrency=[1], workers=2)])


def test_progress_counts_every_point_once_in_either_path():
    for workers in (1, 2):
        seen = []
        simulate(**POINTS, workers=workers, on_point=lambda done, total: seen.append((done, total)))
        assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (16, 16), (workers, seen)


@pytest.mark.parametrize("workers", [0, -2, 1.5, "two", True])
def test_bad_worker_counts_name_the_argument(workers):
    with pytest.raises(ValueError, match="workers"):
        simulate(concurrency=[1], workers=workers)


def test_the_environment_sets_the_default_and_a_bad_value_names_it(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert resolve_workers() == 3
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=WORKERS_ENV):
        resolve_workers()


def test_an_unguarded_script_is_not_run_again_in_the_workers(tmp_path):
    script = tmp_path / "sweep_once.py"
    marker = tmp_path / "runs.txt"
    script.write_text(textwrap.dedent(f"""
        with open({str(marker)!r}, "a") as f:
            f.write("ran\\n")
        from treewy.sim import simulate
        df = simulate(mode=["store_all", "reconstruct"], concurrency=[1, 2, 4, 8], workers=2)
        print(df.height)
    """))
    for run in ([sys.executable, str(script)], [sys.executable, "-"]):
        out = subprocess.run(run, input=script.read_text() if run[-1] == "-" else None, capture_output=True,
                             text=True, timeout=300, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": ""})
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == ["8"]
    assert marker.read_text().splitlines() == ["ran", "ran"]


def test_a_dead_worker_fails_that_sweep_and_the_next_starts_a_new_pool():
    from concurrent.futures.process import BrokenProcessPool

    from treewy.sim import pool

    before = simulate(**POINTS, workers=2)
    for proc in list(pool._executor._processes.values()):
        proc.kill()
        proc.join()
    with pytest.raises(BrokenProcessPool):
        simulate(**POINTS, workers=2)
    assert pool._executor is None
    assert simulate(**POINTS, workers=2).equals(before)


def test_an_interrupt_sent_to_the_workers_leaves_the_pool_usable():
    """A Jupyter kernel's interrupt reaches every process of its group."""
    import signal
    import time

    from treewy.sim import pool

    before = simulate(**POINTS, workers=2)
    workers = list(pool._executor._processes.values())
    for proc in workers:
        os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    assert all(proc.is_alive() for proc in workers)
    assert simulate(**POINTS, workers=2).equals(before)


def test_an_interrupted_sweep_ends_the_points_under_way_and_the_next_sweep_starts_a_new_pool():
    from treewy.sim import pool

    class Interrupt(BaseException):   # KeyboardInterrupt would stop pytest too
        pass

    def interrupt(done, total):
        raise Interrupt

    before = simulate(**POINTS, workers=2)
    workers = list(pool._executor._processes.values())
    slow = dict(mode=["store_all", "reconstruct"], workload="generation-heavy", concurrency=[1, 8, 256, 1024])
    with pytest.raises(Interrupt):
        simulate(**slow, workers=2, on_point=interrupt)   # a 1024 point done (the longest go first), others under way
    assert pool._executor is None and all(not w.is_alive() for w in workers)
    assert simulate(**POINTS, workers=2).equals(before)


@pytest.mark.parametrize("workers, starts", [("2", True), ("1", False)])
def test_start_early_starts_the_worker_server_only_where_points_leave_the_process(workers, starts):
    code = ("import multiprocessing.forkserver as fs\n"
            "from treewy.sim.pool import start_early\n"
            "start_early()\n"
            "print(fs._forkserver._forkserver_pid is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "", WORKERS_ENV: workers})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(starts)]


def test_the_labs_setup_starts_the_simulator_early_when_asked(monkeypatch):
    import treewy_lab
    from treewy.sim import pool

    calls = []
    monkeypatch.setattr(pool, "start_early", lambda: calls.append(1))
    treewy_lab.setup(banner=False)
    assert calls == []
    treewy_lab.setup(banner=False, simulator=True)
    assert calls == [1]


def test_stop_ends_the_workers_and_their_server_and_the_next_sweep_starts_them_again():
    import multiprocessing.forkserver as fs
    import multiprocessing.resource_tracker as rt

    from treewy.sim import pool

    before = simulate(**POINTS, workers=2)
    workers = list(pool._executor._processes.values())
    servers = (fs._forkserver._forkserver_pid, rt._resource_tracker._pid)
    assert workers and None not in servers
    pool.stop()
    assert pool._executor is None and (fs._forkserver._forkserver_pid, rt._resource_tracker._pid) == (None, None)
    assert all(not w.is_alive() for w in workers)
    for pid in servers:
        with pytest.raises(ChildProcessError):   # reaped, not a zombie
            os.waitpid(pid, os.WNOHANG)
    pool.stop()   # again: nothing to stop
    assert simulate(**POINTS, workers=2).equals(before)


KERNEL_CELL = """
import atexit, treewy_lab
from treewy.sim import simulate
treewy_lab.setup(banner=False, simulator=True)
simulate(mode=["store_all", "reconstruct"], workload=["generation-short"], concurrency=[1, 3, 8], workers=2)
atexit.register(lambda: open({marker!r}, "w").write("exited by itself"))
"""


def test_a_kernel_that_simulated_shuts_down_by_itself(tmp_path):
    """Without the lab's hook the kernel never reaches its atexit handlers: ipykernel waits on the worker server it
    signalled until the client kills it."""
    from jupyter_client.manager import start_new_kernel

    marker = tmp_path / "marker"
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "TREEWY_DEVICE": "cpu"})
    try:
        reply = kc.execute_interactive(KERNEL_CELL.format(marker=str(marker)), timeout=300)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    assert marker.read_text() == "exited by itself"
