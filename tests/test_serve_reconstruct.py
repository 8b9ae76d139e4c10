"""The plugin's reconstruct commit (treewy.serve.reconstruct) against vLLM's store-all semantics.

Two engines run the same random serving trace side by side: store-all (1 + N slots per request,
every node's state written, the next step reading the accepted snapshot) and reconstruct (one slot
per request, the pending commit folded into the next verify). Requests join and leave, the batch
holds padding rows pointing at the NULL block 0, windows are chains or trees, acceptances random.
The claim: identical outputs every step and identical states whenever the reconstruct slot is
folded (fp64 to 1e-12, fp32 to 1e-5).
"""

from __future__ import annotations

import pytest
import torch

from treewy.ops.gates import gdn_gating, l2norm
from treewy.serve.reconstruct import (
    ReconstructPools,
    conv_spec_step,
    fold_pending,
    gdn_spec_step,
    reset_slots,
    stash_shapes,
    store_all_step,
)
from treewy.tree import DraftTree

H, HV, K, V, W = 2, 4, 8, 6, 4
C = 2 * H * K + HV * V


def _rel(a, b):
    return float((a - b).norm() / (b.norm() + 1e-30))


def _random_tree(gen, T):
    return [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]


class _Trace:
    def __init__(self, dtype, gen, weight, bias, A_log, dt_bias):
        self.dtype, self.gen = dtype, gen
        self.weight, self.bias, self.A_log, self.dt_bias = weight, bias, A_log, dt_bias

    def make_qkvgb(self, y, ab):
        B, T, _ = y.shape
        q, k, v = torch.split(y, [H * K, H * K, HV * V], dim=-1)
        q = l2norm(q.reshape(B, T, H, K)).to(self.dtype)
        k = l2norm(k.reshape(B, T, H, K)).to(self.dtype)
        v = v.reshape(B, T, HV, V)
        g, beta = gdn_gating(self.A_log, ab[..., 0], ab[..., 1], self.dt_bias)
        return q, k, v, g.to(self.dtype), beta.to(self.dtype)


