"""treewy.experiments.acceptance: the tidy acceptance frame and the ``treewy sweep`` command."""

import pytest
import torch

pytest.importorskip("transformers")
pl = pytest.importorskip("polars")

from treewy.cli import main as cli_main  # noqa: E402
from treewy.models import build, save, tiny_config  # noqa: E402
from treewy.models.spec import spec_of  # noqa: E402
from treewy.models.train_tiny import SIZES  # noqa: E402
from treewy.experiments.acceptance import mt_bench_prompts, sweep  # noqa: E402
from treewy.models.tokenizer import BOS  # noqa: E402
from treewy.workloads import prompt_rows  # noqa: E402

PROMPTS = [[256] + list(b"x = x + 1\nx = x + 1\nx = x"), [256] + list(b"import os\nimport sys\nimport")]


pytestmark = pytest.mark.usefixtures("one_thread")  # decoding on a shared 2-core CPU


@pytest.fixture(scope="module")
def model():
    return build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=7)


def test_sweep_frame_is_tidy_and_consistent(model):
    df = sweep(model, PROMPTS, shapes=[(1, 1, 1), (2, 2, 1)], chains=[2], max_new_tokens=8, progress=False)
    assert df.height == 1 + 2 * 3 * 2  # baseline + drafters x shapes x modes
    need = {"drafter", "shape", "N", "mode", "state_blocks", "acceptance", "acceptance_lo", "acceptance_hi",
            "accept_ge_d1", "gdn_state_bytes", "step_ms", "device", "date"}
    assert need <= set(df.columns)
    spec = spec_of(model)
    block = spec.HV * spec.V * spec.K * 4 * len(spec.gdn_layers)
    for r in df.iter_rows(named=True):
        assert r["gdn_state_bytes"] == r["state_blocks"] * block
        assert 1 <= r["acceptance"] <= r["depth"] + 1
        if r["drafter"] != "none":
            assert r["acceptance_lo"] <= r["acceptance"] <= r["acceptance_hi"]
    spec_rows = df.filter(pl.col("drafter") != "none")
    by = spec_rows.group_by("drafter", "shape").agg(pl.col("acceptance").n_unique().alias("n"),
                                                    pl.col("state_blocks").max().alias("sa"))
    assert by["n"].to_list() == [1] * by.height  # both modes accept the same nodes
    row = df.filter((pl.col("shape") == "(2, 2, 1)") & (pl.col("mode") == "store_all")).row(0, named=True)
    assert row["N"] == 10 and row["state_blocks"] == 11 and row["paper_acceptance"] == 3.38


def test_sweep_cli_writes_parquet(model, tmp_path):
    save(model, tmp_path / "ck", dtype=torch.float32)
    out = tmp_path / "new" / "s.parquet"  # a folder that does not exist yet is made before the sweep runs
    rc = cli_main(["sweep", "--model", str(tmp_path / "ck"), "--drafters", "ngram", "--shapes", "2,1",
                   "--chains", "", "--modes", "reconstruct", "--prompts", "2", "--prompt-len", "24",
                   "--max-new-tokens", "6", "--out", str(out)])
    assert rc == 0
    df = pl.read_parquet(out)
    assert df["shape"].to_list() == ["()", "(2, 1)"] and df["drafter"].to_list() == ["none", "ngram"]


def test_mt_bench_prompts_take_the_categories_in_turn():
    rows = prompt_rows("mt-bench")
    cat_of = {r["prompt"].encode()[-20:]: r["category"] for r in rows}
    prompts = mt_bench_prompts(16, 10_000)
    assert all(p[0] == BOS for p in prompts)
    cats = [cat_of[bytes(p[1:])[-20:]] for p in prompts]
    assert cats[:8] == cats[8:] and len(set(cats)) == 8 and len({bytes(p[1:]) for p in prompts}) == 16
    assert mt_bench_prompts(16, 10_000, seed=1) != prompts
    short = mt_bench_prompts(16, 40)
    assert all(len(s) <= 40 and bytes(s[1:]) == bytes(p[1:])[-39:] for s, p in zip(short, prompts))
    with pytest.raises(ValueError, match=r"--prompts 81: the mt-bench prompt set has 80 prompts"):
        mt_bench_prompts(81, 100)


def test_sweep_cli_runs_on_mt_bench_prompts(model, tmp_path):
    save(model, tmp_path / "ck", dtype=torch.float32)
    out = tmp_path / "s.parquet"
    rc = cli_main(["sweep", "--model", str(tmp_path / "ck"), "--prompt-set", "mt-bench", "--drafters", "ngram",
                   "--shapes", "2,1", "--chains", "", "--prompts", "2", "--prompt-len", "24",
                   "--max-new-tokens", "4", "--out", str(out)])
    assert rc == 0
    df = pl.read_parquet(out)
    assert df["prompt_set"].to_list() == ["mt-bench"] * 2 and df["requests"].to_list() == [2, 2]
    assert df["prompt_tokens"][0] == sum(map(len, mt_bench_prompts(2, 24))) and df["max_new_tokens"][0] == 4
