"""The path kernel (one launch, any tree, or two as "path_split"): its depth tables, their bound, and parity with
the fp64 reference on trees of every shape (CPU: Triton interpreter, awkward sizes)."""

from __future__ import annotations

import pytest
import torch

from treewy.ops import PendingCommit, naive_tree_step
from treewy.ops.tree_verify import default_dot_precision, tree_verify, tree_verify_fwd
from treewy.ops.tree_verify import verify as verify_mod
from treewy.ops.tree_verify.path import CONFIGS, SINGLE_REQUEST, _config_key, _prune, config, depth_block
from treewy.testing import assert_close_fp32 as close
from treewy.testing import random_tree
from treewy.tree import DraftTree, path_depth

from test_tree_verify import DEVICE, O_TF32_TOL, case_step, close_step, normalized, rel, window  # noqa: E402

#: Outputs take one tf32 pass on a GPU (they feed only bf16 outputs); u and the state stay fp32-accurate.
O_TF32 = default_dot_precision(DEVICE) == "tf32"


def test_depth_block_holds_the_deepest_path():
    assert depth_block(40, 3) == 4 and depth_block(15, 3) == 4 and depth_block(4, 3) == 4
    assert depth_block(1, 0) == 2 and depth_block(40, None) == 64 and depth_block(9, 4) == 8
    assert depth_block(5, 99) == 8   # a bound above T - 1 is cut to T - 1


