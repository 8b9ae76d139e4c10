"""treewy.decode_graph: the static-buffer step gives exactly the eager loop's tokens and acceptance (greedy: both
drafters, chains and trees, both commit modes, ragged prompts in a padded bucket; seeded sampling: every rule);
buckets; engines reused across calls; padding rows inert; bad input named. GPU: the captured step against the
eager loop, and no host sync inside a replay."""

import re
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from treewy import decode_graph  # noqa: E402
from treewy.decode import generate  # noqa: E402
from treewy.decode_graph import Engine, batch_bucket, choose, context_bucket, engines  # noqa: E402
from treewy.models import load  # noqa: E402
from treewy.models.tokenizer import encode  # noqa: E402
from treewy.paper import SHAPES  # noqa: E402

# three ragged prompts: the bucket of 4 holds one padding row
PROMPTS = [encode("def fibonacci(n):\n    "), encode("import os\nimport sys\n\ndef main("), encode("class A")]
NEW = 12

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return load("tiny")   # a trained checkpoint: drafts get accepted, so every path of the walk runs


def outcome(res):
    return res.tokens, [(s.step, s.request, s.accepted, s.length) for s in res.steps]


def both(model, prompts=PROMPTS, **kw):
    """(eager loop, static step) outcomes of one generate call."""
    return (outcome(generate(model, prompts, max_new_tokens=NEW, graphs=False, **kw)),
            outcome(generate(model, prompts, max_new_tokens=NEW, graphs="static", **kw)))


@pytest.mark.parametrize("drafter,tree,commit", [
    pytest.param(None, None, None, id="plain"),
    *[pytest.param(d, t, c, id=f"{d}-{t}-{c}") for d in ("mtp", "ngram") for t in ((1, 1, 1), (2, 2, 2))
      for c in ("reconstruct", "store_all")],
    pytest.param("mtp", (3, 3, 3), "reconstruct", id="mtp-(3, 3, 3)-reconstruct"),
])
def test_static_step_is_the_eager_loop_greedy(model, drafter, tree, commit):
    eager, static = both(model, drafter=drafter, tree=tree, commit=commit)
    assert static == eager
    if drafter == "mtp":
        assert max(n for *_, n in static[1]) > 1   # drafts were accepted: the commit paths ran


@pytest.mark.parametrize("rule", ["match", "rrs", "rrs_wor"])
@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
def test_static_step_is_the_eager_loop_seeded_sampling(model, drafter, rule):
    eager, static = both(model, PROMPTS[:2], drafter=drafter, tree=(2, 2, 1), temperature=0.8, seed=5, rule=rule)
    assert static == eager
    other = outcome(generate(model, PROMPTS[:2], drafter=drafter, tree=(2, 2, 1), max_new_tokens=NEW,
                             temperature=0.8, seed=6, rule=rule, graphs="static"))
    assert other[0] != static[0]   # the seed reaches the step's draws


def test_end_token_and_one_token_runs(model):
    eos = generate(model, PROMPTS, max_new_tokens=NEW, graphs=False).tokens[0][3]
    eager, static = both(model, drafter="mtp", tree=(2, 2, 2), eos_token_id=eos)
    assert static == eager and static[0][0][-1] == eos and len(static[0][0]) < NEW
    one = generate(model, PROMPTS, drafter="mtp", max_new_tokens=1, graphs="static")
    assert [len(t) for t in one.tokens] == [1, 1, 1] and one.steps == []


def test_buckets():
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 17, 33, 64)] == [1, 2, 4, 8, 32, 64, 64]
    assert batch_bucket(3, exact=True) == 3
    assert [context_bucket(n) for n in (1, 64, 65, 300)] == [64, 64, 128, 512]
    with pytest.raises(ValueError, match=r"prompts holds 65 requests.*at most 64 prompts.*graphs=False"):
        batch_bucket(65)


