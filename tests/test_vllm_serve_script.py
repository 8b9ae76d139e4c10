"""benchmarks/vllm_serve_gpu.py's verdict: outputs against treewy's (as prefixes), and the two modes' counters."""

from __future__ import annotations

import json

import pytest

from treewy.paper import PAPER_35B_CHAIN_RATES
from treewy.serve.launcher import build_command


def _phase(outputs, accepted):
    return {"outputs": outputs, "seconds": 1.0,
            "counters": {"drafts": 2, "draft_tokens": 6, "accepted": accepted, "preemptions": 0,
                         "accepted_per_pos": [accepted, 0, 0]}}


def test_verdict_counts_prefix_matches_and_compares_the_modes(bench_script):
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    report = {"treewy_generate": ref, "runs": [
        {"mode": "store_all", "tag": "graphs", "phases": {"c1": _phase([[1, 2], [5, 6]], 3)}},
        {"mode": "reconstruct", "tag": "graphs", "phases": {"c1": _phase([[1, 2], [5, 9]], 4)}},
        {"mode": "store_all", "tag": "preempt", "error": "ServeError: refused"},
    ]}
    v = bench_script("vllm_serve_gpu").compare(report)
    rows = {r["run"]: r for r in v["phases"]}
    assert rows["graphs/store_all/c1"]["equal_to_treewy"] == 2
    assert rows["graphs/reconstruct/c1"]["equal_to_treewy"] == 1
    pair = rows["graphs/c1 store_all vs reconstruct"]
    assert pair["outputs_equal"] == 1 and pair["counters_equal"] is False
    assert rows["preempt/store_all"]["error"] == "ServeError: refused"
    assert v["all_equal"] is False


def test_capacity_lines_are_read_from_vllms_log(bench_script):
    log = ("INFO [gpu_worker.py:560] Available KV cache memory: 56.99 GiB\n"
           "INFO [kv_cache_utils.py:2177] GPU KV cache size: 1,037,516 tokens\n"
           "INFO [kv_cache_utils.py:2178] Maximum concurrency for 8,192 tokens per request: 126.65x\n")
    assert bench_script("vllm_serve_gpu").kv_capacity(log) == {
        "kv_cache_tokens": 1037516, "max_concurrency_at_len": 8192, "max_concurrency": 126.65,
        "available_kv_gib": 56.99}


def test_sweep_resumes_a_checkpoint_and_reruns_failed_points_when_asked(tmp_path, monkeypatch, bench_script):
    """``sweep --retry-failed`` resumes the checkpoint in --out and reruns its failed points (how the 35B
    concurrency 256 points were measured after their first run failed); without the flag they are kept.
    The capture sizes come from the launcher (max_num_seqs x (1 + k) unless ``--graph-max-tokens`` says otherwise),
    beside the chosen compile mode, and the acceptance is the paper's on these dummy weights unless asked."""
    import treewy.serve.export as export

    mod = bench_script("vllm_serve_gpu")
    seen = []
    monkeypatch.setattr(export, "export_dummy", lambda *a, **k: str(tmp_path / "model"))
    monkeypatch.setattr(mod, "run_sweep", lambda cfg, out: (seen.append(cfg), (0, 0))[1])
    for flags in ([], ["--retry-failed", "--graph-max-tokens", "512", "--acceptance", "none"]):
        assert mod.main(["sweep", "--mode", "reconstruct", "--out", str(tmp_path), "--port", "8022", *flags]) == 0
    assert [c.retry_failed for c in seen] == [False, True]
    assert seen[1].checkpoint == seen[0].checkpoint and seen[1].checkpoint.parent == tmp_path
    # the grid the committed predictions cover (treewy.sim.predict): its workloads, concurrencies, requests per point
    from treewy.sim import predict
    assert seen[1].server.port == 8022 and seen[1].concurrencies == [1, 8, 32, 64, 128, 256]
    assert seen[0].workloads == list(predict.WORKLOADS) and len(predict.WORKLOADS) == 3
    assert [seen[0].prompts(p) for p in seen[0].points()[:6]] == [predict.requests_per_point(c)
                                                                  for c in predict.CONCURRENCIES]
    configs = [json.loads(c.server.extra_args[c.server.extra_args.index("--compilation-config") + 1]) for c in seen]
    assert configs == [{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}] * 2
    commands = [build_command(c.server)[0] for c in seen]
    assert [a[a.index("--max-cudagraph-capture-size") + 1] for a in commands] == ["1024", "512"]
    specs = [json.loads(a[a.index("--speculative-config") + 1]) for a in commands]
    assert specs[0]["rejection_sample_method"] == "synthetic" and "rejection_sample_method" not in specs[1]
    assert mod.compile_args("default") == []
    assert json.loads(mod.compile_args("piecewise")[1]) == {"mode": 3, "cudagraph_mode": "PIECEWISE"}


