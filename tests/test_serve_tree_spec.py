"""Tree speculation pieces for serving (treewy/serve/tree_spec.py, tree_commit.py) against the engine's own.

Claims:
- the layout's tables are the DraftTree's (parents, depths, ancestor mask, paths, children per level) for (2,2,1),
  (2,2,2), (3,3,3) and chains;
- propose_mtp_tree gives MTPDrafter.propose's tokens from the same MTP logits (a toy checkpoint), and
  propose_ngram_tree NgramDrafter.propose's on random contexts;
- accept_tree equals treewy.accept.greedy bit for bit, and treewy.accept.sampled (rules match, rrs, rrs_wor) given
  the same uniforms, row by row at per-request temperatures; from a seeded generator it draws Sampling.uniforms'
  numbers (generate's);
- synthetic acceptance: a chain takes vLLM's decisions; over many steps the mean length, each depth's rate and each
  child's share lie within 4 standard errors of the formulas (and a 0.05 shift of the rates would not);
- KV compaction, the conv state and the pending fold equal the engine's commit (KVCache.append,
  naive_tree_conv1d_commit, the recurrence along the accepted path);
- every piece runs on meta tensors (a host sync or a data-dependent shape raises there), and, on a GPU, inside a
  captured CUDA graph with the eager results;
- bad input names the argument.
"""

from __future__ import annotations

import math

import pytest
import torch

from treewy.accept import greedy, sampled
from treewy.drafters import NgramDrafter
from treewy.models.cache import KVCache
from treewy.ops.conv.naive import naive_tree_conv1d_commit
from treewy.ops.verify import PendingCommit, naive_flush, naive_tree_verify
from treewy.sampling.params import Sampling, warp
from treewy.serve.tree_commit import (
    commit_conv_state, compact_kv, kv_compaction, pending_commit, plan_commit, record_accepted, reset_accepted,
    window_positions, window_slots,
)
from treewy.serve.tree_spec import (
    SyntheticAcceptance, TreeLayout, accept_tree, propose_mtp_tree,
    propose_ngram_tree, synthetic_accept_tree,
)
from treewy.tree import DraftTree

SHAPES = [(2, 2, 1), (2, 2, 2), (3, 3, 3), (1, 1, 1), (1,), (3, 1)]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _inputs(layout, B, V, seed, hit=0.7):
    """Random target logits and drafts that often equal the target's argmax at the parent (so walks go deep)."""
    g = _gen(seed)
    logits = torch.randn(B, layout.num_nodes, V, generator=g)
    drafts = torch.randint(0, V, (B, layout.num_nodes), generator=g)
    want = logits.argmax(-1).gather(1, layout.parents.clamp(min=0)[None].expand(B, -1))
    drafts = torch.where(torch.rand(B, layout.num_nodes, generator=g) < hit, want, drafts)
    drafts[:, 0] = torch.randint(0, V, (B,), generator=g)
    return logits, drafts


# ------------------------------------------------------------------------------------------------------- layout

@pytest.mark.parametrize("widths", SHAPES)
def test_layout_tables_are_the_trees(widths):
    lay = TreeLayout(widths)
    tree = DraftTree.from_widths(widths)
    assert lay.num_nodes == tree.num_nodes and lay.max_depth == tree.max_depth == len(widths)
    assert torch.equal(lay.parents, tree.parents.long()) and torch.equal(lay.depth, tree.depth.long())
    assert torch.equal(lay.anc, tree.ancestor_mask())
    for t in range(tree.num_nodes):
        p = tree.path(t)
        assert lay.path[t, : len(p)].tolist() == p and (lay.path[t, len(p):] == -1).all()
    for d in range(tree.max_depth):
        nodes = lay.level_nodes[d]
        assert nodes.tolist() == [t for t in range(tree.num_nodes) if int(tree.depth[t]) == d]
        assert lay.children[d].shape == (nodes.numel(), widths[d])
        for i, t in enumerate(nodes.tolist()):
            assert lay.children[d][i].tolist() == tree.children(t) and int(lay.level_index[t]) == i
    assert (lay.rank[1:] < torch.tensor(widths)[lay.depth[1:] - 1]).all()


def test_layout_sizes_of_the_paper_shapes():
    assert [TreeLayout(w).num_drafts for w in ((2, 2, 1), (2, 2, 2), (3, 3, 3))] == [10, 14, 39]


