"""The serving sweep: workload x load point x mode, one ``vllm bench serve`` run per point, one tidy row each.

Points are grouped by mode (one server start per mode). Each finished point, good or failed, is
appended to a JSONL checkpoint keyed by (model, k, workload, mode, concurrency, rate) and the
table (``treewy.schema.serving_frame``) is rewritten after every point, so an interrupted sweep
resumes where it stopped. A failed point becomes a row with ``error`` set, never a missing row.
Because the table is rebuilt from the checkpoint, an existing table with rows the checkpoint does
not hold is refused rather than replaced. A running server is recorded in OUT.server.pid, so that
the next run stops a server that a killed run left behind.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from treewy.serve.launcher import (
    ServeError,
    ServeOptions,
    VLLMServer,
    acceptance_of,
    build_command,
    capture_plan,
    check_port_free,
    dummy_weights,
    group_members,
    has_proc,
    process_alive,
    process_start_time,
)
from treewy.serve.acceptance import check_acceptance
from treewy.serve.metrics import MetricsScraper
from treewy.workloads import CATALOGUE


@dataclass(frozen=True)
class Workload:
    """How ``vllm bench serve`` generates a workload's requests."""

    dataset: str
    input_len: int | None = None
    output_len: int | None = None
    path_file: str | None = None  # file name under --dataset-dir, or the absolute path of a file shipped in treewy
    range_ratio: float = 0.0      # random dataset: lengths uniform within +- this fraction
    extra_args: tuple[str, ...] = ()

    def bench_args(self, dataset_dir: str | None) -> list[str]:
        args = ["--dataset-name", self.dataset]
        if self.path_file is not None:
            path = Path(self.path_file)
            if not path.is_absolute():
                if not dataset_dir:
                    raise ServeError(f"dataset {self.dataset!r} is read from disk: pass --dataset-dir holding "
                                     f"{self.path_file}")
                path = Path(dataset_dir) / self.path_file
                if not path.is_file():
                    raise ServeError(f"{path} does not exist: put {self.path_file} in --dataset-dir")
            elif not path.is_file():
                raise ServeError(f"{path} does not exist: the package's prompt file is missing; reinstall treewy")
            args += ["--dataset-path", str(path)]
        if self.dataset == "random":
            args += ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
                     "--random-range-ratio", str(self.range_ratio), "--ignore-eos"]
        elif self.dataset == "spec_bench" and self.output_len:
            args += ["--spec-bench-output-len", str(self.output_len)]
        elif self.dataset == "sharegpt" and self.output_len:
            args += ["--sharegpt-output-len", str(self.output_len)]
        elif self.dataset == "custom" and self.output_len:
            args += ["--custom-output-len", str(self.output_len)]
        return args + list(self.extra_args)


#: The one workload catalogue (treewy.workloads, which the simulator samples too) as vllm bench serve arguments.
WORKLOADS: dict[str, Workload] = {name: Workload(w.dataset, w.input_len, w.output_len, w.path_file, w.range_ratio,
                                           w.extra_args)
                                  for name, w in CATALOGUE.items()}


@dataclass(frozen=True)
class Point:
    workload: str
    mode: str
    concurrency: int | None = None
    request_rate: float | None = None

    def label(self) -> str:
        load = f"c{self.concurrency}" if self.concurrency is not None else f"r{self.request_rate:g}"
        return f"{self.workload}-{self.mode}-{load}"


