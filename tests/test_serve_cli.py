"""`treewy serve`: exact dry-run command lines, every refusal with its message, and a clean stop on Ctrl-C.

The server runs are a fake ``vllm`` executable (tests/serve_fakes/fake_vllm.py) on PATH, bound to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

from treewy.cli import main  # noqa: E402
from treewy.serve.launcher import (  # noqa: E402
    ServeError,
    ServeOptions,
    build_command,
    check_mtp_weights,
    check_vllm_installed,
)
from treewy.serve.presets import PRESETS, ServePreset  # noqa: E402


def _dry(capsys, *argv):
    assert main(["serve", "--dry-run", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    cmd = shlex.split(out[0])
    env = dict(w.split("=", 1) for w in cmd if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
    argv_ = [w for w in cmd if w not in {f"{k}={v}" for k, v in env.items()}]
    return argv_, env, out


def _flag(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("preset,tp,gmu", [("qwen3.5-35b-a3b", "1", "0.6"), ("qwen3.5-397b-a17b", "8", "0.9")])
@pytest.mark.parametrize("mode", ["store_all", "reconstruct"])
def test_dry_run_prints_the_exact_command(capsys, preset, tp, gmu, mode):
    argv, env, out = _dry(capsys, "--preset", preset, "--mode", mode)
    assert argv[:3] == ["vllm", "serve", PRESETS[preset].model]
    assert json.loads(_flag(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert _flag(argv, "--tensor-parallel-size") == tp and _flag(argv, "--gpu-memory-utilization") == gmu
    assert _flag(argv, "--max-num-seqs") == "256" and _flag(argv, "--host") == "127.0.0.1"
    assert "--no-enable-prefix-caching" in argv
    assert env["TREEWY_MODE"] == mode
    if mode == "reconstruct":
        assert env["VLLM_PLUGINS"] == "treewy"
        assert "# env VLLM_PLUGINS=treewy" in out
    else:
        assert "VLLM_PLUGINS" not in env
    assert "--compilation-config" not in argv   # both modes run under vLLM's default CUDA graphs


def test_dry_run_overrides_and_model_path(capsys, tmp_path):
    argv, env, _ = _dry(capsys, "--model", str(tmp_path), "-k", "5", "--gmu", "0.75", "--tp", "2", "--port", "8123",
                        "--prefix-caching", "--max-num-seqs", "64", "--", "--max-model-len", "32768")
    assert argv[2] == str(tmp_path)
    assert json.loads(_flag(argv, "--speculative-config"))["num_speculative_tokens"] == 5
    assert (_flag(argv, "--gpu-memory-utilization"), _flag(argv, "--tensor-parallel-size"), _flag(argv, "--port"),
            _flag(argv, "--max-num-seqs"), _flag(argv, "--max-model-len")) == ("0.75", "2", "8123", "64", "32768")
    assert "--enable-prefix-caching" in argv


def test_reconstruct_refuses_prefix_caching():
    with pytest.raises(ServeError, match="does not support prefix caching"):
        build_command(ServeOptions(model="m", mode="reconstruct", prefix_caching=True))
    with pytest.raises(ServeError, match="127.0.0.1 only"):
        build_command(ServeOptions(model="m", host="0.0.0.0"))


def test_unknown_preset_lists_the_known_ones(capsys):
    assert main(["serve", "--preset", "qwen9", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'qwen9'" in err and "qwen3.5-35b-a3b" in err and "qwen3.5-397b-a17b" in err
    with pytest.raises(ValueError, match="known presets"):
        ServePreset.from_name("nope")


def test_vllm_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["serve", "--model", "m", "--no-gpu-check"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "0.26.x" in err and "0.33.x" in err   # spelled out, as when unsupported


@pytest.mark.parametrize("version", ["0.33.0", "0.25.1", "0.27.0"])
def test_unsupported_vllm_is_refused_with_the_supported_versions(capsys, tmp_path, monkeypatch, version):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))
    monkeypatch.setenv("FAKE_VLLM_VERSION", version)
    if version == "0.33.0":   # source-checked line: accepted
        assert check_vllm_installed().endswith("vllm")
        return
    assert main(["serve", "--model", "m", "--no-gpu-check"]) == 2
    err = capsys.readouterr().err
    assert f"vLLM {version} is not supported" in err and "0.26.x" in err and "0.33.x" in err


def test_no_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))  # a vllm, but no nvidia-smi
    assert main(["serve", "--model", "m"]) == 2
    assert "no GPU" in capsys.readouterr().err


@pytest.mark.parametrize("indexed", [True, False], ids=["index", "single-file"])
def test_checkpoint_without_mtp_weights(capsys, tmp_path, monkeypatch, indexed):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))
    bad = support.checkpoint(tmp_path, mtp_weights=False, indexed=indexed)
    assert main(["serve", "--model", str(bad), "--no-gpu-check"]) == 2
    assert "has no MTP weights" in capsys.readouterr().err
    check_mtp_weights(str(support.checkpoint(tmp_path, indexed=indexed)))  # the same folder with mtp.* passes
    with pytest.raises(ServeError, match="declares no MTP layers"):
        check_mtp_weights(str(support.checkpoint(tmp_path, mtp_layers=0)))


def test_port_in_use(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["serve", "--model", str(support.checkpoint(tmp_path)), "--no-gpu-check", "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_server_that_fails_to_start(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))
    monkeypatch.setenv("FAKE_VLLM_FAIL_START", "1")
    assert main(["serve", "--model", "m", "--no-gpu-check", "--port", str(support.free_port())]) == 2
    err = capsys.readouterr().err
    assert "exited with code 1 before becoming healthy" in err and "CUDA out of memory" in err


def test_serve_waits_for_health_streams_logs_and_stops_on_ctrl_c(tmp_path):
    port = support.free_port()
    env = {**os.environ, "PATH": str(support.fake_vllm_bin(tmp_path)) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.Popen([sys.executable, "-m", "treewy.cli", "serve", "--model", str(support.checkpoint(tmp_path)),
                             "--mode", "reconstruct", "--no-gpu-check", "--port", str(port), "--health-timeout", "30"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "server ready" in line or not line:
                break
        assert any("server ready at http://127.0.0.1" in ln for ln in lines), "".join(lines)
        assert any(ln.startswith("[vllm] INFO TREEWY_MODE=reconstruct VLLM_PLUGINS=treewy") for ln in lines)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for _ in range(50):  # the fake server (a grandchild) is gone: nothing accepts on its port
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.1)
        except ConnectionRefusedError:
            break
    else:
        pytest.fail(f"port {port} still served after treewy serve stopped")


def test_importing_treewy_serve_does_not_import_vllm():
    code = ("import sys, treewy.serve, treewy.serve.plugin, treewy.serve.cli_serve, treewy.serve.cli_bench, "
            "treewy.serve.reconstruct, treewy.serve.vllm_names; "
            "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serving_reads_the_tokenizer_without_the_models_package():
    """export.py's byte vocabulary comes from treewy.tokenizer, not from inside treewy.models (which re-exports it)."""
    code = ("import sys, treewy.serve.export; "
            "assert 'treewy.models' not in sys.modules, 'export imported treewy.models'; "
            "import treewy.tokenizer as t, treewy.models.tokenizer as m; "
            "assert all(getattr(m, n) is getattr(t, n) for n in ('BOS', 'EOS', 'PAD', 'SPECIALS', 'VOCAB_SIZE', "
            "'encode', 'decode'))")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------------------
