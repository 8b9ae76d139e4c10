"""The deferred commit folded into verify (``tree_verify(..., pending=...)``) against the references.

CPU: Triton interpreter, small awkward sizes. Every kernel forced across mild and hard inputs, the model's
shapes and CUDA graphs: tests/test_verify.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from treewy.ops import (
    PendingCommit, flush_pending, naive_flush, naive_tree_step, naive_tree_verify, tree_commit, tree_verify,
)
from treewy.bench.parity import folded_drift
from treewy.testing import assert_close_fp32 as close
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(x, ref):
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def window(B, T, H, HV, K, V, gen, dtype=torch.float32):
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 4
    beta = torch.rand(B, T, HV, generator=gen)
    return [x.to(DEVICE, dtype) for x in (q, k, v, g, beta)]


def normalized(x):
    """Keys and queries as the kernels normalize them in-kernel, in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def as_dtype(pend, dt):
    """The same pending commit in a reference's dtype."""
    return PendingCommit(pend.u.to(dt), pend.k.to(dt), pend.g.to(dt), pend.parents, pend.accepted,
                         use_qk_l2norm_in_kernel=pend.use_qk_l2norm_in_kernel)


def step_refs(w, S, parents, pend):
    """naive_tree_step (o, u, state) in fp64 and in fp32 on the kernel's inputs: window w, state S and the
    kernel's pending commit pend."""
    return tuple(naive_tree_step(*[x.to(dt) for x in w], S.to(dt), parents, pending=as_dtype(pend, dt))
                 for dt in (torch.float64, torch.float32))


def close_step(o, u, state, ref64, ref32):
    """The folded state, o and u within the fp32 bound of the step's references."""
    close("state", state, ref64[2], ref32[2])
    close("o", o, ref64[0], ref32[0])
    close("u", u, ref64[1], ref32[1])


def random_parents(T, gen):
    return [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]


CASES = [  # name, B, H, HV, K, V, previous tree, new tree
    ("chain3-chain3", 2, 1, 2, 20, 24, DraftTree.chain(3), DraftTree.chain(3)),
    ("tree222-chain1", 2, 2, 4, 16, 20, DraftTree.from_widths((2, 2, 2)), DraftTree.chain(1)),
    ("chain1-tree332", 2, 1, 1, 24, 17, DraftTree.chain(1), DraftTree.from_widths((3, 3, 2))),
    ("tree332-tree22", 2, 2, 2, 32, 16, DraftTree.from_widths((3, 3, 2)), DraftTree.from_widths((2, 2))),
    ("decode-decode", 3, 1, 2, 16, 16, DraftTree([-1]), DraftTree([-1])),
]


@pytest.mark.parametrize("name,B,H,HV,K,V,prev,new", CASES, ids=[c[0] for c in CASES])
def test_folded_commit_matches_flush_then_verify(name, B, H, HV, K, V, prev, new):
    gen = torch.Generator().manual_seed(7)
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE)
    w0 = window(B, prev.num_nodes, H, HV, K, V, gen)
    w1 = window(B, new.num_nodes, H, HV, K, V, gen)
    _, u0 = tree_verify(*w0, S, prev)
    acc = torch.randint(0, prev.num_nodes, (B,), generator=gen)
    acc[-1] = -1  # the last request has nothing pending
    pend = PendingCommit(u0, w0[1], w0[3], prev, acc)
    ref64, ref32 = step_refs(w1, S, new, pend)
    state = S.clone()
    o, u = tree_verify(*w1, state, new, pending=pend)
    close_step(o, u, state, ref64, ref32)
    assert torch.equal(state[-1], S[-1])  # accepted = -1: untouched
    close("flushed state", flush_pending(S.clone(), pend), ref64[2], ref32[2])


@pytest.mark.parametrize("T", [1, 4, 7])
def test_chain_kernel_matches_the_reference(T):
    """The node-by-node recurrence kernel on chain windows, pending from a tree and an idle slot (num_nodes:
    tests/test_verify.py)."""
    gen = torch.Generator().manual_seed(17 + T)
    B, H, HV, K, V = 3, 1, 2, 20, 24
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE)
    prev, chain = DraftTree.from_widths((2, 2)), DraftTree.chain(T - 1)
    w0, w1 = window(B, prev.num_nodes, H, HV, K, V, gen), window(B, T, H, HV, K, V, gen)
    _, u0 = tree_verify(*w0, S, prev)
    pend = PendingCommit(u0, w0[1], w0[3], prev, torch.tensor([6, 3, -1]))
    state = S.clone()
    o, u = tree_verify(*w1, state, chain, pending=pend, kernel="chain")
    close_step(o, u, state, *step_refs(w1, S, chain, pend))
    with pytest.raises(ValueError, match="chain"):
        tree_verify(*window(B, 3, H, HV, K, V, gen), S.clone(), DraftTree.from_widths((2,)), kernel="chain")


