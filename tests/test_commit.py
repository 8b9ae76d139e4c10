"""The commit op folder: ``tree_commit`` rebuilds the accepted node's state from a verify's u, against the fp64
reference, at every node, per-request topologies, keys normalized in the kernel, a bf16 state, pool slices with a
batch stride, and a CUDA-graph replay of verify then commit (GPU, marked ``gpu``). The reference against the
store-all recurrence: tests/test_reference_parity.py.

CPU: Triton interpreter, small awkward sizes (TREEWY_TF32_EMULATION=1: with the GPU's tf32 numerics emulated).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import pytest
import torch

from treewy.ops import PendingCommit, naive_tree_commit, naive_tree_verify, tree_commit, tree_verify
from treewy.testing import (
    TF32_EMULATION_ENV, as64, bfs_tree, make_inputs, normalized, output_tf32, picked_kernel, random_gdn_inputs,
    random_parents, refs, tf32_on_the_interpreter,
)
from treewy.testing import assert_close_fp32 as close
from treewy.testing import assert_close_output as close_o
from treewy.testing import rel_err as rel
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def tf32_everywhere_when_asked():
    """TREEWY_TF32_EMULATION=1 runs every test of the module with the GPU's tf32 numerics emulated (CPU only)."""
    with tf32_on_the_interpreter() if os.environ.get(TF32_EMULATION_ENV) == "1" else nullcontext():
        yield


def o_tf32(parents, B: int, state_dtype=torch.float32) -> bool:
    """Whether tree_verify's pick for this window (parents [T] or [B, T]) takes its outputs through one tf32 pass."""
    par = parents.parents if isinstance(parents, DraftTree) else torch.as_tensor(parents)
    T = par.shape[-1]
    chain = bool((par.reshape(-1, T).cpu() == torch.arange(T) - 1).all())
    return output_tf32(picked_kernel(T, B, chain, state_dtype))


def commit_refs(S, us, k, g, parents, accepted):
    """naive_tree_commit in fp64 and in fp32, each from its own reference's u (us: the fp64 and the fp32 u)."""
    return tuple(naive_tree_commit(S.to(dt), u, k.to(dt), g.to(dt), parents, accepted)
                 for dt, u in zip((torch.float64, torch.float32), us))


# (id, B, H, HV, K, V, parents) -- awkward sizes, GVA 1x/2x/4x, chains, stars, trees
CASES = [
    ("chain3-gva2", 2, 2, 4, 32, 32, DraftTree.chain(3)),
    ("tree221-gva4-v48", 2, 1, 4, 16, 48, DraftTree.from_widths((2, 2, 1))),
    ("star6-k60-v20", 1, 2, 2, 60, 20, DraftTree.from_widths((6,))),
    ("bfs-order", 2, 1, 2, 32, 16, bfs_tree()),
    ("root-only", 3, 1, 1, 16, 16, DraftTree.chain(0)),
    ("tree333-v100", 1, 1, 1, 16, 100, DraftTree.from_widths((3, 3, 3))),
]


@pytest.mark.parametrize("name,B,H,HV,K,V,tree", CASES, ids=[c[0] for c in CASES])
def test_verify_and_commit_match_fp64(name, B, H, HV, K, V, tree):
    tree = tree if isinstance(tree, DraftTree) else DraftTree(tree)
    T = tree.num_nodes
    ins = make_inputs(B, T, H, HV, K, V, seed=T)
    o, u = tree_verify(*ins, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)
    assert o.dtype == ins[2].dtype and u.dtype == torch.float32
    close_o("o", o, ro, ro32, o_tf32(tree, B))
    close("u", u, ru, ru32)
    for a in range(T):  # commit of every node
        acc = torch.full((B,), a)
        state = ins[5].clone()
        out = tree_commit(state, u, ins[1], ins[3], tree, acc)
        assert out is state
        close(f"state committed at node {a}", state, *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], tree, acc))


def test_tree_is_paths_for_random_per_request_topologies():
    B, T, H, HV, K, V = 3, 17, 1, 2, 32, 16
    gen = torch.Generator().manual_seed(3)
    parents = random_parents(B, T, gen)
    ins = make_inputs(B, T, H, HV, K, V, seed=5)
    o, u = tree_verify(*ins, parents.to(DEVICE))
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, parents)
    close_o("o", o, ro, ro32, o_tf32(parents, B))
    close("u", u, ru, ru32)
    acc = torch.tensor([16, 7, 0])
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], parents, acc)
    close("state", state, *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], parents, acc))


def test_qk_l2norm_in_kernel_matches_normalized_reference():
    B, T, H, HV, K, V = 2, 5, 1, 2, 32, 16
    tree = DraftTree.from_widths((2, 1))
    ins = make_inputs(B, T, H, HV, K, V, seed=11)
    ins[1] = ins[1] * 3.0  # unnormalized keys
    o, u = tree_verify(*ins, tree, use_qk_l2norm_in_kernel=True)
    n64, n32 = as64(ins), [x.float() for x in ins]
    for n in (n64, n32):  # q and k as the kernels normalize them, in each reference's dtype
        for i in (0, 1):
            n[i] = normalized(n[i])
    (ro, ru), (ro32, ru32) = naive_tree_verify(*n64, tree), naive_tree_verify(*n32, tree)
    close_o("o", o, ro, ro32, o_tf32(tree, B))
    close("u", u, ru, ru32)
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([4, 2]), use_qk_l2norm_in_kernel=True)
    close("state", state, naive_tree_commit(n64[5], ru, n64[1], n64[3], tree, torch.tensor([4, 2])),
          naive_tree_commit(n32[5], ru32, n32[1], n32[3], tree, torch.tensor([4, 2])))