# --tree: a fixed draft tree served through the plugin
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["store_all", "reconstruct"])
@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
def test_tree_sets_n_drafts_the_plugin_and_graphs_for_n_plus_one(capsys, mode, drafter):
    argv, env, out = _dry(capsys, "--model", "m", "--mode", mode, "--tree", "2,2,1", "--drafter", drafter)
    spec = json.loads(_flag(argv, "--speculative-config"))
    assert spec["method"] == drafter and spec["num_speculative_tokens"] == 10   # N = 2 + 4 + 4
    assert ("prompt_lookup_max" in spec) == (drafter == "ngram")
    assert "rejection_sample_method" not in spec          # vLLM's synthetic rates are per chain position
    assert env["TREEWY_MODE"] == mode and env["TREEWY_TREE"] == "2,2,1" and env["VLLM_PLUGINS"] == "treewy"
    assert env["TREEWY_TREE_DRAFTER"] == drafter          # what the plugin must have installed for this tree
    assert "TREEWY_TREE_RATES" not in env                 # real weights: the drafts' own acceptance
    assert _flag(argv, "--max-cudagraph-capture-size") == "2816"   # max_num_seqs x (N + 1) = 256 x 11
    blocks = "N + 1 state blocks" if mode == "store_all" else "one state block"
    assert any(line.startswith("# tree: (2, 2, 1), N = 10") and blocks in line for line in out)


def test_a_served_tree_turns_async_scheduling_off_and_a_chain_keeps_it(capsys):
    """tree_vllm carries the accepted node in vLLM's num_accepted_tokens, which async spec decode would recount."""
    for mode in ("store_all", "reconstruct"):
        argv, _, _ = _dry(capsys, "--model", "m", "--mode", mode, "--tree", "2,2")
        assert argv.count("--no-async-scheduling") == 1
        argv, _, _ = _dry(capsys, "--model", "m", "--mode", mode)
        assert not any("async-scheduling" in a for a in argv)