def test_sweep_runs_on_a_host_without_polars(tmp_path):
    """A GPU host has no polars (the sweep keeps its rows in the JSONL checkpoint there): ``sweep`` must not import
    it, as it did through treewy.sim.predict for the grid's defaults (the 2026-12-06 H200 run stopped on that)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    code = f"""
import json, sys
sys.modules["polars"] = None
import treewy.serve.export as export
from benchmarks import vllm_serve_gpu as mod
export.export_dummy = lambda *a, **k: {str(tmp_path / "model")!r}
seen = []
mod.run_sweep = lambda cfg, out: (seen.append(cfg), (0, 0))[1]
assert mod.main(["sweep", "--mode", "store_all", "--out", {str(tmp_path)!r}]) == 0
print(seen[0].workloads, seen[0].concurrencies)
print(json.loads(open({str(tmp_path / "capacity_store_all_tp1.json")!r}).read())["simulated_knee"])
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "['generation-short', 'summarize-short', 'balanced-short'] [1, 8, 32, 64, 128, 256]" in done.stdout
    assert "'skipped': 'polars is not installed on this host'" in done.stdout


def test_acceptance_check_serves_the_default_acceptance_and_reports_graphs(tmp_path, monkeypatch, bench_script,
                                                                          capsys):
    """``acceptance --mode M``: the 35B dummy server at the paper's acceptance, graphs up to 1024 tokens and vLLM's
    --cudagraph-metrics, bench-serve's driver at concurrency 32 and 256, then one line per point (requested beside
    measured) and the report; a point that strayed makes the exit code 1."""
    import treewy.serve.export as export
    from treewy.serve.sweep import Sweep
    from treewy.serve.sweep_points import _base_row as sweep_row

    mod = bench_script("vllm_serve_gpu")
    monkeypatch.setattr(export, "export_dummy", lambda *a, **k: str(tmp_path / "model"))
    seen = []

    def fake_sweep(cfg, out):
        seen.append(cfg)
        sweep = Sweep(cfg)
        for p in cfg.points():
            row = {**sweep_row(cfg, p), "acceptance_length": 3.2, "measured_acceptance_rates": [0.86, 0.73, 0.61],
                   "acceptance_stderr": 0.01, "mean_tpot_ms": 20.0, "peak_running": p.concurrency,
                   "acceptance_warning": "strayed" if p.concurrency == 256 else None}
            sweep._record(p, row)
        cfg.result_dir.mkdir(parents=True, exist_ok=True)
        (cfg.result_dir / f"server-{cfg.modes[0]}.log").write_text(GRAPH_LOG)
        return len(cfg.points()), 0

    monkeypatch.setattr(mod, "run_sweep", fake_sweep)
    assert mod.main(["acceptance", "--mode", "reconstruct", "--out", str(tmp_path)]) == 1
    cfg = seen[0]
    assert cfg.concurrencies == [32, 256] and cfg.workloads == ["generation-short"] and cfg.modes == ["reconstruct"]
    argv, env = build_command(cfg.server)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["synthetic_acceptance_rates"] == list(PAPER_35B_CHAIN_RATES)
    assert "--cudagraph-metrics" in argv and argv[argv.index("--max-cudagraph-capture-size") + 1] == "1024"
    report = json.loads((tmp_path / "acceptance_reconstruct.json").read_text())
    assert report["graphs"]["largest_capture_size"] == 1024 and report["graphs"]["capture_gib"] == 1.52
    assert report["graphs"]["steps_by_mode"]["FULL"] == {"steps": 19, "max_tokens": 588, "steps_over_512": 12}
    assert report["graphs"]["steps_by_mode"]["NONE"]["steps"] == 2 and len(report["rows"]) == 2
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("reconstruct generation-short")]
    assert lines[0].startswith("reconstruct generation-short c32: requested 3.230 tokens/step (0.859, 0.738, 0.634) "
                               "(paper-35b); vLLM measured 3.200 +- 0.010 (0.860, 0.730, 0.610): within noise")
    assert "c256" in lines[1] and "WARNING strayed" in lines[1]


