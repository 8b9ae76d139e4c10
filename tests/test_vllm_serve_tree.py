"""``vllm_serve_gpu tree-tiny --temperature T``: a served tree's accepted depths per step against the engine's, as
statistics (two random streams), on synthetic counts and through the command against the fake vLLM."""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

RATES = (0.9, 0.6, 0.3)  # P(depth >= d) of a depth-3 tree, d = 1, 2, 3


def _depths(counts):
    """Explicit per-step depths: counts[k] steps at depth k."""
    return [k for k, c in enumerate(counts) for _ in range(c)]


def _at_least(depths, D=3):
    return len(depths), [sum(x >= d for x in depths) for d in range(1, D + 1)]


def test_depth_statistics_match_equal_rates_and_flag_different_ones(bench_script):
    mod = bench_script("vllm_serve_gpu")
    served, engine = _depths((150, 180, 150, 120)), _depths((140, 175, 160, 125))
    cmp = mod.compare_depths(_at_least(served), _at_least(engine))
    s = cmp["served"]
    assert s["steps"] == 600 and s["at_least"] == [450, 270, 120]
    assert s["mean_depth"] == pytest.approx(statistics.mean(served))
    assert s["mean_se"] == pytest.approx(statistics.pstdev(served) / 600 ** 0.5)
    assert s["rate_se"][1] == pytest.approx((0.45 * 0.55 / 600) ** 0.5)
    pool = (270 + 285) / 1200
    assert cmp["z"][1] == pytest.approx((0.45 - 285 / 600) / (pool * (1 - pool) * (2 / 600)) ** 0.5)
    assert cmp["matches"] and cmp["z_max"] == 3.0 and all(abs(z) < 1 for z in cmp["z"])
    line = mod.depth_line(cmp)
    assert "matches (|z| < 3 at every depth)" in line and "600 served steps, 600 generate steps" in line
    assert "P(depth >= 1) 450/600 = 0.750 +- 0.018 vs 460/600 = 0.767" in line
    # an engine that accepts far less: every depth is off, and the line says which
    far = mod.compare_depths(_at_least(served), _at_least(_depths((400, 120, 60, 20))))
    assert not far["matches"] and all(z > 3 for z in far["z"])
    assert "does NOT match (|z| >= 3 at depth 1, 2, 3)" in mod.depth_line(far)
    back = mod.compare_depths(_at_least(_depths((400, 120, 60, 20))), _at_least(served))
    assert not back["matches"] and all(z < -3 for z in back["z"])
    # one depth off by a few standard errors is enough
    near = mod.compare_depths(_at_least(served), _at_least(_depths((150, 180, 195, 75))))
    assert not near["matches"] and [abs(z) >= 3 for z in near["z"]] == [False, False, True]
    # both sides never reaching a depth agree there
    assert mod.compare_depths((10, [5, 0, 0]), (20, [10, 0, 0]))["z"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("served, engine, match", [
    ((0, [0, 0, 0]), (10, [5, 2, 1]), "served: 0 steps"),
    ((10, [5, 6, 1]), (10, [5, 2, 1]), "served: steps at depth >= d must be non-increasing"),
    ((10, [5, 2, 1]), (10, [11, 2, 1]), "engine: steps at depth >= d"),
    ((10, [5, 2, 1]), (10, [5, 2]), "served has 3 depths and engine 2"),
], ids=["no-steps", "increasing", "above-steps", "other-tree"])
def test_depth_statistics_name_bad_counts(bench_script, served, engine, match):
    with pytest.raises(ValueError, match=match):
        bench_script("vllm_serve_gpu").compare_depths(served, engine)


def test_depth_counts_come_from_vllms_positions_and_generates_records(bench_script):
    """vLLM counts a served tree's depth d at position d - 1 (floats from Prometheus); positions past the tree's depth
    must stay 0. generate's StepStat.length is the accepted depth + 1."""
    mod = bench_script("vllm_serve_gpu")
    got = {"drafts": 10.0, "accepted_per_pos": [8.0, 5.0, 2.0, 0.0, 0.0, 0.0]}
    assert mod.served_depth_counts(got, 3) == (10, [8, 5, 2])
    with pytest.raises(ValueError, match=r"positions 3\.\. \(\[1, 0, 0\]\): a tree of depth 3"):
        mod.served_depth_counts({"drafts": 10.0, "accepted_per_pos": [8.0, 5.0, 2.0, 1.0, 0.0, 0.0]}, 3)
    steps = [SimpleNamespace(length=n) for n in (1, 2, 4, 3, 4, 1)]
    assert mod.engine_depth_counts(steps, 3) == (6, [4, 3, 2])


def _engine_steps(rates, prompts: int, new_tokens: int, seed: int):
    """Steps of a process accepting depth >= d with probability rates[d - 1], each request until its tokens."""
    rng, steps = random.Random(seed), []
    cond = [a / b for a, b in zip(rates, (1.0, *rates[:-1]))]
    for _ in range(prompts):
        emitted = 1
        while emitted < new_tokens:
            depth = 0
            while depth < len(cond) and rng.random() < cond[depth]:
                depth += 1
            steps.append(SimpleNamespace(length=depth + 1))
            emitted += depth + 1
    return steps


def test_tree_tiny_at_temperature_1_compares_accepted_depths_with_generate(tmp_path, monkeypatch, bench_script):
    """``tree-tiny --temperature 1 --seed 5`` against the fake vLLM (its tree sampler accepting at RATES): every request
    sampled at temperature 1 with seed 5 + i, generate called at the same temperature with seed 5, and one line per
    phase from the counters. The store_all engine accepts at RATES (matches); the reconstruct one far less, which
    must read "does NOT match" and make the exit code 1."""
    import torch

    import treewy.decode
    import treewy.models
    import treewy.serve.export as export

    mod = bench_script("vllm_serve_gpu")
    monkeypatch.setenv("PATH", f"{support.fake_vllm_bin(tmp_path)}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("TREEWY_TREE_RATES", ",".join(map(str, RATES)))
    monkeypatch.setenv("FAKE_VLLM_REQUEST_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setattr(export, "export_vllm", lambda *a, **k: str(tmp_path / "model"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    monkeypatch.setattr(mod, "check_gpus", lambda tp: None)
    monkeypatch.setattr(treewy.models, "load", lambda *a, **k: "model")
    calls = []

    def generate(model, prompts, drafter, tree, commit, max_new_tokens, temperature, seed):
        calls.append((drafter, tree, commit, temperature, seed))
        rates = RATES if commit == "store_all" else (0.5, 0.2, 0.05)
        return SimpleNamespace(tokens=[[0] * max_new_tokens] * len(prompts),
                               steps=_engine_steps(rates, len(prompts), max_new_tokens, seed=len(calls)))

    monkeypatch.setattr(treewy.decode, "generate", generate)
    rc = mod.main(["tree-tiny", "--out", str(tmp_path), "--prompts", "8", "--trees", "2,2,1", "--concurrency", "1,4",
                   "--temperature", "1", "--seed", "5", "--port", str(support.free_port())])
    assert rc == 1
    assert calls == [("mtp", (2, 2, 1), m, 1.0, 5) for m in ("store_all", "reconstruct")]
    sent = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(sent) == 2 * 2 * 8 and all(r["temperature"] == 1.0 and r["max_tokens"] == 48 for r in sent)
    assert sorted(r["seed"] for r in sent) == sorted(list(range(5, 13)) * 4)
    lines = (tmp_path / "tree_tiny.txt").read_text().splitlines()
    assert lines[0].endswith("8 prompts x 48 new tokens, fp32, temperature 1, request i seeded 5 + i, generate "
                             "seeded 5, compile decode")
    assert [line.split(": accepted depth")[0] for line in lines[1:]] == [
        f"{m} tree (2, 2, 1) mtp c{c} temperature 1" for m in ("store_all", "reconstruct") for c in (1, 4)]
    assert all("matches (|z| < 3 at every depth)" in line for line in lines[1:3]), lines
    assert all("does NOT match" in line for line in lines[3:]), lines
    report = json.loads((tmp_path / "tree_tiny.json").read_text())
    assert report["temperature"] == 1.0 and report["seed"] == 5
    for run in report["runs"]:
        for phase in run["phases"].values():
            s = phase["depths"]["served"]
            # the fake's per-prompt draws: 8 requests of 48 tokens at RATES, about 2.8 tokens per step
            assert 100 < s["steps"] < 180 and s["steps"] == phase["counters"]["drafts"]
            assert s["at_least"] == phase["counters"]["accepted_per_pos"][:3]
            assert s["mean_depth"] == pytest.approx(sum(RATES), abs=4 * s["mean_se"])
    # the same prompts and seeds give the same counters at either concurrency (the fake draws per request)
    c1, c4 = report["runs"][0]["phases"]["c1"], report["runs"][0]["phases"]["c4"]
    assert c1["counters"] == c4["counters"]


@pytest.mark.parametrize("flag, value, match", [
    ("--temperature", "-1", "expected a finite number >= 0"),
    ("--temperature", "hot", "expected a finite number >= 0"),
    ("--seed", "-3", "expected an integer in 0..2"),
], ids=["negative-temperature", "text-temperature", "negative-seed"])
def test_tree_tiny_names_a_bad_temperature_or_seed(tmp_path, bench_script, capsys, flag, value, match):
    with pytest.raises(SystemExit) as e:
        bench_script("vllm_serve_gpu").main(["tree-tiny", "--out", str(tmp_path), flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"tree-tiny: error: argument {flag}" in err and match in err
