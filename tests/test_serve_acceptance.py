"""Accepted drafts on dummy weights and CUDA graphs for every admitted step: `treewy serve / bench-serve
--acceptance` (vLLM 0.26's synthetic rejection sampler), the paper's default rule, the noise check against vLLM's
counters, and the capture sizes the launcher asks for. Servers are the fake ``vllm`` of tests/serve_fakes/, which
draws its drafts as vLLM's synthetic sampler does."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

from treewy.cli import main  # noqa: E402
from treewy.paper import ACCEPTANCE, PAPER_35B_ALPHA, PAPER_35B_CHAIN_RATES, geometric_acceptance_rates  # noqa: E402
from treewy.serve.acceptance import check_acceptance, parse_acceptance, tiny_depth_rates  # noqa: E402
from treewy.serve.launcher import ServeError, ServeOptions, build_command, capture_grid, capture_plan  # noqa: E402
from treewy.serve.metrics import accepted_per_position, parse_prometheus  # noqa: E402

LOG_0530 = (Path(__file__).parents[1] / "benchmarks/results/vllm_h200_2026-11-30/session3/serve35b/reconstruct/results"
            / "server-reconstruct.log")


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)) + os.pathsep + os.environ["PATH"])


def _dry(capsys, *argv):
    assert main(["serve", "--dry-run", "--preset", "qwen3.5-35b-a3b", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    cmd = [w for w in shlex.split(lines[0]) if not re.match(r"^[A-Z_]+=", w)]
    return cmd, json.loads(cmd[cmd.index("--speculative-config") + 1]), lines[1:]


# --- the default rule ------------------------------------------------------------------------------------------------

def test_paper_rule_gives_the_papers_tokens_per_step_with_one_rate_per_draft():
    a = PAPER_35B_CHAIN_RATES
    assert len(a) == 3 and abs(1 + sum(a) - ACCEPTANCE[(1, 1, 1)]) < 1e-12
    assert all(abs(a[i] - PAPER_35B_ALPHA ** (i + 1)) < 1e-15 for i in range(3))  # the same conditional rate each
    assert geometric_acceptance_rates(1.0, 3) == (0.0, 0.0, 0.0) and geometric_acceptance_rates(4.0, 3) == (1.0,) * 3
    assert abs(1 + sum(geometric_acceptance_rates(2.5, 5)) - 2.5) < 1e-12
    with pytest.raises(ValueError, match="1 to 4 tokens per step"):
        geometric_acceptance_rates(4.5, 3)


@pytest.mark.parametrize("text,k,want", [
    ("paper-35b", 3, PAPER_35B_CHAIN_RATES),
    ("Paper-35B", 5, tuple(PAPER_35B_ALPHA ** i for i in range(1, 6))),   # other chains keep the per-draft rate
    ("length=2.5", 3, geometric_acceptance_rates(2.5, 3)),
    ("rates=0.8, 0.6,0.4", 3, (0.8, 0.6, 0.4)),
    ("none", 3, None),
])
def test_acceptance_forms(text, k, want):
    acc = parse_acceptance(text, k, dummy=True)
    assert acc.rates == want
    assert acc.expected_tokens_per_step == (None if want is None else 1 + sum(want))
    assert acc.source == {"Paper-35B": "paper-35b", "rates=0.8, 0.6,0.4": "rates=0.8,0.6,0.4"}.get(text, text)


def test_default_is_the_paper_on_dummy_weights_and_real_acceptance_otherwise():
    assert parse_acceptance(None, 3, dummy=True).source == "paper-35b"
    assert parse_acceptance(None, 3, dummy=False).rates is None


def test_paper_acceptance_of_a_tree_is_its_table_2_length_per_depth():
    """A served tree's rates are per depth: the paper's Table 2 length for its shape ((2, 2, 1): 3.38 tokens per
    step, (3, 3, 3): 3.58), geometric over the depths; the chain (1, 1, 1) keeps its own; a shape the table lacks
    gets the chain's per-position rates."""
    from treewy.paper import ACCEPTANCE

    for shape in ((2, 2, 1), (3, 3, 3)):
        acc = parse_acceptance(None, 3, dummy=True, tree=shape)
        assert acc.source == "paper-35b" and acc.rates == geometric_acceptance_rates(ACCEPTANCE[shape], 3)
        assert abs(acc.expected_tokens_per_step - ACCEPTANCE[shape]) < 1e-9
    assert parse_acceptance(None, 3, dummy=True, tree=(1, 1, 1)).rates == parse_acceptance(None, 3, dummy=True).rates
    assert parse_acceptance(None, 2, dummy=True, tree=(4, 4)).rates == parse_acceptance(None, 2, dummy=True).rates


