"""Sampled tree speculation keeps the target distribution: the batched walk equals its one-request twin;
on a toy chain whose distributions are known exactly, the emitted tokens pass a chi-square test
(p > 0.01) under every rule, and a deliberately wrong rule fails it; on the tiny checkpoint the second
generated token (the first decided through the tree) follows the model's own conditional distribution."""

import math

import pytest
import torch

import treewy.accept as accept
from treewy.accept import RULES, sampled, sampled_ref
from treewy.experiments import chi_square, second_token_check, toy_check
from treewy.sampling import Sampling, draw_children, sampling_of, warp
from treewy.testing import random_tree
from treewy.tree import DraftTree



def random_case(rule, T, B=5, V=7, seed=0):
    """A random tree, target and drafter (some zero probabilities), and drafts as the rule expects them."""
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(T, g)
    logits = torch.randn(2, B, T, V, generator=g, dtype=torch.float64) * 2
    logits[torch.rand(2, B, T, V, generator=g) < 0.2] = -math.inf
    logits[..., 0] = 0.0  # at least one token left per row
    p, q = logits.softmax(-1)
    tokens = torch.full((B, T), -1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, V, (B,), generator=g)
    for t in range(T):
        kids = tree.children(t)
        if kids:
            if rule == "match":
                x = torch.randint(0, V, (B, len(kids)), generator=g)
            else:
                x = draw_children(q[:, t], len(kids), rule == "rrs", g)
            tokens[:, kids] = x
    tokens[torch.rand(B, T, generator=g) < 0.05] = -1  # some nodes without a token
    tokens[:, 0] = 0
    coins = torch.rand(B, T, generator=g, dtype=torch.float64)
    draws = 1 - torch.rand(B, T, generator=g, dtype=torch.float64)
    return tree, tokens, p, q, coins, draws


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("T", [1, 2, 13, 40], ids=lambda t: f"T{t}")
def test_batched_walk_is_the_one_request_walk(rule, T):
    for seed in range(3):
        tree, tokens, p, q, coins, draws = random_case(rule, T, seed=seed)
        acc = sampled(tree, tokens, p, q, rule, coins, draws)
        for b in range(tokens.shape[0]):
            path, bonus = sampled_ref(tree.parents.tolist(), tokens[b].tolist(), p[b], q[b], rule,
                                      coins[b].tolist(), draws[b].tolist())
            assert acc.path[b, :acc.length[b]].tolist() == path
            assert int(acc.accepted[b]) == path[-1] and int(acc.length[b]) == len(path)
            assert int(acc.bonus[b]) == bonus
            assert p[b, path[-1], bonus] > 0


@pytest.mark.parametrize("rule", RULES)
def test_toy_tokens_follow_the_target(rule):
    test, per_step = toy_check(rule)
    assert test.p_value > 0.01, test
    assert per_step > 1.5  # drafts were accepted: the tree was exercised, not just the bonus


@pytest.mark.parametrize("rule", ["rrs", "rrs_wor"])
def test_resampling_from_the_target_after_a_rejection_fails(rule, monkeypatch):
    monkeypatch.setattr(accept, "residual", lambda r, q: r)
    test, _ = toy_check(rule)
    assert test.p_value < 0.01, test


def test_a_fresh_bonus_after_a_miss_fails():
    """``match`` with the bonus drawn afresh from the target (not the sample that missed) is biased too."""
    def wrong(tree, tokens, p, q, rule, generator=None):
        acc = sampled(tree, tokens, p, q, rule, generator=generator)
        B = tokens.shape[0]
        fresh = accept.sample_categorical(p[torch.arange(B), acc.accepted], 1 - torch.rand(B, generator=generator,
                                                                                             dtype=p.dtype))
        return accept.Acceptance(acc.accepted, acc.path, acc.length, fresh)

    assert toy_check("match", accept=wrong)[0].p_value < 0.01


def test_chi_square_against_closed_forms():
    # two degrees of freedom: p = exp(-statistic / 2)
    t = chi_square(torch.tensor([30, 50, 20]), torch.tensor([0.25, 0.5, 0.25]))
    assert t.dof == 2 and t.statistic == pytest.approx(25 / 25 + 0 + 25 / 25)
    assert t.p_value == pytest.approx(math.exp(-t.statistic / 2), rel=1e-12)
    # rare cells are pooled: expected 1 + 1 + 3 < 5, so three cells become one
    t = chi_square(torch.tensor([50, 45, 1, 1, 3]), torch.tensor([0.5, 0.45, 0.01, 0.01, 0.03], dtype=torch.float64))
    assert t.cells == 3 and t.dof == 2
    assert chi_square(torch.tensor([5, 1]), torch.tensor([1.0, 0.0])).p_value == 0.0