GRAPH_LOG = """(EngineCore pid=1) INFO 12-02 10:00:00 [gpu_model_runner.py:6844] Graph capturing finished in 31 secs, \
took 1.52 GiB
(EngineCore pid=1) INFO 12-02 10:00:01 [core.py:347] init engine (profile, create kv cache, warmup model) took 140.20 s
(APIServer pid=2) INFO 12-02 10:01:00 [loggers.py:318] **CUDAGraph Config Settings:**

- Mode: FULL_DECODE_ONLY
- Capture sizes: [1, 2, 4, 8, 1008, 1024]

**CUDAGraph Stats:**

| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
|-----------------|---------------|--------------|--------------|-------|
| 588             | 592           | 4            | FULL         | 12    |
| 128             | 128           | 0            | FULL         | 7     |
| 1100            | 1100          | 0            | NONE         | 2     |
"""


def test_tiny_in_fp32_serves_both_modes_with_the_fp32_prefill(tmp_path, monkeypatch, bench_script):
    """``tiny --dtype float32`` passes --dtype to every server, turns on treewy's fp32 prefill in both modes (vLLM
    0.26's refuses fp32), optionally exact fp32 Triton dots, and generates the reference in fp32 too."""
    import sys
    import types

    import torch

    import treewy.serve.export as export

    mod = bench_script("vllm_serve_gpu")
    calls, ref_dtypes = [], []
    monkeypatch.setattr(export, "export_vllm", lambda *a, **k: str(tmp_path / "model"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.26.0"))
    prompt = [[1, 2, 3]]
    monkeypatch.setattr("treewy.models.corpus.heldout_prompts", lambda *a, **k: prompt)

    def serve(model_dir, mode, prompts, tokens, out, tag, extra, concs, seqs, port, extra_env, tp=1):
        calls.append((tag, mode, extra, extra_env))
        return {"mode": mode, "tag": tag, "phases": {f"c{c}": _phase([[7] * 2], 1) for c in concs}}

    monkeypatch.setattr(mod, "serve_phases", serve)
    monkeypatch.setattr(mod, "treewy_outputs", lambda p, n, dtype: (ref_dtypes.append(dtype), [[7] * 2])[1])
    assert mod.main(["tiny", "--out", str(tmp_path), "--dtype", "float32", "--triton-f32", "ieee",
                     "--graphs-compile", "decode"]) == 0
    assert [(t, m) for t, m, _, _ in calls] == [("graphs", "store_all"), ("graphs", "reconstruct"),
                                                ("preempt", "store_all"), ("preempt", "reconstruct")]
    for _, _, extra, env in calls:
        assert extra[extra.index("--dtype") + 1] == "float32" and "--compilation-config" in extra
        assert env == {"TREEWY_FP32_PREFILL": "1", "TRITON_F32_DEFAULT": "ieee"}
    assert ref_dtypes == ["float32"]
    report = json.loads((tmp_path / "tiny_store_all-reconstruct_float32.json").read_text())
    assert report["dtype"] == "float32" and report["compile"] == {"graphs": "decode", "preempt": "decode"}
    calls.clear()
    assert mod.main(["tiny", "--out", str(tmp_path), "--stages", "graphs"]) == 0   # bf16: vLLM's own prefill
    assert all(env == {} and "bfloat16" in extra for _, _, extra, env in calls)


def test_tf32_probe_writes_attention_out_exactly_and_rounds_to_ten_bits(bench_script):
    """benchmarks/tf32_attention_probe.py: its written-out attention equals torch's (causal, GQA, masks), and its
    tf32 roundings keep 10 mantissa bits (to nearest, and truncated)."""
    import torch
    import torch.nn.functional as F

    probe = bench_script("tf32_attention_probe")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 5, 8, generator=g) for h in (4, 2, 2))
    exact = probe.attention_with(lambda x: x)
    torch.testing.assert_close(exact(q, k, v, is_causal=True, enable_gqa=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask.fill_diagonal_(True)
    kg, vg = k[:, [0, 0, 1, 1]], v[:, [0, 0, 1, 1]]
    torch.testing.assert_close(exact(q, kg, vg, attn_mask=mask),
                               F.scaled_dot_product_attention(q, kg, vg, attn_mask=mask))
    x = torch.tensor([1 + 2 ** -11, 1 + 2 ** -12, -3.0 - 2 ** -9])   # a half ulp of tf32, a quarter, a whole one
    assert probe.tf32_nearest(x).tolist() == [1 + 2 ** -10, 1.0, -3.0 - 2 ** -9]   # halves away from zero (cvt.rna)
    assert probe.tf32_truncated(x).tolist() == [1.0, 1.0, -3.0 - 2 ** -9]
    assert probe.tf32_nearest(torch.randn(100, generator=g)).view(torch.int32).bitwise_and(0x1FFF).eq(0).all()


def test_fault_kills_only_the_engine_of_the_server_it_started(bench_script):
    """The fault mode kills the engine-core process of its own server, found from the server's pid through /proc:
    a process elsewhere on the host whose command line also says EngineCore is left alone, and so is the server."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pytest

    from treewy.serve.launcher import process_alive

    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc")
    mod = bench_script("vllm_serve_gpu")
    source = Path(mod.__file__).read_text()
    assert "pkill" not in source and "killall" not in source
    sleeper = "import sys, time; print('up', flush=True); time.sleep(30)"
    server_code = ("import subprocess, sys, time; "
                   f"c = subprocess.Popen([sys.executable, '-c', {sleeper!r}, 'VLLM::EngineCore'], "
                   "stdout=subprocess.PIPE); c.stdout.readline(); print(c.pid, flush=True); time.sleep(30)")
    decoy = subprocess.Popen([sys.executable, "-c", sleeper, "VLLM::EngineCore"], stdout=subprocess.PIPE)
    server = subprocess.Popen([sys.executable, "-c", server_code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        decoy.stdout.readline()
        engine = int(server.stdout.readline())
        assert mod.kill_engine(server.pid) == [engine]
        deadline = time.monotonic() + 5
        while process_alive(engine):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert process_alive(server.pid) and decoy.poll() is None
    finally:
        os.killpg(server.pid, signal.SIGKILL)   # the server and, had the fault missed it, its engine
        decoy.kill()
        server.wait()
        decoy.wait()


def test_tree_tiny_serves_every_tree_and_mode_and_reports_equal_lines(tmp_path, monkeypatch, bench_script):
    """``tree-tiny``: one server per (tree, mode) with --tree's command (N drafts, TREEWY_TREE, the plugin, fp32 with
    exact dots), the prompts at each concurrency, and one "N/N equal" line per run against generate's outputs, with
    the steps vLLM counted at each accepted depth against generate's."""
    import types

    import torch

    import treewy.decode
    import treewy.models
    import treewy.serve.export as export

    mod = bench_script("vllm_serve_gpu")
    monkeypatch.setattr(export, "export_vllm", lambda *a, **k: str(tmp_path / "model"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "fake GPU")
    monkeypatch.setattr(mod, "check_gpus", lambda tp: None)
    monkeypatch.setattr(treewy.models, "load", lambda *a, **k: "model")
    refs = []

    def generate(model, prompts, drafter, tree, commit, max_new_tokens):
        refs.append((drafter, tree, commit))
        steps = [types.SimpleNamespace(length=n) for n in (3, 1, 2)]   # depths 2, 0, 1
        return types.SimpleNamespace(tokens=[[7, 8]] * len(prompts), steps=steps)

    monkeypatch.setattr(treewy.decode, "generate", generate)
    servers = []

    class Server:
        def __init__(self, argv, env, base_url, log_path, echo):
            servers.append((argv, env))

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def wait_healthy(self, timeout):
            pass

    monkeypatch.setattr(mod, "VLLMServer", Server)
    # vLLM's counters: 3 windows; the (2, 2) reconstruct server's accepted one depth less than generate's
    monkeypatch.setattr(mod, "counters", lambda url: {})
    monkeypatch.setattr(mod, "delta", lambda a, b: {"drafts": 3.0, "accepted_per_pos": (
        [2.0, 0.0, 0.0] if servers[-1][1]["TREEWY_TREE"] == "2,2" and servers[-1][1]["TREEWY_MODE"] == "reconstruct"
        else [2.0, 1.0, 0.0])})
    # the reconstruct server of (2, 2) differs on one prompt: its run is not all equal
    monkeypatch.setattr(mod, "complete", lambda url, m, p, n: [7, 9] if servers[-1][1]["TREEWY_MODE"] == "reconstruct"
                        and servers[-1][1]["TREEWY_TREE"] == "2,2" and p is prompts_seen[0] else [7, 8])
    prompts_seen = []
    monkeypatch.setattr("treewy.models.corpus.heldout_prompts",
                        lambda n, L, seed: prompts_seen.extend([[1, 2, 3 + i] for i in range(n)]) or prompts_seen)
    assert mod.main(["tree-tiny", "--out", str(tmp_path), "--prompts", "3", "--trees", "2,2,1;2,2",
                     "--concurrency", "1,2"]) == 1
    assert refs == [("mtp", t, m) for t in ((2, 2, 1), (2, 2)) for m in ("store_all", "reconstruct")]
    for (argv, env), tree, n in zip(servers, ["2,2,1", "2,2,1", "2,2", "2,2"], [10, 10, 6, 6]):
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp",
                                                                             "num_speculative_tokens": n}
        assert env["TREEWY_TREE"] == tree and env["VLLM_PLUGINS"] == "treewy"
        assert env["TREEWY_FP32_PREFILL"] == "1" and env["TRITON_F32_DEFAULT"] == "ieee"
        assert argv[argv.index("--dtype") + 1] == "float32"
        assert json.loads(argv[argv.index("--compilation-config") + 1])["cudagraph_mode"] == "FULL_DECODE_ONLY"
    lines = (tmp_path / "tree_tiny.txt").read_text().splitlines()
    assert lines[0].startswith("tree-tiny ") and "fake GPU" in lines[0] and "3 prompts x 48 new tokens" in lines[0]
    assert lines[0].endswith("temperature 0, compile decode")
    def line(m, t, c):
        odd = (m, t) == ("reconstruct", (2, 2))
        served = "[2, 0]" if odd else f"[2, 1{', 0' if len(t) == 3 else ''}]"
        return (f"{m} tree {t} mtp c{c}: {'2' if odd else '3'}/3 equal to treewy.decode.generate; steps accepting "
                f"depth >= 1..{len(t)}: {served} of 3 served, [2, 1{', 0' if len(t) == 3 else ''}] of 3 in generate "
                f"({'NOT the same' if odd else 'the same'})")
    assert lines[1:] == [line(m, t, c) for t in ((2, 2, 1), (2, 2)) for m in ("store_all", "reconstruct")
                         for c in (1, 2)]
    report = json.loads((tmp_path / "tree_tiny.json").read_text())
    assert len(report["runs"]) == 4 and report["runs"][0]["tree"] == [2, 2, 1] and report["drafter"] == "mtp"
    # --drafter ngram: the reference and the server draft with n-grams
    refs.clear(), servers.clear()
    mod.main(["tree-tiny", "--out", str(tmp_path), "--prompts", "3", "--trees", "2,2,1", "--modes", "reconstruct",
              "--concurrency", "1", "--drafter", "ngram"])
    assert refs == [("ngram", (2, 2, 1), "reconstruct")]
    argv, env = servers[0]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "ngram"
    assert env["TREEWY_TREE_DRAFTER"] == "ngram"
    # a server that stops answering (run 4's reconstruct at c32): its stacks are asked for, its run is recorded as
    # failed after --stall-s, and the next mode runs
    import threading
    hung, dumps = threading.Event(), []
    Server.dump_stacks = lambda self: dumps.append(1) or [4242]
    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout="100 %\n"))
    monkeypatch.setattr(mod, "complete", lambda url, m, p, n: hung.wait(30) and [7, 8]
                        if servers[-1][1]["TREEWY_MODE"] == "reconstruct" else [7, 8])
    servers.clear(), prompts_seen.clear()
    assert mod.main(["tree-tiny", "--out", str(tmp_path), "--prompts", "3", "--trees", "2,2,1", "--modes",
                     "reconstruct,store_all", "--concurrency", "1", "--stall-s", "0.2"]) == 1
    hung.set()
    lines = (tmp_path / "tree_tiny.txt").read_text().splitlines()
    assert lines[1] == ("reconstruct tree (2, 2, 1) mtp: FAILED (PhaseStalled: 3 of 3 requests unanswered, none "
                        "answered for 0.2 s; stacks of pids [4242] in the server log; GPU utilization 100 %)")
    assert lines[2].startswith("store_all tree (2, 2, 1) mtp c1: 3/3 equal") and dumps == [1]
    assert all(env["TREEWY_STACKS"] == "1" for _, env in servers)


