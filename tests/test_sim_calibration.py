"""The simulator against the measured 35B serving sweep (H200, vLLM 0.26.0, dummy weights, two workloads, 1-256
requests): memory exact at every point; with the fitted fixed costs and eager steps, TPOT within 12 % on
generation-short's decode points (30 % at one request) and within 35 % everywhere; older serving tables (without
the late columns) still load."""

from __future__ import annotations

import dataclasses
import functools

import polars as pl
import pytest

from treewy.memory import ModelSpec, ServerConfig
from treewy.results import DATA_DIR
from treewy.schema import LATE_COLUMNS, SERVING_SCHEMA, load_measured
from treewy.sim.calibrated import H200_VLLM026_DECODE_GRAPHS
from treewy.sim.sweep import simulate_measured_point

MEASURED = DATA_DIR / "serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-11-30.parquet"


@pytest.fixture(autouse=True)
def page_of_that_sweep(monkeypatch):
    """The sweep served the stash's keys and decays in one half
    (``reconstruct_stash_bytes(halves=1, key_dtype="float32")``)."""
    monkeypatch.setattr(ModelSpec, "reconstruct_stash_bytes",
                        functools.partialmethod(ModelSpec.reconstruct_stash_bytes, halves=1, key_dtype="float32"))


def _rows():
    return list(pl.read_parquet(MEASURED).filter(pl.col("error").is_null()).iter_rows(named=True))


def _sim(r, server):
    return simulate_measured_point(r, "h200", server)


def test_measured_table_is_what_the_calibration_says():
    rows = _rows()
    assert len(rows) == 24 and {r["max_num_seqs"] for r in rows} == {256} and {r["weights"] for r in rows} == {"dummy"}
    assert {(r["workload"], r["mode"]) for r in rows} == {(w, m) for w in ("generation-short", "summarize-short")
                                                          for m in ("store_all", "reconstruct")}
    assert {r["concurrency"] for r in rows} == {1, 16, 32, 64, 128, 256}
    assert H200_VLLM026_DECODE_GRAPHS.max_num_seqs == 256


@pytest.mark.parametrize("i", range(24))
def test_simulator_admits_what_vllm_admitted_and_fitted_tpot_is_close(i):
    r = _rows()[i]
    s = _sim(r, H200_VLLM026_DECODE_GRAPHS)
    assert abs(s["peak_running"] - r["peak_running"]) <= 1, (r["mode"], r["concurrency"])
    assert abs(s["peak_kv_usage"] - r["peak_kv_usage"]) < 0.03
    decode = r["workload"] == "generation-short" and r["peak_running"] == r["concurrency"]
    bound = (0.3 if r["concurrency"] == 1 else 0.12) if decode else 0.35
    assert abs(s["mean_tpot_ms"] / r["mean_tpot_ms"] - 1) < bound, \
        (r["workload"], r["mode"], r["concurrency"], s["mean_tpot_ms"], r["mean_tpot_ms"])


def test_eager_steps_explain_treewy_past_the_largest_graph():
    """TreeWY at 256 requests runs more than 512 tokens per step, past the largest CUDA graph: measured TPOT more
    than doubles, and only the fitted eager step reproduces it."""
    r = next(r for r in _rows() if r["mode"] == "reconstruct" and r["concurrency"] == 256
             and r["workload"] == "generation-short")
    assert r["peak_running"] * 4 > 512 and r["mean_tpot_ms"] > 2 * 46
    graphs_everywhere = dataclasses.replace(H200_VLLM026_DECODE_GRAPHS, eager_step_s=0.0)
    assert _sim(r, graphs_everywhere)["mean_tpot_ms"] < 0.5 * r["mean_tpot_ms"]
    assert abs(_sim(r, H200_VLLM026_DECODE_GRAPHS)["mean_tpot_ms"] / r["mean_tpot_ms"] - 1) < 0.2


def test_assumed_fixed_costs_were_far_off():
    r = next(r for r in _rows() if r["concurrency"] == 1)
    assert _sim(r, ServerConfig(max_num_seqs=256))["mean_tpot_ms"] < 0.5 * r["mean_tpot_ms"]


