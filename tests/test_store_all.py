"""The store-all op folder: ``store_all_verify`` keeps every node's state, as the recurrence does, and
``store_all_commit`` copies the accepted snapshot. The recurrence against TreeWY's closed form:
tests/test_reference_parity.py.

CPU: Triton interpreter, small awkward sizes.
"""

from __future__ import annotations

import pytest
import torch

from treewy.ops import naive_tree_recurrent, store_all_commit, store_all_verify
from treewy.testing import assert_close_fp32 as close
from treewy.testing import bfs_tree, make_inputs, refs
from treewy.tree import DraftTree

STORE_CASES = [
    ("chain2-gva2-k60", 2, 1, 2, 60, 16, DraftTree.chain(2)),
    ("tree22-gva4", 1, 1, 4, 16, 20, DraftTree.from_widths((2, 2))),
    ("bfs-order", 1, 1, 1, 32, 16, bfs_tree()),
]


@pytest.mark.parametrize("name,B,H,HV,K,V,tree", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_all_matches_recurrence_and_treewy(name, B, H, HV, K, V, tree):
    T = len(tree)
    ins = make_inputs(B, T, H, HV, K, V, seed=19)
    o, states = store_all_verify(*ins, tree)
    (ro, rstates), (ro32, rstates32) = refs(naive_tree_recurrent, ins, tree)
    assert states.shape == (B, T, HV, V, K) and states.dtype == ins[5].dtype
    close("o", o, ro, ro32)
    close("states", states, rstates, rstates32)
    acc = torch.randint(0, T, (B,))
    state = ins[5].clone()
    store_all_commit(state, states, acc)
    assert torch.equal(state, states[torch.arange(B), acc]), "the commit copies the accepted snapshot"


def test_store_all_commit_refuses_an_integer_state():
    states = torch.randn(1, 3, 1, 8, 8)
    with pytest.raises(ValueError, match="state has dtype torch.int32"):
        store_all_commit(torch.zeros(1, 1, 8, 8, dtype=torch.int32), states, torch.tensor([1]))


def test_store_all_over_a_pool_of_blocks_reads_and_writes_the_blocks_in_place():
    """The serving form (``blocks``, ``start``): each request starts from the block of its start node and writes
    node t's snapshot into block blocks[b, t] of the pool, as the snapshot buffer's form computes; shuffled blocks,
    a pool whose blocks sit a stride apart, a padding row (block 0) that touches nothing."""
    from treewy.ops.store_all.kernel import store_all_verify_fwd

    tree = DraftTree.from_widths((2, 1))
    B, T, H, HV, K, V = 3, len(tree), 1, 2, 16, 12
    q, k, v, g, beta, _ = make_inputs(B, T, H, HV, K, V, seed=23)
    gen = torch.Generator().manual_seed(5)
    page = torch.randn(1 + B * T, HV * V * K + 7, generator=gen).to(q.device)   # a block, then other tensors' bytes
    pool = page[:, : HV * V * K].view(1 + B * T, HV, V, K)
    blocks = (1 + torch.randperm(B * T, generator=gen)).to(torch.int32).reshape(B, T)
    blocks[2] = 0                                                          # a CUDA graph's padding row
    blocks, start = blocks.to(q.device), torch.tensor([0, 2, 1], dtype=torch.int32, device=q.device)
    before = pool.clone()
    S0 = before[blocks.long()[torch.arange(B, device=q.device), start.long()]]
    parents = tree.parents.to(q.device, torch.int32)
    ro, rstates = store_all_verify_fwd(q, k, v, g, beta, S0, parents, 0, K ** -0.5)
    o, out = store_all_verify_fwd(q, k, v, g, beta, pool, parents, 0, K ** -0.5, blocks=blocks, start=start)
    assert out is pool
    live = blocks[:2].long()
    # the two forms are two compiled kernels (HAS_BLOCKS): bit-equal under the interpreter, but a GPU's compiler may
    # contract their multiply-adds differently (an H100, 2026-12-05: 2.4e-7 apart, a few ulp)
    tol = dict(rtol=0, atol=0) if q.device.type == "cpu" else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(o[:2], ro[:2], **tol)
    torch.testing.assert_close(pool[live], rstates[:2], **tol)
    untouched = torch.ones(1 + B * T, dtype=torch.bool, device=q.device)
    untouched[live.flatten()] = False
    assert torch.equal(pool[untouched], before[untouched]), "the padding row and the other blocks stay as they were"
    with pytest.raises(ValueError, match="each block \\[HV, V, K\\] contiguous"):
        store_all_verify_fwd(q, k, v, g, beta, pool.transpose(2, 3), parents, 0, K ** -0.5, blocks=blocks,
                             start=start)