def test_choice_of_path():
    triton, torch_ops = SimpleNamespace(name="triton"), SimpleNamespace(name="torch")
    assert choose("auto", "cuda", triton, "step", 4) == "capture"
    for args in (("cpu", triton, "step", 4), ("cuda", torch_ops, "step", 4), ("cuda", triton, "phases", 4),
                 ("cuda", triton, "step", 65)):
        assert choose("auto", *args) is None
    assert choose("static", "cpu", torch_ops, "step", 4) == "static"
    assert choose(False, "cuda", triton, "step", 4) is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(graphs="yes"), r"graphs = 'yes': expected 'auto'"),
    (dict(graphs=1.0), r"graphs = 1.0"),
    (dict(graphs=True), r"graphs=True captures CUDA graphs, but the model is on the CPU; use graphs='static'"),
    (dict(graphs="static", timing="phases"), r"timing = 'phases'.*use timing='step' or graphs=False"),
    (dict(graphs="static", prompts=[[256, 10]] * 65), r"prompts holds 65 requests.*split the batch"),
])
def test_bad_input(model, kwargs, match):
    prompts = kwargs.pop("prompts", PROMPTS)
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, max_new_tokens=4, **kwargs)


def test_engine_reused_across_calls(model):
    decode_graph.drop_engines(model)
    generate(model, PROMPTS, drafter="mtp", tree=(2, 2, 2), max_new_tokens=NEW, graphs="static")
    (eng,) = engines(model).values()
    k = next(iter(eng.cache.kv.values())).k
    ptr = k.data_ptr()
    later = [encode("for i in range("), encode("x = ")]   # 2 prompts: a bucket of 2, a new engine
    again = [encode("for i in range("), encode("x = "), encode("while True:\n")]   # the bucket of 4 again
    generate(model, later, drafter="mtp", tree=(2, 2, 2), max_new_tokens=NEW, graphs="static")
    res = outcome(generate(model, again, drafter="mtp", tree=(2, 2, 2), max_new_tokens=NEW, graphs="static"))
    assert len(engines(model)) == 2 and eng in engines(model).values() and k.data_ptr() == ptr
    assert res == outcome(generate(model, again, drafter="mtp", tree=(2, 2, 2), max_new_tokens=NEW, graphs=False))


def test_padding_rows_are_inert(model, monkeypatch):
    """Noise in every buffer row past the batch (states, conv, KV, pending, MTP cache, tokens) changes nothing."""
    reset = Engine.reset

    def noisy(self, prompts, *args):
        out = reset(self, prompts, *args)
        B = len(prompts)
        gen = torch.Generator().manual_seed(0)
        bufs = [*self.cache.ssm.values(), *self.cache.conv.values(), self.mtp.root_out, self.mtp.cache.k,
                *(kv.k for kv in self.cache.kv.values()), *(kv.v for kv in self.cache.kv.values())]
        for t in bufs:
            t[B:] = 100 * torch.randn(t[B:].shape, generator=gen, dtype=t.dtype)
        self.roots[B:] = 7
        self.pacc[B:] = 1
        return out

    decode_graph.drop_engines(model)
    monkeypatch.setattr(Engine, "reset", noisy)
    eager, static = both(model, drafter="mtp", tree=(2, 2, 2))
    assert batch_bucket(len(PROMPTS)) > len(PROMPTS) and static == eager