def test_tables_written_before_the_late_columns_still_load(tmp_path):
    old = pl.read_parquet(MEASURED).drop(list(LATE_COLUMNS), strict=False)
    old.write_parquet(tmp_path / "old.parquet")
    df = load_measured(tmp_path)
    assert df.height == old.height and df.schema == pl.Schema(SERVING_SCHEMA)
    assert df["max_num_seqs"].is_null().all()


def test_a_wave_sent_at_once_waits_for_its_prefill_step():
    """TreeWY, generation-short, 128 requests sent at once: every request's first token waits for one prefill step
    holding all 128 (measured TTFT spread 66 ms around 954); the fitted per-request and per-token prefill costs give
    that step's length, the decode-step fit alone gives a fifth of it."""
    r = next(r for r in _rows() if r["mode"] == "reconstruct" and r["concurrency"] == 128
             and r["workload"] == "generation-short")
    assert H200_VLLM026_DECODE_GRAPHS.prefill_request_s > 0 and H200_VLLM026_DECODE_GRAPHS.prefill_token_s > 0
    unpriced = dataclasses.replace(H200_VLLM026_DECODE_GRAPHS, prefill_request_s=0.0, prefill_token_s=0.0)
    assert _sim(r, unpriced)["mean_ttft_ms"] < 0.3 * r["mean_ttft_ms"]
    assert abs(_sim(r, H200_VLLM026_DECODE_GRAPHS)["mean_ttft_ms"] / r["mean_ttft_ms"] - 1) < 0.1


def test_clean_ttft_points_are_the_ones_the_explanation_names():
    from benchmarks.sim_vs_measured import ttft_clean

    clean = {(r["workload"], r["mode"], r["concurrency"]) for r in _rows() if ttft_clean(r) is None}
    assert clean == {("generation-short", "reconstruct", 64), ("generation-short", "reconstruct", 128)} | {
        ("summarize-short", m, c) for m in ("store_all", "reconstruct") for c in (1, 16, 32)} | {
        ("summarize-short", "reconstruct", c) for c in (64, 128)}


def test_step_costs_are_fitted_per_step_when_drafts_are_accepted():
    """With accepted drafts a step emits acceptance_length tokens per request: the fixed costs (per step) come from
    the TPOT gap times it, and the fit refuses servers of different CUDA graph sizes."""
    from benchmarks.sim_vs_measured import graph_max_tokens, step_cost_fit

    rows, sims = [], []
    for n, accepted in ((1, 3.2), (8, 3.3), (32, 3.1), (64, 1.0)):
        sims.append({"mean_tpot_ms": 2.0})
        rows.append({"mean_tpot_ms": 2.0 + (10.0 + 0.05 * n) / accepted, "acceptance_length": accepted,
                     "peak_running": n})
    assert step_cost_fit(rows, sims) == pytest.approx((10.0, 0.05))
    assert graph_max_tokens([{"cudagraph_max_size": 1024}] * 2) == 1024 and graph_max_tokens([{}]) == 512
    with pytest.raises(SystemExit, match="different CUDA graph sizes"):
        graph_max_tokens([{"cudagraph_max_size": 512}, {"cudagraph_max_size": 1024}])


MEASURED_ACCEPTED = DATA_DIR / "serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-12-02.parquet"


def test_decode_bound_points_carry_no_prefill_chunk_beside_their_decodes():
    """The refit's host costs come from the points whose wave ran at once and whose prompts fit one step's tokens:
    summarize-short (1,024-token prompts) up to 8 requests, generation-short (64) up to 128; never a queued point or
    a workload of unknown length."""
    from benchmarks.sim_vs_measured import decode_bound

    rows = list(pl.read_parquet(MEASURED_ACCEPTED).iter_rows(named=True))
    bound = {(r["workload"], r["mode"], r["concurrency"]) for r in rows if decode_bound(r, 8192)}
    assert ("summarize-short", "reconstruct", 8) in bound and ("summarize-short", "reconstruct", 32) not in bound
    assert ("generation-short", "reconstruct", 128) in bound and ("generation-short", "store_all", 64) not in bound
    assert ("balanced-short", "reconstruct", 64) in bound and ("balanced-short", "reconstruct", 128) not in bound
    assert ("balanced-short", "store_all", 32) in bound and ("balanced-short", "store_all", 64) not in bound
    assert len(bound) == 19
    assert not decode_bound({**rows[0], "workload": "mt-bench"}, 8192)


