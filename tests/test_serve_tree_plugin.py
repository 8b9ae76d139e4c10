"""The plugin's tree hooks (treewy.serve.tree_plugin) driven end to end by a CPU stand-in for vLLM 0.26's spec loop
(tests/serve_fakes/fake_tree_engine.py: paged KV, state pools, packed windows) on the tiny checkpoint: the tokens and
every step's accepted node equal ``treewy.decode.generate`` with the same tree and drafter, in both modes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
from fake_tree_engine import FakeTreeEngine  # noqa: E402

from treewy.serve import tree_plugin as hooks  # noqa: E402
from treewy.serve.tree_spec import SyntheticAcceptance  # noqa: E402

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n\nclass Foo", "x = [1, 2, 3]\nprint("]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tiny():
    from treewy.models import load
    from treewy.models.tokenizer import encode
    return load("tiny"), [encode(t) for t in PROMPTS]


@pytest.mark.parametrize("mode", ["reconstruct", "store_all"])
@pytest.mark.parametrize("widths,drafter", [((2, 2, 1), "mtp"), ((2, 2, 2), "mtp"), ((3, 3, 3), "mtp"),
                                            ((2, 2, 1), "ngram")],
                         ids=["221-mtp", "222-mtp", "333-mtp", "221-ngram"])
def test_engine_with_the_tree_hooks_emits_what_generate_emits(tiny, widths, drafter, mode):
    from treewy.decode import generate
    model, prompts = tiny
    ref = generate(model, prompts, drafter=drafter, tree=widths, commit=mode, max_new_tokens=NEW_TOKENS,
                   graphs=False)
    out, steps = FakeTreeEngine(model, widths, mode, drafter).generate(prompts, NEW_TOKENS)
    assert out == ref.tokens
    assert steps == [(s.step, s.request, s.accepted, s.length) for s in ref.steps]
    # drafts were accepted, some of them off the DFS-first chain (whose KV needs no move): the compaction ran
    chain = {0}
    for _ in range(len(widths)):
        chain.add(max(chain) + 1)
    assert any(s[3] > 1 for s in steps) and (drafter == "ngram" or any(s[2] not in chain for s in steps))


def test_tree_positions_are_by_depth_and_slots_stay_consecutive():
    lay = hooks.TreeLayout((2, 2))
    T = lay.num_nodes
    num_computed = torch.tensor([5, 12])
    positions = (num_computed[:, None] + torch.arange(T)[None]).reshape(-1)
    hooks.tree_positions(positions, torch.tensor([0, T]), lay)
    assert positions.reshape(2, T).tolist() == [[5 + d for d in lay.depth.tolist()], [12 + d for d in lay.depth.tolist()]]


def test_synthetic_acceptance_goes_through_the_tree_sampler():
    serving = hooks.TreeServing((2, 2, 1), "reconstruct", num_slots=4, rates=(0.9, 0.6, 0.3))
    B, T, V = 5, serving.layout.num_nodes, 11
    logits = torch.randn(B * T, V, generator=torch.Generator().manual_seed(1))
    drafts = torch.randint(0, V, (B * (T - 1),), generator=torch.Generator().manual_seed(2))
    got = hooks.tree_rejection_sample(serving, drafts, logits, generator=torch.Generator().manual_seed(3))
    draft = torch.cat([torch.zeros(B, 1, dtype=torch.long), drafts.reshape(B, T - 1)], 1)
    want = SyntheticAcceptance(serving.layout, (0.9, 0.6, 0.3))(draft, logits.reshape(B, T, V),
                                                               generator=torch.Generator().manual_seed(3))
    assert torch.equal(got.output_token_ids, want.output_token_ids) and torch.equal(got.accepted, want.accepted)
    assert got.output_token_ids.shape == (B, serving.layout.max_depth + 1)


def test_tree_from_env():
    assert hooks.tree_from_env({}) is None
    assert hooks.tree_from_env({"TREEWY_TREE": "2,2,1"}) == ((2, 2, 1), None)
    assert hooks.tree_from_env({"TREEWY_TREE": "3,3", "TREEWY_TREE_RATES": "0.9,0.5"}) == ((3, 3), (0.9, 0.5))


@pytest.mark.parametrize("call,match", [
    (lambda: hooks.tree_from_env({"TREEWY_TREE": "2,0"}), r"TREEWY_TREE '2,0': width 2"),
    (lambda: hooks.tree_from_env({"TREEWY_TREE": "2", "TREEWY_TREE_RATES": "a"}), r"TREEWY_TREE_RATES='a'"),
    (lambda: hooks.TreeServing((2, 2), "chain", 4), r"mode = 'chain'"),
    (lambda: hooks.TreeServing((2, 2), "reconstruct", 1), r"num_slots = 1"),
    (lambda: hooks.TreeServing((2, 2), "store_all", 4, rates=(0.5, 0.9)), r"cannot rise"),
    (lambda: hooks.ngram_tree_drafts([], hooks.TreeLayout((2,))), r"contexts must be a non-empty list"),
    (lambda: hooks.ngram_tree_drafts([[1, 2], []], hooks.TreeLayout((2,))), r"contexts must be"),
    (lambda: hooks.tree_rejection_sample(hooks.TreeServing((2,), "reconstruct", 4), torch.zeros(3, dtype=torch.long),
                                         torch.zeros(4, 5)), r"needs full windows: .* T = 3"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_plugin_refuses_a_tree_it_cannot_serve_yet(monkeypatch):
    from treewy.serve import plugin
    monkeypatch.setenv("TREEWY_TREE", "2,2,1")
    monkeypatch.setenv("TREEWY_MODE", "store_all")
    with pytest.raises(NotImplementedError, match="TREEWY_TREE=2,2,1: the tree hooks .* not yet installed into vLLM"):
        plugin.register()
    monkeypatch.delenv("TREEWY_TREE")
    plugin.register()   # store_all without a tree: inert, as before