def test_tiny_acceptance_is_the_tiny_checkpoints_measured_depths():
    """``tiny``: P(accepted depth >= d) of the tiny checkpoint's MTP drafter on the shape, read from the committed
    acceptance sweep (a chain of k drafts reads the chain (1,) * k); rates and tokens per step are one measurement;
    a shape the sweep did not run is refused, naming the ones it did."""
    from treewy.results import table

    df = pl.read_parquet(table("acceptance_sweeps"))
    for tree, k in (((2, 2, 1), 3), ((2, 2, 2), 3), ((3, 3, 3), 3), (None, 3), (None, 1)):
        acc = parse_acceptance("tiny", k, dummy=True, tree=tree)
        row = df.filter((pl.col("drafter") == "mtp") & (pl.col("mode") == "reconstruct")
                        & (pl.col("shape") == str(tree or (1,) * k))).row(0, named=True)
        assert acc.source == "tiny" and acc.rates == tuple(row[f"accept_ge_d{d}"] for d in range(1, k + 1))
        assert abs(acc.expected_tokens_per_step - row["acceptance"]) < 1e-9
        assert list(acc.rates) == sorted(acc.rates, reverse=True) and 0 < acc.rates[-1] <= acc.rates[0] <= 1
        assert tiny_depth_rates(tree, k)["device"] == row["device"]
    # the two sources differ in how acceptance spreads over the depths, not only in the length
    assert parse_acceptance("tiny", 3, dummy=True, tree=(2, 2, 1)).rates != parse_acceptance(
        "paper-35b", 3, dummy=True, tree=(2, 2, 1)).rates
    with pytest.raises(ValueError, match=r"--acceptance tiny: .* no 'mtp' row for the shape \(4, 4\); measured shapes"):
        parse_acceptance("tiny", 2, dummy=True, tree=(4, 4))


def test_dry_run_of_a_tree_passes_tinys_rates_per_depth(capsys):
    cmd, spec, notes = _dry(capsys, "--tree", "2,2,1", "--acceptance", "tiny", "--", "--load-format", "dummy")
    rates = parse_acceptance("tiny", 3, dummy=True, tree=(2, 2, 1)).rates
    assert any(n.startswith("# acceptance: synthetic acceptance") and "(tiny; per position "
               + ", ".join(f"{a:.3f}" for a in rates) + ")" in n for n in notes), notes


