"""The simulator beside a measured serving sweep, and the fit of its fixed step costs (CPU, a few seconds).

    python -m benchmarks.sim_vs_measured treewy/data/serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-11-30.parquet \
        --gpu h200 --out benchmarks/results/sim_vs_measured_qwen3.5-35b-a3b_h200_2026-11-30.txt

For every good measured point (closed loop), simulates the same model, GPU, gmu, workload, mode, requests sent
and max_num_seqs with acceptance fixed at the measured one (dummy weights accept nothing)
(``treewy.sim.sweep.simulate_measured_point``), first with the assumed fixed costs (``ServerConfig``'s defaults), then fits
``measured TPOT - simulated TPOT = a + b x running requests`` by least squares over the points whose wave ran at
once (decode steps only), then the extra cost of a step run without CUDA graphs (``eager_step_s``) over the
other points, and simulates again with host_overhead_s += a, host_per_request_s = b and that eager cost. Then the
prefill costs that a wave's time to first token measures (``prefill_request_s`` per request with a prefill chunk in a
step, ``prefill_token_s`` per prefill token) by least squares on the relative mean TTFT of the points
``ttft_clean`` names (the others carry one-time costs or queueing: ``benchmarks/results/ttft_explained_2026-12-01.md``),
and the eager cost again with them. ``--long-steps RESULTS`` prices the eager step on what it measures directly
instead: the engine's long steps in vllm bench serve's records (``long_step_means``: their mean per point,
``benchmarks/long_steps_vs_sim.py``), matched by the simulated eager steps' mean at the same points. Prints and
writes one table: measured, assumed, fitted; and the time to first
token per point measured, then SIMULATED with the fixed costs of the TPOT fit alone, then with the prefill costs too,
mean and p99.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path



def simulate_like(rows, gpu: str, server):
    from tqdm.auto import tqdm

    from treewy.sim.sweep import simulate_measured_point

    return [simulate_measured_point(r, gpu, server) for r in tqdm(rows, desc="simulating", leave=False,
                                                                  disable=len(rows) < 10)]


#: vLLM 0.26's largest captured CUDA graph (tokens per step) on the sweep's servers of 2026-11-30, whose rows predate
#: the cudagraph_max_size column (their logs: max_cudagraph_capture_size 512); ``--compile decode`` captures
#: decode-only steps (FULL_DECODE_ONLY).
GRAPH_MAX_TOKENS_2026_11_30 = 512


def graph_max_tokens(rows) -> int:
    """The largest captured step of the measured servers: the rows' cudagraph_max_size (one value), else that of the
    2026-11-30 servers."""
    sizes = {r.get("cudagraph_max_size") for r in rows} - {None}
    if len(sizes) > 1:
        raise SystemExit(f"the rows come from servers with different CUDA graph sizes {sorted(sizes)}: fit one at a "
                         "time")
    return sizes.pop() if sizes else GRAPH_MAX_TOKENS_2026_11_30


def fit_eager_step(rows, gpu: str, server) -> float:
    """The eager step's extra seconds that best fit the measured TPOT of ``rows`` (golden section on the
    squared log ratios, 0-300 ms)."""
    import math

    def loss(x):
        sims = simulate_like(rows, gpu, dataclasses.replace(server, eager_step_s=x))
        return sum(math.log(s["mean_tpot_ms"] / r["mean_tpot_ms"]) ** 2 for r, s in zip(rows, sims))

    return golden_section(loss, 0.0, 0.3)


#: the points whose long steps price the eager step: a replacement's prefill beside other requests' decodes (not
#: a single request's loop, whose gaps between requests also hold the client's turnaround), enough of them
LONG_STEPS_MIN_CONCURRENCY = 8
LONG_STEPS_MIN_COUNT = 5


def long_step_means(rows, results, slow_ms: float = 100.0) -> dict[int, float]:
    """{row index: the mean ms of the engine's steps longer than ``slow_ms``} for the rows whose point has its vllm
    bench serve record in ``results`` and prices the eager step (``LONG_STEPS_MIN_*``). ``results``: one folder, or
    {gmu: folder} for rows of several sweeps (a record's name does not say its gmu)."""
    from benchmarks.itl_gaps import load_record, stalls_row
    from benchmarks.long_steps_vs_sim import result_file

    out = {}
    for i, r in enumerate(rows):
        folder = results.get(r["gmu"]) if isinstance(results, dict) else results
        path = (result_file(Path(folder), r) if folder is not None and r["concurrency"] >= LONG_STEPS_MIN_CONCURRENCY
                else None)
        if path is None:
            continue
        st = stalls_row(load_record(path), slow_ms / 1e3)
        if st["stalls"] >= LONG_STEPS_MIN_COUNT:
            out[i] = st["stall_mean_ms"]
    return out


def fit_eager_to_long_steps(rows, means: dict[int, float], gpu: str, server) -> float:
    """The eager step's extra seconds whose simulated eager steps average what the measured long steps of the same
    points average (``long_step_means``; golden section on the squared log ratios of the means, 0-300 ms)."""
    import math

    from treewy.sim.sweep import simulate_measured_point

    picked = [(rows[i], ms) for i, ms in means.items()]

    def loss(x):
        cfg = dataclasses.replace(server, eager_step_s=x)
        total = 0.0
        for r, ms in picked:
            _, point = simulate_measured_point(r, gpu, cfg, with_point=True)
            if point.eager_steps:
                total += math.log(point.eager_time / point.eager_steps * 1e3 / ms) ** 2
        return total

    return golden_section(loss, 0.0, 0.3)


def golden_section(loss, lo: float, hi: float, rounds: int = 30) -> float:
    """The minimum of a unimodal ``loss`` on [lo, hi]."""
    import math

    phi = (math.sqrt(5) - 1) / 2
    m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
    f1, f2 = loss(m1), loss(m2)
    for _ in range(rounds):  # each step keeps one of the two inner points and evaluates one new one
        if f1 < f2:
            hi, m2, f2 = m2, m1, f1
            m1 = hi - phi * (hi - lo)
            f1 = loss(m1)
        else:
            lo, m1, f1 = m1, m2, f2
            m2 = lo + phi * (hi - lo)
            f2 = loss(m2)
    return (lo + hi) / 2


def bench_ttft(folder) -> dict:
    """(workload, mode, concurrency) -> (median, std) TTFT in ms from `vllm bench serve` result files."""
    import json
    import re

    out = {}
    for path in sorted(Path(folder).rglob("*-c*.json")):
        m = re.fullmatch(r"(.+)-(store_all|reconstruct)-c(\d+)\.json", path.name)
        if m:
            d = json.loads(path.read_text())
            out[(m[1], m[2], int(m[3]))] = (d["median_ttft_ms"], d["std_ttft_ms"])
    return out


def ttft_clean(row) -> str | None:
    """Why a measured point's time to first token cannot calibrate the prefill costs, or None when it can
    (``benchmarks/results/ttft_explained_2026-12-01.md``): the first points each server ran paid one-time costs
    (generation-short at 1 and 16 requests: compiles during inference, every request of the c16 wave waited 2-4.5 s),
    generation-short at 32 ran third on a fresh server with no repeat to tell its share, and a point whose wave did
    not run at once measures queueing behind finishing requests (the decode side, fitted on TPOT) instead."""
    if row.get("warmup_requests") is None and row["workload"] == "generation-short" and row["concurrency"] <= 32:
        return "first points of a fresh server (one-time costs)"
    if row["peak_running"] < row["concurrency"]:
        return "queued behind the pool (decode-bound)"
    return None


def fit_prefill(rows, gpu: str, server, rounds: int = 3) -> tuple[float, float]:
    """(prefill_request_s, prefill_token_s) by least squares on the relative mean TTFT of ``rows`` (Gauss-Newton:
    the TTFT of a wave is close to linear in both), kept >= 0."""
    import numpy as np

    x = np.zeros(2)
    steps = np.array([1e-3, 1e-6])
    meas = np.array([r["mean_ttft_ms"] for r in rows])

    def ttft(v):
        cfg = dataclasses.replace(server, prefill_request_s=float(v[0]), prefill_token_s=float(v[1]))
        return np.array([s["mean_ttft_ms"] for s in simulate_like(rows, gpu, cfg)])

    for _ in range(rounds):
        base = ttft(x)
        jac = np.stack([(ttft(x + np.eye(2)[i] * steps[i]) - base) / steps[i] for i in range(2)], 1)
        dx, *_ = np.linalg.lstsq(jac / meas[:, None], (meas - base) / meas, rcond=None)
        x = np.maximum(x + dx, 0.0)
    return float(x[0]), float(x[1])


def step_cost_fit(rows, sims) -> tuple[float, float]:
    """(a, b) in ms per step: the least-squares line measured - simulated step time = a + b x running requests, over
    paired measured and simulated rows, b >= 0. A step emits acceptance_length tokens per request, so its time is
    TPOT x acceptance_length (dummy weights without synthetic acceptance: 1)."""
    import numpy as np

    y = np.array([(r["mean_tpot_ms"] - s["mean_tpot_ms"]) * (r["acceptance_length"] or 1.0) for r, s in zip(rows, sims)])
    running = np.array([r["peak_running"] for r in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(y), running], 1), y, rcond=None)
    if b < 0:   # a host cost per running request is not negative: the constant alone then
        a, b = float(y.mean()), 0.0
    return float(a), float(b)


def admitted_at_once(row) -> bool:
    """Whether every request of a measured point's wave ran at once (nothing queued behind the pool)."""
    return row["peak_running"] == min(row["concurrency"], row["max_num_seqs"])


def decode_bound(row, token_budget: int) -> bool:
    """Whether a point's TPOT measures decode steps alone: its wave ran at once and the wave's prompts (at the
    workload's centre length) fit one step's token budget (max_num_batched_tokens), so no request decodes through
    other requests' prefill chunks (summarize-short's 1,024-token prompts at 32 requests take four such steps).
    Workloads of unknown prompt length are left out."""
    from treewy.workloads import CATALOGUE

    w = CATALOGUE.get(row["workload"])
    if w is None or w.input_len is None:
        return False
    wave = min(row["concurrency"], row["max_num_seqs"])
    return admitted_at_once(row) and wave * w.input_len <= token_budget


def long_step_folders(specs: list[str]) -> Path | dict[float, Path]:
    """``--long-steps``' values: one folder for every row, or GMU=FOLDER per sweep."""
    if len(specs) == 1 and "=" not in specs[0]:
        return Path(specs[0])
    out = {}
    for spec in specs:
        gmu, sep, folder = spec.partition("=")
        try:
            out[float(gmu)] = Path(folder)
        except ValueError:
            sep = ""
        if not sep or not folder:
            raise SystemExit(f"--long-steps {spec!r}: with several sweeps give GMU=FOLDER each, e.g. "
                             "0.6=benchmarks/results/serve35b_h200_gmu0.6_2026-12-02/results")
    return out


def main(argv=None) -> int:
    import polars as pl

    from treewy.memory import ServerConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured", nargs="+", help="measured serving tables (treewy.schema), fitted together")
    ap.add_argument("--gpu", required=True, help="the simulator's GPU key for the measured device (h200, ...)")
    ap.add_argument("--out")
    ap.add_argument("--bench-dir", help="a folder holding the sweep's `vllm bench serve` results "
                    "(<workload>-<mode>-c<N>.json, searched recursively): adds their median and spread of TTFT")
    ap.add_argument("--fit-name", help="also write the fitted ServerConfig into the server fits table under this "
                    "name (treewy.sim.calibrated.fitted(NAME) reads it)")
    ap.add_argument("--long-steps", metavar="RESULTS", nargs="+", help="price the eager step from the measured long "
                    "steps (vllm bench serve's records in RESULTS: long_step_means) instead of the queued points' "
                    "TPOT; with tables of several gmu, GMU=RESULTS per sweep")
    args = ap.parse_args(argv)
    meas = pl.concat([pl.read_parquet(m) for m in args.measured], how="diagonal_relaxed").filter(
        pl.col("error").is_null(), pl.col("concurrency").is_not_null(), ~pl.col("simulated"))
    rows = list(meas.iter_rows(named=True))
    seqs = {r["max_num_seqs"] for r in rows}
    if len(seqs) != 1 or None in seqs:
        raise SystemExit(f"{', '.join(args.measured)}: expected one known max_num_seqs, found {seqs}")
    gmus = sorted({r["gmu"] for r in rows})
    assumed = ServerConfig(max_num_seqs=seqs.pop())
    first = simulate_like(rows, args.gpu, assumed)
    fit = [i for i, r in enumerate(rows) if decode_bound(r, assumed.max_num_batched_tokens)]
    a, b = step_cost_fit([rows[i] for i in fit], [first[i] for i in fit])
    top = graph_max_tokens(rows)
    graphs = dataclasses.replace(assumed, host_overhead_s=assumed.host_overhead_s + a * 1e-3,
                                 host_per_request_s=b * 1e-3, graph_max_tokens=top, graphs_decode_only=True)
    queued = [r for i, r in enumerate(rows) if i not in fit]
    if args.long_steps:
        folders = long_step_folders(args.long_steps)
        if isinstance(folders, dict) and set(folders) != set(gmus):
            raise SystemExit(f"--long-steps names gmu {sorted(folders)}; the tables hold gmu {gmus}: one folder each")
        means = long_step_means(rows, folders)
        if not means:
            raise SystemExit(f"--long-steps {' '.join(args.long_steps)}: no point there with {LONG_STEPS_MIN_COUNT} "
                             f"or more long steps at {LONG_STEPS_MIN_CONCURRENCY} or more requests")

        def eager_fit(server):
            return fit_eager_to_long_steps(rows, means, args.gpu, server)
        eager_on = (f"the measured long steps (> 100 ms, no token out) of the {len(means)} points with "
                    f">= {LONG_STEPS_MIN_COUNT} of them at >= {LONG_STEPS_MIN_CONCURRENCY} requests (least squares on "
                    "the log of the simulated eager steps' mean over the measured long steps' mean)")
    else:
        def eager_fit(server):
            return fit_eager_step(queued, args.gpu, server) if queued else 0.0
        eager_on = f"the {len(queued)} other points (least squares on log TPOT)"
    eager0 = eager_fit(graphs)
    tpot_only = dataclasses.replace(graphs, eager_step_s=eager0)
    clean = [r for r in rows if ttft_clean(r) is None]
    per_req, per_tok = fit_prefill(clean, args.gpu, tpot_only) if clean else (0.0, 0.0)
    with_prefill = dataclasses.replace(graphs, prefill_request_s=per_req, prefill_token_s=per_tok)
    eager = eager_fit(with_prefill)
    fitted = dataclasses.replace(with_prefill, eager_step_s=eager)
    second = simulate_like(rows, args.gpu, fitted)
    before = simulate_like(rows, args.gpu, tpot_only)
    r0 = rows[0]
    lines = [f"Simulator vs measured: {r0['model']}, {r0['device']} (measured) vs '{args.gpu}' (SIMULATED), "
             f"gmu {', '.join(map(str, gmus))}, tp {r0['tp']}, max_num_seqs {assumed.max_num_seqs}, "
             f"weights {r0['weights']}; measured on {', '.join(sorted({str(r['date']) for r in rows}))}",
             f"fit over the {len(fit)} points whose whole wave ran at once and whose prompts fit one step's "
             f"{assumed.max_num_batched_tokens} tokens (decode steps only; in the others requests queue, or decode "
             "through prefill chunks): "
             f"(measured TPOT - assumed TPOT) x tokens per step = {a:.3f} ms + {b:.4f} ms x running requests per step "
             f"(host_overhead_s {assumed.host_overhead_s:.2e} -> {fitted.host_overhead_s:.2e}, "
             f"host_per_request_s 0 -> {fitted.host_per_request_s:.2e})",
             f"then, with steps of more than {top} tokens or with a prefill chunk run eagerly (the "
             "servers' max_cudagraph_capture_size and FULL_DECODE_ONLY graphs), the eager step's extra cost fitted "
             f"on {eager_on}: eager_step_s {eager0:.2e}",
             f"then the prefill costs over the {len(clean)} points whose TTFT is clean (least squares on relative mean "
             f"TTFT; the others: {', '.join(sorted({ttft_clean(r) for r in rows} - {None}))}): "
             f"prefill_request_s 0 -> {per_req:.2e}, prefill_token_s 0 -> {per_tok:.2e}",
             f"and the eager step's extra cost again with them: eager_step_s {eager0:.2e} -> {eager:.2e}", "",
             "columns: measured / simulated with assumed fixed costs / simulated with fitted fixed costs; "
             "* = in the fit",
             "",
             f"{'gmu':>4s} {'workload':18s} {'mode':11s} {'conc':>4s} | {'running':>14s} | {'KV usage':>17s} | "
             f"{'TPOT ms':>17s} | {'output tok/s':>20s} | {'p99 TTFT ms':>23s}"]
    for i, (r, s0, s1) in enumerate(zip(rows, first, second)):
        f = lambda k, fmt: "/".join(format(x[k], fmt) for x in (r, s0, s1))  # noqa: E731
        lines.append(f"{r['gmu']:4.2f} {r['workload']:18s} {r['mode']:11s} {r['concurrency']:4d}"
                     f"{'*' if i in fit else ' '}| "
                     f"{f('peak_running', 'd'):>14s} | "
                     f"{f('peak_kv_usage', '.2f'):>17s} | {f('mean_tpot_ms', '.1f'):>17s} | "
                     f"{f('output_throughput', '.0f'):>20s} | {f('p99_ttft_ms', '.0f'):>23s}")
    lines += ["", "time to first token, ms: measured / SIMULATED with the TPOT fit's fixed costs alone / SIMULATED with the "
              "prefill costs too (the fitted server); c = clean, in the prefill fit; otherwise why not", "",
              f"{'gmu':>4s} {'workload':18s} {'mode':11s} {'conc':>4s} | {'requests':>8s} | {'mean TTFT ms':>26s} | "
              f"{'p99 TTFT ms':>26s} | {'p99 measured / after':>20s}"]
    if args.bench_dir and len(gmus) > 1:
        raise SystemExit("--bench-dir: its records do not say their gmu; give it with one gmu's tables")
    bench = bench_ttft(args.bench_dir) if args.bench_dir else {}
    if bench:
        lines[-1] += f" | {'measured median / std TTFT ms':>30s}"
    for r, b, a in zip(rows, before, second):
        f = lambda k: "/".join(format(x[k], ".0f") for x in (r, b, a))  # noqa: E731
        why = ttft_clean(r)
        line = (f"{r['gmu']:4.2f} {r['workload']:18s} {r['mode']:11s} {r['concurrency']:4d}{' ' if why else 'c'}| "
                f"{r['completed'] + (r['failed'] or 0):8d} | {f('mean_ttft_ms'):>26s} | {f('p99_ttft_ms'):>26s} | "
                f"{r['p99_ttft_ms'] / a['p99_ttft_ms']:20.2f}")
        if bench:
            m = bench.get((r["workload"], r["mode"], r["concurrency"]))
            line += f" | {m[0]:>14.0f} / {m[1]:<13.0f}" if m else f" | {'-':>30s}"
        lines.append(line + (f" | {why}" if why else ""))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    if args.fit_name:
        entry = fit_entry(fitted, rows, args.measured, len(fit), len(clean), args.out, eager_on)
        print(f"wrote {write_fit(args.fit_name, entry)} ({args.fit_name})")
    return 0


#: The ServerConfig fields a fit sets (the memory side keeps ServerConfig's defaults).
FIT_FIELDS = ("max_num_seqs", "host_overhead_s", "host_per_request_s", "graph_max_tokens", "graphs_decode_only",
              "eager_step_s", "prefill_request_s", "prefill_token_s")


def fit_entry(server, rows, measured: str | list[str], n_fit: int, n_clean: int, report: str | None,
              eager_on: str) -> dict:
    """The server fits table's entry for a fit: the ServerConfig, where and how it was measured and fitted."""
    r0 = rows[0]
    graphs = f"decode-only full CUDA graphs up to {server.graph_max_tokens} tokens"
    fields = {k: getattr(server, k) for k in FIT_FIELDS}
    return {"server": {k: float(f"{v:.3g}") if isinstance(v, float) else v for k, v in fields.items()},
            "device": f"NVIDIA {str(r0['device']).upper()}" if r0["device"] else None,
            "date": ", ".join(sorted({str(r["date"]) for r in rows})),
            "engine": "vLLM 0.26.0", "served_as": f"benchmarks/vllm_serve_gpu.py sweep: {graphs}, no torch.compile, "
            f"max_num_seqs {server.max_num_seqs}, weights {r0['weights']}, acceptance {r0.get('acceptance_source')}",
            "fitted_to": ", ".join(map(_table_name, [measured] if isinstance(measured, str) else measured)),
            "points": len(rows),
            "fit": [f"host_overhead_s and host_per_request_s: least squares of (measured - assumed TPOT) x tokens per "
                    f"step on the {n_fit} decode-bound points (benchmarks/sim_vs_measured.py decode_bound)",
                    f"eager_step_s: on {eager_on} (a step with a prefill chunk, or more tokens than the largest "
                    "graph, runs without CUDA graphs)",
                    f"prefill_request_s, prefill_token_s: on the relative mean TTFT of the {n_clean} clean points "
                    "(ttft_clean), then eager_step_s again"],
            "report": report}


def _table_name(path: str) -> str:
    """A measured table as the fits table names it: its file name in the package's data, else its path."""
    from treewy.results import DATA_DIR

    p = Path(path).resolve()
    return p.name if p.parent == DATA_DIR else str(Path(path))


def write_fit(name: str, entry: dict, data_dir=None) -> Path:
    """Add (or replace) ``name`` in the server fits table (kind "server_fits" of treewy/data/index.json)."""
    import json

    from treewy.results import table

    path = table("server_fits", data_dir)
    fits = json.loads(path.read_text())
    fits[name] = entry
    path.write_text(json.dumps(fits, indent=1) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
