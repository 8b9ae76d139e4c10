"""What a serving sweep measures: the workloads as ``vllm bench serve`` arguments, the load points, the sweep's
configuration, the bench command of a point and the tidy row (``treewy.schema.SERVING_SCHEMA``) it becomes."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from treewy.serve.acceptance import check_acceptance
from treewy.serve.launcher_command import (
    ServeError, ServeOptions, acceptance_of, acceptance_positions, capture_plan, dummy_weights,
)
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
    warmup_waves: int = 1                 # unmeasured requests before a point, in multiples of its own; 0: none
    stop_after_s: float | None = None     # start no point once this many seconds have passed (the rest: a later run)

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
        if isinstance(self.warmup_waves, bool) or not isinstance(self.warmup_waves, int) or self.warmup_waves < 0:
            raise ServeError(f"warmup_waves = {self.warmup_waves!r}: expected 0 (no warm-up) or how many times each "
                             "point's requests to send unmeasured before it, e.g. 1")
        if self.stop_after_s is not None and not self.stop_after_s > 0:
            raise ServeError(f"--stop-after {self.stop_after_s}: expected a positive number of seconds, e.g. 480")
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

    def warmups(self, p: Point) -> int:
        """Unmeasured requests sent before a point's measured run (``warmup_bodies``): ``warmup_waves`` times as many
        as the point sends, at its concurrency (a rate point: as many at once as the server runs). As many, and not
        one wave of the concurrency, because a prompt length can be a new kernel shape too: after a warm-up of one
        request, single-request points still had first requests of 0.9-1.3 s TTFT against about 0.17 s (H200,
        2026-12-02), and short warm-up requests make the extra ones cheap."""
        return self.warmup_waves * self.prompts(p)

    def key(self, p: Point) -> str:
        return point_key(self.model_name, self.server.num_speculative_tokens, p.workload, p.mode, p.concurrency,
                         p.request_rate, self.server.tree)


def point_key(model: str, k: int, workload: str, mode: str, concurrency, request_rate, tree=None) -> str:
    """The checkpoint's key of a point; a table row has it as (model, num_drafts, workload, mode, concurrency,
    request_rate) and, for a served tree, its widths (a chain's key is unchanged, so older checkpoints resume)."""
    return json.dumps([model, k, workload, mode, concurrency, request_rate] + ([list(tree)] if tree else []))


def tree_label(s: ServeOptions) -> str:
    """The row's tree column: the served tree's widths, or a chain of k as (1, ..., 1)."""
    return str(tuple(s.tree) if s.tree else (1,) * s.num_speculative_tokens)


def bench_command(cfg: SweepConfig, p: Point, result_dir: Path, result_name: str) -> list[str]:
    s = cfg.server
    argv = [s.vllm, "bench", "serve", "--backend", "openai", "--base-url", s.base_url,
            "--endpoint", "/v1/completions", "--model", s.served_model_name or s.model,
            *WORKLOADS[p.workload].bench_args(cfg.dataset_dir),
            "--num-prompts", str(cfg.prompts(p)), "--seed", str(cfg.seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "99",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_name]
    if p.concurrency is not None:
        argv += ["--max-concurrency", str(p.concurrency)]
    if p.request_rate is not None:
        argv += ["--request-rate", str(p.request_rate)]
    return argv


#: Output tokens of a warm-up request: a few decode steps, whose graphs the server captured when it started.
WARMUP_OUTPUT_TOKENS = 16
#: Prompt length of a warm-up request for a workload whose prompts come from a file (their lengths vary).
WARMUP_FILE_PROMPT_TOKENS = 256


def warmup_bodies(cfg: SweepConfig, p: Point) -> list[dict]:
    """The /v1/completions bodies of a point's warm-up (``cfg.warmups(p)`` of them, sent ``p.concurrency`` at a time
    just before the point). The first steps of a new batch shape compile and tune kernels during inference (prefill
    chunks of a new token count pick new MoE and GDN kernel configurations); the warm-up pays that instead of the
    point's first requests. Its prompts have the workload's lengths (random ones: uniform within its spread) but
    token ids of their own (byte ids 1..255, drawn from a seed the measured prompts do not use), so no measured
    prompt is in the prefix cache, and each asks for WARMUP_OUTPUT_TOKENS tokens: the prefill shapes of the point's
    requests at a small part of their time. (vLLM's ``--num-warmups`` would instead send copies of the first
    prompt at full output length: the same prefill each time, for a wave's whole time.)"""
    n = cfg.warmups(p)
    w = WORKLOADS[p.workload]
    rng = np.random.default_rng([cfg.seed, 1 << 20, *p.label().encode()])
    if w.dataset == "random":
        lo, hi = int(w.input_len * (1 - w.range_ratio)), int(w.input_len * (1 + w.range_ratio))
        lengths = rng.integers(max(lo, 1), max(hi, 1) + 1, size=n)
    else:
        lengths = np.full(n, WARMUP_FILE_PROMPT_TOKENS)
    model = cfg.server.served_model_name or cfg.server.model
    return [{"model": model, "prompt": rng.integers(1, 256, size=int(m)).tolist(), "max_tokens": WARMUP_OUTPUT_TOKENS,
             "ignore_eos": True, "temperature": 0.0, "stream": False}
            for m in lengths]


def _base_row(cfg: SweepConfig, p: Point) -> dict:
    s = cfg.server
    acc, plan = acceptance_of(s), capture_plan(s)
    return {"model": cfg.model_name, "gpu": cfg.device, "tp": s.tp, "gmu": s.gmu, "workload": p.workload,
            "mode": p.mode, "tree": tree_label(s), "num_drafts": s.num_speculative_tokens,
            "concurrency": p.concurrency, "request_rate": p.request_rate, "simulated": False,
            "device": cfg.device, "date": _dt.date.today().isoformat(), "max_num_seqs": s.max_num_seqs,
            "weights": "dummy" if dummy_weights(s) else "real", "acceptance_source": acc.source,
            "acceptance_rates": None if acc.rates is None else list(acc.rates),
            "expected_tokens_per_step": acc.expected_tokens_per_step, "warmup_requests": cfg.warmups(p),
            "cudagraph_max_size": plan.max_size,
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
        "mean_tpot_ms": _float(result.get("mean_tpot_ms")), "median_tpot_ms": _float(result.get("median_tpot_ms")),
        "mean_e2el_ms": _float(result.get("mean_e2el_ms")),
        "peak_kv_usage": metrics.peak_kv_usage, "peak_running": metrics.peak_running,
        "preemptions": metrics.preemptions,
        "acceptance_length": metrics.acceptance_length if metrics.acceptance_length is not None
        else _float(result.get("spec_decode_acceptance_length")),
        "error": None,
    })
    n, k = acceptance_positions(cfg.server), cfg.server.num_speculative_tokens
    per_pos, draft_tokens = metrics.spec_accepted_per_pos, metrics.spec_draft_tokens
    if cfg.server.tree is not None:  # vLLM counts a tree's emitted tokens by position: position d - 1 is depth d
        per_pos = None if per_pos is None else list(per_pos)[:n]
        draft_tokens = None if draft_tokens is None else draft_tokens * n / k
    check = check_acceptance(acceptance_of(cfg.server), n, metrics.spec_drafts, metrics.spec_accepted_tokens, per_pos,
                             draft_tokens)
    row.update({"measured_acceptance_rates": None if check.rates is None else list(check.rates),
                "acceptance_stderr": check.stderr, "acceptance_warning": check.warning})
    if (result.get("completed") or 0) == 0:
        row["error"] = f"no request completed ({result.get('failed')} failed)"
    return row


def failed_row(cfg: SweepConfig, p: Point, error: str) -> dict:
    row = _base_row(cfg, p)
    row.update({"completed": 0, "failed": cfg.prompts(p), "error": error})
    return row
