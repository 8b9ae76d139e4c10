"""The tidy serving table shared by the simulator (treewy.sim) and the vLLM sweep driver (treewy.serve).

One row per (workload, load point, mode). Column names follow ``vllm bench serve``'s result JSON
where one exists (output_throughput, p99_ttft_ms, mean_tpot_ms, mean_e2el_ms).
"""

from __future__ import annotations

import polars as pl

SERVING_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String,             # preset name or model path
    "gpu": pl.String,               # b200 / h200 / h100 / the device name of a real run
    "tp": pl.Int64,
    "gmu": pl.Float64,              # gpu-memory-utilization
    "workload": pl.String,          # sharegpt-chat, spec-bench, balanced-chat, generation-heavy, summarize-heavy
    "mode": pl.String,              # store_all | reconstruct | none (no speculation)
    "tree": pl.String,              # branching factors, e.g. "(1, 1, 1)"
    "num_drafts": pl.Int64,         # N
    "concurrency": pl.Int64,        # closed loop: max concurrent requests (null for rate points)
    "request_rate": pl.Float64,     # open loop: Poisson rate in req/s (null for concurrency points)
    "completed": pl.Int64,
    "failed": pl.Int64,
    "output_throughput": pl.Float64,  # output tokens / s
    "request_throughput": pl.Float64,
    "mean_ttft_ms": pl.Float64,
    "p99_ttft_ms": pl.Float64,
    "mean_tpot_ms": pl.Float64,
    "mean_e2el_ms": pl.Float64,
    "peak_kv_usage": pl.Float64,    # fraction of the KV pool (mamba pages included), 0..1
    "peak_running": pl.Int64,       # peak number of running (admitted) requests
    "preemptions": pl.Int64,
    "acceptance_length": pl.Float64,  # tokens emitted per speculative step
    "simulated": pl.Boolean,
    "device": pl.String,            # "simulated" or the GPU a measurement ran on
    "date": pl.String,              # ISO date of the run
    "error": pl.String,             # null for a good point; why a measured point failed (treewy.serve)
    "cost_source": pl.String,       # simulator only: GDN state cost "analytic" or "measured:<kernels file>"
    "max_num_seqs": pl.Int64,       # the server's cap on running requests (vLLM --max-num-seqs; the simulator's)
    "weights": pl.String,           # measured only: "real", or "dummy" (--load-format dummy: no draft accepted)
    # measured only: the acceptance asked of vLLM (treewy.serve.acceptance) and what its counters show
    "acceptance_source": pl.String,   # --acceptance: "paper-35b", "tiny", "length=L", "rates=A1,...", or "none" (real)
    "acceptance_rates": pl.List(pl.Float64),  # requested unconditional per-position rates (null: real acceptance)
    "expected_tokens_per_step": pl.Float64,   # 1 + sum(acceptance_rates)
    "measured_acceptance_rates": pl.List(pl.Float64),  # vLLM's accepted_per_pos / drafts over the point
    "acceptance_stderr": pl.Float64,  # standard error of acceptance_length for this many drafts (synthetic only)
    "acceptance_warning": pl.String,  # null, or why acceptance_length strays beyond noise from the request
    # measured only: CUDA graphs (treewy.serve.launcher.capture_plan)
    "cudagraph_max_size": pl.Int64,   # the largest step, in tokens, captured as a CUDA graph (0: none)
    "eager_fallback_possible": pl.Boolean,  # True when max_num_seqs x (1 + k) tokens exceeds cudagraph_max_size
    "compilation_config": pl.String,  # the --compilation-config JSON the server got (null: none passed)
    "warmup_requests": pl.Int64,      # measured only: unmeasured requests sent before the point (warmup_bodies)
    "median_tpot_ms": pl.Float64,     # the median request's time per output token (less moved by a few slow ones)
}

#: Columns added after the first tables were written: read as null from older files.
LATE_COLUMNS = ("max_num_seqs", "weights", "acceptance_source", "acceptance_rates", "expected_tokens_per_step",
                "measured_acceptance_rates", "acceptance_stderr", "acceptance_warning", "cudagraph_max_size",
                "eager_fallback_possible", "compilation_config", "warmup_requests", "median_tpot_ms")


def serving_frame(rows: list[dict]) -> pl.DataFrame:
    """A frame in the shared schema; missing columns are null, unknown columns are an error."""
    extra = {k for r in rows for k in r} - SERVING_SCHEMA.keys()
    if extra:
        raise ValueError(f"unknown serving columns {sorted(extra)}; the schema is treewy.schema.SERVING_SCHEMA")
    return pl.DataFrame([{k: r.get(k) for k in SERVING_SCHEMA} for r in rows], schema=SERVING_SCHEMA)


def load_measured(*dirs) -> pl.DataFrame:
    """Every measured (simulated == False) serving row in the parquet files of the given folders."""
    from pathlib import Path

    frames = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.parquet")) if Path(d).is_dir() else []:
            df = pl.read_parquet(path)
            missing = set(SERVING_SCHEMA) - set(df.columns)
            if missing <= set(LATE_COLUMNS):
                df = df.with_columns(pl.lit(None, SERVING_SCHEMA[c]).alias(c) for c in missing)
                frames.append(df.select(list(SERVING_SCHEMA)).filter(~pl.col("simulated")))
    return pl.concat(frames) if frames else serving_frame([])