# --- the command line -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["store_all", "reconstruct"])
def test_dry_run_passes_the_synthetic_sampler_and_graphs_for_every_admitted_step(capsys, mode):
    cmd, spec, notes = _dry(capsys, "--mode", mode, "--", "--load-format", "dummy")
    assert spec == {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_rates": list(PAPER_35B_CHAIN_RATES)}
    assert cmd[cmd.index("--max-cudagraph-capture-size") + 1] == "1024"   # 256 requests x (1 + 3) tokens
    assert "# acceptance: synthetic acceptance 3.23 tokens/step (paper-35b; per position 0.859, 0.738, 0.634)" in notes
    assert "# CUDA graphs: steps of up to 1024 tokens (max_num_seqs x (1 + k) = 256 x 4)" in notes
    cmd, spec, notes = _dry(capsys, "--mode", mode, "--acceptance", "none", "--", "--load-format", "dummy")
    assert spec == {"method": "mtp", "num_speculative_tokens": 3} and "# acceptance: real acceptance" in notes
    _, spec, _ = _dry(capsys, "--mode", mode, "-k", "2", "--acceptance", "rates=0.9,0.5")
    assert spec["synthetic_acceptance_rates"] == [0.9, 0.5]   # asked for explicitly: real weights too


def test_capture_sizes_follow_the_server_and_respect_what_the_user_set():
    def plan(**kw):
        return capture_plan(ServeOptions(model="m", **kw))

    cc = ["--compilation-config", '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}']
    p = plan(extra_args=cc)
    assert (p.max_size, p.flags, p.eager_fallback_possible) == (1024, ("--max-cudagraph-capture-size", "1024"), False)
    assert p.compilation_config == cc[1]
    argv, _ = build_command(ServeOptions(model="m", extra_args=cc))
    assert argv[-2:] == cc                                        # the user's config is passed as given
    assert plan(max_num_seqs=64).max_size == 512                  # vLLM's own default is larger there: kept
    off = plan(max_num_seqs=300, num_speculative_tokens=2)        # 900: off vLLM's grid, so the sizes are listed
    assert off.flags[0] == "--cudagraph-capture-sizes" and off.flags[-2:] == ("896", "900")
    wide = plan(num_speculative_tokens=39)                         # a (3,3,3) tree: 256 x 40 = 10240 tokens
    assert wide.flags == ("--max-cudagraph-capture-size", "10240", "--max-num-batched-tokens", "10240"), wide.flags
    mid = plan(num_speculative_tokens=10)                          # (2,2,1): 2816, above small GPUs' default budget
    assert mid.flags[-2:] == ("--max-num-batched-tokens", "8192")  # never below the big GPUs' default
    assert "--max-num-batched-tokens" not in plan(num_speculative_tokens=10, extra_args=[
        "--max-num-batched-tokens", "4096"]).flags               # the user's budget is kept
    capped = plan(extra_args=["--max-num-batched-tokens", "601"])
    assert capped.max_size == 600 and capped.eager_fallback_possible and "601" in capped.why
    assert plan(cudagraph_max_size=512).eager_fallback_possible  # the 2026-11-30 setting, on purpose
    for extra in (["--enforce-eager"], ["-cc", '{"cudagraph_mode": "NONE"}']):
        assert (plan(extra_args=extra).max_size, plan(extra_args=extra).flags) == (0, ())
    for extra in (["--max-cudagraph-capture-size", "512"], ["--max_cudagraph_capture_size=512"],
                  ["--compilation_config", '{"cudagraph_capture_sizes": [8, 512]}'],
                  ["--cudagraph-capture-sizes", "8", "512", "--no-enforce-eager"]):
        p = plan(extra_args=extra)
        assert (p.max_size, p.flags, p.eager_fallback_possible) == (512, (), True), extra
    with pytest.raises(ServeError, match="keep one of them"):
        plan(cudagraph_max_size=256, extra_args=["--max-cudagraph-capture-size", "512"])
    with pytest.raises(ServeError, match="one JSON object"):
        plan(extra_args=["--compilation_config.max_cudagraph_capture_size=512"])
    with pytest.raises(ServeError, match="expected a JSON object"):
        plan(extra_args=["--compilation-config", "[1]"])


@pytest.mark.skipif(not LOG_0530.is_file(), reason="the 2026-11-30 server log is not in this checkout")
def test_capture_grid_is_vllms_own_list():
    """vLLM 0.26's own capture list for 512 tokens, from the config line of a 2026-11-30 server log."""
    logged = re.search(r"'cudagraph_capture_sizes': \[([\d, ]+)\]", LOG_0530.read_text(errors="replace"))
    assert capture_grid(512) == [int(x) for x in logged.group(1).split(",")]


# --- refusals ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,words", [
    ("rates=0.8,0.6", "2 rate(s) for 3 drafts"), ("rates=0.8,1.2,0.1", "in [0, 1]"),
    ("rates=0.5,0.6,0.1", "non-increasing"), ("rates=a,b,c", "'a' is not a number"), ("rates=", "not a number"),
    ("length=5", "1 to 4 tokens per step"), ("length=0.5", "1 to 4 tokens per step"), ("length=nan", "finite"),
    ("length=x", "not a number"), ("paper", "expected one of paper-35b"), ("", "expected one of paper-35b"),
])
@pytest.mark.parametrize("command", ["serve", "bench-serve"])
def test_bad_acceptance_is_refused_in_one_line(capsys, tmp_path, fake_path, value, words, command):
    common = ["--model", str(support.checkpoint(tmp_path)), "--acceptance", value, "--no-gpu-check"]
    if command == "serve":
        argv = ["serve", *common, "--dry-run"]
    else:
        argv = ["bench-serve", *common, "--concurrency", "1", "--out", str(tmp_path / "t.parquet")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"treewy {command}: error: --acceptance ") and "\n" not in err, err
    assert words in err
    assert not (tmp_path / "t.parquet").exists()


def test_bad_capture_size_is_refused(capsys):
    assert main(["serve", "--preset", "qwen3.5-35b-a3b", "--dry-run", "--cudagraph-max-size", "0"]) == 2
    assert "--cudagraph-max-size 0: expected a positive integer" in capsys.readouterr().err


# --- the noise check ------------------------------------------------------------------------------------------------

def test_standard_error_is_that_of_vllms_sampler():
    """The check's standard error against steps drawn as vLLM's synthetic sampler draws them (conditional rates,
    stop at the first rejection): the spread of the accepted drafts per step and the per-position means agree."""
    acc = parse_acceptance("paper-35b", 3, dummy=True)
    cond = [p / q for p, q in zip(acc.rates, (1.0, *acc.rates[:-1]))]
    rng, n = random.Random(0), 40000
    steps = []
    for _ in range(n):
        a = 0
        while a < 3 and rng.random() < cond[a]:
            a += 1
        steps.append(a)
    mean = sum(steps) / n
    sd = math.sqrt(sum((s - mean) ** 2 for s in steps) / (n - 1))
    per_pos = [sum(s > i for s in steps) for i in range(3)]
    check = check_acceptance(acc, 3, n, sum(steps), per_pos, 3 * n)
    assert abs(check.stderr * math.sqrt(n) / sd - 1) < 0.02
    assert check.warning is None and abs(check.tokens_per_step - acc.expected_tokens_per_step) < 3 * check.stderr


