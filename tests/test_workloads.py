"""One workload catalogue: the simulator samples and the vLLM sweep requests the same lengths."""

import fnmatch
from pathlib import Path

import numpy as np
import pytest

from treewy.serve.sweep import WORKLOADS as SERVE
from treewy.sim.workloads import WORKLOADS as SIM
from treewy.sim.workloads import sample_lengths
from treewy.workloads import CATALOGUE, DATA_DIR, prompt_rows, qwen_token_lengths

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def arg(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("name", [n for n, w in CATALOGUE.items() if w.dataset == "random"])
def test_random_workloads_have_one_length_distribution(name):
    args = SERVE[name].bench_args(None)
    center_in, center_out = int(arg(args, "--random-input-len")), int(arg(args, "--random-output-len"))
    ratio = float(arg(args, "--random-range-ratio"))
    prompt, out = sample_lengths(name, 4000, np.random.default_rng(0))
    for lens, c in ((prompt, center_in), (out, center_out)):
        assert lens.min() >= int(c * (1 - ratio)) and lens.max() <= int(c * (1 + ratio)) + 1
        assert abs(lens.mean() / c - 1) < 0.05


def test_both_sides_know_the_same_workloads():
    assert set(SIM) <= set(SERVE) == set(CATALOGUE)
    assert SERVE["generation-heavy"].bench_args(None)[:6] == [
        "--dataset-name", "random", "--random-input-len", "1024", "--random-output-len", "8192"]
    spec_out = sample_lengths("spec-bench", 3, np.random.default_rng(0))[1]
    assert SERVE["spec-bench"].output_len == CATALOGUE["spec-bench"].output_len == spec_out[0] == 256


def test_unknown_workload_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"workload = 'chat': unknown workload; known workloads are \['sharegpt-chat'"):
        sample_lengths("chat", 4, np.random.default_rng(0))


def test_mt_bench_is_served_from_the_shipped_file():
    w = CATALOGUE["mt-bench"]
    args = SERVE["mt-bench"].bench_args(None)  # no --dataset-dir: the file ships with the package
    path = Path(arg(args, "--dataset-path"))
    assert path == DATA_DIR / "mt_bench" / "question.jsonl" and path.is_file()
    assert path.suffix == ".jsonl"  # vLLM 0.26's custom loader reads only *.jsonl
    assert arg(args, "--dataset-name") == "custom" and int(arg(args, "--custom-output-len")) == w.output_len == 256
    assert "--skip-chat-template" in args and "--ignore-eos" in args  # byte tokenizers have no chat template


def test_mt_bench_file_holds_the_80_questions_with_their_licence():
    rows = prompt_rows("mt-bench")
    assert len(rows) == 80 and [r["question_id"] for r in rows] == list(range(81, 161))
    cats = {}
    for r in rows:
        cats[r["category"]] = cats.get(r["category"], 0) + 1
        assert r["prompt"] == r["turns"][0] and len(r["turns"]) == 2  # custom reads prompt, spec_bench turns[0]
    assert cats == dict.fromkeys(
        ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"], 10)
    folder = DATA_DIR / "mt_bench"
    assert "Apache License" in (folder / "LICENSE").read_text().splitlines()[0]
    assert "Apache License 2.0" in (folder / "README.md").read_text()


def test_only_shipped_workloads_have_prompt_rows():
    with pytest.raises(ValueError, match=r"workload = 'spec-bench': no prompt file ships with it; .*\['mt-bench'\]"):
        prompt_rows("spec-bench")


def test_mt_bench_file_ships_in_the_wheel():
    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["treewy"]
    pkg = DATA_DIR.parent
    for f in (DATA_DIR / "mt_bench").iterdir():
        rel = f.relative_to(pkg).as_posix()
        assert any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(rel, g.removeprefix("**/")) for g in globs), rel


def test_simulated_mt_bench_draws_the_files_prompt_lengths():
    rows = prompt_rows("mt-bench")
    lens = qwen_token_lengths([r["prompt"] for r in rows])
    assert lens[0] == -(-len(rows[0]["prompt"].encode()) // 4) and min(lens) >= 4
    prompt, out = sample_lengths("mt-bench", 4000, np.random.default_rng(0))
    assert set(prompt.tolist()) == set(lens)  # every question drawn, nothing else
    assert abs(prompt.mean() / np.mean(lens) - 1) < 0.05 and (out == 256).all()


def test_simulated_mt_bench_sends_each_question_once_before_repeating():
    lens = sorted(qwen_token_lengths([r["prompt"] for r in prompt_rows("mt-bench")]))
    prompt, _ = sample_lengths("mt-bench", 100, np.random.default_rng(1))
    assert sorted(prompt[:80].tolist()) == lens and len(prompt) == 100