def test_sweep_resumes_from_a_carried_folder_and_packs_its_results(tmp_path, monkeypatch, bench_script):
    """``sweep --resume-from DIR`` copies an earlier run's table and checkpoint into --out (so its points are not
    run again), ``--stop-after`` reaches the sweep, and ``--pack`` leaves one results.tar.gz instead of the folder;
    the server logs its steps per CUDA graph mode, summed into the capacity report."""
    import tarfile

    import treewy.serve.export as export

    mod = bench_script("vllm_serve_gpu")
    monkeypatch.setattr(export, "export_dummy", lambda *a, **k: str(tmp_path / "model"))
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "serve35b_store_all.points.jsonl").write_text('{"key": "k", "point": "p", "row": {}}\n')
    (earlier / "serve35b_store_all.parquet").write_bytes(b"table")
    seen = []

    def fake_run(cfg, out):
        seen.append((cfg.checkpoint.read_text(), cfg.out.read_bytes(), cfg.stop_after_s))
        assert "--cudagraph-metrics" in build_command(cfg.server)[0]   # the steps run per graph mode, logged
        cfg.result_dir.mkdir(parents=True)
        (cfg.result_dir / "server-store_all.log").write_text(GRAPH_LOG)
        return 1, 0

    monkeypatch.setattr(mod, "run_sweep", fake_run)
    out = tmp_path / "out"
    argv = ["sweep", "--mode", "store_all", "--out", str(out), "--resume-from", str(earlier), "--stop-after", "480",
            "--pack"]
    assert mod.main(argv) == 0
    assert seen == [('{"key": "k", "point": "p", "row": {}}\n', b"table", 480.0)]
    graphs = json.loads((out / "capacity_store_all_tp1.json").read_text())["graphs"]
    assert graphs["steps_by_mode"]["NONE"]["steps"] == 2 and graphs["largest_capture_size"] == 1024
    assert not (out / "results").exists()
    with tarfile.open(out / "results.tar.gz") as t:
        assert "./server-store_all.log" in t.getnames()
    with pytest.raises(SystemExit, match="exists already"):   # never over a checkpoint already there
        mod.main(argv)
    with pytest.raises(SystemExit, match="no serve35b_reconstruct.points.jsonl"):
        mod.main(["sweep", "--mode", "reconstruct", "--out", str(tmp_path / "o2"), "--resume-from", str(earlier)])


