"""Bad input to `treewy serve` / `treewy bench-serve`: refused before vLLM starts, in one line that names the argument
and the fix; malformed checkpoints named by file; results tables the sweep did not write are left alone; a sweep
killed with SIGKILL leaves no server behind. The server is the fake ``vllm`` of tests/serve_fakes/."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

from treewy.cli import main  # noqa: E402
from treewy.schema import serving_frame  # noqa: E402
from treewy.serve import launcher, launcher_process  # noqa: E402
from treewy.serve.launcher import ServeError, ServeOptions, build_command  # noqa: E402
from treewy.serve.sweep import SweepConfig  # noqa: E402


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"treewy {command}: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("FAKE_VLLM_CALL_LOG", str(tmp_path / "bench_calls.jsonl"))


# --- extra vLLM arguments cannot move the server off 127.0.0.1 ---------------------------------------------------

@pytest.mark.parametrize("extra", [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--hos", "0.0.0.0"],
                                   ["--port", "9000"], ["--port=9000"], ["--por=9000"]],
                         ids=["host", "host=", "host-prefix", "port", "port=", "port-prefix"])
def test_extra_vllm_arguments_cannot_set_host_or_port(capsys, extra):
    assert main(["serve", "--preset", "qwen3.5-35b-a3b", "--dry-run", "--", "--max-model-len", "4096", *extra]) == 2
    err = _one_line_error(capsys, "serve")
    assert repr(extra[0]) in err and "treewy's own --port" in err and "127.0.0.1 only" in err
    with pytest.raises(ServeError, match="127.0.0.1 only"):   # bench-serve and the GPU script build through here too
        build_command(ServeOptions(model="m", extra_args=["--enforce-eager", *extra]))


def test_extra_vllm_arguments_that_only_look_like_host_are_kept():
    argv, _ = build_command(ServeOptions(model="m", extra_args=["--hf-overrides", "{}", "--pooler-config", "{}"]))
    assert argv[-4:] == ["--hf-overrides", "{}", "--pooler-config", "{}"]


# --- numbers refused before vLLM starts ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--tp", "0"), ("--tp", "-4"), ("--port", "70000"), ("--port", "-1"),
                                        ("--port", "0"), ("--max-num-seqs", "0"), ("--max-model-len", "0")])
def test_serve_refuses_out_of_range_numbers_before_vllm_starts(capsys, tmp_path, monkeypatch, flag, value):
    monkeypatch.setenv("PATH", str(tmp_path))   # no vllm at all: the number is what is refused, first
    assert main(["serve", "--model", "m", "--no-gpu-check", flag, value]) == 2
    err = _one_line_error(capsys, "serve")
    assert f"{flag} {value}" in err and "vLLM is not installed" not in err
    assert main(["serve", "--model", "m", "--dry-run", flag, value]) == 2
    assert f"{flag} {value}" in _one_line_error(capsys, "serve")


def test_serve_tp_must_split_the_presets_heads(capsys):
    assert main(["serve", "--preset", "qwen3.5-35b-a3b", "--dry-run", "--tp", "3"]) == 2
    err = _one_line_error(capsys, "serve")
    assert "--tp 3" in err and "1, 2, 4, 8, 16" in err
    assert main(["serve", "--preset", "qwen3.5-35b-a3b", "--dry-run", "--tp", "32"]) == 2
    assert "1, 2, 4, 8, 16" in _one_line_error(capsys, "serve")
    assert main(["serve", "--preset", "qwen3.5-397b-a17b", "--dry-run", "--tp", "8"]) == 0   # 2 KV heads, replicated


def test_serve_tp_must_split_a_local_checkpoints_heads(capsys, tmp_path):
    ck = support.checkpoint(tmp_path)   # 16 GDN key heads, 32 value heads
    assert main(["serve", "--model", str(ck), "--dry-run", "--tp", "6"]) == 2
    err = _one_line_error(capsys, "serve")
    assert "--tp 6" in err and "1, 2, 4, 8, 16" in err and str(ck / "config.json") in err
    assert main(["serve", "--model", str(ck), "--dry-run", "--tp", "4"]) == 0


# --- malformed checkpoints name the file --------------------------------------------------------------------------

def _tiny_config_dir(tmp_path) -> Path:
    from treewy.models import TINY_DIR

    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text((TINY_DIR / "config.json").read_text())
    return d


BAD_WEIGHTS = {
    "3-byte": b"abc",
    "huge-header-length": struct.pack("<Q", 10**15) + b"{}",
    "header-not-json": struct.pack("<Q", 4) + b"\xff{x}",
    "header-not-an-object": struct.pack("<Q", 2) + b"[]",
}


@pytest.mark.parametrize("case", list(BAD_WEIGHTS))
def test_serve_names_a_malformed_safetensors_file(capsys, tmp_path, fake_path, case):
    d = _tiny_config_dir(tmp_path)
    (d / "model.safetensors").write_bytes(BAD_WEIGHTS[case])
    t0 = time.monotonic()
    assert main(["serve", "--model", str(d), "--no-gpu-check", "--port", str(support.free_port())]) == 2
    assert time.monotonic() - t0 < 5   # a header length of 10**15 is compared with the file size, never read
    err = _one_line_error(capsys, "serve")
    assert str(d / "model.safetensors") in err and "safetensors" in err


@pytest.mark.parametrize("data", [b'{"model_type": ', b"[1, 2]", b"\xff\xfe\x00"], ids=["cut", "list", "binary"])
def test_serve_names_a_config_that_is_not_a_json_object(capsys, tmp_path, fake_path, data):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_bytes(data)
    assert main(["serve", "--model", str(d), "--no-gpu-check", "--port", str(support.free_port())]) == 2
    err = _one_line_error(capsys, "serve")
    assert str(d / "config.json") in err and "JSON object" in err


def test_serve_names_an_index_that_is_not_json(capsys, tmp_path, fake_path):
    d = support.checkpoint(tmp_path)
    (d / "model.safetensors.index.json").write_text("{")
    assert main(["serve", "--model", str(d), "--no-gpu-check", "--port", str(support.free_port())]) == 2
    assert str(d / "model.safetensors.index.json") in _one_line_error(capsys, "serve")


@pytest.mark.parametrize("case", ["3-byte", "huge-header-length", "config-not-json"])
def test_load_names_the_malformed_file(tmp_path, case):
    import treewy

    d = _tiny_config_dir(tmp_path)
    if case == "config-not-json":
        (d / "config.json").write_text("not json")
        bad = d / "config.json"
    else:
        (d / "model.safetensors").write_bytes(BAD_WEIGHTS[case])
        bad = d / "model.safetensors"
    with pytest.raises(ValueError, match=f"^{re.escape(str(bad))}: "):
        treewy.load(str(d))


# --- bench-serve load points and its results table ----------------------------------------------------------------

def _bench_argv(tmp_path, *extra, out="sweep.parquet", port=None):
    return ["bench-serve", "--model", str(support.checkpoint(tmp_path)), "--no-gpu-check",
            "--port", str(port or support.free_port()), "--workloads", "smoke", "--modes", "store_all",
            "--out", str(tmp_path / out), "--device", "fake", "--health-timeout", "30", "--point-timeout", "60",
            "--metrics-interval", "0.05", "--no-progress", *extra]


@pytest.mark.parametrize("flag,value", [("--concurrency", "0"), ("--concurrency", "-2"), ("--concurrency", "4,0"),
                                        ("--request-rate", "0"), ("--request-rate", "-1.5"),
                                        ("--request-rate", "nan"), ("--num-prompts", "0"),
                                        ("--prompts-per-concurrency", "-1")])
def test_bench_serve_refuses_bad_load_points_before_anything_starts(capsys, tmp_path, monkeypatch, flag, value):
    monkeypatch.setenv("PATH", str(tmp_path))   # no vllm: the load point is refused before the preflight
    load = [] if flag in ("--concurrency", "--request-rate") else ["--concurrency", "1"]
    assert main(_bench_argv(tmp_path, *load, flag, value)) == 2
    err = _one_line_error(capsys, "bench-serve")
    assert flag in err and value.split(",")[-1] in err and "vLLM is not installed" not in err
    assert not (tmp_path / "sweep_results").exists() and not (tmp_path / "sweep.parquet").exists()


def _rows(n: int, **labels) -> list[dict]:
    return [{"model": "m", "gpu": "fake", "tp": 1, "gmu": 0.9, "workload": "smoke", "mode": "store_all",
             "tree": "(1, 1, 1)", "num_drafts": 3, "concurrency": c, "completed": 4, "failed": 0,
             "simulated": False, **labels} for c in (1, 2, 4, 8)[:n]]


@pytest.mark.parametrize("kind", ["other-run", "simulator", "not-parquet", "folder"])
def test_bench_serve_refuses_an_out_its_checkpoint_does_not_account_for(capsys, tmp_path, fake_path, kind):
    out = tmp_path / "sweep.parquet"
    if kind == "other-run":          # another run's table copied here, without its checkpoint
        serving_frame(_rows(4)).write_parquet(out)
    elif kind == "simulator":
        serving_frame(_rows(4, simulated=True, cost_source="analytic")).write_parquet(out)
    elif kind == "not-parquet":
        out.write_text("a table of another tool\n")
    else:
        out.mkdir()
    before = out.read_bytes() if out.is_file() else None
    assert main(_bench_argv(tmp_path, "--concurrency", "4", "--num-prompts", "4")) == 2
    err = _one_line_error(capsys, "bench-serve")
    assert f"--out {out}" in err and ("is a folder" if kind == "folder" else "fresh --out") in err
    assert (out.read_bytes() if out.is_file() else None) == before
    assert not (tmp_path / "bench_calls.jsonl").exists() and not (tmp_path / "sweep_results").exists()


def test_bench_serve_resumes_onto_a_table_its_checkpoint_accounts_for(capsys, tmp_path, fake_path):
    """The table a sweep wrote (every row in its checkpoint) is rebuilt and extended as before."""
    port = support.free_port()
    assert main(_bench_argv(tmp_path, "--concurrency", "1", "--num-prompts", "2", port=port)) == 0
    assert main(_bench_argv(tmp_path, "--concurrency", "1,2", "--num-prompts", "2", port=port)) == 0
    assert pl.read_parquet(tmp_path / "sweep.parquet")["concurrency"].sort().to_list() == [1, 2]


# --- a bench-serve killed with SIGKILL leaves no server -----------------------------------------------------------

def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5):
            return True
    except OSError:
        return False


def test_sigkill_of_bench_serve_takes_its_server_down(tmp_path, fake_path):
    port = support.free_port()
    code = "import sys; from treewy.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, *_bench_argv(tmp_path, "--concurrency", "1", "--num-prompts", "100000",
                                                     port=port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server_pid = None
    try:
        deadline = time.monotonic() + 30
        while not _healthy(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pid_file = SweepConfig(server=None, model_name="m", workloads=[], modes=[],
                               out=tmp_path / "sweep.parquet").server_pid_file
        server_pid = json.loads(pid_file.read_text())["pid"]
        proc.kill()
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while _healthy(port) or launcher.process_alive(server_pid):
            assert time.monotonic() < deadline, "the vLLM server outlived the bench-serve killed with SIGKILL"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        if server_pid is not None and launcher.process_alive(server_pid):   # the defect: stop what it left
            os.killpg(server_pid, signal.SIGKILL)


def test_next_run_stops_a_server_an_earlier_run_left_running(capsys, tmp_path, fake_path):
    """Where the parent-death signal is missing, the pid file beside the table finds the orphan."""
    from treewy.serve.sweep import write_server_pid

    port = support.free_port()
    exe = str(support.fake_vllm_bin(tmp_path) / "vllm")
    orphan = subprocess.Popen([exe, "serve", "m", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _healthy(port):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cfg = SweepConfig(server=None, model_name="m", workloads=[], modes=[], out=tmp_path / "sweep.parquet")
        write_server_pid(cfg.server_pid_file, orphan.pid, port)
        assert main(_bench_argv(tmp_path, "--concurrency", "1", "--num-prompts", "2", port=port)) == 0
        assert orphan.wait(timeout=5) is not None
        assert f"stopped the vLLM server (pid {orphan.pid}" in capsys.readouterr().err
        assert not cfg.server_pid_file.exists()
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


def test_a_pid_file_naming_someone_elses_process_is_ignored(tmp_path):
    """A recycled pid (another start time) is not the server: it is left alone and the stale file removed."""
    from treewy.serve.sweep import stop_leftover_server

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        pid_file = tmp_path / "sweep.server.pid"
        pid_file.write_text(json.dumps({"pid": other.pid, "start_time": -1, "port": 1}))
        stop_leftover_server(pid_file, log=lambda m: None)
        assert other.poll() is None and not pid_file.exists()
    finally:
        other.kill()
        other.wait()


def test_server_starts_where_prctl_is_missing(monkeypatch):
    class NoPrctl:
        pass

    monkeypatch.setattr(launcher_process.ctypes, "CDLL", lambda *a, **k: NoPrctl())
    assert launcher_process._parent_death_signal() is None
    srv = launcher.VLLMServer([sys.executable, "-c", "print('up')"], {}, "http://127.0.0.1:1", echo=False).start()
    assert srv.proc.wait(timeout=10) == 0
    srv.stop()
    assert srv.last_log() == "up"
