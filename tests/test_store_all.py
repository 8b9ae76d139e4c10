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