def test_benchmark_smoke(bench_script, tmp_path):
    """benchmarks/engine_step_gpu.py --smoke on the CPU: the table and its JSON, every row measured."""
    import json
    pytest.importorskip("polars")                                 # the sweep's table (a GPU host may lack it)
    mod = bench_script("engine_step_gpu")
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "engine_step.json").read_text())
    assert data["device"] and data["date"] and data["rows"]
    for row in data["rows"]:
        assert row["step_ms"] > 0 and row["steps"] > 0
    assert {r["path"] for r in data["rows"]} == {"eager", "static"}
    assert data["sweep"]["runs"] and all(r["seconds"] > 0 for r in data["sweep"]["runs"])
    assert "step_ms" in (tmp_path / "engine_step.txt").read_text()


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu_model():
    return load("tiny", device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("commit", ["reconstruct", "store_all"])
@pytest.mark.parametrize("tree", [(1, 1, 1)] + [tuple(s) for s in SHAPES])
def test_captured_is_eager_greedy(gpu_model, tree, commit):
    kw = dict(drafter="mtp", tree=tree, commit=commit, max_new_tokens=24)
    eager = outcome(generate(gpu_model, PROMPTS, graphs=False, **kw))
    assert outcome(generate(gpu_model, PROMPTS, graphs=True, **kw)) == eager
    assert outcome(generate(gpu_model, PROMPTS, graphs=True, **kw)) == eager   # replayed from the first step


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_captured_is_eager_plain_and_host_drafter(gpu_model, drafter):
    kw = dict(drafter=drafter, tree=(2, 2, 2), max_new_tokens=24)
    assert outcome(generate(gpu_model, PROMPTS, graphs=True, **kw)) == \
        outcome(generate(gpu_model, PROMPTS, graphs=False, **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["match", "rrs", "rrs_wor"])
def test_captured_is_eager_seeded_sampling(gpu_model, rule):
    kw = dict(drafter="mtp", tree=(3, 3, 3), max_new_tokens=24, temperature=0.8, seed=11, rule=rule)
    eager = outcome(generate(gpu_model, PROMPTS, graphs=False, **kw))
    assert outcome(generate(gpu_model, PROMPTS, graphs=True, **kw)) == eager
    assert outcome(generate(gpu_model, PROMPTS, graphs=True, **kw)) == eager


@pytest.mark.gpu
@pytest.mark.parametrize("commit", ["reconstruct", "store_all"])
def test_no_host_sync_inside_the_step(gpu_model, commit):
    decode_graph.drop_engines(gpu_model)
    generate(gpu_model, PROMPTS, drafter="mtp", tree=(3, 3, 3), commit=commit, max_new_tokens=16, graphs=True)
    (eng,) = engines(gpu_model).values()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eng.graph.replay()
        eng.step()   # the step itself, eagerly: any .item(), mask index or data-dependent shape raises here
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_warmup_decodes_every_variant(model):
    from treewy.decode_warmup import variants, warmup
    assert len(variants()) == 2 + 2 * 2 * 2 * 13   # plain at 2 batches; 2 drafters x 13 trees x 2 modes x 2 batches
    rows = warmup(model, batches=(2,), drafters=("ngram",), shapes=[(2, 1)], chains=[], modes=("reconstruct",),
                  new_tokens=2, progress=False)
    assert [(r["drafter"], r["tree"], r["B"]) for r in rows] == [("none", "None", 2), ("ngram", "(2, 1)", 2)]
    assert all(r["seconds"] > 0 for r in rows)
    with pytest.raises(ValueError, match=r"new_tokens = 1: expected an integer >= 2"):
        warmup(model, new_tokens=1)


@pytest.mark.parametrize("argv,match", [
    (["--batch", "0"], r"--batch '0': expected positive integers"),
    (["--drafters", "eagle"], r"--drafters 'eagle': expected mtp, ngram"),
    (["--device", "tpu"], r"--device 'tpu': expected cuda or cpu"),
])
def test_warmup_command_bad_input(argv, match, capsys):
    from treewy.cli import main
    assert main(["warmup", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("treewy warmup: error: ") and "\n" not in err
    assert re.search(match, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_benchmark_without_a_gpu_names_the_cpu_choices(bench_script, tmp_path, capsys):
    mod = bench_script("engine_step_gpu")
    assert mod.main(["--out", str(tmp_path)]) == 2
    assert "--device cpu" in capsys.readouterr().err