def test_predictions_are_compared_point_by_point_with_the_measured_sweep(tmp_path, bench_script, capsys):
    import polars as pl

    from treewy.schema import serving_frame

    mod = bench_script("predictions_vs_measured")
    base = {"model": "m", "gmu": 0.6, "workload": "generation-short", "failed": 0, "peak_running": 8}
    pred = serving_frame([dict(base, mode=m, concurrency=c, output_throughput=100.0, mean_tpot_ms=10.0,
                               p99_ttft_ms=50.0, simulated=True) for m in ("store_all", "reconstruct") for c in (1, 8)])
    meas = serving_frame([dict(base, mode="store_all", concurrency=1, output_throughput=50.0, mean_tpot_ms=20.0,
                               p99_ttft_ms=100.0, simulated=False, device="H200", date="2026-12-02"),
                          dict(base, mode="store_all", concurrency=8, simulated=False, error="server died"),
                          dict(base, mode="reconstruct", concurrency=1, output_throughput=100.0, mean_tpot_ms=10.0,
                               p99_ttft_ms=50.0, simulated=False, device="H200", date="2026-12-02"),
                          dict(base, mode="reconstruct", concurrency=64, output_throughput=1.0, mean_tpot_ms=1.0,
                               p99_ttft_ms=1.0, simulated=False, device="H200", date="2026-12-02")]
                         + [dict(base, workload="summarize-short", mode=m, concurrency=c, output_throughput=x,
                                 mean_tpot_ms=10.0, p99_ttft_ms=50.0, simulated=False, device="H200", date="2026-12-02")
                            for c in (1, 8) for m, x in (("store_all", 50.0), ("reconstruct", 100.0))])
    pred = pl.concat([pred, pred.with_columns(workload=pl.lit("summarize-short"))])
    pred.write_parquet(tmp_path / "p.parquet")
    meas.write_parquet(tmp_path / "m.parquet")
    assert mod.main([str(tmp_path / "p.parquet"), str(tmp_path / "m.parquet"), "--out", str(tmp_path / "r.txt")]) == 0
    text = (tmp_path / "r.txt").read_text()
    assert "50 / 100 (0.50)" in text and "20.00 / 10.00 (2.00)" in text and "8 / 8 (1.00)" in text
    assert "store_all   (3 points): tok/s 0.50 [0.50, 0.50] rms 0.693" in text    # |ln 0.5| at every point
    assert "reconstruct (3 points): tok/s 1.00 [1.00, 1.00] rms 0.000" in text
    assert "all         (6 points): tok/s 0.71 [0.50, 1.00] rms 0.490" in text      # sqrt(ln(0.5)^2 / 2)
    assert "generation-short reconstruct c64 gmu 0.6" in text and "generation-short store_all c8 gmu 0.6" in text
    # the Table-1-shaped ratios where both modes finished: TreeWY / store-all measured (predicted: equal modes)
    assert "gmu 0.6: TreeWY / store-all, measured (SIMULATED prediction) [paper, B200]" in text
    assert "| output throughput       |  2.00 ( 1.00) [0.94] |" in text
    assert "(at 8: summarize-short alone: the other workloads lack a mode there)" in text
    assert mod.main([str(tmp_path / "m.parquet"), str(tmp_path / "m.parquet")]) == 2   # measured rows as predictions
    assert "expected the simulator's predictions" in capsys.readouterr().err


