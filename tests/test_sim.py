"""treewy.sim: invariants of the scheduler, the paper's serving checks, speed, and bad input."""

import json
import subprocess
import sys
import time

import numpy as np
import polars as pl
import pytest

from treewy.sim import WORKLOADS, ratio_table, simulate, sweep

M35 = "qwen3.5-35b-a3b"


@pytest.fixture(scope="module")
def paper_sweep():
    """35B, TP1, B200, gmu 0.6, depth-3 chain; 6 concurrencies x 5 workloads x 2 modes."""
    t0 = time.process_time()
    df = sweep(M35, "b200", tp=1, gmu=0.6, tree=(1, 1, 1), kernels=None)
    return df, time.process_time() - t0


def test_full_sweep_is_fast_and_labelled_simulated(paper_sweep):
    df, cpu_s = paper_sweep
    assert cpu_s < 30, f"a full sweep took {cpu_s:.1f} s of CPU; the target is < 10 s"
    assert df.height == 6 * 5 * 2
    assert df["simulated"].all() and (df["device"] == "simulated").all()
    assert set(df["workload"]) == set(WORKLOADS) and set(df["mode"]) == {"store_all", "reconstruct"}
    assert (df["cost_source"] == "analytic").all()
    assert (df["failed"] == 0).all()


def _ratios(df):
    return {r["concurrency"]: r for r in ratio_table(df).iter_rows(named=True)}


def test_below_the_knee_admission_is_equal_and_kv_usage_2_to_2_7x_lower(paper_sweep):
    r = _ratios(paper_sweep[0])
    for c in (1, 8, 32, 64):
        assert abs(r[c]["peak admitted requests"] - 1.0) <= 0.03, (c, r[c])
        assert 2.0 <= r[c]["peak KV usage reduction"] <= 2.7, (c, r[c])


def test_store_all_pool_saturates_between_64_and_128(paper_sweep):
    sa = paper_sweep[0].filter(pl.col("mode") == "store_all")
    at = {c: sa.filter(pl.col("concurrency") == c) for c in (64, 128)}
    assert at[64]["peak_kv_usage"].max() < 0.999
    assert (at[64]["peak_running"] == 64).all()
    assert at[128]["peak_kv_usage"].min() > 0.99
    assert (at[128]["peak_running"] < 128).all()


def test_above_the_knee_treewy_admits_1_2x_and_cuts_p99_ttft_2x(paper_sweep):
    r = _ratios(paper_sweep[0])
    for c in (128, 256):
        assert r[c]["peak admitted requests"] >= 1.2, (c, r[c])
        assert r[c]["p99 TTFT speedup"] >= 2.0, (c, r[c])


def _points(**kw):
    args = dict(model=M35, gpu="b200", gmu=0.6, mode=["store_all", "reconstruct"], workload="generation-heavy",
                concurrency=[128], num_prompts=192, kernels=None, return_points=True)
    args.update(kw)
    return simulate(**args)


def test_every_request_completes_once_with_its_tokens_and_the_pool_holds():
    df, points = _points()
    assert df.filter(pl.col("mode") == "store_all")["preemptions"].item() > 0   # the preemption path ran
    for res in points:
        ok = ~res.failed
        assert (res.finish_count[ok] == 1).all() and (res.finish_count[~ok] == 0).all()
        assert (res.generated[ok] == res.output[ok]).all()                     # output tokens conserved
        assert res.capacity_violations == 0 and res.peak_blocks <= res.num_blocks
        assert (res.t_first[ok] >= res.t_send[ok]).all() and (res.t_done[ok] >= res.t_first[ok]).all()
    assert (df["completed"] == 192).all()


def test_poisson_arrivals_complete_and_conserve_tokens():
    df, points = _points(concurrency=None, rate=[2.0, 20.0], workload="balanced-chat", num_prompts=96)
    assert df["request_rate"].to_list() == [2.0, 2.0, 20.0, 20.0] and df["concurrency"].is_null().all()
    for res in points:
        assert (res.finish_count == 1).all() and (res.generated == res.output).all()
    assert df["p99_ttft_ms"][0] < df["p99_ttft_ms"][2] * 5   # a light load does not queue more


