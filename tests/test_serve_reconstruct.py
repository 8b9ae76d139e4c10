"""The plugin's reconstruct step (treewy.serve.reconstruct) against vLLM's store-all semantics.

Two engines run the same random serving trace side by side: store-all (every node's state kept, the
next step starting from the accepted node's state) and reconstruct (one slot per request in a pool
laid out as vLLM lays out a Mamba page, the pending commit folded into the next verify by the
kernel). Requests join (a prefill writes their slot) and leave, slots are reused, windows are ragged
(fewer drafts), the batch has padding rows on the NULL block 0, acceptances are random. The claim:
identical outputs every step and identical committed states after a flush (in fp32: within the bound from
the store-all reference run in fp32 beside the fp64 one, ``treewy.testing.fp32_bound``); the NULL block's
state is never written.
"""

from __future__ import annotations

import pytest
import torch

from treewy.ops import naive_tree_recurrent
from treewy.ops.verify.chain import fixed_config
from treewy.serve.reconstruct import (
    ReconstructPools,
    flush_slots,
    pack_index,
    reset_slots,
    spec_step,
    stash_layout,
    unpack_index,
)
from treewy.testing import assert_close_fp32 as close
from treewy.tree import DraftTree

H, HV, K, V, T = 2, 4, 8, 6, 4
#: The kernels run on the GPU where there is one, else under the Triton interpreter on the CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def page_views(num_blocks: int, shapes, dtypes):
    """Views of one raw buffer as vLLM 0.26's model runner makes them for a MambaSpec: per tensor
    [num_blocks, *shape], slot stride = the page size, each tensor at its byte offset in the page."""
    sizes = [torch.Size(s).numel() * torch.empty(0, dtype=d).element_size() for s, d in zip(shapes, dtypes)]
    page = sum(sizes)
    raw = torch.full((num_blocks * page,), 255, dtype=torch.uint8, device=DEVICE)   # NaN garbage everywhere
    out, off = [], 0
    for shape, dtype, size in zip(shapes, dtypes, sizes):
        es = torch.empty(0, dtype=dtype).element_size()
        assert off % es == 0 and page % es == 0
        stride = torch.empty(num_blocks, *shape).stride()
        out.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape), (page // es, *stride[1:]), off // es))
        off += size
    return out


def _pools(num_blocks):
    shapes, dtypes = stash_layout(H=H, HV=HV, K=K, V=V, max_nodes=T)
    conv, state, u, k, g, meta = page_views(num_blocks, ((HV * V + 2 * H * K, 3 + T - 1), (HV, V, K), *shapes),
                                            (torch.bfloat16, torch.float32, *dtypes))
    meta.zero_()                                        # vLLM zero-fills the KV cache
    return ReconstructPools(state, u, k, g, meta)


def _window(gen, L):
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return r(L, H, K), r(L, H, K), r(L, HV, V), -torch.rand(L, HV, generator=gen) * 2, torch.rand(L, HV, generator=gen)


def _dev(*xs):
    return [x.to(DEVICE) for x in xs]


def _l2norm(x):
    """fla's l2norm (treewy.ops.gates.l2norm, as the kernels apply it), in x's dtype."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _store_all(state, w, dtype):
    """States after every node of a chain window, and its outputs, the reference run in ``dtype``."""
    q, k, v, g, beta = (x.to(dtype)[None] for x in w)
    o, states = naive_tree_recurrent(_l2norm(q), _l2norm(k), v, g, beta, state.to(dtype)[None],
                                     DraftTree.chain(q.shape[1] - 1).parents)
    return o[0], states[0]


DTYPES = (torch.float64, torch.float32)   # each reference runs in both: fp32's error gives the bound


@pytest.mark.parametrize("seed", [0, 1])
def test_reconstruct_pool_equals_store_all(seed):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 9
    pools = _pools(num_blocks)
    null_state = pools.state[0].clone()
    free = list(range(1, num_blocks))
    live = {}              # request -> [slot, committed state (fp64, fp32), the last window's states (fp64, fp32)]
    next_id = 0
    for step in range(14):
        # requests leave, new ones join through a "prefill" that writes their slot's state
        for rid in list(live):
            if torch.rand(1, generator=gen) < 0.2:
                free.append(live.pop(rid)[0])
        while free and len(live) < 5 and torch.rand(1, generator=gen) < 0.7:
            slot = free.pop(int(torch.randint(0, len(free), (1,), generator=gen)))
            S = torch.randn(HV, V, K, generator=gen) * 0.3
            pools.state[slot] = S.to(DEVICE)
            reset_slots(pools, torch.tensor([slot], device=DEVICE))
            live[next_id] = [slot, (S.double(), S), None]
            next_id += 1
        if not live:
            continue
        rids = list(live)
        lens = [int(torch.randint(1, T + 1, (1,), generator=gen)) for _ in rids]
        windows = [_window(gen, L) for L in lens]
        num_acc = []
        for rid in rids:                                 # the previous window's accepted count
            prev = live[rid][2]
            num_acc.append(1 if prev is None else int(torch.randint(1, prev[0].shape[0] + 1, (1,), generator=gen)))
            if prev is not None:
                live[rid][1] = tuple(states[num_acc[-1] - 1] for states in prev)
        pad = 2                                          # CUDA-graph padding rows: NULL block, no tokens
        slots = torch.tensor([live[r][0] for r in rids] + [0] * pad)
        cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens + [0] * pad), 0)), dtype=torch.int32)
        packed = [torch.cat([w[i] for w in windows]) for i in range(5)]
        acc_t = torch.tensor(num_acc + [1] * pad)
        o = spec_step(pools, *_dev(slots, acc_t, *packed), cu_seqlens=cu.to(DEVICE), config=fixed_config()).cpu()
        refs = []
        for rid, w in zip(rids, windows):
            (o64, states64), (o32, states32) = (_store_all(S, w, dt) for S, dt in zip(live[rid][1], DTYPES))
            live[rid][2] = (states64, states32)
            refs.append((o64, o32))
        close(f"step {step}: outputs against store-all", o, *(torch.cat(r) for r in zip(*refs)))
        assert torch.equal(pools.state[0].view(torch.int32), null_state.view(torch.int32)), "NULL block written"
    # a flush commits node 0 of the pending window, what store-all's column 0 holds
    slots = torch.tensor([live[r][0] for r in live], device=DEVICE)
    flush_slots(pools, slots)
    for rid in live:
        slot, _, (states64, states32) = live[rid]
        close(f"flushed state of slot {slot}", pools.state[slot].cpu(), states64[0], states32[0])
        assert int(pools.meta[slot, 0]) == 0


def test_pack_unpack_round_trip():
    cu = torch.tensor([0, 3, 4, 8, 8], dtype=torch.int32)
    x = torch.arange(8.0)[:, None]
    src, live, lens = pack_index(cu, 4, 4)
    assert lens.tolist() == [3, 1, 4, 0]
    w = x[src] * live[..., None]
    row, col = unpack_index(cu, 4, 8, 4)
    assert torch.equal(w[row, col], x)
    # a replayed CUDA graph may carry more tokens than the step (padding requests have none): in range
    cu = torch.tensor([0, 4, 5, 5, 5], dtype=torch.int32)
    row, col = unpack_index(cu, 4, 16, 4)
    assert row.tolist()[:5] == [0, 0, 0, 0, 1] and col.tolist()[:5] == [0, 1, 2, 3, 0]
    assert int(row.max()) < 4 and int(col.max()) < 4 and int(col.min()) >= 0


def test_empty_pools_have_the_stash_layout():
    p = ReconstructPools.empty(3, H=H, HV=HV, K=K, V=V, max_nodes=T)
    assert p.u.shape == (3, T, HV, V) and p.k.shape == (3, 2, T, H, K) and p.g.shape == (3, 2, T, HV)
    assert p.meta.shape == (3, 1) and p.meta.dtype == torch.int32 and p.max_nodes == T


@pytest.mark.parametrize("max_nodes", [0, 256])
def test_a_window_the_meta_word_cannot_hold_is_refused(max_nodes):
    with pytest.raises(ValueError, match=rf"max_nodes = {max_nodes}: the meta word holds lengths 1 to 255"):
        stash_layout(H=H, HV=HV, K=K, V=V, max_nodes=max_nodes)