# ---------------------------------------------------------------------------------------------------- proposers

@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("widths", [(2, 2, 1), (3, 2), (1, 1, 1)])
def test_mtp_proposer_equals_the_engines_drafter(widths):
    pytest.importorskip("transformers")
    from treewy.drafters import MTPDrafter
    from treewy.models import build, tiny_config
    from treewy.models.cache import HybridCache
    from treewy.models.hybrid import prefill
    from treewy.models.spec import spec_of
    from treewy.models.train_tiny import SIZES

    model = build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=5)
    spec = spec_of(model)
    prompts = [[256] + list(b"for i in range(10):"), [256] + list(b"def f(x):\n    return")]
    cache = HybridCache.empty(spec, 2, 64, torch.float32, "cpu")
    with torch.no_grad():
        hidden, logits = prefill(spec, cache, prompts, "cpu")
    roots = logits.argmax(-1)
    d = MTPDrafter(model)
    d.begin(model, prompts, hidden, roots.tolist())
    seen = []
    hook = spec.lm_head.register_forward_hook(lambda m, i, o: seen.append(o if o.ndim == 3 else o[:, None]))
    try:
        want = d.propose(DraftTree.from_widths(widths))
    finally:
        hook.remove()
    lay = TreeLayout(widths)
    assert len(seen) == lay.max_depth           # one MTP pass per depth, leaves excepted
    got = propose_mtp_tree(seen, lay, roots)
    assert torch.equal(got, want)