def test_deterministic_for_a_seed():
    kw = dict(model=M35, gpu="b200", mode="store_all", workload="sharegpt-chat", concurrency=[8, 128],
              num_prompts=64, kernels=None)
    a, b, c = simulate(seed=3, **kw), simulate(seed=3, **kw), simulate(seed=4, **kw)
    cols = ["output_throughput", "p99_ttft_ms", "peak_kv_usage", "preemptions"]
    assert a.select(cols).equals(b.select(cols))
    assert not a.select(cols).equals(c.select(cols))


def test_more_memory_never_admits_fewer_requests():
    for mode in ("store_all", "reconstruct"):
        peaks = [simulate(M35, "b200", gmu=g, mode=mode, workload="summarize-heavy", concurrency=[256],
                          num_prompts=256, kernels=None)["peak_running"].item() for g in (0.5, 0.55, 0.6, 0.7, 0.8)]
        assert peaks == sorted(peaks) and peaks[-1] > peaks[0], (mode, peaks)


def test_acceptance_follows_the_paper_chain_and_given_rates():
    df = simulate(M35, "b200", mode="reconstruct", workload="spec-bench", concurrency=[32], kernels=None)
    assert abs(df["acceptance_length"].item() - 3.23) < 0.05
    df = simulate(M35, "b200", mode="reconstruct", workload="spec-bench", concurrency=[32], kernels=None,
                  acceptance=[0.5, 0.5, 0.5])
    assert abs(df["acceptance_length"].item() - 1.875) < 0.05
    frame = pl.DataFrame({"tree": ["(1, 1, 1)"], "acceptance_length": [2.5]})
    df = simulate(M35, "b200", mode="reconstruct", workload="spec-bench", concurrency=[32], kernels=None,
                  acceptance=frame)
    assert abs(df["acceptance_length"].item() - 2.5) < 0.05


def test_measured_kernel_ratios_replace_the_analytic_state_cost(tmp_path):
    rows = [{"provider": p, "tree": "(1, 1, 1)", "num_nodes": 4, "B": b, "HV": 32, "state_dtype": "float32", "us": us}
            for b in (1, 64, 256) for p, us in (("store_all", 100.0 * b), ("treewy", 400.0 * b), ("fla", 1.0))]
    path = tmp_path / "kernels_h200_test.json"
    path.write_text(json.dumps({"device": "h200", "date": "2026-11-29", "rows": rows}))
    kw = dict(model=M35, gpu="b200", mode="reconstruct", workload="sharegpt-chat", concurrency=[64], num_prompts=64)
    slow = simulate(kernels=path, **kw)
    fast = simulate(kernels=None, **kw)
    assert slow["cost_source"].item() == "measured:kernels_h200_test.json"
    assert fast["cost_source"].item() == "analytic"
    assert slow["mean_tpot_ms"].item() > fast["mean_tpot_ms"].item()   # 4x the store-all state time is slower


@pytest.mark.parametrize("kw, match", [
    (dict(rate=[0.0]), r"rate = 0\.0: expected positive request rates"),
    (dict(rate=[-2]), r"rate = -2: expected positive request rates"),
    (dict(concurrency=[0]), r"concurrency = 0: expected positive integers"),
    (dict(concurrency=[8], lengths=([100, 0], [10, 10])), r"lengths: every prompt length must be a positive"),
    (dict(concurrency=[8], lengths=([100, 10], [10, -1])), r"lengths: every output length must be a positive"),
    (dict(concurrency=[8], workload="chatbot-arena"), r"workload = 'chatbot-arena'.*sharegpt-chat"),
    (dict(concurrency=[8], mode="store_some"), r"mode = 'store_some'.*store_all"),
    (dict(concurrency=[8], model="gpt-4"), r"known presets are"),
    (dict(concurrency=[8], gmu=0.2), r"gmu = 0\.2.*weights take .* GiB"),
    (dict(concurrency=[8], rate=[1.0]), r"exactly one of concurrency"),
], ids=["rate-zero", "rate-negative", "concurrency-zero", "prompt-zero", "output-negative", "workload", "mode",
        "model", "gmu", "both"])
