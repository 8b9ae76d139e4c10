"""The sweep driver: ``simulate(...)`` runs load points and returns the shared serving table."""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from treewy.paper import ACCEPTANCE, CONCURRENCIES, SERVING_RATIOS
from treewy.memory import GPU, MODES, ModelSpec, ServerConfig, paging, tree_depth, tree_num_nodes
from treewy.schema import serving_frame
from treewy.results import fastest_rows, kernel_table, newest_targets
from treewy.sim.cost import StepCost
from treewy.sim.pool import run_points
from treewy.sim.workloads import WORKLOADS, poisson_arrivals, sample_lengths
from treewy.workloads import CATALOGUE

#: The largest closed-loop concurrency simulated: every request in flight is stepped through every engine step,
#: so the run time grows with concurrency x requests (4 x concurrency by default).
MAX_CONCURRENCY = 4096
MAX_SEED = 2**63 - 1


def rates_for_mean(mean_length: float, depth: int) -> np.ndarray:
    """Per-depth conditional acceptance rates, all equal to p, with 1 + p + ... + p^depth = mean_length.

    The paper publishes only mean acceptance lengths, so a constant rate per depth is the
    one-parameter reading of a mean."""
    if depth == 0:
        return np.zeros(0)
    if not 1.0 <= mean_length <= depth + 1:
        raise ValueError(f"acceptance length {mean_length} is impossible for depth {depth}: "
                         f"it lies between 1 and {depth + 1}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(depth + 1)) < mean_length:
            lo = mid
        else:
            hi = mid
    return np.full(depth, (lo + hi) / 2)


def acceptance_rates(tree, acceptance=None) -> tuple[np.ndarray, str]:
    """Per-depth conditional acceptance rates for a tree, and where they came from.

    acceptance: None (the paper's acceptance length for this shape, or for the chain of the same
    depth); a float (a mean acceptance length); a sequence of per-depth rates; or a polars frame
    from an acceptance sweep with an ``acceptance_length`` column (and optionally ``tree``)."""
    depth = tree_depth(tree)
    if acceptance is None:
        key = tuple(tree) if isinstance(tree, (tuple, list)) else None
        if key in ACCEPTANCE:
            return rates_for_mean(ACCEPTANCE[key], depth), f"paper {key}"
        return rates_for_mean(min(ACCEPTANCE[(1, 1, 1)], depth + 1), depth), "paper chain (1, 1, 1)"
    if isinstance(acceptance, pl.DataFrame):
        df = acceptance
        if "acceptance_length" not in df.columns:
            raise ValueError(f"acceptance frame has columns {df.columns}: it needs 'acceptance_length' "
                             "(tokens per step), e.g. the acceptance sweep's result")
        if "tree" in df.columns:
            sel = df.filter(pl.col("tree") == str(tuple(tree)))
            df = sel if sel.height else df
        return rates_for_mean(float(df["acceptance_length"].mean()), depth), "acceptance frame"
    if isinstance(acceptance, (int, float)) and not isinstance(acceptance, bool):
        return rates_for_mean(float(acceptance), depth), f"mean {acceptance}"
    rates = np.asarray(acceptance, dtype=float)
    if rates.shape != (depth,) or (rates < 0).any() or (rates > 1).any():
        raise ValueError(f"acceptance = {list(rates)}: expected {depth} per-depth rates in [0, 1] for a tree of "
                         f"depth {depth}, e.g. {[0.86] * depth}")
    return rates, "given rates"


def _as_list(name, value, allowed=None):
    items = [value] if isinstance(value, str) else list(value)
    if allowed is not None:
        for v in items:
            if v not in allowed:
                raise ValueError(f"{name} = {v!r}: expected one of {list(allowed)}")
    return items


def _check_points(concurrency, rate):
    if (concurrency is None) == (rate is None):
        raise ValueError("pass exactly one of concurrency=[...] (closed loop) or rate=[...] (Poisson, req/s); "
                         f"got concurrency={concurrency!r}, rate={rate!r}")
    vals = concurrency if concurrency is not None else rate
    name = "concurrency" if concurrency is not None else "rate"
    vals = [vals] if isinstance(vals, (int, float)) else list(vals)
    for v in vals:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if name == "concurrency":
            ok = ok and isinstance(v, int)
        if not ok:
            what = "positive integers (requests in flight)" if name == "concurrency" else "positive request rates (req/s)"
            raise ValueError(f"{name} = {v!r}: expected {what}, e.g. {name}={[1, 8, 32] if name == 'concurrency' else [1.0, 4.0]}")
        if name == "concurrency" and v > MAX_CONCURRENCY:
            raise ValueError(f"concurrency = {v!r}: the simulator runs at most {MAX_CONCURRENCY} requests in flight "
                             "(the default sends 4 x concurrency requests, each stepped through every engine step); "
                             "e.g. concurrency=[1024, 4096]")
    if not vals:
        raise ValueError(f"{name} = {vals!r}: expected at least one load point, e.g. "
                         f"{name}={[1, 8, 32] if name == 'concurrency' else [1.0, 4.0]}")
    return name, vals


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed = {seed!r}: expected an integer in 0..2**63 - 1")


def _kernel_file(kernels) -> Path | None:
    """The kernel table ``kernels`` names, read once here so that a missing or malformed file is refused in every
    mode (store_all never prices from it) instead of ignored."""
    if kernels is None:
        return None
    if isinstance(kernels, str) and kernels == "auto":
        return newest_targets()
    how = "pass a targets_*.json or kernels_*.json, 'auto' (the current targets table) or None (analytic)"
    if not isinstance(kernels, (str, Path)):
        raise ValueError(f"kernels = {kernels!r}: {how}")
    path = Path(kernels)
    if not path.is_file():
        raise ValueError(f"kernels = {str(kernels)!r}: no such file; {how}")
    try:
        rows = fastest_rows(kernel_table(path)["rows"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, or not rows of kernel timings
        raise ValueError(f"kernels = {str(kernels)!r} is not a kernel table ({type(e).__name__}: {e}); {how}") from e
    if not rows:
        raise ValueError(f"kernels = {str(kernels)!r} is not a kernel table (no timed rows); {how}")
    return path


def simulate(model="qwen3.5-35b-a3b", gpu="b200", tp: int = 1, gmu: float = 0.6, mode="store_all", tree=(1, 1, 1),
             workload="generation-heavy", concurrency=None, rate=None, seed: int = 0, *, num_prompts: int | None = None,
             state_dtype: str | None = None, acceptance=None, kernels="auto",
             server: ServerConfig = ServerConfig(), lengths: tuple[Sequence[int], Sequence[int]] | None = None,
             return_points: bool = False, workers: int | None = None, on_point=None):
    """Simulate a vLLM-style server; one row per (workload, mode, load point), labelled simulated.

    mode and workload may also be lists (a sweep); concurrency points go up to MAX_CONCURRENCY (4096). kernels: "auto" (the current measured kernel targets table,
    ``treewy.results.newest_targets``: treewy/data/index.json's "kernel_targets"), a path to a targets_*.json or kernels_*.json, or None (analytic only);
    the ``cost_source`` column says which table priced each row.
    lengths: explicit (prompt_lens, output_lens) instead of a workload's distribution.
    workers: processes for the points (``treewy.sim.pool``; default ``TREEWY_SIM_WORKERS`` or every core, 1: here);
    the rows do not depend on it. on_point(done, total): progress, as each (workload, mode, point) finishes.
    """
    tasks, frame = _plan(model, gpu, tp, gmu, mode, tree, workload, concurrency, rate, seed,
                         num_prompts=num_prompts, state_dtype=state_dtype, acceptance=acceptance, kernels=kernels,
                         server=server, lengths=lengths)
    raw = run_points(tasks, workers, on_point)
    return (frame(raw), raw) if return_points else frame(raw)


def simulate_many(calls: Sequence[dict], workers: int | None = None, on_point=None) -> list[pl.DataFrame]:
    """``[simulate(**kw) for kw in calls]``, every call's points in one batch across the workers: a call's points no
    longer wait for the previous call's slowest (the frames are the same, to the bit). on_point(done, total):
    progress over all the calls' points."""
    plans = []
    for kw in calls:
        bad = {"workers", "on_point", "return_points"} & set(kw)
        if bad:
            raise ValueError(f"calls: {sorted(bad)} apply to the whole batch; pass them to simulate_many itself")
        plans.append(_plan(**kw))
    raw = run_points([t for tasks, _ in plans for t in tasks], workers, on_point)
    frames, start = [], 0
    for tasks, frame in plans:
        frames.append(frame(raw[start:start + len(tasks)]))
        start += len(tasks)
    return frames


def _plan(model="qwen3.5-35b-a3b", gpu="b200", tp: int = 1, gmu: float = 0.6, mode="store_all", tree=(1, 1, 1),
          workload="generation-heavy", concurrency=None, rate=None, seed: int = 0, *, num_prompts: int | None = None,
          state_dtype: str | None = None, acceptance=None, kernels="auto",
          server: ServerConfig = ServerConfig(), lengths: tuple[Sequence[int], Sequence[int]] | None = None):
    """simulate's arguments checked and its points laid out: (tasks for ``run_points``, frame(raw results) -> rows)."""
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    gpu = gpu if isinstance(gpu, GPU) else GPU.from_name(gpu)
    modes = _as_list("mode", mode, MODES)
    workloads = _as_list("workload", workload, None if lengths is not None else list(CATALOGUE))
    kind, points = _check_points(concurrency, rate)
    _check_seed(seed)
    if num_prompts is not None and (isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts <= 0):
        raise ValueError(f"num_prompts = {num_prompts!r}: expected a positive integer (requests per load point)")
    if lengths is not None:
        p_in, p_out = (np.asarray(x) for x in lengths)
        for nm, arr in (("prompt length", p_in), ("output length", p_out)):
            if arr.size == 0 or (arr <= 0).any() or not np.issubdtype(arr.dtype, np.integer):
                bad = arr[arr <= 0][:1].tolist() if arr.size else []
                raise ValueError(f"lengths: every {nm} must be a positive integer number of tokens, got {bad or arr.dtype}; "
                                 "drop empty requests or pass token counts")
    kernel_file = _kernel_file(kernels)
    rates, acc_source = acceptance_rates(tree, acceptance)
    accept_cum = np.cumprod(rates)
    tree_str = str(tuple(tree)) if isinstance(tree, (tuple, list)) else repr(tree)
    T = tree_num_nodes(tree)
    layouts = {m: paging(model, gpu, tp=tp, gmu=gmu, mode=m, tree=tree, state_dtype=state_dtype, server=server)
               for m in modes}
    costs = {m: StepCost(model, gpu, tp, m, tuple(tree) if isinstance(tree, list) else tree,
                         layouts[m].state_dtype, kernel_file, server=server)
             for m in modes}
    today = _dt.date.today().isoformat()
    tasks, labels = [], []
    for wi, wl in enumerate(workloads):
        for pi, point in enumerate(points):
            if num_prompts is not None:
                n = num_prompts
            elif lengths is not None:
                n = len(lengths[0])
            else:
                n = max(16, 4 * int(point)) if kind == "concurrency" else 256
            lrng = np.random.default_rng([seed, wi, pi, 0])
            if lengths is not None:
                idx = np.arange(n) % len(p_in)
                prompt, out = p_in[idx].astype(np.int64), p_out[idx].astype(np.int64)
            else:
                prompt, out = sample_lengths(wl, n, lrng)
            send_times = poisson_arrivals(float(point), n, lrng) if kind == "rate" else None
            for m in modes:
                tasks.append(((layouts[m], costs[m], prompt, out),
                              dict(accept_cum=accept_cum, rng=np.random.default_rng([seed, wi, pi, 1]),
                                   concurrency=int(point) if kind == "concurrency" else None, send_times=send_times,
                                   server=server)))
                labels.append((wl, point, m))

    def frame(raw) -> pl.DataFrame:
        return serving_frame([_row(res, model=model.name, gpu=gpu.name, tp=tp, gmu=gmu, workload=wl, mode=m,
                                   tree=tree_str, num_drafts=T - 1, kind=kind, point=point, date=today,
                                   cost_source=costs[m].source, max_num_seqs=server.max_num_seqs,
                                   error=_fit_error(res, layouts[m]))
                              for res, (wl, point, m) in zip(raw, labels)])

    return tasks, frame


def _fit_error(res, layout) -> str | None:
    """Why requests failed: the scheduler fails only a request whose KV blocks and state pages exceed the pool."""
    n = int(res.failed.sum())
    if not n:
        return None
    tokens = (res.prompt + res.output)[res.failed]
    need = layout.attn_groups * -(-tokens // layout.block_size) + layout.state_blocks_per_request
    return (f"{n} of {len(res.failed)} requests can never fit: the smallest of them needs {int(need.min())} blocks "
            f"({layout.state_blocks_per_request} of them GDN state) and the pool holds {res.num_blocks}; raise gmu, "
            "shrink the tree or shorten the requests")


def _row(res, *, kind, point, **labels) -> dict:
    ok = ~res.failed
    ttft = (res.t_first - res.t_send)[ok] * 1e3
    e2el = (res.t_done - res.t_send)[ok] * 1e3
    multi = ok & (res.output > 1)
    tpot = ((res.t_done - res.t_first)[multi] / (res.output[multi] - 1)) * 1e3
    dur = max(res.duration, 1e-12)
    return {
        **labels,
        "concurrency": int(point) if kind == "concurrency" else None,
        "request_rate": float(point) if kind == "rate" else None,
        "completed": int(ok.sum()),
        "failed": int(res.failed.sum()),
        "output_throughput": float(res.output[ok].sum() / dur),
        "request_throughput": float(ok.sum() / dur),
        "mean_ttft_ms": float(ttft.mean()) if ttft.size else None,
        "p99_ttft_ms": float(np.percentile(ttft, 99)) if ttft.size else None,
        "mean_tpot_ms": float(tpot.mean()) if tpot.size else None,
        "median_tpot_ms": float(np.median(tpot)) if tpot.size else None,
        "mean_e2el_ms": float(e2el.mean()) if e2el.size else None,
        "peak_kv_usage": res.peak_blocks / res.num_blocks,
        "peak_running": res.peak_running,
        "preemptions": res.preemptions,
        "acceptance_length": res.decode_tokens / res.decode_steps if res.decode_steps else None,
        "simulated": True,
        "device": "simulated",
    }


def simulate_measured_point(row: dict, gpu: str, server: ServerConfig = ServerConfig(), *, with_point: bool = False):
    """The simulated twin of one measured closed-loop row (``treewy bench-serve``): same model, TP, gmu, workload,
    mode, concurrency, requests sent (completed + failed) and acceptance length, on the simulator's ``gpu``. Returns
    its row (a dict); ``with_point``: (row, the scheduler's PointResult, with its step counts)."""
    c = row["concurrency"]
    df, (point,) = simulate(row["model"], gpu, row["tp"], row["gmu"], mode=row["mode"], workload=row["workload"],
                            concurrency=[c], num_prompts=row["completed"] + (row["failed"] or 0),
                            acceptance=row["acceptance_length"] or None, server=server, return_points=True)
    return (df.row(0, named=True), point) if with_point else df.row(0, named=True)


def sweep(model="qwen3.5-35b-a3b", gpu="b200", tp=1, gmu=0.6, tree=(1, 1, 1), concurrency=CONCURRENCIES, seed=0,
          **kw) -> pl.DataFrame:
    """All five workloads x both modes x the closed-loop concurrencies."""
    return simulate(model, gpu, tp, gmu, mode=list(MODES), tree=tree, workload=list(WORKLOADS),
                    concurrency=list(concurrency), seed=seed, **kw)


def ratio_table(df: pl.DataFrame) -> pl.DataFrame:
    """TreeWY / store-all ratios per concurrency, geomean over workloads (> 1 favours TreeWY)."""
    key = ["workload", "concurrency"]
    s = df.filter(pl.col("mode") == "store_all").select(key + ["output_throughput", "peak_kv_usage", "p99_ttft_ms",
                                                               "mean_tpot_ms", "peak_running"])
    r = df.filter(pl.col("mode") == "reconstruct").select(key + ["output_throughput", "peak_kv_usage", "p99_ttft_ms",
                                                                 "mean_tpot_ms", "peak_running"])
    j = s.join(r, on=key, suffix="_r")
    j = j.with_columns(
        (pl.col("output_throughput_r") / pl.col("output_throughput")).alias("output throughput"),
        (pl.col("peak_kv_usage") / pl.col("peak_kv_usage_r")).alias("peak KV usage reduction"),
        (pl.col("p99_ttft_ms") / pl.col("p99_ttft_ms_r")).alias("p99 TTFT speedup"),
        (pl.col("mean_tpot_ms") / pl.col("mean_tpot_ms_r")).alias("TPOT speedup"),
        (pl.col("peak_running_r") / pl.col("peak_running")).alias("peak admitted requests"),
    )
    metrics = list(SERVING_RATIOS)
    return (j.group_by("concurrency")
            .agg([pl.col(m).log().mean().exp() for m in metrics])
            .sort("concurrency"))


def format_ratio_table(df: pl.DataFrame, title: str = "") -> str:
    """The serving table of DESIGN §4, simulated ratios with the paper's beside them in brackets. A concurrency at
    which a mode completes no request in some workload has no ratios: its cells say so, and a line below says why."""
    table = ratio_table(df)
    concs = table["concurrency"].to_list()
    empty = (df.filter(pl.col("concurrency").is_not_null()).group_by("mode", "concurrency")
             .agg((pl.col("completed") == 0).any().alias("none")).filter(pl.col("none")))
    none_at = {m: sorted(empty.filter(pl.col("mode") == m)["concurrency"].to_list()) for m in MODES}
    blank = {c for cs in none_at.values() for c in cs}
    paper_conc = list(CONCURRENCIES)
    width = 14
    head = f"| {'concurrency':<26}|" + "".join(f"{c:>{width}} |" for c in concs)
    lines = [title, "", "simulated TreeWY / store-all, geomean over workloads  [paper, 35B TP1 B200 gmu 0.6]", "",
             head, "|" + "-" * 27 + "|" + ("-" * (width + 1) + "|") * len(concs)]
    for m in SERVING_RATIOS:
        cells = []
        for c, v in zip(concs, table[m].to_list()):
            paper = f"[{SERVING_RATIOS[m][paper_conc.index(c)]:.2f}]" if c in paper_conc else ""
            value = "  none" if c in blank or v is None else f"{v:6.2f}"
            cells.append(f"{value} {paper:>7}".rjust(width) + " |")
        lines.append(f"| {m:<26}|" + "".join(cells))
    for m, cs in none_at.items():
        if cs:
            lines.append(f"{m} admits no request at concurrency {', '.join(map(str, cs))} in some workload: no ratio "
                         "there (the rows' error column says what does not fit)")
    return "\n".join(lines)


def knee(df: pl.DataFrame, mode: str = "store_all", threshold: float = 0.98) -> int | None:
    """The lowest concurrency at which ``mode``'s KV pool is full (peak usage >= threshold) for any
    workload: from there on it cannot admit every request in flight. None if it never fills."""
    full = df.filter((pl.col("mode") == mode) & (pl.col("peak_kv_usage") >= threshold) & pl.col("concurrency").is_not_null())
    return None if full.is_empty() else int(full["concurrency"].min())