def test_warp_cuts_to_top_k_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    assert torch.allclose(warp(logits, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    assert torch.allclose(warp(logits, 1.0, top_k=2), torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    assert torch.allclose(warp(logits, 1.0, top_p=0.79), torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    assert torch.allclose(warp(logits, 1.0, top_p=0.81), torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.float64) / 0.95)
    hot = warp(logits, 0.5)
    assert torch.allclose(hot, logits.mul(2).softmax(-1))


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 5e-324])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_warp_at_tiny_temperatures_is_the_argmax(temperature, dtype):
    """logits / temperature would overflow to inf (a NaN softmax): the limit is one-hot at the argmax."""
    logits = torch.tensor([[3.0, 40.0, -2.0, 39.5], [-1e4, -3.0, -7.0, float("-inf")]], dtype=dtype)
    for top_k, top_p in ((None, None), (2, None), (None, 0.5)):
        probs = warp(logits, temperature, top_k, top_p)
        assert torch.equal(probs, torch.eye(4, dtype=probs.dtype)[[1, 1]])
    assert torch.equal(warp(torch.tensor([[2.0, 2.0, 1.0]]), 1e-38), torch.tensor([[0.5, 0.5, 0.0]]))  # a tie


def test_draws_without_replacement_are_distinct_and_in_order():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.6, 0.3, 0.1, 0.0]]).expand(20000, -1)
    x = draw_children(probs, 4, False, g)
    assert (x[:, 3] == -1).all() and bool((x[:, :3].sort(-1).values == torch.arange(3)).all())
    first = torch.bincount(x[:, 0], minlength=3) / 20000
    assert torch.allclose(first, torch.tensor([0.6, 0.3, 0.1]), atol=0.015)
    second_after_0 = torch.bincount(x[x[:, 0] == 0, 1], minlength=3).float()
    assert second_after_0[1] / second_after_0.sum() == pytest.approx(0.75, abs=0.02)  # 0.3 / (0.3 + 0.1)