@pytest.mark.parametrize("widths", [(2, 2, 1), (3, 3, 3), (1, 1, 1), (2, 1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ngram_proposer_equals_the_engines_drafter(widths, seed):
    g = _gen(seed)
    lens = [1, 3, 17, 40, 64]
    L = 64
    ctx = torch.randint(0, 4, (len(lens), L), generator=g)   # a small alphabet: many repeats, ties in the counts
    ctx[:, 30:34] = ctx[:, 10:14]
    lay = TreeLayout(widths)
    tree = DraftTree.from_widths(widths)
    want = []
    for b, n in enumerate(lens):
        dr = NgramDrafter(max_n=3)
        row = ctx[b, :n].tolist()
        dr.begin(None, [row[:-1]], None, [row[-1]])
        want.append(dr.propose(tree)[0])
    got = propose_ngram_tree(ctx, torch.tensor(lens), lay, max_n=3)
    assert torch.equal(got, torch.stack(want))
    assert (got[0, 1:] == -1).all()              # a one-token context has nothing to look up


# --------------------------------------------------------------------------------------------------- acceptance

@pytest.mark.parametrize("widths", SHAPES)
def test_greedy_acceptance_is_treewy_accept(widths):
    lay = TreeLayout(widths)
    for seed in range(4):
        logits, drafts = _inputs(lay, 16, 5, seed)
        drafts[0, 1:] = -1                     # nothing drafted: the root alone is accepted
        want = greedy(lay.tree, drafts, logits.argmax(-1))
        got = accept_tree(logits, drafts, lay)
        for f in ("accepted", "path", "length", "bonus"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
        for b in range(drafts.shape[0]):
            n = int(got.length[b])
            assert got.output_token_ids[b, :n].tolist() == want.emitted(drafts, b)
            assert (got.output_token_ids[b, n:] == -1).all()
    assert int(want.length.max()) == lay.max_depth + 1  # the inputs reach the leaves


def _drawn_children(lay, q, g):
    """Drafts sampled from q at each node's parent (what rules rrs / rrs_wor are exact for)."""
    B, T, V = q.shape
    par = q[:, lay.parents.clamp(min=0)].reshape(-1, V)
    drafts = torch.multinomial(par, 1, generator=g).reshape(B, T)
    drafts[:, 0] = 0
    return drafts


@pytest.mark.parametrize("rule", ["match", "rrs", "rrs_wor"])
@pytest.mark.parametrize("widths", [(2, 2, 1), (3, 3, 3), (1, 1, 1)])
def test_sampled_acceptance_is_treewy_accept_given_the_uniforms(widths, rule):
    lay = TreeLayout(widths)
    B, V = 12, 6
    g = _gen(7)
    logits, drafts = _inputs(lay, B, V, 3)
    q = None
    if rule != "match":
        q = torch.softmax(torch.randn(B, lay.num_nodes, V, generator=g), -1)
        drafts = _drawn_children(lay, q, g)
    temp = torch.tensor([0.0, 0.5, 1.0, 2.0] * (B // 4))
    coins = torch.rand(B, lay.num_nodes, generator=g)
    draws = 1 - torch.rand(B, lay.num_nodes, generator=g)
    got = accept_tree(logits, drafts, lay, temp, coins=coins, draws=draws, q_draft=q, rule=rule)
    deep = 0
    for b in range(B):
        one = slice(b, b + 1)
        if temp[b] == 0:
            want = greedy(lay.tree, drafts[one], logits[one].argmax(-1))
        else:
            want = sampled(lay.tree, drafts[one], warp(logits[one], float(temp[b])), None if q is None else q[one],
                           rule, coins[one], draws[one])
        assert torch.equal(got.path[b], want.path[0]) and int(got.bonus[b]) == int(want.bonus[0]), b
        deep += int(want.length[0]) > 1
    assert deep >= B // 3                        # the walks went past the root: the comparison saw decisions


def test_sampled_acceptance_draws_generates_uniforms():
    lay = TreeLayout((2, 2, 1))
    logits, drafts = _inputs(lay, 8, 5, 11)
    s = Sampling(0.8, seed=123)
    coins, draws = s.uniforms(drafts.shape, "cpu")
    want = accept_tree(logits, drafts, lay, 0.8, coins=coins, draws=draws)
    got = accept_tree(logits, drafts, lay, 0.8, generator=_gen(123))
    assert torch.equal(got.path, want.path) and torch.equal(got.bonus, want.bonus)


# -------------------------------------------------------------------------------------------- synthetic acceptance

def test_synthetic_chain_takes_vllms_decisions():
    """vLLM's synthetic kernel accepts draft i while uniform_i < c_i (c = conditional rates), stopping at the first
    rejection; on a chain every node has one child, so the child uniform does not matter."""
    lay = TreeLayout((1, 1, 1))
    rates = (0.9, 0.6, 0.3)
    cond = [0.9, 0.6 / 0.9, 0.3 / 0.6]
    u = torch.rand(500, 3, 2, dtype=torch.float64, generator=_gen(4))
    logits, drafts = _inputs(lay, 500, 5, 4)
    got = synthetic_accept_tree(lay, rates, drafts, logits, uniforms=u)
    want = []
    for b in range(500):
        n = 0
        while n < 3 and float(u[b, n, 0]) < cond[n]:
            n += 1
        want.append(n + 1)
    assert got.length.tolist() == want
    assert torch.equal(got.bonus, logits.argmax(-1).gather(1, got.accepted[:, None])[:, 0])


@pytest.mark.parametrize("widths,rates", [((2, 2, 1), (0.9255, 0.6804, 0.3902)), ((3, 3, 3), (0.8, 0.8, 0.2)),
                                          ((2, 2, 2), (1.0, 0.5, 0.0))])
def test_synthetic_statistics_match_the_formulas(widths, rates):
    """n = 40,000 independent steps (rows of one call, fixed seed). A 4-SE band is missed by chance with
    probability 6e-5 per quantity (two-sided normal); the test also checks the band is narrow enough that rates
    0.05 lower everywhere fall outside it."""
    lay = TreeLayout(widths)
    syn = SyntheticAcceptance(lay, rates)
    n, V = 40_000, 3
    drafts = torch.zeros(n, lay.num_nodes, dtype=torch.long)
    acc = syn(drafts, torch.zeros(n, lay.num_nodes, V), generator=_gen(2024))
    L = acc.length.double()
    se = math.sqrt(syn.variance / n)
    assert abs(float(L.mean()) - syn.expected_length) <= 4 * se + 1e-12
    assert abs(float(L.var()) - syn.variance) <= 0.05 * syn.variance + 1e-12
    lower = SyntheticAcceptance(lay, [max(0.0, a - 0.05) for a in rates]).expected_length
    assert abs(float(L.mean()) - lower) > 4 * se
    depth = acc.length - 1
    for d, a in enumerate(rates, start=1):
        p = float((depth >= d).double().mean())
        assert abs(p - a) <= 4 * math.sqrt(a * (1 - a) / n) + 1e-12, (d, p, a)
    # uniform over the root's children: each takes a_1 / w of the steps
    w, a1 = widths[0], rates[0]
    for c in lay.children[0][0].tolist():
        share = float((acc.path[:, 1] == c).double().mean())
        p = a1 / w
        assert abs(share - p) <= 4 * math.sqrt(p * (1 - p) / n), (c, share, p)


def test_synthetic_rejects_a_child_without_a_token():
    lay = TreeLayout((2, 1))
    drafts = torch.zeros(4, lay.num_nodes, dtype=torch.long)
    drafts[:, 1] = -1                                        # the root's first child has no token
    u = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.9], [0.0, 0.0]]] * 2, dtype=torch.float64)
    acc = synthetic_accept_tree(lay, (1.0, 1.0), drafts, torch.zeros(4, lay.num_nodes, 2), uniforms=u)
    assert acc.length.tolist() == [1, 3, 1, 3] and acc.accepted.tolist() == [0, 4, 0, 4]


def test_both_sources_of_rates_are_valid_for_the_synthetic_sampler():
    pytest.importorskip("polars", reason="tiny's rates are read from a parquet table")   # absent on a bare GPU host
    from treewy.serve.acceptance import parse_acceptance

    for text in ("paper-35b", "tiny"):
        rates = parse_acceptance(text, 3, dummy=True, tree=(2, 2, 1)).rates
        SyntheticAcceptance(TreeLayout((2, 2, 1)), rates)


# -------------------------------------------------------------------------------------------------- bookkeeping

def _paged(B, blocks, block_size, seed):
    """A block table of distinct physical blocks in random order (block 0 left out: vLLM's NULL block)."""
    perm = torch.randperm(B * blocks, generator=_gen(seed)) + 1
    return perm.reshape(B, blocks)


@pytest.mark.parametrize("widths", [(2, 2, 1), (3, 3, 3), (1, 1, 1)])
def test_kv_compaction_is_the_engines_kv_append(widths):
    lay = TreeLayout(widths)
    B, bs, blocks, H, Dh = 6, 4, 16, 2, 3
    logits, drafts = _inputs(lay, B, 4, 5)
    acc = accept_tree(logits, drafts, lay)
    prefix = torch.tensor([0, 3, 5, 8, 13, 2])
    table = _paged(B, blocks, bs, 1)
    kv = torch.randn((B * blocks + 1) * bs, H, Dh, generator=_gen(9))
    win = torch.randn(B, lay.num_nodes, H, Dh, generator=_gen(10))
    slots = window_slots(lay, prefix, table, bs)
    kv[slots.flatten()] = win.reshape(-1, H, Dh)                # the verify pass wrote the window
    ref = KVCache(B, H, 64, Dh, torch.float32, "cpu")
    ref.lens = prefix.clone()
    ref.append(win.transpose(1, 2), win.transpose(1, 2), acc.path, acc.length)
    before = kv.clone()
    src, dst = kv_compaction(lay, acc, prefix, table, bs)
    compact_kv(kv, src, dst)
    for b in range(B):
        n = int(acc.length[b])
        logical = torch.arange(int(prefix[b]), int(prefix[b]) + n)
        phys = table[b, logical // bs] * bs + logical % bs
        assert torch.equal(kv[phys], ref.k[b, :, logical].transpose(0, 1))
    touched = torch.zeros(kv.shape[0], dtype=torch.bool)
    touched[dst[src != dst]] = True
    assert torch.equal(kv[~touched], before[~touched])          # nothing else moved
    if max(widths) == 1:
        assert torch.equal(src, dst)                            # a chain's accepted KV is already in place
    else:
        assert (src != dst).any()                               # some rows left the DFS-first chain: real copies
    assert torch.equal(window_positions(lay, prefix), prefix[:, None] + lay.depth)


def test_plan_commit_moves_nothing_for_padding_rows():
    lay = TreeLayout((2, 2, 1))
    logits, drafts = _inputs(lay, 4, 4, 6, hit=1.0)
    acc = accept_tree(logits, drafts, lay)
    live = torch.tensor([True, False, True, False])
    prefix = torch.tensor([4, 0, 9, 0])
    plan = plan_commit(lay, acc, prefix, _paged(4, 8, 4, 2), 4, live)
    assert torch.equal(plan.kv_src[~live], plan.kv_dst[~live])
    assert plan.num_accepted.tolist() == [int(acc.length[0]), 0, int(acc.length[2]), 0]
    assert torch.equal(plan.num_computed, prefix + plan.num_accepted) and torch.equal(plan.next_root, acc.bonus)


@pytest.mark.parametrize("W", [2, 4, 6])
@pytest.mark.parametrize("widths", [(2, 2, 1), (1, 1, 1, 1, 1)])
def test_conv_state_is_the_engines_conv_commit(widths, W):
    lay = TreeLayout(widths, conv_width=W)
    T, C = lay.num_nodes, 5
    x = torch.randn(T, T, C, generator=_gen(3))                  # one request per accepted node
    state = torch.randn(T, C, W - 1, generator=_gen(4))
    accepted = torch.arange(T)
    want = naive_tree_conv1d_commit(x, state, lay.tree, accepted)
    assert torch.equal(commit_conv_state(state, x, lay, accepted), want)


def _recurrence(S, q, k, v, g, beta, path):
    """The gated delta rule along one root..a path (fp64), from state S [HV, V, K]."""
    for t in path:
        S = g[t].exp()[:, None, None] * S
        u = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", S, k[t]))
        S = S + u[:, :, None] * k[t][:, None, :]
    return S


def test_pending_fold_commits_the_accepted_path():
    lay = TreeLayout((2, 2, 1))
    g0 = _gen(8)
    slots_n, H, K, V = 6, 2, 4, 3
    T = lay.num_nodes
    state = torch.randn(slots_n, H, V, K, dtype=torch.float64, generator=g0)
    slots = torch.tensor([3, 1, 5, 0])                             # the last row is padding (NULL block)
    B = slots.shape[0]
    q = torch.randn(B, T, H, K, dtype=torch.float64, generator=g0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, dtype=torch.float64, generator=g0), dim=-1)
    v = torch.randn(B, T, H, V, dtype=torch.float64, generator=g0)
    g = -torch.rand(B, T, H, dtype=torch.float64, generator=g0)
    beta = torch.rand(B, T, H, dtype=torch.float64, generator=g0)
    _, u = naive_tree_verify(q, k, v, g, beta, state[slots], lay.tree)
    pools = [torch.zeros(slots_n, *x.shape[1:], dtype=torch.float64) for x in (u, k, g)]
    for pool, x in zip(pools, (u, k, g)):
        pool[slots] = x                                          # the stash the verify wrote into each slot
    slot_accepted = torch.full((slots_n,), -1, dtype=torch.int32)
    logits, drafts = _inputs(lay, B, 4, 12, hit=0.8)
    acc = accept_tree(logits, drafts, lay)
    record_accepted(slot_accepted, slots, acc)
    reset_accepted(slot_accepted, slots[1:2])                    # slot 1 was just prefilled: nothing pending
    pend = pending_commit(*pools, lay, slot_accepted, slots, use_qk_l2norm_in_kernel=False)
    assert pend.accepted.tolist() == [int(acc.accepted[0]), -1, int(acc.accepted[2]), -1]
    rows = PendingCommit(*(p[slots] for p in pools), pend.parents, pend.accepted)
    got = naive_flush(state[slots], rows)
    for b in range(B):
        a = int(pend.accepted[b])
        want = state[slots[b]] if a < 0 else _recurrence(state[slots[b]], q[b], k[b], v[b], g[b], beta[b],
                                                         lay.tree.path(a))
        torch.testing.assert_close(got[b], want, rtol=1e-10, atol=1e-10)
    assert (acc.accepted[[0, 2]] > 0).all()


# ---------------------------------------------------------------------------------- no host sync, fixed shapes

def _every_piece(dev, B=3, V=7, L=20, widths=(2, 2, 1)):
    """Each public piece once, on ``dev``: what a CUDA-graph step would run."""
    lay = TreeLayout(widths, device=dev)
    T = lay.num_nodes
    lg = torch.randn(B, T, V, device=dev)
    drafts = torch.randint(0, V, (B, T), device=dev)
    temp = torch.ones(B, device=dev)
    q = torch.softmax(torch.randn(B, T, V, device=dev), -1)
    u = torch.rand(B, lay.max_depth, 2, dtype=torch.float64, device=dev)
    out = dict(
        greedy=accept_tree(lg, drafts, lay),
        match=accept_tree(lg, drafts, lay, temp),
        rrs=accept_tree(lg, drafts, lay, temp, rule="rrs_wor", q_draft=q),
        synthetic=SyntheticAcceptance(lay, (0.9, 0.6, 0.3))(drafts, lg, uniforms=u),
        mtp=propose_mtp_tree([torch.randn(B, lay.level_nodes[d].numel(), V, device=dev)
                              for d in range(lay.max_depth)], lay, drafts[:, 0]),
        ngram=propose_ngram_tree(torch.randint(0, 3, (B, L), device=dev), torch.full((B,), L, device=dev), lay),
    )
    table = torch.arange(1, B * 8 + 1, device=dev).reshape(B, 8)
    plan = plan_commit(lay, out["greedy"], torch.zeros(B, dtype=torch.long, device=dev), table, 4)
    kv = torch.zeros((B * 8 + 1) * 4, 2, device=dev)
    compact_kv(kv, plan.kv_src, plan.kv_dst)
    out["conv"] = commit_conv_state(torch.zeros(B, 5, 3, device=dev), torch.zeros(B, T, 5, device=dev), lay,
                                    out["greedy"].accepted)
    acc = torch.full((B * 8 + 1,), -1, dtype=torch.int32, device=dev)
    record_accepted(acc, table[:, 0], out["greedy"])
    out["pending"] = pending_commit(kv, kv, kv, lay, acc, table[:, 0]).accepted
    return lay, out


def test_every_piece_runs_on_meta_tensors():
    """Meta tensors hold no data: reading one on the host (a sync) or an output whose shape depends on values
    raises. So these pieces never sync and their shapes follow from the inputs' alone."""
    lay, out = _every_piece("meta")
    B, D = 3, lay.max_depth
    for name in ("greedy", "match", "rrs", "synthetic"):
        assert tuple(out[name].output_token_ids.shape) == (B, D + 1), name
    assert tuple(out["mtp"].shape) == tuple(out["ngram"].shape) == (B, lay.num_nodes)
    assert tuple(out["conv"].shape) == (B, 5, 3) and tuple(out["pending"].shape) == (B,)


@pytest.mark.gpu
def test_pieces_replay_in_a_cuda_graph():
    """Captured once, replayed on new inputs copied into the captured buffers: the eager results."""
    dev = torch.device("cuda")
    lay = TreeLayout((2, 2, 1), device=dev)
    B, V, T = 8, 50, lay.num_nodes
    syn = SyntheticAcceptance(lay, (0.9, 0.6, 0.3))
    bufs = dict(lg=torch.randn(B, T, V, device=dev), drafts=torch.randint(0, V, (B, T), device=dev),
                temp=torch.rand(B, device=dev), coins=torch.rand(B, T, device=dev),
                draws=1 - torch.rand(B, T, device=dev), u=torch.rand(B, lay.max_depth, 2, dtype=torch.float64,
                                                                     device=dev),
                prefix=torch.randint(0, 9, (B,), device=dev), ctx=torch.randint(0, 4, (B, 32), device=dev),
                lens=torch.randint(1, 33, (B,), device=dev))
    table = torch.randperm(B * 12, device=dev).reshape(B, 12) + 1

    def step(x):
        greedy_acc = accept_tree(x["lg"], x["drafts"], lay)
        hot = accept_tree(x["lg"], x["drafts"], lay, x["temp"], coins=x["coins"], draws=x["draws"])
        synth = syn(x["drafts"], x["lg"], uniforms=x["u"])
        plan = plan_commit(lay, hot, x["prefix"], table, 4)
        levels = [x["lg"][:, lay.level_nodes[d]] for d in range(lay.max_depth)]
        return (greedy_acc.output_token_ids, hot.output_token_ids, synth.output_token_ids, plan.kv_src,
                plan.kv_dst, propose_mtp_tree(levels, lay, x["drafts"][:, 0]),
                propose_ngram_tree(x["ctx"], x["lens"], lay))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(bufs)                                   # warm-up off the capture stream, as torch's docs ask
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(bufs)
    fresh = dict(lg=torch.randn(B, T, V, device=dev), drafts=torch.randint(0, V, (B, T), device=dev),
                 temp=torch.rand(B, device=dev), coins=torch.rand(B, T, device=dev),
                 draws=1 - torch.rand(B, T, device=dev),
                 u=torch.rand(B, lay.max_depth, 2, dtype=torch.float64, device=dev),
                 prefix=torch.randint(0, 9, (B,), device=dev), ctx=torch.randint(0, 4, (B, 32), device=dev),
                 lens=torch.randint(1, 33, (B,), device=dev))
    for key, val in fresh.items():
        bufs[key].copy_(val)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step(fresh)):
        assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("widths,match", [((0, 2), r"widths\[0\]"), ((2, 1.5), r"widths\[1\]"), ((), "widths = \\(\\)"),
                                          ("2,2", "widths = '2,2'"), (DraftTree([-1, 0, 0, 1]), "widths =")])
def test_bad_widths_name_the_argument(widths, match):
    with pytest.raises(ValueError, match=match):
        TreeLayout(widths)


@pytest.mark.parametrize("rates,match", [((0.9, 1.2, 0.1), r"rates\[1\] = 1.2"), ((0.9, -0.1, 0.0), r"rates\[1\]"),
                                         ((0.5, 0.7, 0.1), "non-increasing"), ((0.9, 0.5), "rates has 2 entries"),
                                         ("0.9", "rates = ")])
def test_bad_rates_name_the_argument(rates, match):
    with pytest.raises(ValueError, match=match):
        SyntheticAcceptance(TreeLayout((2, 2, 1)), rates)


def test_bad_shapes_name_the_argument():
    lay = TreeLayout((2, 2, 1))
    logits, drafts = _inputs(lay, 4, 5, 0)
    cases = [
        (lambda: accept_tree(logits[:, :5], drafts, lay), "target_logits must be a floating tensor"),
        (lambda: accept_tree(logits, drafts[:3], lay), r"draft_tokens must be an integer tensor \[B, T\] = \[4, 11\]"),
        (lambda: accept_tree(logits, drafts.float(), lay), "draft_tokens"),
        (lambda: accept_tree(logits, drafts, lay, -1.0), "temperature = -1.0"),
        (lambda: accept_tree(logits, drafts, lay, torch.ones(3)), r"temperature must be .* \[B\] = \[4\]"),
        (lambda: accept_tree(logits, drafts, lay, 1.0, rule="rrs"), "q_draft must be"),
        (lambda: accept_tree(logits, drafts, lay, rule="top"), "rule = 'top'"),
        (lambda: accept_tree(logits, drafts, lay, 1.0, coins=torch.rand(4, 3), draws=torch.rand(4, 11)), "coins"),
        (lambda: accept_tree(logits, drafts, TreeLayout((2, 2, 1), device="meta")), "build the TreeLayout"),
        (lambda: SyntheticAcceptance(lay, (0.9, 0.5, 0.1))(drafts, logits, uniforms=torch.rand(4, 2, 2)),
         r"uniforms must be .* \[4, 3, 2\]"),
        (lambda: propose_mtp_tree([logits[:, :1]] * 2, lay, drafts[:, 0]), "logits_per_level must be a list of 3"),
        (lambda: propose_mtp_tree([logits[:, :1], logits[:, :3], logits[:, :4]], lay, drafts[:, 0]),
         r"logits_per_level\[1\] must be floating \[B, n_1, V\] = \[4, 2, 5\]"),
        (lambda: propose_mtp_tree([logits[:, :1], logits[:, :2], logits[:, :4]], lay, drafts[:, :1]), "roots"),
        (lambda: propose_ngram_tree(logits[:, :, 0], torch.tensor([1, 2, 3, 4]), lay), "context must be"),
        (lambda: propose_ngram_tree(drafts, torch.tensor([1, 2]), lay), r"lens must be .* \[B\] = \[4\]"),
        (lambda: propose_ngram_tree(drafts, torch.tensor([1, 2, 3, 4]), lay, max_n=0), "max_n = 0"),
        (lambda: window_slots(lay, torch.zeros(4, dtype=torch.long), torch.zeros(4, 3, dtype=torch.long), 0),
         "block_size = 0"),
        (lambda: window_slots(lay, torch.zeros(4), torch.zeros(4, 3, dtype=torch.long), 4), "num_computed"),
        (lambda: commit_conv_state(torch.zeros(4, 5, 2), torch.zeros(4, 11, 5), lay, torch.zeros(4, dtype=torch.long)),
         r"conv_state must be \[B, C, W - 1\] = \[B, C, 3\]"),
        (lambda: commit_conv_state(torch.zeros(4, 5, 3), torch.zeros(4, 10, 5), lay, torch.zeros(4, dtype=torch.long)),
         r"x must be .* \[4, 11, 5\]"),
        (lambda: TreeLayout((2, 2), conv_width=0), "conv_width = 0"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()