def test_a_negative_per_request_slope_is_fitted_as_a_constant():
    from benchmarks.sim_vs_measured import step_cost_fit

    rows = [{"mean_tpot_ms": 12.0 - 0.01 * n, "acceptance_length": 1.0, "peak_running": n} for n in (1, 8, 32, 64)]
    a, b = step_cost_fit(rows, [{"mean_tpot_ms": 2.0}] * 4)
    assert b == 0.0 and a == pytest.approx(sum(10.0 - 0.01 * n for n in (1, 8, 32, 64)) / 4)


def test_the_refit_prices_the_accepted_sweeps_decode_points(tmp_path):
    """H200_VLLM026_GRAPHS1024_ACCEPTED (fitted to the 2026-12-02 sweep): at the decode-bound points from 32
    requests up, TPOT within 15 % of vLLM's on generation-short and 40 % on balanced-short, admitted requests within
    4; and a fit is written into the table it is read from."""
    import json
    import shutil

    from benchmarks.sim_vs_measured import decode_bound, fit_entry, write_fit
    from treewy.results import INDEX_NAME, table
    from treewy.sim.calibrated import H200_VLLM026_GRAPHS1024_ACCEPTED as refit

    assert refit.graph_max_tokens == 1024 and refit.host_per_request_s >= 0
    rows = [r for r in pl.read_parquet(MEASURED_ACCEPTED).iter_rows(named=True)
            if decode_bound(r, 8192) and r["concurrency"] >= 32]
    assert len(rows) == 7     # 6 fitted, and store-all's balanced-short 32, measured after the fit
    for r in rows:
        s = simulate_measured_point(r, "h200", refit)
        assert abs(s["peak_running"] - r["peak_running"]) <= 4
        bound = 0.15 if r["workload"] == "generation-short" else 0.4     # balanced-short at 32: 9.3 vs 6.85 ms
        assert abs(s["mean_tpot_ms"] / r["mean_tpot_ms"] - 1) < bound, (r["workload"], r["mode"], r["concurrency"])
    shutil.copy(DATA_DIR / INDEX_NAME, tmp_path / INDEX_NAME)
    shutil.copy(table("server_fits"), tmp_path / table("server_fits").name)
    path = write_fit("TEST_FIT", fit_entry(refit, rows, str(MEASURED_ACCEPTED), 7, 0, None, "the 0 other points"),
                     tmp_path)
    entry = json.loads(path.read_text())["TEST_FIT"]
    assert ServerConfig(**entry["server"]) == dataclasses.replace(ServerConfig(), **entry["server"])
    assert entry["server"]["host_overhead_s"] == pytest.approx(refit.host_overhead_s, rel=1e-2)
    assert entry["fitted_to"] == MEASURED_ACCEPTED.name and entry["points"] == 7


def _record(path, gaps_s):
    """A vllm bench serve record of one request whose engine steps are ``gaps_s`` apart."""
    import gzip
    import json

    with gzip.open(path, "wt") as f:
        json.dump({"start_times": [0.0], "ttfts": [0.1], "itls": [list(gaps_s)]}, f)


def test_long_step_means_take_the_points_that_price_a_replacements_prefill(tmp_path):
    """A point counts with 5 or more long steps at 8 or more requests: not a single request's loop, whose gaps
    between requests hold the client's turnaround too."""
    from benchmarks.sim_vs_measured import long_step_means

    rows = [{"workload": "w", "mode": "store_all", "concurrency": c} for c in (8, 1, 32, 64)]
    _record(tmp_path / "w-store_all-c8.json.gz", [0.02] * 10 + [0.2, 0.3] * 3)     # 6 long steps: 250 ms
    _record(tmp_path / "w-store_all-c1.json.gz", [0.02] * 10 + [0.2] * 6)          # a single request's loop
    _record(tmp_path / "w-store_all-c32.json.gz", [0.02] * 10 + [0.2] * 4)         # too few long steps
    assert long_step_means(rows, tmp_path) == {0: pytest.approx(250.0)}            # c64 has no record