def test_iid_draws_follow_the_row_and_never_draw_a_zero():
    """i.i.d. children by inverse CDF: each column distributed as the row (unnormalized rows too, zeros never
    drawn, the last token drawable), the columns independent, and no host sync (no op reads a value back)."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.0, 0.6, 0.0, 0.3, 0.1], [0.0, 0.0, 2.0, 0.0, 2.0]]).repeat(10000, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = draw_children(probs, 3, True, g)
    assert not {e.name for e in prof.events()} & {"aten::item", "aten::nonzero", "aten::_local_scalar_dense"}
    assert x.shape == (20000, 3) and x.dtype == torch.int64
    for row, want in ((0, [0, 0.6, 0, 0.3, 0.1]), (1, [0, 0, 0.5, 0, 0.5])):
        for col in range(3):
            freq = torch.bincount(x[row::2, col], minlength=5) / 10000
            assert torch.allclose(freq, torch.tensor(want), atol=0.02), (row, col, freq)
    same = (x[0::2, 0] == x[0::2, 1]).float().mean()
    assert same == pytest.approx(0.6 ** 2 + 0.3 ** 2 + 0.1 ** 2, abs=0.02)     # independent columns
    empty = draw_children(torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 1.0], [0.0, 0.0, 1.0]]), 2, True, g)
    assert empty.tolist() == [[-1, -1], [-1, -1], [2, 2]]                      # nothing to draw: -1, as without


def test_bad_sampling_input_is_a_clear_error():
    with pytest.raises(ValueError, match="temperature = -1"):
        Sampling(-1.0)
    with pytest.raises(ValueError, match="top_k = 0"):
        Sampling(1.0, top_k=0)
    with pytest.raises(ValueError, match="top_p = 1.5"):
        Sampling(1.0, top_p=1.5)
    with pytest.raises(ValueError, match="seed = '1'"):
        Sampling(1.0, seed="1")
    for seed in (2**70, 2**63, -1, True):
        with pytest.raises(ValueError, match=rf"seed = {seed!r}: expected None or an integer in 0..2\*\*63 - 1"):
            Sampling(1.0, seed=seed)
    assert Sampling(1.0, seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ValueError, match="rule = 'greedy'"):
        Sampling(1.0, rule="greedy")
    assert sampling_of(0.0, top_k=3) is None
    with pytest.raises(ValueError, match="seed = -1"):  # greedy does not use it, but it is checked
        sampling_of(0.0, seed=-1)
    from treewy.drafters import NgramDrafter
    d = NgramDrafter()
    d.begin(None, [[1, 2, 1]], None, [2])
    with pytest.raises(ValueError, match="sampling.vocab is None"):
        d.propose_sampled(DraftTree.from_widths((2,)), Sampling(1.0, rule="rrs"))
    tree, tokens, p, q, coins, draws = random_case("rrs", 13)
    with pytest.raises(ValueError, match="rule = 'rrs' needs q_draft"):
        sampled(tree, tokens, p, None, "rrs")
    with pytest.raises(ValueError, match="rule = 'argmax'"):
        sampled(tree, tokens, p, q, "argmax")
    with pytest.raises(ValueError, match="p_target must be a floating tensor"):
        sampled(tree, tokens, p[:, :3], q, "match")
    with pytest.raises(ValueError, match="coins must be a tensor"):
        sampled(tree, tokens, p, q, "rrs", coins[:, :2], draws)
    node = int((tokens[0, 1:] >= 0).nonzero()[0]) + 1
    bad = q.clone()
    bad[0, int(tree.parents[node]), int(tokens[0, node])] = 0
    with pytest.raises(ValueError, match=f"q_draft gives probability 0 to the token of node {node}"):
        sampled(tree, tokens, p, bad, "rrs")


# ---- the engine ------------------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

from treewy.decode import generate  # noqa: E402
from treewy.models import build, load, tiny_config  # noqa: E402
from treewy.models.tokenizer import encode  # noqa: E402
from treewy.models.train_tiny import SIZES  # noqa: E402

PROMPTS = [[256] + list(b"def foo(x):\n    return x"), [256] + list(b"import os\n"), [256, 10]]


@pytest.fixture(scope="module")
def toy_model():
    return build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=3)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("drafter, rule", [("mtp", "match"), ("mtp", "rrs"), ("ngram", "rrs_wor"), (None, "match")])
def test_a_seed_reproduces_a_run_and_a_cold_one_is_greedy(toy_model, drafter, rule):
    kw = dict(drafter=drafter, tree=(2, 2), max_new_tokens=10, rule=rule)
    greedy = generate(toy_model, PROMPTS, **kw).tokens
    a = generate(toy_model, PROMPTS, temperature=1.5, seed=7, **kw)
    assert a.tokens == generate(toy_model, PROMPTS, temperature=1.5, seed=7, **kw).tokens
    assert a.tokens != generate(toy_model, PROMPTS, temperature=1.5, seed=8, **kw).tokens
    assert a.tokens != greedy
    # softmax(logits / 1e-4) is one-hot at the argmax: every rule then accepts what greedy accepts, also
    # where logits / temperature overflows
    for t in (1e-4, 1e-38):
        assert generate(toy_model, PROMPTS, temperature=t, seed=1, **kw).tokens == greedy


def test_sampling_arguments_are_checked(toy_model):
    class FixedOnly:
        name = "fixed"

        def begin(self, *a, **k): ...

        def propose(self, tree): ...

        def advance(self, *a): ...

    with pytest.raises(ValueError, match="has no propose_sampled"):
        generate(toy_model, PROMPTS, drafter=FixedOnly(), temperature=1.0, rule="rrs")
    with pytest.raises(ValueError, match="temperature = -0.5"):
        generate(toy_model, PROMPTS, temperature=-0.5)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("drafter, rule", [("mtp", "match"), ("mtp", "rrs"), ("mtp", "rrs_wor"), ("ngram", "rrs")])
def test_second_token_follows_the_tiny_model(drafter, rule):
    """500 requests of one prompt, top_k = 4 at temperature 1 (see second_token_check)."""
    test, per_step = second_token_check(load("tiny"), encode("a = a"), drafter, rule)
    assert test.p_value > 0.01, test
    assert per_step > 1.05  # the tree decided some second tokens