def _run_trace(*, dtype, tol, steps, tree_mode, seed, max_nodes):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    weight, bias = rnd(C, W) * 0.5, rnd(C) * 0.1
    A_log, dt_bias = rnd(HV) * 0.3, rnd(HV) * 0.3
    tr = _Trace(dtype, gen, weight, bias, A_log, dt_bias)

    R_SLOTS, S_SLOTS = 12, 12 * max_nodes + 1
    rp = ReconstructPools.empty(R_SLOTS, H=H, HV=HV, K=K, V=V, C=C, W=W, max_nodes=max_nodes,
                                state_dtype=dtype, conv_dtype=dtype, stash_dtype=dtype)
    s_state = torch.zeros(S_SLOTS, HV, V, K, dtype=dtype)
    s_conv = torch.zeros(S_SLOTS, C, W - 1, dtype=dtype)
    for pool in (rp.state, rp.conv, rp.conv_x, rp.u, rp.k, rp.g, s_state, s_conv):
        pool[0] = float("nan")                                       # the NULL block: never read or written
    free_r = list(range(1, R_SLOTS))
    free_s = [list(range(1 + i * max_nodes, 1 + (i + 1) * max_nodes)) for i in range(11)]
    reqs: dict[int, dict] = {}
    next_id, checked_states = 0, 0

    for step in range(steps):
        # requests leave, then join (a prefill writes the slot's state and conv inputs directly)
        for rid in list(reqs):
            if torch.rand(1, generator=gen) < 0.15:
                r = reqs.pop(rid)
                free_r.append(r["slot"])
                free_s.append(r["slots"])
        while free_r and len(reqs) < 8 and torch.rand(1, generator=gen) < 0.6:
            slot, slots = free_r.pop(0), free_s.pop(0)
            S_init, conv_init = rnd(HV, V, K) * 0.3, rnd(C, W - 1)
            rp.state[slot], rp.conv[slot] = S_init, conv_init
            reset_slots(rp, [slot])
            s_state[slots[0]], s_conv[slots[0]] = S_init, conv_init
            reqs[next_id] = {"slot": slot, "slots": slots, "acc": 0}
            next_id += 1
        if not reqs:
            continue

        order = list(reqs)
        order = [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]
        rows = order + [None] * int(torch.randint(0, 3, (1,), generator=gen))  # padding rows
        perm = torch.randperm(len(rows), generator=gen).tolist()
        rows = [rows[i] for i in perm]
        B = len(rows)
        T = int(torch.randint(1, max_nodes + 1, (1,), generator=gen)) if tree_mode != "fixed" else max_nodes
        if tree_mode == "chain":
            parents = torch.as_tensor(DraftTree.chain(T - 1).parents).expand(B, T)
        else:
            parents = torch.tensor([_random_tree(gen, T) for _ in range(B)])

        block_idx = torch.tensor([reqs[r]["slot"] if r is not None else 0 for r in rows])
        accepted = torch.tensor([reqs[r]["acc"] if r is not None else 0 for r in rows])
        s_idx = torch.stack([torch.tensor(reqs[r]["slots"][:max_nodes]) if r is not None
                             else torch.zeros(max_nodes, dtype=torch.long) for r in rows])
        x = rnd(B, T, C)
        before = {r: s_state[reqs[r]["slots"][reqs[r]["acc"]]].clone() for r in rows if r is not None}
        ab = rnd(B, T, HV, 2)

        y_s, o_s = store_all_step(s_state, s_conv, s_idx, accepted + 1, x, weight,
                                  lambda y: tr.make_qkvgb(y, ab), parents, bias=bias)
        y_r = conv_spec_step(rp, block_idx, accepted, x, weight, parents, bias=bias)
        q, k, v, g, beta = tr.make_qkvgb(y_r, ab)
        o_r = gdn_spec_step(rp, block_idx, accepted, q, k, v, g, beta, parents)

        assert _rel(y_r, y_s) < tol, f"step {step}: conv outputs differ"
        assert _rel(o_r, o_s) < tol, f"step {step}: outputs differ"
        pad = block_idx <= 0
        assert torch.all(o_r[pad] == 0) and torch.all(y_r[pad] == 0)

        # the reconstruct slot now holds the state committed before this window: the snapshot store-all read
        for r, snap in before.items():
            assert _rel(rp.state[reqs[r]["slot"]], snap) < tol, f"step {step}: committed state of request {r}"
        # acceptance: a random node of each request's own tree
        for b, r in enumerate(rows):
            if r is not None:
                reqs[r]["acc"] = int(torch.randint(0, T, (1,), generator=gen))

        # every few steps, fold the pending commits and compare every request's state with store-all
        if step % 5 == 4:
            live = list(reqs)
            fold_pending(rp, torch.tensor([reqs[r]["slot"] for r in live]), torch.tensor([reqs[r]["acc"] for r in live]))
            for r in live:
                req = reqs[r]
                snap = req["slots"][req["acc"]]
                assert _rel(rp.state[req["slot"]], s_state[snap]) < tol, f"step {step}: state of request {r}"
                assert _rel(rp.conv[req["slot"]], s_conv[snap]) < tol, f"step {step}: conv state of request {r}"
                checked_states += 1
            # the folded slot is now the committed state; store-all's next read is the same snapshot
            for r in live:
                req = reqs[r]
                s_state[req["slots"][0]], s_conv[req["slots"][0]] = s_state[req["slots"][req["acc"]]].clone(), \
                    s_conv[req["slots"][req["acc"]]].clone()
                req["acc"] = 0

    for pool in (rp.state, rp.conv, rp.conv_x, rp.u, rp.k, rp.g, s_state, s_conv):
        assert bool(torch.isnan(pool[0]).all()), "the NULL block 0 was written"
    assert checked_states > 20
    return next_id