def test_bf16_state_is_read_and_committed():
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    tree = DraftTree.from_widths((3,))
    ins = make_inputs(B, T, H, HV, K, V, seed=13, state_dtype=torch.bfloat16)
    o, u = tree_verify(*ins, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)  # both read the same bf16 state exactly
    close_o("o", o, ro, ro32, o_tf32(tree, B, torch.bfloat16))
    close("u", u, ru, ru32)
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([2, 0]))
    ref = naive_tree_commit(ins[5].double(), ru, ins[1].double(), ins[3].double(), tree, torch.tensor([2, 0]))
    assert state.dtype == torch.bfloat16 and rel(state, ref) < 1e-2  # one bf16 rounding


def test_commit_into_pool_slice_with_batch_stride():
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    tree = DraftTree.chain(3)
    ins = make_inputs(B, T, H, HV, K, V, seed=17)
    pool = torch.randn(7, HV, V, K, device=DEVICE)
    pool[1], pool[4] = ins[5][0], ins[5][1]
    state = pool[1:5:3]  # two slots three apart: batch stride 3 * HV * V * K
    untouched = pool[[0, 2, 3, 5, 6]].clone()
    o, u = tree_verify(*ins[:5], state, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)
    close_o("o", o, ro, ro32, o_tf32(tree, B))
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([3, 1]))
    close("state", pool[1:5:3], *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], tree, torch.tensor([3, 1])))
    assert torch.equal(pool[[0, 2, 3, 5, 6]], untouched)


# ---- validation at the door (what every op refuses: tests/test_input_checks.py) ----

TREE = DraftTree.from_widths((2, 1))


def inputs():
    return random_gdn_inputs(TREE, B=2, H=2, HV=4, K=8, V=6, seed=0)


def test_commit_rejects_bad_accepted_nodes():
    x = inputs()
    _, u = naive_tree_verify(*x.args())
    with pytest.raises(ValueError, match=r"node index in 0\.\.4"):
        naive_tree_commit(x.initial_state, u, x.k, x.g, TREE, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"accepted has shape \(3,\)"):
        naive_tree_commit(x.initial_state, u, x.k, x.g, TREE, torch.tensor([0, 1, 2]))


def test_commit_messages_name_the_state_and_the_pending_prefix():
    x = inputs()
    f = [t.to(DEVICE, torch.float32) for t in (x.q, x.k, x.v, x.g, x.beta, x.initial_state)]
    _, u = naive_tree_verify(*f, x.parents)
    with pytest.raises(ValueError, match=f"u is on {u.device} but state is on meta"):
        tree_commit(torch.zeros(2, 4, 6, 8, device="meta"), u, f[1], f[3], x.parents, [1, 1])
    pend = PendingCommit(u, f[1], f[3], TREE.parents, torch.tensor([5, 0]))
    with pytest.raises(ValueError, match=r"pending.accepted holds \[5, 0\]"):
        tree_verify(*f, x.parents, pending=pend)


# ---- GPU only ----

@pytest.mark.gpu
def test_cuda_graph_replay_of_verify_and_commit_matches_eager():
    tree = DraftTree.from_widths((3, 3, 3))
    B, T, H, HV, K, V = 4, tree.num_nodes, 16, 32, 128, 128
    par = tree.parents.cuda()
    static = make_inputs(B, T, H, HV, K, V, seed=1, dtype=torch.bfloat16)
    static[3], static[4] = static[3].float(), static[4].float()
    state = static[5].clone()
    acc = torch.zeros(B, dtype=torch.int32, device="cuda")
    tree_verify(*static[:5], state, par)  # compile and autotune outside the capture
    tree_commit(state.clone(), torch.zeros(B, T, HV, V, device="cuda"), static[1], static[3], par, acc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # device parents inside a capture: the chain flag and depth are given, not read
        o, u = tree_verify(*static[:5], state, par, chain=False, max_depth=tree.max_depth)
        tree_commit(state, u, static[1], static[3], par, acc)
    for seed in (2, 3):
        new = make_inputs(B, T, H, HV, K, V, seed=seed, dtype=torch.bfloat16)
        new[3], new[4] = new[3].float(), new[4].float()
        a = torch.randint(0, T, (B,), dtype=torch.int32, device="cuda")
        for dst, src in zip(static[:5], new[:5]):
            dst.copy_(src)
        state.copy_(new[5])
        acc.copy_(a)
        graph.replay()
        torch.cuda.synchronize()
        eo, eu = tree_verify(*new, par)
        es = new[5].clone()
        tree_commit(es, eu, new[1], new[3], par, a)
        assert torch.equal(o, eo) and torch.equal(u, eu) and torch.equal(state, es)