def test_bad_input_names_the_argument(kw, match):
    args = dict(model=M35, gpu="b200", mode="store_all", kernels=None)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        simulate(**args)


def test_explicit_lengths_run():
    df = simulate(M35, "b200", mode="reconstruct", concurrency=[4], lengths=([100, 200, 300], [50, 60, 70]),
                  kernels=None, workload="custom")
    assert df["completed"].item() == 3


def test_cli_prints_the_ratio_table(capsys):
    from treewy.cli import main
    assert main(["simulate", "--workload", "spec-bench", "--concurrency", "1,128", "--kernels", "none"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "peak admitted requests" in out and "[1.45]" in out


def test_treewy_does_not_import_display_libraries():
    code = ("import sys, treewy.memory, treewy.sim, treewy.sim.cli; "
            "bad = [m for m in ('altair', 'ipywidgets') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_simulated_curves_move_with_memory():
    """Sanity: on a small GPU share the knee moves left (fewer admitted at 64)."""
    small = simulate(M35, "b200", gmu=0.45, mode="store_all", workload="balanced-chat", concurrency=[64],
                     num_prompts=128, kernels=None)
    big = simulate(M35, "b200", gmu=0.6, mode="store_all", workload="balanced-chat", concurrency=[64],
                   num_prompts=128, kernels=None)
    assert small["peak_running"].item() < big["peak_running"].item()
    assert np.isfinite(small["p99_ttft_ms"].item())


def test_eager_steps_cost_extra_only_past_the_graphs():
    """A step runs without CUDA graphs when it holds more tokens than the largest captured graph, or a prefill
    chunk where only decode steps are captured; only those pay ``eager_step_s``, and the default pays nothing."""
    from treewy.memory import GPU, ModelSpec, ServerConfig
    from treewy.sim.cost import StepCost

    base = dict(model=ModelSpec.from_name(M35), gpu=GPU.from_name("h200"), mode="reconstruct", tree=(1, 1, 1))
    plain = StepCost(**base)
    eager = StepCost(**base, server=ServerConfig(graph_max_tokens=512, graphs_decode_only=True, eager_step_s=0.08))
    for args in ((128, 128 * 600), (129, 129 * 600), (16, 16 * 600, 1024, 1024 * 512.0, 1, 0)):
        no_limits = StepCost(**base, server=ServerConfig(eager_step_s=0.08))
        assert plain.scalar(*args) == no_limits.scalar(*args)   # no limits set: no extra
    assert eager.scalar(128, 128 * 600) == pytest.approx(plain.scalar(128, 128 * 600))   # 512 tokens: graphed
    assert eager.scalar(129, 129 * 600) == pytest.approx(plain.scalar(129, 129 * 600) + 0.08)
    assert eager.scalar(16, 9600, 1024, 1024 * 512.0, 1, 0) == pytest.approx(plain.scalar(16, 9600, 1024,
                                                                                        1024 * 512.0, 1, 0) + 0.08)
    steps = np.array([100, 128, 129, 200])
    np.testing.assert_allclose(eager(steps, steps * 600) - plain(steps, steps * 600), [0, 0, 0.08, 0.08])


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, 1.5, True])
def test_seed_out_of_range_names_seed(seed):
    with pytest.raises(ValueError, match=r"seed = .*: expected an integer in 0\.\.2\*\*63 - 1"):
        simulate(M35, "b200", mode="store_all", concurrency=[8], kernels=None, seed=seed)


@pytest.mark.parametrize("mode", ["store_all", "reconstruct"])
def test_missing_or_malformed_kernel_table_is_refused_in_every_mode(tmp_path, mode):
    bad = tmp_path / "targets_bad.json"
    bad.write_text('{"rows": ')
    not_rows = tmp_path / "targets_list.json"
    not_rows.write_text("[1, 2]")
    no_rows = tmp_path / "targets_empty.json"
    no_rows.write_text("{}")
    kw = dict(model=M35, gpu="b200", mode=mode, workload="spec-bench", concurrency=[8])
    with pytest.raises(ValueError, match=r"kernels = '/nonexistent\.json': no such file"):
        simulate(kernels="/nonexistent.json", **kw)
    for path in (bad, not_rows, no_rows):
        with pytest.raises(ValueError, match=rf"kernels = '{path}' is not a kernel table"):
            simulate(kernels=path, **kw)


def test_concurrency_has_a_documented_bound():
    from treewy.sim.sweep import MAX_CONCURRENCY

    with pytest.raises(ValueError, match=rf"concurrency = {10**6}: the simulator runs at most {MAX_CONCURRENCY}"):
        simulate(M35, "b200", mode="store_all", concurrency=[8, 10**6], kernels=None)
    with pytest.raises(ValueError, match=r"concurrency = \[\]: expected at least one load point"):
        simulate(M35, "b200", mode="store_all", concurrency=[], kernels=None)


def test_a_pool_that_admits_no_request_says_why_and_the_table_prints():
    from treewy.sim import format_ratio_table

    df = simulate(M35, "h200", gmu=0.56, mode=["store_all", "reconstruct"], tree=(2, 2, 2, 2, 2, 2),
                  workload="generation-heavy", concurrency=[1, 8], kernels=None)
    sa = df.filter(pl.col("mode") == "store_all")
    assert (sa["completed"] == 0).all() and sa["error"].str.contains("requests can never fit").all()
    assert sa["error"].str.contains("the pool holds").all()
    assert df.filter(pl.col("mode") == "reconstruct")["error"].is_null().all()
    text = format_ratio_table(df)
    assert "store_all admits no request at concurrency 1, 8" in text
    assert "none" in text and "inf" not in text


def _successor_ttft(async_scheduling: bool):
    """Two requests in flight, one short (8 tokens) and one long (400); the short one's successor is sent when it
    finishes. One token per step (acceptance 1.0), so every step is a plain verify and the timing is exact."""
    import dataclasses

    from treewy.sim.calibrated import H200_VLLM026_DECODE_GRAPHS
    server = dataclasses.replace(H200_VLLM026_DECODE_GRAPHS, async_scheduling=async_scheduling)
    df, (res,) = simulate(M35, "h200", gmu=0.6, mode="reconstruct", workload="custom", concurrency=[2], kernels=None,
                          lengths=([64, 64, 64], [8, 400, 8]), num_prompts=3, acceptance=1.0, server=server,
                          return_points=True)
    long_tpot = (res.t_done[1] - res.t_first[1]) / (res.output[1] - 1)
    return res.t_first[2] - res.t_send[2], long_tpot, res


def test_async_scheduling_delays_a_closed_loop_successor_by_two_steps():
    """vLLM 0.26 schedules step K + 1 before reading step K's outputs: the request sent when another finishes in
    step K reaches the engine after step K + 2 was scheduled and prefills in step K + 3. The old scheduler (read every
    output at once) prefilled it in step K + 1: its TTFT was one step, where vLLM's is three."""
    sync, tpot, _ = _successor_ttft(False)
    late, _, res = _successor_ttft(True)
    assert 1.6 * tpot < late - sync < 2.4 * tpot, (sync, late, tpot)
    assert (res.finish_count == 1).all() and (res.generated == res.output).all()


def test_async_scheduling_runs_a_verify_that_may_have_finished_again():
    """A request whose last step accepted drafts (it may or may not have finished: the scheduler cannot know yet)
    is scheduled once more, a wasted verify that emits nothing; one finished by its sure token is not."""
    import dataclasses

    from treewy.sim.calibrated import H200_VLLM026_DECODE_GRAPHS
    runs = {}
    for flag in (False, True):
        server = dataclasses.replace(H200_VLLM026_DECODE_GRAPHS, async_scheduling=flag)
        _, (res,) = simulate(M35, "h200", gmu=0.6, mode="store_all", workload="custom", concurrency=[1], kernels=None,
                             lengths=([64], [9]), num_prompts=1, acceptance=[1.0, 1.0, 1.0], server=server,
                             return_points=True)
        runs[flag] = res
    # 9 tokens: 1 from the prefill, then verifies of 4 sure tokens each: 5, 9 -> the last step ends it for certain
    # only when one token was left; here four were, so async scheduling runs one more (wasted) step
    assert runs[True].steps == runs[False].steps + 1
    assert runs[True].decode_tokens == runs[False].decode_tokens == 8
    assert runs[True].decode_steps == runs[False].decode_steps == 2


def test_acceptance_is_an_input_and_defaults_to_the_paper_35b_chain():
    from treewy.sim.sweep import acceptance_rates, rates_for_mean
    default, source = acceptance_rates((1, 1, 1))
    assert np.allclose(default, rates_for_mean(3.23, 3)) and "paper" in source
    alpha = default[0]
    assert abs(1 + alpha + alpha**2 + alpha**3 - 3.23) < 1e-9   # a_i = alpha^i: the same per-draft rate at each depth
    for acc, want in ((2.0, 2.0), ([0.9, 0.5, 0.2], 1 + 0.9 + 0.45 + 0.09)):
        df = simulate(M35, "h200", mode="store_all", workload="generation-short", concurrency=[16], kernels=None,
                      acceptance=acc)
        assert abs(df["acceptance_length"].item() - want) < 0.06, (acc, df["acceptance_length"].item())


def test_cli_takes_the_acceptance(capsys):
    import argparse

    from treewy.cli import main
    from treewy.sim.cli import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--acceptance", "2.5"]).acceptance == 2.5
    assert parser.parse_args(["--acceptance", "0.9,0.5,0.2"]).acceptance == [0.9, 0.5, 0.2]
    assert parser.parse_args([]).acceptance is None
    # two rates for a depth-3 chain reach simulate(), which names the argument
    assert main(["simulate", "--workload", "spec-bench", "--concurrency", "8", "--kernels", "none",
                 "--acceptance", "0.5,0.5"]) == 2
    assert "acceptance" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--acceptance", "fast"])


def test_predictions_committed_before_the_sweep_cover_its_grid():
    from pathlib import Path

    from treewy.sim import predict as P
    base = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "predictions_35b_h200_tp1_2026-12-02"
    df = pl.read_parquet(base.with_suffix(".parquet"))
    meta = json.loads(base.with_suffix(".json").read_text())
    grid = {(g, w, c, m) for g in P.GMUS for w in P.WORKLOADS for c in P.CONCURRENCIES
            for m in ("store_all", "reconstruct")}
    assert set(zip(df["gmu"], df["workload"], df["concurrency"], df["mode"])) == grid and df.height == len(grid)
    assert df["simulated"].all() and (df["gpu"] == "h200").all() and (df["failed"] == 0).all()
    assert all(r["completed"] == P.requests_per_point(r["concurrency"]) for r in df.iter_rows(named=True))
    assert [P.requests_per_point(c) for c in (1, 8, 32, 64, 128, 256)] == [16, 16, 32, 64, 128, 256]
    assert len(meta["commit"].split("+")[0]) == 40 and meta["date"] == "2026-12-02"
    assert abs(df.filter(pl.col("concurrency") == 8)["acceptance_length"].mean() - 3.23) < 0.05


def test_width_predictions_serve_each_tree_at_its_acceptance_and_graphs():
    """benchmarks/sim_width_predictions: each tree's sweep predicted with its own graphs (max_num_seqs x (1 + N))
    and the served sampler's rates (the simulator's conditional ones multiply back to P(depth >= d)), so a tree's
    tokens per step are its acceptance's, and the text divides every tree by the chain of the same gmu, acceptance
    and mode."""
    from benchmarks.sim_width_predictions import predict_width, text_table
    from treewy.serve.acceptance import parse_acceptance
    from treewy.sim import predict as P

    assert [P.graph_max_tokens(t) for t in ((1, 1, 1), (2, 2, 1), (3, 3, 3))] == [1024, 256 * 11, 256 * 40]
    assert P.server_for().graph_max_tokens == 1024 and P.server_for((2, 2, 1)).graph_max_tokens == 2816
    trees = ((1, 1, 1), (2, 2, 1))
    df = predict_width(gmus=(0.9,), acceptances=("paper-35b", "tiny"), trees=trees, concurrency=(8,))
    assert df.height == 8 and df["simulated"].all() and set(df["tree"]) == {str(t) for t in trees}
    for acc in ("paper-35b", "tiny"):
        want = 1 + sum(parse_acceptance(acc, 3, dummy=True, tree=(2, 2, 1)).rates)
        got = df.filter((pl.col("acceptance_source") == acc) & (pl.col("tree") == "(2, 2, 1)"))["acceptance_length"]
        assert abs(got.mean() - want) < 0.15, (acc, got.mean(), want)
    meta = {"model": "qwen3.5-35b-a3b", "workload": "generation-short", "date": "d", "commit": "c", "fit": "f",
            "graph_max_tokens": {}, "gmus": [0.9], "acceptances": ["paper-35b", "tiny"], "trees": trees}
    text = text_table(df, meta)
    assert text.count("(1, 1, 1)      1.00 [") == 4 and "gmu 0.9, acceptance tiny" in text


def test_width_predictions_committed_before_the_tree_sweep_cover_its_grid():
    from pathlib import Path

    from benchmarks.sim_width_predictions import ACCEPTANCES, GMUS, TREES
    from treewy.sim import predict as P
    base = (Path(__file__).resolve().parents[1] / "benchmarks" / "results"
            / "predictions_width_35b_h200_tp1_2026-12-05")
    df = pl.read_parquet(base.with_suffix(".parquet"))
    meta = json.loads(base.with_suffix(".json").read_text())
    grid = {(g, a, str(t), c, m) for g in GMUS for a in ACCEPTANCES for t in TREES for c in P.CONCURRENCIES
            for m in ("store_all", "reconstruct")}
    assert set(zip(df["gmu"], df["acceptance_source"], df["tree"], df["concurrency"], df["mode"])) == grid
    assert df.height == len(grid) and df["simulated"].all() and (df["workload"] == "generation-short").all()
    assert len(meta["commit"]) == 40 and meta["date"] == "2026-12-05"   # a clean checkout: no "+dirty"


def test_predict_runs_a_slice_of_the_grid():
    from treewy.sim.predict import predict
    df = predict(gmus=(0.6,), workloads=("balanced-short",), concurrency=(8,))
    assert df.height == 2 and (df["completed"] == 16).all()
    assert 0.8 * 128 <= df["mean_e2el_ms"].min() / df["mean_tpot_ms"].min()   # ~128 output tokens per request


def test_the_scheduler_counts_the_steps_run_without_cuda_graphs():
    """A step with a prefill chunk under decode-only graphs, or with more tokens than the largest captured graph,
    is eager: the point counts those steps and their seconds, on the regular path and on the fast decode path."""
    import dataclasses

    from treewy.memory import ServerConfig

    def point(**server):
        _, (res,) = simulate(M35, "h200", gmu=0.6, mode="store_all", workload="custom", concurrency=[8],
                             kernels=None, lengths=([64] * 16, [40] * 16), num_prompts=16, acceptance=2.0,
                             server=dataclasses.replace(ServerConfig(max_num_seqs=256), **server),
                             return_points=True)
        return res

    graphs = point()
    assert graphs.eager_steps == 0 and graphs.eager_time == 0.0
    decode_only = point(graphs_decode_only=True, eager_step_s=0.05)
    # 16 prompts prefill in the first wave's step and in later steps of their own: at least 2, at most 16
    assert 2 <= decode_only.eager_steps <= 16 < decode_only.steps
    assert 0.05 * decode_only.eager_steps < decode_only.eager_time < decode_only.duration
    # the eager steps cost eager_step_s more each, and nothing else changed: the run is that much longer
    assert abs(decode_only.duration - graphs.duration - 0.05 * decode_only.eager_steps) < 1e-9
    too_big = point(graph_max_tokens=8, eager_step_s=0.05)   # 8 requests x 4 tokens > 8: the decode steps too
    assert too_big.steps - 2 <= too_big.eager_steps < too_big.steps          # the last step or two run <= 2 requests
    assert abs(too_big.duration - graphs.duration - 0.05 * too_big.eager_steps) < 1e-9
    assert 0.05 * too_big.eager_steps < too_big.eager_time <= too_big.duration
