"""`treewy bench-serve` end to end against a fake vLLM (server + `vllm bench serve`) on 127.0.0.1:
launcher, /metrics scraper, tidy table, resume after an interruption, and a server that dies mid-sweep."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

from treewy.cli import main  # noqa: E402
from treewy.schema import SERVING_SCHEMA  # noqa: E402
from treewy.serve.metrics import parse_prometheus  # noqa: E402


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)) + ":" + __import__("os").environ["PATH"])
    log = tmp_path / "bench_calls.jsonl"
    monkeypatch.setenv("FAKE_VLLM_CALL_LOG", str(log))
    monkeypatch.setenv("FAKE_VLLM_REQUEST_LOG", str(tmp_path / "requests.jsonl"))
    return log


def _bench(tmp_path, *extra, out="sweep.parquet"):
    return main(["bench-serve", "--model", str(support.checkpoint(tmp_path)), "--no-gpu-check",
                 "--port", str(support.free_port()), "--workloads", "smoke", "--num-prompts", "6",
                 "--out", str(tmp_path / out), "--device", "fake-h200", "--metrics-interval", "0.05",
                 "--health-timeout", "30", "--point-timeout", "60", "--no-progress", *extra])


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_sweep_writes_one_tidy_row_per_point_and_resumes(tmp_path, fake_env, capsys):
    assert _bench(tmp_path, "--concurrency", "1,4", "--request-rate", "50", "--modes", "store_all,reconstruct") == 0
    df = pl.read_parquet(tmp_path / "sweep.parquet")
    assert df.schema == pl.Schema(SERVING_SCHEMA)
    assert df.height == 6 and _calls(fake_env) == 6
    assert df["error"].is_null().all(), df["error"].to_list()
    assert (df["completed"] == 6).all() and (df["failed"] == 0).all()
    assert not df["simulated"].any() and (df["device"] == "fake-h200").all()
    assert set(df["mode"]) == {"store_all", "reconstruct"} and (df["tree"] == "(1, 1, 1)").all()
    assert (df["num_drafts"] == 3).all() and (df["tp"] == 1).all()
    rate_rows = df.filter(pl.col("request_rate").is_not_null())
    assert rate_rows.height == 2 and rate_rows["concurrency"].is_null().all()
    # each point was preceded by as many unmeasured requests as it sends, sent by the sweep itself as token ids (the
    # fake bench sends text), 16 tokens each, prompts of smoke's 64 +- 20 %
    assert (df["warmup_requests"] == 6).all()
    import json
    sent = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    warm = [r for r in sent if r["prompt_len"] is not None]
    assert len(warm) == df["warmup_requests"].sum() and len(sent) - len(warm) == df["completed"].sum()
    assert all(r["max_tokens"] == 16 and 51 <= r["prompt_len"] <= 76 for r in warm)
    assert (df["output_throughput"] > 0).all() and (df["p99_ttft_ms"] >= df["mean_ttft_ms"] * 0.5).all()
    assert (df["median_tpot_ms"] > 0).all() and (df["median_tpot_ms"] != df["mean_tpot_ms"]).any()
    # the scraper saw the load: peaks, counters, acceptance = 1 + accepted / drafts (the fake emits 3.2)
    assert (df["peak_running"] >= 1).all() and (df["peak_kv_usage"] > 0).all() and (df["peak_kv_usage"] <= 1).all()
    assert df["preemptions"].is_not_null().all()
    assert df["acceptance_length"].is_between(3.1, 3.3).all(), df["acceptance_length"].to_list()
    # each mode's server was the right one (the fake holds 0.12 of the pool per request, 0.05 under the plugin)
    per_req = df["mode"].replace_strict({"store_all": 0.12, "reconstruct": 0.05}, return_dtype=pl.Float64)
    assert ((df["peak_kv_usage"] - df["peak_running"] * per_req).abs() < 1e-9).all()
    results = sorted(p.name for p in (tmp_path / "sweep_results").glob("*.json"))
    assert "smoke-reconstruct-c4.json" in results and "smoke-store_all-r50.json" in results

    # rerun: nothing to do
    assert _bench(tmp_path, "--concurrency", "1,4", "--request-rate", "50", "--modes", "store_all,reconstruct") == 0
    assert _calls(fake_env) == 6
    assert "nothing to run" in capsys.readouterr().err
    # an interruption lost the last point: only that point runs again
    ck = tmp_path / "sweep.points.jsonl"
    lines = ck.read_text().splitlines()
    ck.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # the last record cut mid-line
    table = pl.read_parquet(tmp_path / "sweep.parquet")   # and, as then, the table written before that record
    table.head(table.height - 1).write_parquet(tmp_path / "sweep.parquet")
    assert _bench(tmp_path, "--concurrency", "1,4", "--request-rate", "50", "--modes", "store_all,reconstruct") == 0
    assert _calls(fake_env) == 7
    assert pl.read_parquet(tmp_path / "sweep.parquet").height == 6
    # the record appended after the torn line starts a line of its own: the next resume reads it and runs nothing
    assert _bench(tmp_path, "--concurrency", "1,4", "--request-rate", "50", "--modes", "store_all,reconstruct") == 0
    assert _calls(fake_env) == 7


def test_server_that_dies_mid_sweep_is_recorded_and_restarted(tmp_path, fake_env, monkeypatch, capsys):
    # each server process dies at its 20th request: the first during c2's measured run (c1: 6 warm-ups + 6, c2: 6 +
    # 6), the restarted one during c8's warm-up (c4: 6 + 6, then c8's 8 warm-ups: max(6 prompts, 1 x 8))
    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", "20")
    rc = _bench(tmp_path, "--concurrency", "1,2,4,8,16", "--modes", "store_all", "--max-restarts", "1",
                "--prompts-per-concurrency", "1")
    assert rc == 1
    df = pl.read_parquet(tmp_path / "sweep.parquet").sort("concurrency")
    assert df.height == 5  # every point is a row, failed or not
    err = df["error"].to_list()
    assert err[0] is None and err[2] is None, err
    assert "server exited with code 3 during this point" in err[1] and "engine core died" in err[1]
    assert "server exited with code 3 during this point's warm-up" in err[3]
    assert "died 2 time(s); not restarting" in err[4]
    assert df["completed"][1] < 6 and df["completed"][4] == 0
    assert _calls(fake_env) == 3  # the last two points never reached vllm bench serve
    out = capsys.readouterr()
    assert "2 failed" in out.out or "3 failed" in out.out
    assert "point smoke-store_all-c16 failed" in out.err

    # fix the cause and resume with --retry-failed: only the failed points run
    monkeypatch.delenv("FAKE_VLLM_DIE_AFTER")
    assert _bench(tmp_path, "--concurrency", "1,2,4,8,16", "--modes", "store_all", "--retry-failed",
                  "--prompts-per-concurrency", "1") == 0
    assert _calls(fake_env) == 6
    assert pl.read_parquet(tmp_path / "sweep.parquet")["error"].is_null().all()


def test_server_that_cannot_start_fails_every_point_with_the_reason(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL_START", "1")
    assert _bench(tmp_path, "--concurrency", "1,2", "--modes", "reconstruct") == 1
    df = pl.read_parquet(tmp_path / "sweep.parquet")
    assert df.height == 2 and df["error"].str.contains("could not start").all()
    assert df["error"].str.contains("CUDA out of memory").all()


def test_bad_sweep_arguments_say_what_to_do(tmp_path, fake_env, capsys):
    assert _bench(tmp_path, "--concurrency", "1", "--modes", "store_all,fast") == 2
    assert "--modes" in capsys.readouterr().err
    assert _bench(tmp_path, "--modes", "store_all") == 2
    assert "give at least one load point" in capsys.readouterr().err
    assert main(["bench-serve", "--model", "m", "--no-gpu-check", "--workloads", "spec-bench", "--concurrency", "1",
                 "--port", str(support.free_port()), "--out", str(tmp_path / "x.parquet")]) == 2
    assert "--dataset-dir" in capsys.readouterr().err


def test_prometheus_parser_reads_labels_and_counters():
    text = r'''# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="a \"quoted\" {name}"} 7.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0 1700000000000
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
not a sample line
'''
    s = parse_prometheus(text)
    labels, value = s["vllm:num_preemptions_total"][0]
    assert value == 7.0 and labels["model_name"] == 'a "quoted" {name}' and labels["engine"] == "0"
    assert [v for _, v in s["vllm:num_requests_running"]] == [3.0, 2.0]
    assert s["vllm:kv_cache_usage_perc"][0][1] == 0.5 and len(s) == 3


def test_sigterm_stops_the_server_it_started(tmp_path, fake_env):
    """`timeout` or a job scheduler sends SIGTERM: the sweep must stop its vLLM server, not orphan it on the port."""
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    port = support.free_port()
    code = ("import sys; from treewy.cli import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-c", code, "bench-serve", "--model", str(support.checkpoint(tmp_path)), "--no-gpu-check",
            "--port", str(port), "--workloads", "smoke", "--num-prompts", "100000", "--concurrency", "1",
            "--out", str(tmp_path / "s.parquet"), "--device", "fake", "--health-timeout", "30", "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return True
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while not healthy():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.1)
    time.sleep(1.0)                                       # inside the point's requests
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    deadline = time.monotonic() + 15
    while healthy():
        assert time.monotonic() < deadline, "the server outlived the sweep that SIGTERM stopped"
        time.sleep(0.2)


def test_each_point_first_sends_as_many_short_unmeasured_requests(tmp_path):
    """One-time costs (kernels compiled for a new batch or prompt shape during inference) land on the first requests
    of that shape: before a point the sweep sends as many unmeasured requests as the point, at its concurrency, with
    prompts of the workload's lengths but token ids of their own (not in the prefix cache) and 16 output tokens each;
    the bench command itself sends no warm-up and keeps per-request times (``--save-detailed``)."""
    from treewy.serve.launcher import ServeError, ServeOptions
    from treewy.serve.sweep_points import Point, SweepConfig, bench_command, warmup_bodies

    cfg = SweepConfig(server=ServeOptions(model="m"), model_name="m", workloads=["smoke", "summarize-short"],
                      modes=["reconstruct"], concurrencies=[128], request_rates=[4.0], num_prompts=64,
                      prompts_per_concurrency=4)
    point = Point("summarize-short", "reconstruct", 128)
    argv = bench_command(cfg, point, tmp_path, "x.json")
    assert "--save-detailed" in argv and "--num-warmups" not in argv
    bodies = warmup_bodies(cfg, point)
    # as many as the point sends (max(64, 4 x 128)): a prompt length can be a new kernel shape as much as a batch size
    assert len(bodies) == cfg.warmups(point) == 512 and cfg.warmups(Point("smoke", "reconstruct", None, 4.0)) == 64
    lengths = [len(b["prompt"]) for b in bodies]
    assert 819 <= min(lengths) < max(lengths) <= 1228 and len(set(lengths)) > 200
    assert all(b["max_tokens"] == 16 and b["ignore_eos"] and b["model"] == "m" for b in bodies)
    assert all(1 <= t <= 255 for b in bodies for t in b["prompt"])
    # reproducible per point, and another point's warm-up has other prompts
    assert warmup_bodies(cfg, point) == bodies
    assert warmup_bodies(cfg, Point("summarize-short", "store_all", 128))[0]["prompt"] != bodies[0]["prompt"]
    assert len(warmup_bodies(SweepConfig(**{**cfg.__dict__, "warmup_waves": 2}), point)) == 1024
    assert warmup_bodies(SweepConfig(**{**cfg.__dict__, "warmup_waves": 0}), point) == []
    with pytest.raises(ServeError, match="warmup_waves = -1"):
        SweepConfig(**{**cfg.__dict__, "warmup_waves": -1}).points()


def test_stop_after_leaves_the_rest_to_the_next_run(tmp_path, fake_env, capsys):
    """--stop-after S starts no point once S seconds have passed (the server's start counts): the points left are
    neither run nor written as failed, and the same command without it resumes them from the checkpoint."""
    assert _bench(tmp_path, "--concurrency", "1,2,4", "--modes", "reconstruct", "--stop-after", "0.01") == 0
    df = pl.read_parquet(tmp_path / "sweep.parquet")
    assert df.height == 1 and df["error"].is_null().all() and _calls(fake_env) == 1
    assert "2 point(s) left for the next run" in capsys.readouterr().err
    assert _bench(tmp_path, "--concurrency", "1,2,4", "--modes", "reconstruct") == 0
    assert pl.read_parquet(tmp_path / "sweep.parquet").height == 3 and _calls(fake_env) == 3
    assert main(["bench-serve", "--model", "m", "--concurrency", "1", "--stop-after", "0",
                 "--out", str(tmp_path / "x.parquet")]) == 2
    assert "--stop-after 0" in capsys.readouterr().err
