"""The plugin's one-launch spec step (``spec_step`` / ``spec_step_gated`` / ``flush_slots``) against its loop twins.

Claims, on random packed batches with awkward sizes (GVA 3, head dims that are no powers of two, ragged windows and
empty ones, padding rows on slots 0 and -1, pools laid out as vLLM lays out a Mamba page over NaN garbage):
- over several steps (each folding the previous window's accepted node) the outputs, the committed states and the
  stash u / g are within the fp32 bound of the fp64 twin, the stashed keys are the raw keys exactly, and the stash
  length is the window's (no count left in the meta word); the NULL block's state is never written;
- the raw gates give what ``gdn_gating``'s gates give;
- a flush commits the accepted node without a host sync, and leaves padding and idle slots as they are;
- the whole spec step is one kernel launch and no torch op that would launch device work (it was 59 + 1).
"""

from __future__ import annotations

import copy

import pytest
import torch

from treewy.ops.gates import gdn_gating
from treewy.serve.reconstruct import (
    ReconstructPools,
    flush_slots,
    naive_flush_slots,
    naive_spec_step,
    naive_spec_step_gated,
    spec_step,
    spec_step_gated,
    stash_layout,
    vllm_spec_update,
)
from treewy.testing import assert_close_fp32 as close

H, HV, K, V, T = 2, 6, 12, 10, 4
SLOTS = 8
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def page_pools(num_blocks=SLOTS):
    """Pools as strided views of one NaN-filled buffer, one page per slot (vLLM's layout), meta zeroed."""
    shapes, dtypes = stash_layout(H=H, HV=HV, K=K, V=V, max_nodes=T)
    shapes, dtypes = ((HV, V, K), *shapes), (torch.float32, *dtypes)
    sizes = [torch.Size(s).numel() * 4 for s in shapes]             # every part is 4-byte
    page = sum(sizes)
    raw = torch.full((num_blocks * page // 4,), -1, dtype=torch.int32, device=DEVICE)   # NaN as fp32
    views, off = [], 0
    for shape, dtype, size in zip(shapes, dtypes, sizes):
        inner = torch.empty(shape).stride()
        views.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape), (page // 4, *inner), off // 4))
        off += size
    pools = ReconstructPools(*views)
    pools.meta.zero_()
    pools.state.copy_(torch.randn(num_blocks, HV, V, K, generator=torch.Generator().manual_seed(7)) * 0.3)
    return pools


def as_dtype(pools, dtype):
    return ReconstructPools(*(x.to(dtype) if x.is_floating_point() else x.clone()
                              for x in (pools.state, pools.u, pools.k, pools.g, pools.meta)))


def batch(gen, lens, slots):
    """A packed step: q, k, v, raw gates (a, b with two rows of padding past N, as vLLM hands them over)."""
    N = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)
    x = dict(q=r(N, H, K), k=r(N, H, K), v=r(N, HV, V), A_log=r(HV) * 0.5, a=r(N + 2, HV) * 2, b=r(N + 2, HV),
             dt_bias=r(HV))
    return {n: t.to(DEVICE) for n, t in x.items()}, cu.to(DEVICE), torch.tensor(slots, device=DEVICE)


def run_step(pools, x, cu, slots, acc, gated):
    refs = {dt: as_dtype(pools, dt) for dt in (torch.float64, torch.float32)}
    if gated:
        o = spec_step_gated(pools, slots, acc, x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], cu)
        ro = {dt: naive_spec_step_gated(p, slots, acc, x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"],
                                        x["dt_bias"], cu, dtype=dt) for dt, p in refs.items()}
    else:
        g, beta = gdn_gating(x["A_log"], x["a"][: x["q"].shape[0]], x["b"][: x["q"].shape[0]], x["dt_bias"])
        o = spec_step(pools, slots, acc, x["q"], x["k"], x["v"], g, beta, cu)
        ro = {dt: naive_spec_step(p, slots, acc, x["q"], x["k"], x["v"], g, beta, cu, dtype=dt)
              for dt, p in refs.items()}
    return o, ro, refs


@pytest.mark.parametrize("gated", [True, False], ids=["raw-gates", "given-gates"])
def test_spec_steps_match_the_loop_twin(gated):
    gen = torch.Generator().manual_seed(int(gated))
    pools = page_pools()
    null_state = pools.state[0].clone()
    steps = [([4, 2, 0, 3, 2], [3, 5, 2, 0, -1], [1, 1, 1, 1, 1]),     # fresh slots: nothing pending
             ([1, 4, 3, 0, 4], [3, 5, 2, 6, 0], [3, 2, 1, 1, 1]),     # ragged windows, one idle row
             ([3, 4, 2, 1, 4], [5, 3, 6, 2, 7], [4, 1, 1, 3, 1])]     # slot 6 joined empty, 7 is fresh
    for step, (lens, slots, acc) in enumerate(steps if gated else steps[:2]):     # given gates: one fold is enough
        x, cu, slots = batch(gen, lens, slots)
        acc = torch.tensor(acc, device=DEVICE)
        o, ro, refs = run_step(pools, x, cu, slots, acc, gated)
        real = ~torch.isnan(ro[torch.float64][:, 0, 0])
        assert int(real.sum()) == sum(n for n, s in zip(lens, slots.tolist()) if s > 0)
        close(f"step {step}: outputs", o[real].cpu(), ro[torch.float64][real].cpu(), ro[torch.float32][real].cpu())
        for s in sorted({int(s) for s in slots if s > 0}):
            L = int(refs[torch.float64].meta[s, 0])
            assert int(pools.meta[s, 0]) == L, f"step {step}: slot {s}: stash length"
            close(f"step {step}: state of slot {s}", pools.state[s].cpu(), *(r.state[s].cpu() for r in refs.values()))
            if L:
                close(f"step {step}: stash u of slot {s}", pools.u[s, :L].cpu(),
                      *(r.u[s, :L].cpu() for r in refs.values()))
                close(f"step {step}: stash g of slot {s}", pools.g[s, :L].cpu(),
                      *(r.g[s, :L].cpu() for r in refs.values()))
                assert torch.equal(pools.k[s, :L], refs[torch.float32].k[s, :L]), f"step {step}: stashed keys"
        assert torch.equal(pools.state[0].view(torch.int32), null_state.view(torch.int32)), "NULL block written"


