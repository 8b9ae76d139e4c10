"""The tree conv1d: the reference is nn.Conv1d over each node's own path (a chain: over the history), and the
kernels match the reference."""

import pytest
import torch
import torch.nn.functional as F

from treewy.ops import (
    naive_tree_conv1d, naive_tree_conv1d_commit, naive_tree_conv_update, tree_conv1d, tree_conv1d_commit,
)
from treewy.testing import assert_close_fp32 as close
from treewy.testing import random_parents, random_tree
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def conv_over_sequence(seq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv + SiLU over [B, L, C] with nn.functional.conv1d; last output per position."""
    C, W = weight.shape
    y = F.conv1d(seq.transpose(1, 2), weight[:, None, :], groups=C)  # valid conv: [B, C, L - W + 1]
    return F.silu(y.transpose(1, 2))


def test_every_node_convolves_its_own_path():
    gen = torch.Generator().manual_seed(0)
    B, C, W = 2, 6, 4
    for trial in range(10):
        tree = random_tree(int(torch.randint(1, 20, (1,), generator=gen)), gen)
        x = torch.randn(B, tree.num_nodes, C, dtype=torch.float64, generator=gen)
        weight = torch.randn(C, W, dtype=torch.float64, generator=gen)
        state = torch.randn(B, C, W - 1, dtype=torch.float64, generator=gen)
        y = naive_tree_conv1d(x, weight, state, tree)
        for t in range(tree.num_nodes):
            seq = torch.cat([state.transpose(1, 2), x[:, tree.path(t)]], 1)  # history then the path
            ref = conv_over_sequence(seq, weight)[:, -1]
            torch.testing.assert_close(y[:, t], ref, rtol=1e-12, atol=1e-12)
            new_state = naive_tree_conv1d_commit(x, state, tree, torch.full((B,), t))
            torch.testing.assert_close(new_state, seq[:, -(W - 1):].transpose(1, 2), rtol=0, atol=0)


CONV_CASES = [
    ("tree221-w4-bias", 2, 37, 4, True, "silu", DraftTree.from_widths((2, 2, 1))),
    ("chain5-w2", 1, 20, 2, False, "silu", DraftTree.chain(5)),
    ("star4-w4-linear", 2, 16, 4, False, None, DraftTree.from_widths((4,))),
]


@pytest.mark.parametrize("name,B,C,W,has_bias,act,tree", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_tree_conv1d_and_commit_match_reference(name, B, C, W, has_bias, act, tree):
    T = len(tree)
    gen = torch.Generator().manual_seed(23)
    x = torch.randn(B, T, C, generator=gen).to(DEVICE)
    w = torch.randn(C, W, generator=gen).to(DEVICE)
    cs = torch.randn(B, C, W - 1, generator=gen).to(DEVICE)
    bias = torch.randn(C, generator=gen).to(DEVICE) if has_bias else None
    y = tree_conv1d(x, w, cs, tree, bias, act)
    close("y", y, *(naive_tree_conv1d(x.to(dt), w.to(dt), cs.to(dt), tree, None if bias is None else bias.to(dt), act)
                    for dt in (torch.float64, torch.float32)))
    for a in range(T):
        acc = torch.full((B,), a)
        c2 = cs.clone()
        tree_conv1d_commit(x, c2, tree, acc)
        assert torch.equal(c2, naive_tree_conv1d_commit(x, cs, tree, acc))


def test_tree_conv1d_per_request_topologies():
    B, T, C, W = 3, 9, 24, 4
    gen = torch.Generator().manual_seed(29)
    parents = random_parents(B, T, gen)
    x, w, cs = torch.randn(B, T, C), torch.randn(C, W), torch.randn(B, C, W - 1)
    y = tree_conv1d(x.to(DEVICE), w.to(DEVICE), cs.to(DEVICE), parents)
    close("y", y, naive_tree_conv1d(x.double(), w.double(), cs.double(), parents), naive_tree_conv1d(x, w, cs, parents))
    acc = torch.tensor([8, 0, 5])
    c2 = cs.clone().to(DEVICE)
    tree_conv1d_commit(x.to(DEVICE), c2, parents, acc)
    assert torch.equal(c2.cpu(), naive_tree_conv1d_commit(x, cs, parents, acc))


# ---- validation at the door ----

def test_conv_rejects_wrong_state_shape():
    x = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match=r"conv_state has shape \(2, 6, 4\), expected \[B, C, W - 1\]"):
        naive_tree_conv1d(x, torch.randn(6, 4), torch.randn(2, 6, 4), DraftTree.from_widths((2, 1)))


def test_conv_reference_rejects_integer_inputs():
    with pytest.raises(ValueError, match="x has dtype torch.int64; expected a floating dtype"):
        naive_tree_conv1d(torch.randint(0, 5, (1, 3, 4)), torch.randn(4, 4), torch.randn(1, 4, 3), [-1, 0, 0])


def test_the_engines_launcher_reads_a_view_of_a_serving_conv_pool():
    """The engine's Triton conv (``get_ops(..., "triton")``) on the committed columns of vLLM 0.26's conv pool,
    [slots, W - 1 + N, C] seen as [slots, C, W - 1 + N]: a view whose columns are C apart. The kernel reads a
    contiguous state; before the launcher made it so, every served tree's conv read the wrong inputs (H200,
    2026-12-04: tree-tiny's outputs parted from generate's at the first window)."""
    from treewy.models.backends import get_ops
    gen = torch.Generator().manual_seed(3)
    B, C, W, N, slots = 2, 12, 4, 5, 6
    tree = DraftTree.from_widths((2, 2))
    x = torch.randn(B, tree.num_nodes, C, generator=gen).to(DEVICE)
    weight = torch.randn(C, W, generator=gen).to(DEVICE)
    pool = torch.randn(slots, W - 1 + N, C, generator=gen).to(DEVICE).transpose(1, 2)   # vLLM's SD layout, viewed
    committed = pool[torch.tensor([4, 1], device=DEVICE), :, : W - 1]
    assert not committed.is_contiguous()
    parents = tree.parents.to(torch.int32).to(DEVICE)
    y = get_ops(DEVICE, "triton").tree_conv1d(x, weight, committed, parents, None, "silu")
    ref = naive_tree_conv1d(x.double(), weight.double(), committed.double(), tree)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


SERVED_CONV_CASES = [((2, 2, 1), 4), ((1, 1, 1, 1), 4), ((3,), 4), ((2, 1), 2)]


@pytest.mark.parametrize("widths,W", SERVED_CONV_CASES, ids=[f"{w}-w{W}" for w, W in SERVED_CONV_CASES])
def test_the_served_tree_conv_update_convolves_each_path_over_the_committed_history(widths, W):
    """Three served steps on vLLM's pool layout ([slots, C, columns], dim first, a transposed view), slots shuffled,
    a padding row: the reference's every output equals nn.functional.conv1d over the request's committed history
    then the node's path, the accepted node off the leftmost path; the one-launch kernel equals the reference, outputs
    and pool."""
    from treewy.ops.conv.kernel import tree_conv_update_fwd
    from treewy.serve.tree_spec import TreeLayout

    lay, on = TreeLayout(widths, conv_width=W), TreeLayout(widths, DEVICE, conv_width=W)
    T, C, S = lay.num_nodes, 37, 6
    gen = torch.Generator().manual_seed(T * W)
    slots = torch.tensor([4, 0, 1], dtype=torch.int32)                # the second: a padding row
    weight, bias = torch.randn(C, W, generator=gen), torch.randn(C, generator=gen)
    pool0 = torch.randn(S, W - 1 + T, C, generator=gen).transpose(1, 2)   # vLLM's conv pool: dim first, a view
    history = [pool0[int(s), :, : W - 1].T.double() for s in slots]       # the committed inputs, oldest first
    pools = {"naive": pool0.double().clone(), "kernel": pool0.clone().to(DEVICE)}   # the view's strides kept
    accepted = torch.full((3,), -1, dtype=torch.int32)                    # after a prefill: nothing pending
    for step in range(3):
        x = torch.randn(3 * T, C, generator=gen)
        y = naive_tree_conv_update(x.double(), pools["naive"], weight.double(), bias.double(), slots, accepted,
                                   lay.parents32, lay.conv_src, "silu")
        yk = tree_conv_update_fwd(*(t.to(DEVICE) for t in (x, pools["kernel"], weight, bias, slots, accepted)),
                                  on.parents32, on.conv_src32, "silu")
        torch.testing.assert_close(yk.cpu().double(), y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pools["kernel"].cpu().double(), pools["naive"], rtol=1e-6, atol=1e-6)
        assert torch.equal(pools["naive"][0], pool0[0].double()), "padding rows leave slot 0 alone"
        assert not y.reshape(3, T, C)[1].any(), "a padding row's outputs are zeros"
        xw = x.double().reshape(3, T, C)
        for b in (0, 2):
            for t in range(T):
                seq = torch.cat([history[b][-(W - 1):], xw[b, lay.tree.path(t)]])[None]
                ref = F.silu(F.conv1d(seq.transpose(1, 2), weight.double()[:, None], bias.double(), groups=C))
                torch.testing.assert_close(y.reshape(3, T, C)[b, t], ref[0, :, -1], rtol=1e-12, atol=1e-12)
        accepted = torch.randint(0, T, (3,), generator=gen, dtype=torch.int32)
        accepted[0] = T - 1                                               # the last node in DFS order
        for b in (0, 2):
            history[b] = torch.cat([history[b], xw[b, lay.tree.path(int(accepted[b]))]])


def test_the_served_tree_conv_update_names_a_misshapen_argument():
    from treewy.ops.conv.kernel import tree_conv_update_fwd
    from treewy.serve.tree_spec import TreeLayout

    lay = TreeLayout((2, 1))
    W, C = lay.conv_width, 8
    args = dict(weight=torch.zeros(C, W), bias=None, slots=torch.ones(2, dtype=torch.int32),
                accepted=torch.zeros(2, dtype=torch.int32), parents=lay.parents32, conv_src=lay.conv_src32)
    with pytest.raises(ValueError, match=r"x has shape \(7, 8\), expected \(10, 8\) \(B = 2 slots, T = 5 nodes"):
        tree_conv_update_fwd(torch.zeros(7, C), torch.zeros(3, C, W - 1 + 5), **args)
    with pytest.raises(ValueError, match=r"conv_state has shape \(3, 8, 4\)"):
        tree_conv_update_fwd(torch.zeros(10, C), torch.zeros(3, C, 4), **args)