def test_width_predictions_are_matched_per_tree_and_acceptance(tmp_path, bench_script):
    """The width predictions hold one row per tree and acceptance at each point: a measured tree point matches its
    own (never the chain's or the other source's), and the ratio tables come per tree, the paper's figures beside
    the chain's alone."""
    import polars as pl

    from pathlib import Path

    mod = bench_script("predictions_vs_measured")
    pred = pl.read_parquet(Path(__file__).parents[1] / "benchmarks/results"
                           / "predictions_width_35b_h200_tp1_2026-12-05.parquet")
    point = ((pl.col("gmu") == 0.9) & (pl.col("concurrency") == 32) & (pl.col("acceptance_source") == "tiny")
             & pl.col("tree").is_in(["(1, 1, 1)", "(2, 2, 1)"]))
    meas = pred.filter(point).with_columns(simulated=pl.lit(False), device=pl.lit("NVIDIA H200"),
                                           date=pl.lit("2026-12-09"), output_throughput=pl.col("output_throughput") * 2)
    matched, unmatched = mod.compare(pred, meas)
    assert matched.height == 4 and unmatched.is_empty()
    assert matched["output_throughput_ratio"].to_list() == pytest.approx([2.0] * 4)
    assert set(zip(matched["tree"], matched["acceptance_source"])) == {("(1, 1, 1)", "tiny"), ("(2, 2, 1)", "tiny")}
    lines = mod.ratio_tables(pred, meas)
    heads = [i for i, x in enumerate(lines) if "TreeWY / store-all" in x]
    assert [lines[i].split(":")[0] for i in heads] == ["gmu 0.9 tiny", "gmu 0.9 tree (2, 2, 1) tiny"]
    throughput = [next(x for x in lines[i:] if x.startswith("| output throughput")) for i in heads]
    assert "[" in throughput[0] and "[" not in throughput[1]     # the paper's B200 figure beside the chain alone


