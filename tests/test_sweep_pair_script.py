"""benchmarks/sweep_pair.sh, both modes' sweeps at once on two GPUs (or the modes MODES names), and
benchmarks/width_sweep.sh, several trees' sweeps in turn on one GPU, with python3 stubbed."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sweep_pair.sh"


def _run(tmp_path, *args, rc: int = 0, env=None, script=SCRIPT):
    """Run the script with a python3 stub: it records its GPU and arguments, parses them with vllm_serve_gpu's own
    parser (the sweep itself stubbed out), and exits with ``rc`` in TreeWY's mode."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f"""#!{sys.executable}
import os, sys
with open({str(calls)!r}, "a") as f:
    f.write("gpu=" + os.environ.get("CUDA_VISIBLE_DEVICES", "") + " " + " ".join(sys.argv[1:]) + "\\n")
assert sys.argv[1:3] == ["-m", "benchmarks.vllm_serve_gpu"], sys.argv
import benchmarks.vllm_serve_gpu as m
m.cmd_sweep = lambda args: print("a point") or 0
m.main(sys.argv[3:])
sys.exit({rc} if "reconstruct" in sys.argv else 0)
""")
    stub.chmod(0o755)
    r = subprocess.run(["bash", str(script), str(tmp_path / "out"), *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
                            **(env or {})})
    return r, sorted(line.split() for line in calls.read_text().splitlines())


def test_each_mode_gets_its_own_gpu_and_port_and_comes_back_as_one_file(tmp_path):
    r, calls = _run(tmp_path, "0.75", "420", "--workloads", "generation-short")
    assert r.returncode == 0, r.stderr
    assert [c[0] for c in calls] == ["gpu=0", "gpu=1"]
    by_mode = {c[c.index("--mode") + 1]: c for c in calls}
    assert by_mode["store_all"][0] == "gpu=0" and by_mode["reconstruct"][0] == "gpu=1"
    ports = {m: c[c.index("--port") + 1] for m, c in by_mode.items()}
    assert ports["store_all"] != ports["reconstruct"]
    for mode, c in by_mode.items():
        assert c[c.index("--gmu") + 1] == "0.75" and c[c.index("--stop-after") + 1] == "420"
        assert "--pack" in c and c[-2:] == ["--workloads", "generation-short"] and "--resume-from" not in c
        with tarfile.open(tmp_path / "out" / f"{mode}.tar.gz") as tar:
            assert f"{mode}/sweep_{mode}_gmu0.75.log" in tar.getnames()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["reconstruct.tar.gz", "store_all.tar.gz"]


def test_resume_folders_go_to_their_own_mode_and_a_failure_sets_the_exit_status(tmp_path):
    r, calls = _run(tmp_path, "0.9", "300", rc=3, env={"RESUME_RECONSTRUCT": "build/resume_rc"})
    assert r.returncode == 3 and "sweep_pair rc=3" in r.stdout
    by_mode = {c[c.index("--mode") + 1]: c for c in calls}
    assert by_mode["reconstruct"][by_mode["reconstruct"].index("--resume-from") + 1] == "build/resume_rc"
    assert "--resume-from" not in by_mode["store_all"]


def test_modes_runs_one_mode_on_the_first_gpu(tmp_path):
    r, calls = _run(tmp_path, "0.75", "420", env={"MODES": "reconstruct"})
    assert r.returncode == 0, r.stderr
    assert len(calls) == 1 and calls[0][0] == "gpu=0" and calls[0][calls[0].index("--mode") + 1] == "reconstruct"
    assert calls[0][calls[0].index("--port") + 1] == "8021"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["reconstruct.tar.gz"]


def test_missing_arguments_are_refused_with_the_usage(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "0.75"], capture_output=True, text=True)
    assert r.returncode != 0 and "usage: sweep_pair.sh OUT GMU STOP_AFTER_S" in r.stderr
    assert not (tmp_path / "out").exists()


def test_in_turn_runs_both_modes_on_the_first_gpu_one_after_the_other(tmp_path):
    """IN_TURN=1: a one-GPU machine measures both modes in one call (on one GPU, each mode in its own call measured
    that call's host as much as the mode), each after the other on GPU 0 with its own --stop-after; the larger exit
    status comes back."""
    r, calls = _run(tmp_path, "0.75", "200", "--concurrency", "1,8", rc=3, env={"IN_TURN": "1"})
    assert r.returncode == 3 and "sweep_pair rc=3" in r.stdout
    assert [c[0] for c in calls] == ["gpu=0", "gpu=0"]
    assert sorted(c[c.index("--mode") + 1] for c in calls) == ["reconstruct", "store_all"]
    assert all(c[c.index("--stop-after") + 1] == "200" and c[-2:] == ["--concurrency", "1,8"] for c in calls)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["reconstruct.tar.gz", "store_all.tar.gz"]


def test_width_sweep_serves_each_tree_in_turn_into_its_own_folder(tmp_path):
    """width_sweep.sh: the chain without --tree, each tree with it, every server on GPU 0 with the call's gmu and
    --stop-after, each tree's mode folder packed under OUT/<tree, dashed>/; the largest exit status comes back."""
    r, calls = _run(tmp_path, "0.9", "140", "--workloads", "generation-short", rc=3,
                    env={"TREES": "chain 2,2,1 3,3,3", "MODES": "reconstruct"},
                    script=ROOT / "benchmarks" / "width_sweep.sh")
    assert r.returncode == 3 and "width_sweep rc=3" in r.stdout, r.stderr
    assert [c[0] for c in calls] == ["gpu=0"] * 3
    trees = sorted(c[c.index("--tree") + 1] if "--tree" in c else "chain" for c in calls)
    assert trees == ["2,2,1", "3,3,3", "chain"]
    assert all(c[c.index("--gmu") + 1] == "0.9" and c[c.index("--stop-after") + 1] == "140" for c in calls)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["2-2-1", "3-3-3", "chain"]
    for tree in ("2-2-1", "3-3-3", "chain"):
        assert [p.name for p in (tmp_path / "out" / tree).iterdir()] == ["reconstruct.tar.gz"]