@pytest.mark.parametrize("T,PT,K,V,gva,l2norm,state_dtype", [
    (4, 6, 20, 24, 2, False, torch.float32),
    (3, 12, 16, 13, 1, True, torch.float32),
    (5, 9, 24, 16, 4, False, torch.bfloat16),
    (1, 3, 12, 8, 1, True, torch.float32),
])
def test_chain_kernel_folds_any_pending_tree(T, PT, K, V, gva, l2norm, state_dtype):
    """The chain kernel against the path kernel and the fp64 flush: pending from random per-request trees
    (one request idle), num_nodes cutting windows short, GVA, keys normalized in the kernel, bf16 state."""
    gen = torch.Generator().manual_seed(K * V + T)
    B, H, chain = 3, 2, DraftTree.chain(T - 1)
    HV = H * gva
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE, state_dtype)
    prev = torch.tensor([random_parents(PT, gen) for _ in range(B)], dtype=torch.int32, device=DEVICE)
    w0, w1 = window(B, PT, H, HV, K, V, gen), window(B, T, H, HV, K, V, gen)
    if l2norm:
        w0[1], w1[1], w1[0] = w0[1] * 3, w1[1] * 2, w1[0] * 5
    _, u0 = tree_verify(*w0, S, prev, use_qk_l2norm_in_kernel=l2norm)
    acc = torch.tensor([PT - 1, PT // 2, -1], dtype=torch.int32, device=DEVICE)
    pend = PendingCommit(u0, w0[1], w0[3], prev, acc, use_qk_l2norm_in_kernel=l2norm)
    nn = torch.tensor([T, max(T - 2, 1), 0], device=DEVICE)
    state, ref = S.clone(), S.clone()
    o, u = tree_verify(*w1, state, chain, use_qk_l2norm_in_kernel=l2norm, num_nodes=nn, pending=pend, kernel="chain")
    ro, ru = tree_verify(*w1, ref, chain, use_qk_l2norm_in_kernel=l2norm, num_nodes=nn, pending=pend, kernel="path")
    assert rel(state, ref) < (4e-3 if state_dtype == torch.bfloat16 else 1e-6)
    assert rel(o, ro) < 1e-5 and rel(u, ru) < 1e-5 and not o[2].any() and not u[2].any()
    flushed = [naive_flush(S.to(dt), as_dtype(pend, dt)) for dt in (torch.float64, torch.float32)]
    if state_dtype == torch.bfloat16:
        assert rel(state, flushed[0]) < 8e-3
    else:
        close("state", state, *flushed)


@pytest.mark.parametrize("kernel,trees", [("chain", [DraftTree.chain(3), DraftTree.chain(1)]),
                                          ("path", [DraftTree.from_widths((2, 2)), DraftTree.chain(2)])])
def test_forced_kernels_fold_forty_steps_without_drift(kernel, trees):
    # a fixed bar (the 1e-5), not an fp32 bound: folded_drift runs the recurrence in fp64 alone
    r = folded_drift(40, trees=trees, kernel=kernel, check_every=10)
    assert r["state_err"] < 1e-5 and r["out_err"] < 1e-5, r


def test_bf16_state_and_l2norm_in_kernel():
    gen = torch.Generator().manual_seed(5)
    B, H, HV, K, V = 2, 1, 2, 16, 16
    tree = DraftTree.from_widths((2, 1))
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE, torch.bfloat16)
    w0, w1 = window(B, 5, H, HV, K, V, gen), window(B, 5, H, HV, K, V, gen)
    w0[1], w1[1] = w0[1] * 3, w1[1] * 3  # unnormalized keys, normalized in the kernel
    _, u0 = tree_verify(*w0, S, tree, use_qk_l2norm_in_kernel=True)
    pend = PendingCommit(u0, w0[1], w0[3], tree, torch.tensor([4, 2]), use_qk_l2norm_in_kernel=True)
    state = S.clone()
    o, u = tree_verify(*w1, state, tree, use_qk_l2norm_in_kernel=True, pending=pend)
    ref = naive_flush(S.float(), pend)
    assert state.dtype == torch.bfloat16 and rel(state, ref) < 8e-3
    # verified from exactly the stored (rounded) state
    (ro, ru), (ro32, ru32) = (naive_tree_verify(*(normalized(x.to(dt)) for x in w1[:2]), *[x.to(dt) for x in w1[2:]],
                                                state.to(dt), tree) for dt in (torch.float64, torch.float32))
    close("o", o, ro, ro32)
    close("u", u, ru, ru32)


def test_two_hundred_folded_steps_follow_the_recurrence():
    """Random trees (1-6 nodes, and 17-19 for the dot kernel) and accepted nodes every step: the kernel
    state (a flushed copy every 20 steps) and outputs track the fp64 recurrence run step by step."""
    # a fixed bar (the 1e-5), not an fp32 bound: folded_drift runs the recurrence in fp64 alone
    r = folded_drift(200)
    assert r["state_err"] < 1e-5 and r["out_err"] < 1e-5, r


def test_flush_at_any_point_gives_the_eager_commit_state():
    """Deferred (fold each commit into the next verify) vs eager (verify, then tree_commit) over 8 steps,
    flushing a copy of the deferred state after every step: same states, same outputs."""
    gen = torch.Generator().manual_seed(13)
    B, H, HV, K, V = 2, 1, 2, 16, 24
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE)
    eager, deferred, pend = S.clone(), S.clone(), None
    for step in range(8):
        tree = DraftTree.from_widths((2, 2)) if step % 2 else DraftTree.chain(3)
        w = window(B, tree.num_nodes, H, HV, K, V, gen)
        eo, eu = tree_verify(*w, eager, tree)
        do, du = tree_verify(*w, deferred, tree, pending=pend)
        assert rel(do, eo) < 1e-6 and rel(du, eu) < 1e-6
        acc = torch.randint(0, tree.num_nodes, (B,), generator=gen)
        tree_commit(eager, eu, w[1], w[3], tree, acc)
        pend = PendingCommit(du, w[1], w[3], tree, acc)
        assert rel(flush_pending(deferred.clone(), pend), eager) < 1e-6
        if step == 4:  # flush for real midway and carry on without a pending commit
            flush_pending(deferred, pend)
            pend = None


