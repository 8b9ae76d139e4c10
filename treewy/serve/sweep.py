"""The serving sweep: workload x load point x mode, one ``vllm bench serve`` run per point, one tidy row each.

Points are grouped by mode (one server start per mode). Each finished point, good or failed, is
appended to a JSONL checkpoint keyed by (model, k, workload, mode, concurrency, rate) and the
table (``treewy.schema.serving_frame``) is rewritten after every point, so an interrupted sweep
resumes where it stopped. A failed point becomes a row with ``error`` set, never a missing row.
Because the table is rebuilt from the checkpoint, an existing table with rows the checkpoint does
not hold is refused rather than replaced. A running server is recorded in OUT.server.pid, so that
the next run stops a server that a killed run left behind.

This module is the driver (``Sweep``); the workloads, points, configuration and rows are in ``sweep_points``, the
checkpoint and the server record in ``sweep_io``; their public names are importable from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from treewy.serve.launcher import ServeError, ServeOptions, VLLMServer, acceptance_of, build_command, check_port_free
from treewy.serve.metrics import MetricsScraper
from treewy.serve.sweep_io import append_record, load_checkpoint, stop_leftover_server, write_server_pid
from treewy.serve.sweep_points import (
    WORKLOADS,
    Point,
    SweepConfig,
    Workload,
    bench_command,
    failed_row,
    point_key,
    row_from_result,
    warmup_bodies,
)

__all__ = ["WORKLOADS", "Point", "Sweep", "SweepConfig", "Workload", "append_record", "bench_command", "failed_row",
           "load_checkpoint", "point_key", "row_from_result", "stop_leftover_server", "wait_port_released",
           "write_server_pid"]


def _run_group(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run a command in its own process group; kill the group on timeout or Ctrl-C."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, (out or "") + f"\n(timed out after {timeout:.0f} s)"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def _settled_alive(srv: VLLMServer) -> bool:
    """Whether the server is still running, after letting one that stopped answering finish dying (it usually is)."""
    if srv.alive and not srv.healthy():
        try:
            srv.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
    return srv.alive


class Sweep:
    def __init__(self, cfg: SweepConfig, log: Callable[[str], None] = print):
        self.cfg, self.log = cfg, log
        self.result_dir = cfg.result_dir or cfg.out.parent / (cfg.out.stem + "_results")
        self.done = load_checkpoint(cfg.checkpoint)
        self.check_out()
        self.check_acceptance_matches()

    def check_out(self) -> None:
        """Refuse an --out that rebuilding the table from the checkpoint would lose rows of: a folder, a file that
        is no parquet table, or a table with a row whose point the checkpoint holds no record of (another run's
        table copied there, or another tool's). What an interrupted sweep leaves passes: its table is written
        after each record."""
        out, fix = self.cfg.out, "pass a fresh --out path, or move the file away"
        if out.is_dir():
            raise ServeError(f"--out {out} is a folder: give the path of a parquet file, e.g. "
                             f"{out / 'serving.parquet'}")
        if not out.exists():
            return
        try:
            import polars as pl
        except ImportError:
            return  # write_table leaves --out alone where polars is not installed
        try:
            table = pl.read_parquet(out)
        except (pl.exceptions.PolarsError, OSError) as e:
            raise ServeError(f"--out {out} exists and is not a parquet table ({type(e).__name__}); bench-serve "
                             f"would replace it: {fix}") from None
        lost = sum(not self._accounted(row) for row in table.to_dicts())
        if lost:
            raise ServeError(f"--out {out} holds {lost} of its {table.height} row(s) that the checkpoint "
                             f"{self.cfg.checkpoint} has no record of (another run's table, or another tool's?); "
                             f"bench-serve rebuilds --out from the checkpoint and would drop them: {fix}")

    def check_acceptance_matches(self) -> None:
        """Refuse to resume a checkpoint measured at another acceptance: its rows and this run's would share a table
        and a point key. Records written before acceptance was recorded had the drafts' real acceptance."""
        want = acceptance_of(self.cfg.server).source
        seen = {(r["row"].get("acceptance_source") or "none") for r in self.done.values()} - {want}
        if seen:
            raise ServeError(f"the checkpoint {self.cfg.checkpoint} was measured with --acceptance "
                             f"{', '.join(sorted(seen))}, this run asks for {want}: pass the same --acceptance to "
                             "resume it, or a fresh --out")

    def _accounted(self, row: dict) -> bool:
        if row.get("simulated") is not False:  # bench-serve writes measured rows only
            return False
        key = point_key(row.get("model"), row.get("num_drafts"), row.get("workload"), row.get("mode"),
                        row.get("concurrency"), row.get("request_rate"))
        return key in self.done

    def stop_leftover_server(self) -> None:
        stop_leftover_server(self.cfg.server_pid_file, self.log)

    def _record(self, p: Point, row: dict) -> None:
        rec = {"key": self.cfg.key(p), "point": p.label(), "row": row}
        append_record(self.cfg.checkpoint, rec)
        self.done[rec["key"]] = rec
        self.write_table()

    def write_table(self):
        """Rewrite the parquet table from the checkpoint; None where polars is not installed (a bare GPU
        server): the rows stay in the JSONL checkpoint, and ``treewy.schema.serving_frame`` reads them later."""
        try:
            from treewy.schema import serving_frame
        except ImportError:
            return None
        frame = serving_frame([r["row"] for r in self.done.values()])
        tmp = self.cfg.out.with_suffix(".tmp.parquet")
        frame.write_parquet(tmp)
        os.replace(tmp, self.cfg.out)
        return frame

    def todo(self) -> list[Point]:
        out = []
        for p in self.cfg.points():
            rec = self.done.get(self.cfg.key(p))
            if rec is None or (self.cfg.retry_failed and rec["row"].get("error")):
                out.append(p)
        return out

    def _start(self, mode: str) -> VLLMServer:
        opts = ServeOptions(**{**self.cfg.server.__dict__, "mode": mode})
        argv, env = build_command(opts)
        wait_port_released(opts.host, opts.port)
        check_port_free(opts.host, opts.port)
        log_path = self.result_dir / f"server-{mode}.log"
        srv = VLLMServer(argv, env, opts.base_url, log_path=str(log_path), echo=self.cfg.echo_server_log)
        srv.start()
        try:
            write_server_pid(self.cfg.server_pid_file, srv.proc.pid, opts.port)
            srv.wait_healthy(timeout=self.cfg.health_timeout)
        except BaseException:
            self._stop(srv)
            raise
        return srv

    def _stop(self, srv: VLLMServer) -> None:
        srv.stop()
        self.cfg.server_pid_file.unlink(missing_ok=True)

    def warm_up(self, srv: VLLMServer, p: Point) -> str | None:
        """Send the point's warm-up (``warmup_bodies``), ``p.concurrency`` requests at a time (a rate point: as many
        as the server runs at once); the first failure's text, or None."""
        bodies = warmup_bodies(self.cfg, p)
        if not bodies:
            return None
        url = srv.base_url + "/v1/completions"

        def send(body: dict) -> str | None:
            req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.cfg.point_timeout) as r:
                    r.read()
            except Exception as e:  # noqa: BLE001 (a refused, failed or timed-out request: reported as the row's error)
                return f"{type(e).__name__}: {e}"
            return None

        width = min(len(bodies), p.concurrency or self.cfg.server.max_num_seqs)
        with ThreadPoolExecutor(max_workers=width) as pool:
            errors = [e for e in pool.map(send, bodies) if e]
        return errors[0] if errors else None

    def run_point(self, srv: VLLMServer, p: Point) -> dict:
        warm_error = self.warm_up(srv, p)
        if warm_error is not None and not _settled_alive(srv):
            return failed_row(self.cfg, p, f"the vLLM server exited with code {srv.proc.returncode} during this "
                              f"point's warm-up; last server log lines: {srv.last_log(5)}")
        if warm_error is not None:
            return failed_row(self.cfg, p, f"a warm-up request failed ({self.cfg.warmups(p)} sent before the "
                              f"point): {warm_error}")
        name = p.label() + ".json"
        result_path = self.result_dir / name
        result_path.unlink(missing_ok=True)
        argv = bench_command(self.cfg, p, self.result_dir, name)
        scraper = MetricsScraper(srv.base_url, interval=self.cfg.metrics_interval).start()
        try:
            code, out = _run_group(argv, self.cfg.point_timeout)
        finally:
            metrics = scraper.stop()
        if not _settled_alive(srv):
            return failed_row(self.cfg, p, f"the vLLM server exited with code {srv.proc.returncode} during this "
                              f"point; last server log lines: {srv.last_log(5)}")
        if code != 0 or not result_path.is_file():
            tail = "\n".join(out.strip().splitlines()[-8:])
            return failed_row(self.cfg, p, f"vllm bench serve exited with code {code}"
                              + ("" if result_path.is_file() else " and wrote no result") + f": {tail}")
        try:
            result = json.loads(result_path.read_text())
        except json.JSONDecodeError as e:
            return failed_row(self.cfg, p, f"unreadable result {result_path}: {e}")
        return row_from_result(self.cfg, p, result, metrics)

    def run(self, progress: bool = True) -> tuple[int, int]:
        """Run every point not yet done; returns (points run now, points failed now). A SIGTERM (``timeout``, a
        job scheduler) stops the server like Ctrl-C does, so no vLLM is left holding the GPU and the port."""
        with _sigterm_as_exit():
            self.stop_leftover_server()
            return self._run(progress)

    def _run(self, progress: bool) -> tuple[int, int]:
        todo = self.todo()
        self.result_dir.mkdir(parents=True, exist_ok=True)
        total = len(self.cfg.points())
        if not todo:
            self.log(f"all {total} points already done ({self.cfg.checkpoint}); nothing to run")
            self.write_table()
            return 0, 0
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc="bench-serve", unit="point", disable=not progress)
        ran = failed = 0
        t0 = time.monotonic()
        try:
            for mode in self.cfg.modes:
                points = [p for p in todo if p.mode == mode]
                if not points:
                    continue
                srv, restarts, start_error = None, 0, None
                try:
                    for p in points:
                        if self.cfg.stop_after_s is not None and time.monotonic() - t0 > self.cfg.stop_after_s:
                            left = len(todo) - ran
                            self.log(f"--stop-after {self.cfg.stop_after_s:g} s reached: {left} point(s) left for "
                                     f"the next run of the same command (the checkpoint {self.cfg.checkpoint} "
                                     "resumes there)")
                            return ran, failed
                        bar.set_postfix_str(p.label())
                        if start_error is None and (srv is None or not srv.alive):
                            if srv is not None:  # it died during the previous point
                                self._stop(srv)
                                srv = None
                                if restarts >= self.cfg.max_restarts:
                                    start_error = (f"the {mode} server died {restarts + 1} time(s); not restarting "
                                                   "it again (fix the cause, then rerun the same command with "
                                                   "--retry-failed)")
                                restarts += 1
                            if start_error is None:
                                try:
                                    self.log(f"starting vLLM ({mode}) for {len(points)} point(s)")
                                    srv = self._start(mode)
                                except ServeError as e:
                                    start_error = f"the {mode} server could not start: {e}"
                        if start_error is not None:
                            row = failed_row(self.cfg, p, start_error)
                        else:
                            row = self.run_point(srv, p)
                        self._record(p, row)
                        ran += 1
                        if row.get("error"):
                            failed += 1
                            self.log(f"point {p.label()} failed: {row['error'].splitlines()[0][:300]}")
                        elif row.get("acceptance_warning"):
                            self.log(f"point {p.label()}: warning: {row['acceptance_warning']}")
                        bar.update(1)
                finally:
                    if srv is not None:
                        self._stop(srv)
        finally:
            bar.close()
        return ran, failed


@contextlib.contextmanager
def _sigterm_as_exit():
    """Within the block, SIGTERM raises SystemExit in the main thread, so ``finally`` clauses stop servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def wait_port_released(host: str, port: int, timeout: float = 30.0) -> None:
    """After a server stopped, wait until its port can be bound again."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                return
            except OSError:
                time.sleep(0.2)
