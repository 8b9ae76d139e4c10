"""Every bad input to the references raises a ValueError that names the argument and the fix."""

import pytest
import torch

from treewy.ops import naive_tree_commit, naive_tree_recurrent, naive_tree_verify
from treewy.testing import random_gdn_inputs
from treewy.tree import DraftTree

TREE = DraftTree.from_widths((2, 1))


def inputs():
    return random_gdn_inputs(TREE, B=2, H=2, HV=4, K=8, V=6, seed=0)


def call(op, **override):
    x = inputs()
    args = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=x.initial_state, parents=x.parents)
    args.update(override)
    return op(*args.values())


OPS = [naive_tree_verify, naive_tree_recurrent]


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state"])
def test_nan_in_any_input_raises(op, name):
    x = inputs()
    bad = getattr(x, name).clone()
    bad.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match=f"{name} holds 1 NaN"):
        call(op, **{name: bad})


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name,shape,match", [
    ("k", (2, 5, 2, 7), r"k has shape \(2, 5, 2, 7\), expected \(2, 5, 2, 8\)"),
    ("v", (2, 5, 3, 6), r"HV = 3 value heads, not a multiple of the H = 2"),
    ("g", (2, 5, 2), r"g has shape"),
    ("beta", (2, 3, 4), r"beta has shape"),
    ("initial_state", (2, 4, 8, 6), r"initial_state has shape .*\[B, HV, V, K\]"),
    ("q", (2, 4, 8), r"q has shape .* 4 dims"),
], ids=["k", "v-heads", "g", "beta", "state-layout", "q-ndim"])
def test_mismatched_shapes_raise(op, name, shape, match):
    with pytest.raises(ValueError, match=match):
        call(op, **{name: torch.zeros(shape, dtype=torch.float64)})


def test_parents_of_the_wrong_size_raise():
    with pytest.raises(ValueError, match="parents describe 3 nodes"):
        call(naive_tree_verify, parents=DraftTree.chain(2).parents)


def test_malformed_parents_raise():
    with pytest.raises(ValueError, match="node 3 has parent 3"):
        call(naive_tree_verify, parents=torch.tensor([-1, 0, 1, 3]))


def test_positive_gate_raises():
    x = inputs()
    with pytest.raises(ValueError, match="g is a log decay"):
        call(naive_tree_verify, g=-x.g)


def test_beta_out_of_range_raises():
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        call(naive_tree_verify, beta=inputs().beta + 1.5)


def test_integer_inputs_raise():
    with pytest.raises(ValueError, match="v has dtype torch.int64"):
        call(naive_tree_verify, v=torch.zeros(2, 5, 4, 6, dtype=torch.long))


def test_mixed_devices_raise():
    x = inputs()
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        call(naive_tree_verify, k=x.k.to("meta"))


def test_commit_rejects_bad_accepted_nodes():
    x = inputs()
    _, u = naive_tree_verify(*x.args())
    with pytest.raises(ValueError, match=r"node index in 0\.\.4"):
        naive_tree_commit(x.initial_state, u, x.k, x.g, TREE, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"accepted has shape \(3,\)"):
        naive_tree_commit(x.initial_state, u, x.k, x.g, TREE, torch.tensor([0, 1, 2]))


# ---- numeric edge cases, references and kernels alike ----

def _kernel_ops():
    pytest.importorskip("triton")
    from treewy.ops import store_all_verify, tree_verify
    return [tree_verify, store_all_verify]


@pytest.mark.parametrize("scale,match", [(float("nan"), "scale = nan"), (float("inf"), "scale = inf"),
                                         (0.0, "scale = 0.0"), (-1.0, "scale = -1.0"), ("abc", "scale = 'abc'"),
                                         (True, "scale = True")], ids=str)
def test_scale_must_be_a_finite_positive_number(scale, match):
    x = inputs()
    args = [t.float() for t in (x.q, x.k, x.v, x.g, x.beta, x.initial_state)] + [x.parents]
    for op in [naive_tree_verify, naive_tree_recurrent, *_kernel_ops()]:
        with pytest.raises(ValueError, match=match):
            op(*args, scale=scale)


@pytest.mark.parametrize("dim", ["H", "K", "HV", "V"])
def test_zero_heads_or_head_dims_name_the_dimension(dim):
    sizes = dict(B=1, T=3, H=1, HV=1, K=8, V=8)
    sizes[dim] = 0
    B, T, H, HV, K, V = sizes.values()
    args = (torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), -torch.rand(B, T, HV),
            torch.rand(B, T, HV), torch.zeros(B, HV, V, K), [-1, 0, 0])
    for op in [naive_tree_verify, naive_tree_recurrent, *_kernel_ops()]:
        with pytest.raises(ValueError, match=f"has {dim} = 0"):
            op(*args)


def test_an_empty_batch_gives_empty_outputs():
    args = (torch.randn(0, 3, 1, 8), torch.randn(0, 3, 1, 8), torch.randn(0, 3, 2, 4), -torch.rand(0, 3, 2),
            torch.rand(0, 3, 2), torch.zeros(0, 2, 4, 8), [-1, 0, 0])
    for op in [naive_tree_verify, *_kernel_ops()]:
        o = op(*args)[0]
        assert o.shape == (0, 3, 2, 4)


def test_store_all_commit_refuses_an_integer_state():
    pytest.importorskip("triton")
    from treewy.ops import store_all_commit
    states = torch.randn(1, 3, 1, 8, 8)
    with pytest.raises(ValueError, match="state has dtype torch.int32"):
        store_all_commit(torch.zeros(1, 1, 8, 8, dtype=torch.int32), states, torch.tensor([1]))


def test_commit_messages_name_the_state_and_the_pending_prefix():
    pytest.importorskip("triton")
    from treewy.ops import PendingCommit, tree_commit, tree_verify
    x = inputs()
    f = [t.float() for t in (x.q, x.k, x.v, x.g, x.beta, x.initial_state)]
    _, u = naive_tree_verify(*f, x.parents)
    with pytest.raises(ValueError, match="u is on cpu but state is on meta"):
        tree_commit(torch.zeros(2, 4, 6, 8, device="meta"), u, f[1], f[3], x.parents, [1, 1])
    pend = PendingCommit(u, f[1], f[3], TREE.parents, torch.tensor([5, 0]))
    with pytest.raises(ValueError, match=r"pending.accepted holds \[5, 0\]"):
        tree_verify(*f, x.parents, pending=pend)


def test_a_pending_commit_of_another_batch_size_is_refused():
    from treewy.ops import PendingCommit, naive_tree_step
    x = inputs()
    _, u = naive_tree_verify(*x.args())
    pend = PendingCommit(u[:1], x.k[:1], x.g[:1], TREE.parents, torch.tensor([1]))
    with pytest.raises(ValueError, match=r"pending.accepted has shape \(1,\), expected \[B\] = \[2\]"):
        naive_tree_step(*x.args(), pending=pend)
    pytest.importorskip("triton")
    from treewy.ops import tree_verify
    f = [t.float() for t in (x.q, x.k, x.v, x.g, x.beta, x.initial_state)]
    with pytest.raises(ValueError, match="pending.u holds a window of 1 requests but the state 2"):
        tree_verify(*f, x.parents, pending=PendingCommit(u[:1].float(), f[1][:1], f[3][:1], TREE.parents,
                                                          torch.tensor([1])))