def test_rejects_bad_pending():
    gen = torch.Generator().manual_seed(1)
    tree = DraftTree.chain(2)
    B, H, HV, K, V = 2, 1, 2, 16, 16
    S = torch.zeros(B, HV, V, K, device=DEVICE)
    w = window(B, 3, H, HV, K, V, gen)
    u = torch.zeros(B, 3, HV, V, device=DEVICE)
    with pytest.raises(ValueError, match="PendingCommit"):
        tree_verify(*w, S, tree, pending=(u, w[1], w[3], tree, [0, 0]))
    with pytest.raises(ValueError, match="pending.u"):
        tree_verify(*w, S, tree, pending=PendingCommit(u[:, :, :1], w[1], w[3], tree, torch.tensor([0, 0])))
    with pytest.raises(ValueError, match="pending.u has dtype"):
        tree_verify(*w, S, tree, pending=PendingCommit(u.double(), w[1], w[3], tree, torch.tensor([0, 0])))
    with pytest.raises(ValueError, match="accepted"):
        tree_verify(*w, S, tree, pending=PendingCommit(u, w[1], w[3], tree, torch.tensor([3, 0])))
    with pytest.raises(ValueError, match="pending.g has positive"):
        tree_verify(*w, S, tree, pending=PendingCommit(u, w[1], w[3].abs() + 0.1, tree, torch.tensor([0, 0])))
    bad = u.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="pending.u holds 1 NaN"):
        tree_verify(*w, S, tree, pending=PendingCommit(bad, w[1], w[3], tree, torch.tensor([0, 0])))
    with pytest.raises(ValueError, match="parents"):
        tree_verify(*w, S, tree, pending=PendingCommit(u, w[1], w[3], [-1, 0, 3], torch.tensor([0, 0])))