def test_sweep_serves_a_tree_with_the_papers_table_2_acceptance_per_depth(tmp_path, monkeypatch, bench_script):
    """``sweep --tree 2,2,1`` serves the tree as vLLM's chain of its N = 10 drafts with the tree's drafter, asks the
    plugin's tree sampler for the paper's Table 2 length (3.38 tokens per step) per depth, and keeps its own table."""
    import treewy.serve.export as export
    from treewy.paper import ACCEPTANCE, geometric_acceptance_rates
    from treewy.serve.acceptance import parse_acceptance

    mod = bench_script("vllm_serve_gpu")
    seen = []
    monkeypatch.setattr(export, "export_dummy", lambda *a, **k: str(tmp_path / "model"))
    monkeypatch.setattr(mod, "run_sweep", lambda cfg, out: (seen.append(cfg), (0, 0))[1])
    assert mod.main(["sweep", "--mode", "reconstruct", "--out", str(tmp_path), "--tree", "2,2,1"]) == 0
    cfg = seen[0]
    assert cfg.server.tree == (2, 2, 1) and cfg.server.num_speculative_tokens == 10 and cfg.server.drafter == "mtp"
    assert cfg.out.name == "serve35b_reconstruct_tree2-2-1.parquet"
    _, env = build_command(cfg.server)
    rates = [float(x) for x in env["TREEWY_TREE_RATES"].split(",")]
    assert rates == pytest.approx(geometric_acceptance_rates(ACCEPTANCE[(2, 2, 1)], 3))
    assert cfg.device == "unchecked"                       # no GPU here; on one, the name nvidia-smi gives
    # the tiny checkpoint's measured rates per depth, into a table of their own beside the paper's
    assert mod.main(["sweep", "--mode", "reconstruct", "--out", str(tmp_path), "--tree", "2,2,1",
                     "--acceptance", "tiny"]) == 0
    assert seen[1].out.name == "serve35b_reconstruct_tree2-2-1_tiny.parquet"
    _, env = build_command(seen[1].server)
    assert tuple(float(x) for x in env["TREEWY_TREE_RATES"].split(",")) == pytest.approx(
        parse_acceptance("tiny", 3, dummy=True, tree=(2, 2, 1)).rates)