@pytest.mark.parametrize("widths", [(1,), (4,), (2, 2, 2), (3, 3, 3), (1, 1, 1, 1, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("bound", ["exact", "loose", "no-prefetch"])
def test_path_kernel_matches_the_reference(widths, bound):
    """Stars, (2,2,2), (3,3,3) and a deep chain, with the exact depth or the always-safe bound T - 1, with the
    state loads one chunk ahead or not, a pending commit from a random tree folded in first."""
    tree = DraftTree.from_widths(widths)
    gen = torch.Generator().manual_seed(len(widths) * 7 + sum(widths))
    B, H, HV, K, V = 2, 2, 4, 20, 12
    prev = torch.tensor([random_tree(6, gen).parents.tolist() for _ in range(B)], dtype=torch.int32)
    S, pend, w1, ref64, ref32 = case_step(B, H, HV, K, V, prev, tree.parents, gen)
    state = S.clone()
    o, u = tree_verify_fwd(*w1, state, tree.parents.to(DEVICE, torch.int32), 0, K ** -0.5, pending=pend,
                           kernel="path", max_depth=None if bound == "loose" else tree.max_depth,
                           config=config(16, 16, 4, 1, 16, False) if bound == "no-prefetch" else None)
    close_step(o, u, state, ref64, ref32, o_tf32=O_TF32)


@pytest.mark.parametrize("kernel", ["path", "path_split"])
def test_path_kernel_random_trees_per_request_with_num_nodes(kernel):
    """Every request its own random tree, cut short by num_nodes (zeros past it), keys normalized in kernel."""
    gen = torch.Generator().manual_seed(3)
    B, H, HV, K, V, T = 3, 1, 2, 16, 20, 23
    par = torch.tensor([random_tree(T, gen).parents.tolist() for _ in range(B)], dtype=torch.int32)
    q, k, v, g, beta = window(B, T, H, HV, K, V, gen)
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(DEVICE)
    nn = torch.tensor([T, 9, 0], dtype=torch.int32)
    o, u = tree_verify(q, k, v, g, beta, S.clone(), par, use_qk_l2norm_in_kernel=True, num_nodes=nn.to(DEVICE),
                       kernel=kernel)
    for b in range(B):
        n = int(nn[b])
        assert not o[b, n:].any() and not u[b, n:].any()
        if n:
            (ro, ru, _), (ro32, ru32, _) = (
                naive_tree_step(*(normalized(x[b:b + 1, :n].to(dt)) for x in (q, k)),
                                *[x[b:b + 1, :n].to(dt) for x in (v, g, beta)], S[b:b + 1].to(dt), par[b, :n])
                for dt in (torch.float64, torch.float32))
            close("u", u[b:b + 1, :n], ru, ru32)
            if O_TF32:
                assert rel(o[b:b + 1, :n], ro) < O_TF32_TOL
            else:
                close("o", o[b:b + 1, :n], ro, ro32)


@pytest.mark.parametrize("kernel", ["path", "path_split"])
def test_a_depth_bound_that_does_not_hold_gives_nan_not_wrong_numbers(kernel):
    tree = DraftTree.from_widths((2, 2, 2))   # depth 3: tables of BD = 2 cannot hold it
    gen = torch.Generator().manual_seed(4)
    w = window(1, tree.num_nodes, 1, 1, 16, 16, gen)
    S = torch.randn(1, 1, 16, 16, generator=gen).to(DEVICE)
    o, u = tree_verify_fwd(*w, S, tree.parents.to(DEVICE, torch.int32), 0, 0.25, kernel=kernel, max_depth=1)
    assert torch.isnan(o).all() and torch.isnan(u).all()
    with pytest.raises(ValueError, match="max_depth = 1 but the window is 3 deep"):
        tree_verify(*w, S, tree, kernel=kernel, max_depth=1)


def test_depth_is_found_from_host_and_device_parents_and_asked_for_inside_capture(monkeypatch):
    """tree_verify sizes the tables from the windows' depth: a DraftTree, a list, a per-request tensor, the
    device tensor outside capture."""
    seen = []
    real = verify_mod.path_fwd
    monkeypatch.setattr(verify_mod, "path_fwd", lambda *a, **kw: (seen.append(kw["max_depth"]), real(*a, **kw))[1])
    gen = torch.Generator().manual_seed(6)
    tree = DraftTree.from_widths((3, 2))
    w = window(2, tree.num_nodes, 1, 1, 16, 16, gen)
    S = torch.zeros(2, 1, 16, 16, device=DEVICE)
    per_req = torch.stack([tree.parents, DraftTree.from_widths((9,)).parents]).to(torch.int32)
    for parents in (tree, tree.parents.tolist(), per_req, per_req.to(DEVICE)):
        tree_verify(*w, S.clone(), parents)
    assert seen == [2, 2, 2, 2]
    assert int(path_depth(per_req).max()) == 2


@pytest.mark.gpu
def test_inside_capture_device_parents_need_max_depth(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    tree = DraftTree.from_widths((3, 2))
    w = window(2, tree.num_nodes, 1, 1, 16, 16, gen)
    S = torch.zeros(2, 1, 16, 16, device=DEVICE)
    monkeypatch.setattr(verify_mod, "is_capturing", lambda: True)
    with pytest.raises(ValueError, match="max_depth = None inside a CUDA-graph capture"):
        tree_verify(*w, S.clone(), tree.parents.to(DEVICE, torch.int32), chain=False)


def test_configs_are_picked_by_window():
    configs = [config(*c) for c in sorted({c for cs in CONFIGS.values() for c in cs})]
    for (prec, BT), want in CONFIGS.items():
        got = _prune(configs, {"BT": BT, "V": 128, "DOT_PRECISION": prec})
        assert sorted(_config_key(c) for c in got) == sorted(want)
    narrow = _prune(configs, {"BT": 16, "V": 20, "DOT_PRECISION": "tf32"})
    assert narrow and all(c.kwargs["BV"] <= 32 for c in narrow)
    for key, want in SINGLE_REQUEST.items():   # one request: no autotuning, the pinned config
        got = _prune(configs, {"BT": key[1], "V": 128, "DOT_PRECISION": key[0], "B_BUCKET": 1})
        assert [_config_key(c) for c in got] == [want] and want in CONFIGS[key]
    assert len(_prune(configs, {"BT": 64, "V": 128, "DOT_PRECISION": "tf32", "B_BUCKET": 4})) > 1
    for (prec, BT), want in CONFIGS.items():   # the split launch's streaming kernel: one stage only (spills)
        got = _prune(configs, {"BT": BT, "V": 128, "DOT_PRECISION": prec, "HAS_TABLES": True})
        assert got and all(c.num_stages == 1 for c in got)
        assert sorted(_config_key(c) for c in got) == sorted(c for c in want if c[3] == 1)


@pytest.mark.parametrize("kernel", ["path", "path_split"])
def test_pending_path_rows_then_tree_in_a_state_pool(kernel):
    """The plugin's layout: states and pending stash in pool slots, a tree window verified from them."""
    gen = torch.Generator().manual_seed(9)
    B, H, HV, K, V, T, slots_total = 2, 1, 2, 16, 8, 13, 5
    tree = DraftTree.from_widths((3, 3))
    par = tree.parents.to(DEVICE, torch.int32)
    slots = torch.tensor([3, 0], device=DEVICE, dtype=torch.int32)
    pool = (torch.randn(slots_total, HV, V, K, generator=gen) * 0.3).to(DEVICE)
    stash = [torch.randn(slots_total, T, *s, generator=gen).to(DEVICE) for s in ((HV, V), (H, K), (HV,))]
    stash[2] = -stash[2].abs() / 4
    acc = torch.tensor([5, 12], device=DEVICE, dtype=torch.int32)
    q, k, v, g, beta = window(B, T, H, HV, K, V, gen)
    ref_state = pool[slots.long()].clone()
    ref64, ref32 = (naive_tree_step(*[x.to(dt) for x in (q, k, v, g, beta)], ref_state.to(dt), tree.parents,
                                    pending=PendingCommit(*(x[slots.long()].to(dt) for x in stash), tree.parents,
                                                          acc.cpu()))
                    for dt in (torch.float64, torch.float32))
    o, u = tree_verify_fwd(q, k, v, g, beta, pool, par, 0, K ** -0.5, pending=PendingCommit(*stash, par, acc),
                           kernel=kernel, max_depth=tree.max_depth, state_indices=slots)
    close_step(o, u, pool[slots.long()], ref64, ref32, o_tf32=O_TF32)