def test_long_steps_of_several_sweeps_are_read_from_each_gmus_folder(tmp_path):
    """Records do not say their gmu: with tables of two sweeps each row reads the folder given for its gmu, and a
    list of folders without GMU= is refused with the form to use."""
    from benchmarks.sim_vs_measured import long_step_folders, long_step_means

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _record(tmp_path / "a" / "w-store_all-c8.json.gz", [0.02] * 10 + [0.2] * 6)
    _record(tmp_path / "b" / "w-store_all-c8.json.gz", [0.02] * 10 + [0.4] * 6)
    rows = [{"workload": "w", "mode": "store_all", "concurrency": 8, "gmu": g} for g in (0.6, 0.75, 0.9)]
    folders = long_step_folders([f"0.6={tmp_path / 'a'}", f"0.75={tmp_path / 'b'}"])
    assert folders == {0.6: tmp_path / "a", 0.75: tmp_path / "b"}
    assert long_step_means(rows, folders) == {0: pytest.approx(200.0), 1: pytest.approx(400.0)}   # no 0.9 folder
    assert long_step_folders([str(tmp_path / "a")]) == tmp_path / "a"
    with pytest.raises(SystemExit, match="GMU=FOLDER"):
        long_step_folders([str(tmp_path / "a"), str(tmp_path / "b")])


def test_the_eager_price_fitted_on_long_steps_recovers_the_one_that_made_them():
    """Measured long steps made by the simulator itself at eager_step_s = 50 ms: the fit finds 50 ms again."""
    from benchmarks.sim_vs_measured import fit_eager_to_long_steps
    from treewy.sim.calibrated import H200_VLLM026_GRAPHS1024_ACCEPTED as refit

    rows = [r for r in pl.read_parquet(MEASURED_ACCEPTED).iter_rows(named=True)
            if r["mode"] == "store_all" and r["concurrency"] == 64 and r["workload"] != "balanced-short"]
    made = dataclasses.replace(refit, eager_step_s=0.05)
    means = {}
    for i, r in enumerate(rows):
        _, point = simulate_measured_point(r, "h200", made, with_point=True)
        assert point.eager_steps >= 5
        means[i] = point.eager_time / point.eager_steps * 1e3
    fitted = fit_eager_to_long_steps(rows, means, "h200", dataclasses.replace(refit, eager_step_s=0.0))
    assert fitted == pytest.approx(0.05, abs=2e-3)


def test_the_long_step_fit_prices_store_alls_queued_points_closer_than_the_refit():
    """H200_VLLM026_GRAPHS1024_LONGSTEPS prices the eager step at what the measured long steps cost: at store-all's
    queued points (balanced-short 128 and 256, summarize-short 256: 2026-12-02) its throughput is within 1.5x of
    vLLM's, where the refit's was 1.6-1.8x too high."""
    from treewy.sim.calibrated import H200_VLLM026_GRAPHS1024_ACCEPTED as refit
    from treewy.sim.calibrated import H200_VLLM026_GRAPHS1024_LONGSTEPS as longsteps

    assert 0.10 < longsteps.eager_step_s < 0.15 and longsteps.eager_step_s > 1.5 * refit.eager_step_s
    rows = [r for r in pl.read_parquet(MEASURED_ACCEPTED).iter_rows(named=True)
            if r["mode"] == "store_all" and (r["workload"], r["concurrency"]) in
            {("balanced-short", 128), ("balanced-short", 256), ("summarize-short", 256)}]
    assert len(rows) == 3
    for r in rows:
        new, old = (simulate_measured_point(r, "h200", f)["output_throughput"] for f in (longsteps, refit))
        assert r["output_throughput"] / old < 0.65 < 1 / 1.5 < r["output_throughput"] / new < 1.0, (
            r["workload"], r["concurrency"], r["output_throughput"], old, new)