def test_run_requests_answers_in_order_and_raises_a_requests_own_error(bench_script):
    gpu = bench_script("vllm_serve_gpu")
    assert gpu.run_requests(lambda x: x * x, range(7), 3) == [x * x for x in range(7)]

    def fail(x):
        if x == 4:
            raise ConnectionError("request 4")
        return x
    with pytest.raises(ConnectionError, match="request 4"):
        gpu.run_requests(fail, range(6), 2)


def test_run_requests_calls_a_phase_stalled_without_waiting_for_the_threads(bench_script):
    """A server that stops answering (tree-tiny's run 4 sat 100 s until its call's limit) ends the phase after
    stall_s without an answer: on_stall says why, and the hung requests are left to the server's stop."""
    import threading
    import time
    gpu = bench_script("vllm_serve_gpu")
    release, seen = threading.Event(), []

    def answer(x):
        if x >= 3:
            release.wait(30)
        return x
    t0 = time.monotonic()
    with pytest.raises(gpu.PhaseStalled, match=r"5 of 8 requests unanswered, none answered for 0.3 s; busy"):
        gpu.run_requests(answer, range(8), 4, stall_s=0.3, on_stall=lambda: seen.append(1) or "busy")
    assert seen == [1] and time.monotonic() - t0 < 5
    release.set()


def test_a_stalled_servers_processes_write_their_stacks_to_its_log(tmp_path, monkeypatch):
    """VLLMServer.dump_stacks signals the server's process group; a process that ran the plugin's register() with
    TREEWY_STACKS=1 writes every thread's Python stack to the log (the dump of a stalled tree server)."""
    import faulthandler
    import sys
    import time

    from treewy.serve import launcher_process as lp
    from treewy.serve import plugin
    monkeypatch.setenv(lp.STACKS_ENV, "1")
    plugin.register()
    assert faulthandler.unregister(lp.STACKS_SIGNAL)      # it was registered
    code = ("import time\nfrom treewy.serve import plugin\nplugin.register()\nprint('ready', flush=True)\n"
            "def waiting_for_the_gpu():\n    time.sleep(60)\nwaiting_for_the_gpu()\n")
    log = tmp_path / "server.log"
    srv = lp.VLLMServer([sys.executable, "-c", code], {lp.STACKS_ENV: "1"}, "http://127.0.0.1:1",
                        log_path=str(log), echo=False).start()
    try:
        for _ in range(200):
            if log.exists() and "ready" in log.read_text():
                break
            time.sleep(0.05)
        assert srv.dump_stacks(settle=1.0) == [srv.proc.pid]
        assert srv.alive and "in waiting_for_the_gpu" in log.read_text()
    finally:
        srv.stop(grace=2)