@pytest.mark.parametrize("tree_mode,max_nodes", [("chain", 4), ("tree", 7), ("fixed", 5)],
                         ids=["chain-k3-ragged", "random-trees-T<=7", "random-trees-T=5"])
def test_reconstruct_is_store_all_fp64(tree_mode, max_nodes):
    joined = _run_trace(dtype=torch.float64, tol=1e-12, steps=40, tree_mode=tree_mode, seed=1, max_nodes=max_nodes)
    assert joined > 8  # requests did join (and leave) during the trace


def test_reconstruct_is_store_all_fp32():
    _run_trace(dtype=torch.float32, tol=1e-5, steps=30, tree_mode="tree", seed=2, max_nodes=6)


def test_pending_commit_is_not_applied_twice():
    """fold_pending leaves nothing pending: folding again (any accepted) changes nothing."""
    gen = torch.Generator().manual_seed(3)
    rp = ReconstructPools.empty(3, H=1, HV=2, K=4, V=3, C=5, W=4, max_nodes=3, state_dtype=torch.float64,
                                conv_dtype=torch.float64, stash_dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 3, 2, 3, generator=gen, dtype=torch.float64)
    g, beta = -torch.rand(1, 3, 2, dtype=torch.float64), torch.rand(1, 3, 2, dtype=torch.float64)
    gdn_spec_step(rp, [2], [0], q, k, v, g, beta, [-1, 0, 1])
    assert int(rp.meta[2, 0]) == 3
    fold_pending(rp, [2], [2])
    once = rp.state[2].clone()
    assert int(rp.meta[2, 0]) == 0 and not torch.equal(once, torch.zeros_like(once))
    fold_pending(rp, [2], [1])
    assert torch.equal(rp.state[2], once)


def test_bad_rows_say_what_is_wrong():
    rp = ReconstructPools.empty(3, H=1, HV=1, K=2, V=2, C=3, W=4, max_nodes=2)
    q = torch.zeros(2, 2, 1, 2)
    v, g = torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1)
    with pytest.raises(ValueError, match="one slot for two rows"):
        gdn_spec_step(rp, [1, 1], [0, 0], q, q, v, g, g, [-1, 0])
    with pytest.raises(ValueError, match="stash holds 2"):
        gdn_spec_step(rp, [1, 2], [0, 0], torch.zeros(2, 3, 1, 2), torch.zeros(2, 3, 1, 2),
                      torch.zeros(2, 3, 1, 2), torch.zeros(2, 3, 1), torch.zeros(2, 3, 1), [-1, 0, 1])
    gdn_spec_step(rp, [1, 2], [0, 0], q, q, v, g, g, [-1, 0])
    with pytest.raises(ValueError, match="pending window has 2 nodes"):
        gdn_spec_step(rp, [1, 2], [5, 0], q, q, v, g, g, [-1, 0])
    with pytest.raises(ValueError, match="backend"):
        gdn_spec_step(rp, [1, 2], [0, 0], q, q, v, g, g, [-1, 0], backend="cuda")


def test_gating_matches_the_formula():
    A_log, dt_bias = torch.tensor([0.1, -0.4]), torch.tensor([0.2, 0.0])
    a, b = torch.tensor([[3.0, 30.0]]), torch.tensor([[0.0, 2.0]])
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    x = a + dt_bias
    sp = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    assert torch.allclose(g, -A_log.exp() * sp) and torch.allclose(beta, torch.sigmoid(b))
    assert bool((g <= 0).all())


def test_stash_is_small_next_to_store_all():
    """Qwen3.5-35B-A3B shapes, chain k = 3: the stash is a few percent of the 3 snapshots it replaces."""
    shapes = stash_shapes(H=16, HV=32, K=128, V=128, C=8192, max_nodes=4)
    elems = {n: torch.Size(s).numel() for n, s in shapes.items()}
    stash_bytes = elems["conv_x"] * 2 + (elems["u"] + elems["k"] + elems["g"] + elems["meta"]) * 4
    snapshot = 32 * 128 * 128 * 4
    assert stash_bytes < 0.1 * 3 * snapshot