def test_tree_on_dummy_weights_passes_per_depth_rates_to_the_plugin(capsys):
    _, env, out = _dry(capsys, "--model", "m", "--tree", "3,3,3", "--acceptance", "rates=0.9,0.7,0.5",
                       "--", "--load-format", "dummy")
    assert env["TREEWY_TREE_RATES"] == "0.9,0.7,0.5"
    assert any("3.10 tokens/step" in line and "by depth" in line for line in out)
    _, env, _ = _dry(capsys, "--model", "m", "--tree", "2,2", "--", "--load-format", "dummy")   # paper-35b by depth
    assert len(env["TREEWY_TREE_RATES"].split(",")) == 2


def test_chain_commands_are_unchanged_by_the_tree_option(capsys):
    argv, env, _ = _dry(capsys, "--model", "m", "--mode", "store_all")
    assert "TREEWY_TREE" not in env and "TREEWY_TREE_DRAFTER" not in env and "VLLM_PLUGINS" not in env
    assert json.loads(_flag(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize("argv,match", [
    (["--tree", "2,0,1"], r"--tree '2,0,1': width 2 \('0'\) is not a positive integer"),
    (["--tree", "2,x"], r"width 2 \('x'\) is not a positive integer"),
    (["--tree", ""], r"width 1 \(''\) is not a positive integer"),
    (["--tree", "2,-1"], r"width 2 \('-1'\) is not a positive integer"),
    (["--tree", "5,5,5"], r"more than 128 nodes"),
    (["--tree", "2,2,1", "-k", "3"], r"-k 3 and --tree 2,2,1 disagree: the tree drafts N = 10 .* pass -k 10"),
    (["--tree", "2,2,1", "--prefix-caching"], r"--tree 2,2,1 does not support prefix caching"),
    (["--tree", "2,2,1", "--drafter", "eagle"], r"invalid choice: 'eagle'"),
    (["--tree", "2,2,1", "--acceptance", "rates=0.9,0.5", "--", "--load-format", "dummy"],
     r"2 rate\(s\) .* per depth, P\(accepted depth >= d\) for d = 1..3: give 3"),
    (["--tree", "2,2", "--", "--speculative-config", "{}"], r"sets vLLM's --speculative-config itself"),
])
def test_bad_tree_options_are_one_line_errors(capsys, argv, match):
    import re
    try:
        code = main(["serve", "--model", "m", "--dry-run", *argv])
    except SystemExit as e:   # argparse's own refusals (choices) exit 2 too
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.search(match, err[-1]), err
    if "invalid choice" not in match:
        assert len(err) == 1 and err[0].startswith("treewy serve: error: ")


def test_build_command_checks_the_tree_against_k():
    with pytest.raises(ServeError, match="drafts N = 6 tokens per step, but num_speculative_tokens is 3"):
        build_command(ServeOptions(model="m", tree=(2, 2)))
    with pytest.raises(ServeError, match="expected one positive integer per level"):
        build_command(ServeOptions(model="m", tree=(2, 0), num_speculative_tokens=2))
    argv, env = build_command(ServeOptions(model="m", tree=(2, 2), num_speculative_tokens=6))
    assert env["TREEWY_TREE"] == "2,2"


def test_ngram_tree_needs_no_mtp_weights(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)))
    bad = support.checkpoint(tmp_path, mtp_weights=False)
    port = support.free_port()
    with socket.socket() as s:   # the preflight gets past the MTP check and stops at the port
        s.bind(("127.0.0.1", port))
        s.listen(1)
        assert main(["serve", "--model", str(bad), "--no-gpu-check", "--port", str(port), "--tree", "2,2",
                     "--drafter", "ngram"]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_bench_serve_records_the_tree_in_every_row(tmp_path, monkeypatch):
    import polars as pl
    monkeypatch.setenv("PATH", str(support.fake_vllm_bin(tmp_path)) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "tree.parquet"
    assert main(["bench-serve", "--model", str(support.checkpoint(tmp_path)), "--no-gpu-check",
                 "--port", str(support.free_port()), "--workloads", "smoke", "--num-prompts", "4", "--out", str(out),
                 "--device", "fake-h200", "--metrics-interval", "0.05", "--health-timeout", "30", "--no-progress",
                 "--concurrency", "2", "--modes", "store_all,reconstruct", "--tree", "2,2,1",
                 "--acceptance", "rates=0.9,0.6,0.3"]) == 0
    df = pl.read_parquet(out)
    assert df.height == 2 and df["error"].is_null().all()
    assert (df["tree"] == "(2, 2, 1)").all() and (df["num_drafts"] == 10).all()
    assert df["acceptance_rates"].to_list() == [[0.9, 0.6, 0.3]] * 2
    # the fake accepts at most D = 3 drafts per step: vLLM's positions 3..9 stay 0, the per-depth rates are measured
    assert all(len(r) == 3 for r in df["measured_acceptance_rates"].to_list())
    assert (df["acceptance_length"] <= 4.0).all()