@pytest.mark.parametrize("accepted", [0, 2])
def test_flush_commits_the_accepted_node_without_a_host_sync(accepted):
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(3)
    pools = page_pools()
    x, cu, slots = batch(gen, [3, 4, 3], [2, 4, 5])
    spec_step_gated(pools, slots, torch.ones(3, device=DEVICE), x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"],
                    x["dt_bias"], cu)
    flush = torch.tensor([4, 0, 2, -1, 6, 5], dtype=torch.int32, device=DEVICE)   # 6: nothing pending
    refs = {dt: as_dtype(pools, dt) for dt in (torch.float64, torch.float32)}
    for dt, p in refs.items():
        naive_flush_slots(p, flush, accepted, dtype=dt)
    before = pools.state.clone()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        flush_slots(pools, flush, accepted)
    syncs = {e.name for e in prof.events()} & {"aten::nonzero", "aten::item", "aten::_local_scalar_dense"}
    assert not syncs, f"flush_slots synced with the host: {syncs}"
    for s in (2, 4, 5):
        close(f"flushed state of slot {s}", pools.state[s].cpu(), *(r.state[s].cpu() for r in refs.values()))
    for s in (0, 1, 3, 6, 7):
        assert torch.equal(pools.state[s].view(torch.int32), before[s].view(torch.int32)), f"slot {s} written"
    assert pools.meta[:, 0].tolist() == [0] * SLOTS


def test_vllm_spec_update_takes_vllm_arguments():
    gen = torch.Generator().manual_seed(5)
    pools = page_pools()
    x, cu, slots = batch(gen, [2, 3, 0], [1, 4, 0])
    idx = slots[:, None].repeat(1, T).to(torch.int32)         # store-all's k + 1 blocks per request: column 0 is ours
    acc = torch.ones(3, dtype=torch.int32, device=DEVICE)
    twin = copy.deepcopy(pools)
    o, none = vllm_spec_update(pools, A_log=x["A_log"], a=x["a"], b=x["b"], dt_bias=x["dt_bias"], q=x["q"][None],
                               k=x["k"][None], v=x["v"][None], cu_seqlens=cu, ssm_state_indices=idx,
                               num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, initial_state=pools.state,
                               inplace_final_state=True)
    ref = spec_step_gated(twin, slots, acc, x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], cu)
    assert none is None and o.shape == (1, 5, HV, V)
    assert torch.equal(o[0], ref) and torch.equal(pools.u[1, :2], twin.u[1, :2]) and torch.equal(pools.meta, twin.meta)


def test_spec_step_is_one_launch_and_no_torch_op(monkeypatch):
    monkeypatch.undo()     # conftest's NaN-filled torch.empty is a fill of its own
    from benchmarks import count_spec_step_ops as count

    step, flush = count.reconstruct_fns(4, 4)
    for what, fn in (("spec step", step), ("flush", flush)):
        with count.reconstruct_kernels(stub=True):
            ops, syncs = count.launches(fn)
        assert [k for k, _ in ops] == ["kernel chain_spec_step_kernel"] and not syncs, f"{what}: {ops}, {syncs}"


def test_engine_profile_tables_sum_kernels_per_layer_kind():
    from benchmarks import profile_serving_step as prof

    assert prof.layer_kind("chain_spec_step_kernel") == prof.layer_kind(
        "fused_sigmoid_gating_delta_rule_update_kernel") == "gdn spec step"
    assert prof.layer_kind("_causal_conv1d_update_kernel") == "gdn conv"
    assert prof.layer_kind("fused_moe_kernel") == "moe" and prof.layer_kind("nvjet_tst_128x64") == "gemm"
    assert prof.layer_kind("some_new_kernel") == "other"
    events = [("chain_spec_step_kernel", 5.0)] * 60 + [("fused_moe_kernel", 20.0)] * 80 + [("zz", 1.0)] * 2
    t = prof.kernel_table(events, steps=2)
    assert t["kinds"] == {"moe": 800.0, "gdn spec step": 150.0, "other": 1.0}
    assert t["kernels"]["chain_spec_step_kernel"] == dict(kind="gdn spec step", us_per_step=150.0,
                                                          launches_per_step=30.0)
    meta = dict(acceptance_rates="0.8", device="h200", date="d", how="h")
    reports = [dict(meta=dict(meta, mode=m), batches={"16": dict(step_ms_median=ms, **t)})
               for m, ms in (("reconstruct", 20.0), ("store_all", 21.0))]
    text = prof.engine_text(reports)
    assert "B = 16: host step (ms) store_all 21.00, reconstruct 20.00" in text
    assert "gdn spec step" in text and "150.0" in text