def test_a_measurement_beyond_noise_is_named():
    acc = parse_acceptance("paper-35b", 3, dummy=True)
    n = 2000
    exact = [a * n for a in acc.rates]
    assert check_acceptance(acc, 3, n, sum(exact), exact, 3 * n).warning is None
    se = check_acceptance(acc, 3, n, sum(exact), exact).stderr
    low = [exact[0], exact[1], exact[2] - 5 * se * n]   # position 2 short by 5 standard errors of the mean
    w = check_acceptance(acc, 3, n, sum(low), low, 3 * n - 40).warning
    assert w.startswith(f"vLLM measured {1 + sum(low) / n:.3f} tokens per step against 3.230 (5.0 standard errors)")
    assert f"per position {low[2] / n:.3f} vs 0.634 (position 2)" in w
    assert "over 2000 drafts, beyond 3 standard errors" in w
    assert "0.7% of draft positions went unscheduled" in w
    assert "could not be checked" in check_acceptance(acc, 3, 0, 0, None).warning
    real = check_acceptance(parse_acceptance("none", 3, dummy=True), 3, 10, 5, [3, 2, 0])
    assert real.warning is None and real.stderr is None and real.rates == (0.3, 0.2, 0.0)


def test_per_position_counters_are_read_per_engine_and_position():
    text = "\n".join([
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0'])
    assert accepted_per_position(parse_prometheus(text)) == [10.0, 6.0, 4.0]
    assert accepted_per_position(parse_prometheus("vllm:num_requests_running 1")) is None


# --- end to end -----------------------------------------------------------------------------------------------------

def _bench(tmp_path, *extra, out="acc.parquet"):
    # weights without mtp.* tensors: vLLM's --load-format dummy reads none, so only the config's MTP layers count
    return main(["bench-serve", "--model", str(support.checkpoint(tmp_path, mtp_weights=False)), "--no-gpu-check",
                 "--port", str(support.free_port()), "--workloads", "smoke", "--num-prompts", "6",
                 "--out", str(tmp_path / out), "--device", "fake-h200", "--metrics-interval", "0.05",
                 "--health-timeout", "30", "--point-timeout", "60", "--no-progress", *extra])


def test_every_row_records_the_request_beside_vllms_counters(tmp_path, fake_path, monkeypatch, capsys):
    assert _bench(tmp_path, "--concurrency", "2", "--modes", "store_all,reconstruct", "--", "--load-format",
                  "dummy") == 0
    df = pl.read_parquet(tmp_path / "acc.parquet")
    assert df.height == 2 and df["error"].is_null().all() and (df["weights"] == "dummy").all()
    assert (df["acceptance_source"] == "paper-35b").all()
    assert df["acceptance_rates"].to_list() == [list(PAPER_35B_CHAIN_RATES)] * 2
    assert ((df["expected_tokens_per_step"] - 3.23).abs() < 1e-12).all()
    assert df["acceptance_warning"].is_null().all(), df["acceptance_warning"].to_list()
    assert (df["acceptance_stderr"] > 0).all() and df["measured_acceptance_rates"].list.len().to_list() == [3, 3]
    assert ((df["acceptance_length"] - 3.23).abs() < 3 * df["acceptance_stderr"]).all()
    assert (df["cudagraph_max_size"] == 1024).all() and not df["eager_fallback_possible"].any()
    for mode in ("store_all", "reconstruct"):   # each mode's server got the synthetic sampler
        log = (tmp_path / "acc_results" / f"server-{mode}.log").read_text()
        assert '"synthetic_acceptance_rates": [0.858853' in log

    # a server whose sampler accepts half as often: every point warns, in its row and on the terminal
    monkeypatch.setenv("FAKE_VLLM_ACCEPT_SCALE", "0.5")
    assert _bench(tmp_path, "--concurrency", "2", "--modes", "reconstruct", "--", "--load-format", "dummy",
                  out="bad.parquet") == 0
    bad = pl.read_parquet(tmp_path / "bad.parquet")
    assert bad["acceptance_warning"].str.contains("beyond 3 standard errors of the requested synthetic").all()
    out = capsys.readouterr()
    assert "point smoke-reconstruct-c2: warning: vLLM measured" in out.err
    assert "at 1 point(s) vLLM's acceptance strayed beyond noise" in out.out

    # resuming that checkpoint at another acceptance would mix two acceptances in one table
    assert _bench(tmp_path, "--concurrency", "2", "--modes", "reconstruct", "--acceptance", "none", "--",
                  "--load-format", "dummy", out="bad.parquet") == 2
    assert "was measured with --acceptance paper-35b, this run asks for none" in capsys.readouterr().err