@dataclass
class SweepConfig:
    server: ServeOptions                  # mode is set per point
    model_name: str                       # what the table's model column says (preset name or path)
    workloads: list[str]
    modes: list[str]
    concurrencies: list[int] = field(default_factory=list)
    request_rates: list[float] = field(default_factory=list)
    num_prompts: int = 200
    prompts_per_concurrency: int = 0      # closed loops send max(num_prompts, this x concurrency) requests
    out: Path = Path("serving.parquet")
    result_dir: Path | None = None
    dataset_dir: str | None = None
    device: str = "unknown"
    health_timeout: float = 1800.0
    point_timeout: float = 3600.0
    metrics_interval: float = 0.5
    retry_failed: bool = False
    max_restarts: int = 1
    seed: int = 0
    echo_server_log: bool = False

    def points(self) -> list[Point]:
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ServeError(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
        if not self.concurrencies and not self.request_rates:
            raise ServeError("give at least one load point: --concurrency 1,8,32 and/or --request-rate 2,8")
        for c in self.concurrencies:
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise ServeError(f"--concurrency {c}: expected positive numbers of requests in flight, e.g. 1,8,32")
        for r in self.request_rates:
            if not r > 0:  # nan too
                raise ServeError(f"--request-rate {r:g}: expected positive request rates (req/s), e.g. 2,8 "
                                 "(inf sends every request at once)")
        if self.num_prompts < 1:
            raise ServeError(f"--num-prompts {self.num_prompts}: expected a positive number of requests per load "
                             "point, e.g. 200")
        if self.prompts_per_concurrency < 0:
            raise ServeError(f"--prompts-per-concurrency {self.prompts_per_concurrency}: expected 0 (off) or a "
                             "positive multiple of the concurrency")
        loads = [(c, None) for c in self.concurrencies] + [(None, r) for r in self.request_rates]
        return [Point(w, m, c, r) for m in self.modes for w in self.workloads for c, r in loads]

    @property
    def checkpoint(self) -> Path:
        return self.out.with_suffix(".points.jsonl")

    @property
    def server_pid_file(self) -> Path:
        return self.out.with_suffix(".server.pid")

    def prompts(self, p: Point) -> int:
        """Requests sent at a load point."""
        return max(self.num_prompts, self.prompts_per_concurrency * (p.concurrency or 0))

    def key(self, p: Point) -> str:
        return point_key(self.model_name, self.server.num_speculative_tokens, p.workload, p.mode, p.concurrency,
                         p.request_rate)


def point_key(model: str, k: int, workload: str, mode: str, concurrency, request_rate) -> str:
    """The checkpoint's key of a point; a table row has it as (model, num_drafts, workload, mode, concurrency,
    request_rate)."""
    return json.dumps([model, k, workload, mode, concurrency, request_rate])


def load_checkpoint(path: Path) -> dict[str, dict]:
    """{key: record} of the points already finished (the last record of a key wins)."""
    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
            done[rec["key"]] = rec
    return done


def bench_command(cfg: SweepConfig, p: Point, result_dir: Path, result_name: str) -> list[str]:
    s = cfg.server
    argv = [s.vllm, "bench", "serve", "--backend", "openai", "--base-url", s.base_url,
            "--endpoint", "/v1/completions", "--model", s.served_model_name or s.model,
            *WORKLOADS[p.workload].bench_args(cfg.dataset_dir),
            "--num-prompts", str(cfg.prompts(p)), "--seed", str(cfg.seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "99",
            "--save-result", "--result-dir", str(result_dir), "--result-filename", result_name]
    if p.concurrency is not None:
        argv += ["--max-concurrency", str(p.concurrency)]
    if p.request_rate is not None:
        argv += ["--request-rate", str(p.request_rate)]
    return argv


def _base_row(cfg: SweepConfig, p: Point) -> dict:
    s = cfg.server
    acc, plan = acceptance_of(s), capture_plan(s)
    return {"model": cfg.model_name, "gpu": cfg.device, "tp": s.tp, "gmu": s.gmu, "workload": p.workload,
            "mode": p.mode, "tree": str((1,) * s.num_speculative_tokens), "num_drafts": s.num_speculative_tokens,
            "concurrency": p.concurrency, "request_rate": p.request_rate, "simulated": False,
            "device": cfg.device, "date": _dt.date.today().isoformat(), "max_num_seqs": s.max_num_seqs,
            "weights": "dummy" if dummy_weights(s) else "real", "acceptance_source": acc.source,
            "acceptance_rates": None if acc.rates is None else list(acc.rates),
            "expected_tokens_per_step": acc.expected_tokens_per_step, "cudagraph_max_size": plan.max_size,
            "eager_fallback_possible": plan.eager_fallback_possible, "compilation_config": plan.compilation_config}


def _float(x):
    return None if x is None else float(x)


def row_from_result(cfg: SweepConfig, p: Point, result: dict, metrics) -> dict:
    row = _base_row(cfg, p)
    row.update({
        "completed": result.get("completed"), "failed": result.get("failed"),
        "output_throughput": _float(result.get("output_throughput")),
        "request_throughput": _float(result.get("request_throughput")),
        "mean_ttft_ms": _float(result.get("mean_ttft_ms")), "p99_ttft_ms": _float(result.get("p99_ttft_ms")),
        "mean_tpot_ms": _float(result.get("mean_tpot_ms")), "mean_e2el_ms": _float(result.get("mean_e2el_ms")),
        "peak_kv_usage": metrics.peak_kv_usage, "peak_running": metrics.peak_running,
        "preemptions": metrics.preemptions,
        "acceptance_length": metrics.acceptance_length if metrics.acceptance_length is not None
        else _float(result.get("spec_decode_acceptance_length")),
        "error": None,
    })
    check = check_acceptance(acceptance_of(cfg.server), cfg.server.num_speculative_tokens, metrics.spec_drafts,
                             metrics.spec_accepted_tokens, metrics.spec_accepted_per_pos, metrics.spec_draft_tokens)
    row.update({"measured_acceptance_rates": None if check.rates is None else list(check.rates),
                "acceptance_stderr": check.stderr, "acceptance_warning": check.warning})
    if (result.get("completed") or 0) == 0:
        row["error"] = f"no request completed ({result.get('failed')} failed)"
    return row


def failed_row(cfg: SweepConfig, p: Point, error: str) -> dict:
    row = _base_row(cfg, p)
    row.update({"completed": 0, "failed": cfg.prompts(p), "error": error})
    return row


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
        self.cfg.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.cfg.checkpoint, "ab+") as f:
            # a line cut short by an interruption gets its newline first, so this record starts a line of its own
            if f.seek(0, os.SEEK_END):
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(json.dumps(rec).encode() + b"\n")
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

    def run_point(self, srv: VLLMServer, p: Point) -> dict:
        name = p.label() + ".json"
        result_path = self.result_dir / name
        result_path.unlink(missing_ok=True)
        argv = bench_command(self.cfg, p, self.result_dir, name)
        scraper = MetricsScraper(srv.base_url, interval=self.cfg.metrics_interval).start()
        try:
            code, out = _run_group(argv, self.cfg.point_timeout)
        finally:
            metrics = scraper.stop()
        if srv.alive and not srv.healthy():
            try:  # a server that stopped answering is usually on its way out: let it finish dying
                srv.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        if not srv.alive:
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
        try:
            for mode in self.cfg.modes:
                points = [p for p in todo if p.mode == mode]
                if not points:
                    continue
                srv, restarts, start_error = None, 0, None
                try:
                    for p in points:
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


def write_server_pid(path: Path, pid: int, port: int) -> None:
    """Record a started server (pid, start time, port) beside the table, for the next run if this one is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid), "port": port}) + "\n")
    os.replace(tmp, path)


def stop_leftover_server(path: Path, log: Callable[[str], None]) -> None:
    """Stop the server an earlier run recorded in ``path`` and never stopped: that run was killed where the kernel's
    parent-death signal is missing, or the server's engine processes outlived it. The server leads its own process
    group, and the whole group is stopped; a record of a process that is gone, or of another process that got the
    same pid since (another start time), is removed."""
    if not path.is_file():
        return
    try:
        rec = json.loads(path.read_text())
        pid, start, port = int(rec["pid"]), rec.get("start_time"), rec.get("port")
    except (ValueError, KeyError, TypeError):
        raise ServeError(f"{path} is not a server record bench-serve wrote; if no vLLM server of this sweep is "
                         "still running, delete it and rerun") from None
    if not has_proc():
        if process_alive(pid):
            raise ServeError(f"a vLLM server an earlier run of this sweep started may still be running (pid {pid}, "
                             f"port {port}, recorded in {path}): stop it with `kill -TERM -{pid}`, delete {path}, "
                             "then rerun")
        path.unlink()
        return
    reused = start is not None and process_alive(pid) and not process_alive(pid, start)
    if not reused and group_members(pid):
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                raise ServeError(f"the vLLM server an earlier run of this sweep left running (pid {pid}, port {port}) "
                                 f"cannot be stopped from here (permission denied): stop it, delete {path}, then "
                                 "rerun") from None
            deadline = time.monotonic() + wait
            while group_members(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not group_members(pid):
                break
        if left := group_members(pid):
            raise ServeError(f"the vLLM server an earlier run of this sweep left running (pid {pid}, port {port}) "
                             f"did not stop on SIGKILL (processes {left}); stop them, delete {path}, then rerun")
        log(f"stopped the vLLM server (pid {pid}, port {port}) that an earlier run of this sweep left running")
    path.unlink(missing_ok=True)


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
