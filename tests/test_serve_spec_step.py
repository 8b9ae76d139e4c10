"""The plugin's one-launch spec step (``spec_step`` / ``spec_step_gated`` / ``flush_slots``) against its loop twins.

Claims, on random packed batches with awkward sizes (GVA 3, head dims that are no powers of two, ragged windows and
empty ones, padding rows on slots 0 and -1, pools laid out as vLLM lays out a Mamba page over NaN garbage):
- over several steps (each folding the previous window's accepted node) the outputs, the committed states and the
  stash u / g are within the fp32 bound of the fp64 twin, the stashed keys are the raw keys exactly, and the meta
  word is the twin's (length and half, no count left); the NULL block's state is never written;
- the keys and decays alternate between the stash's two halves step by step, as rows join, idle, flush, carry no
  tokens and pad (the twins run on copies of the pools: an fp32 twin on the kernel's own tensors would bound the
  kernel by itself);
- the raw gates give what ``gdn_gating``'s gates give;
- a flush commits the accepted node without a host sync, and leaves padding and idle slots as they are; a long
  window with strong decays commits within the bound too;
- the whole spec step is one kernel launch and no torch op that would launch device work (it was 59 + 1).
"""

from __future__ import annotations

import copy

import pytest
import torch

from treewy.ops.gates import gdn_gating
from treewy.ops.verify import chain
from treewy.ops.verify.chain import SPEC_STEP_BV
from treewy.serve.reconstruct import (
    LEN_BITS,
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

import triton  # noqa: E402,I001  (after treewy.ops, which starts the Triton interpreter on a CPU machine)

H, HV, K, V, T = 2, 6, 12, 10, 4
SLOTS = 8
DIMS = dict(H=H, HV=HV, K=K, V=V)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def page_pools(num_blocks=SLOTS, dims=DIMS, key_dtype=torch.float32):
    """Pools as strided views of one NaN-filled buffer, one page per slot (vLLM's layout), meta zeroed."""
    HV, V, K = dims["HV"], dims["V"], dims["K"]
    shapes, dtypes = stash_layout(**dims, max_nodes=T, key_dtype=key_dtype)
    shapes, dtypes = ((HV, V, K), *shapes), (torch.float32, *dtypes)
    sizes = [torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dtypes)]
    assert all(n % 4 == 0 for n in sizes)
    page = sum(sizes)
    raw = torch.full((num_blocks * page // 4,), -1, dtype=torch.int32, device=DEVICE)   # NaN as fp32 and bf16
    views, off = [], 0
    for shape, dtype, size in zip(shapes, dtypes, sizes):
        inner, n = torch.empty(shape).stride(), dtype.itemsize
        views.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape), (page // n, *inner), off // n))
        off += size
    pools = ReconstructPools(*views)
    pools.meta.zero_()
    pools.state.copy_(torch.randn(num_blocks, HV, V, K, generator=torch.Generator().manual_seed(7)) * 0.3)
    return pools


def as_dtype(pools, dtype):
    return ReconstructPools(*(x.to(dtype, copy=True) if x.is_floating_point() else x.clone()
                              for x in (pools.state, pools.u, pools.k, pools.g, pools.meta)))


def batch(gen, lens, slots, dims=DIMS, key_dtype=torch.float32):
    """A packed step: q, k, v, raw gates (a, b with two rows of padding past N, as vLLM hands them over); the keys
    representable in the stash's ``key_dtype`` (as a bf16 model's are)."""
    N, H, HV, K, V = sum(lens), dims["H"], dims["HV"], dims["K"], dims["V"]
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)
    x = dict(q=r(N, H, K), k=r(N, H, K).to(key_dtype).float(), v=r(N, HV, V), A_log=r(HV) * 0.5, a=r(N + 2, HV) * 2,
             b=r(N + 2, HV), dt_bias=r(HV))
    return {n: t.to(DEVICE) for n, t in x.items()}, cu.to(DEVICE), torch.tensor(slots, device=DEVICE)


def run_step(pools, x, cu, slots, acc, gated, config=None):
    refs = {dt: as_dtype(pools, dt) for dt in (torch.float64, torch.float32)}
    if gated:
        o = spec_step_gated(pools, slots, acc, x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], cu,
                            config=config)
        ro = {dt: naive_spec_step_gated(p, slots, acc, x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"],
                                        x["dt_bias"], cu, dtype=dt) for dt, p in refs.items()}
    else:
        g, beta = gdn_gating(x["A_log"], x["a"][: x["q"].shape[0]], x["b"][: x["q"].shape[0]], x["dt_bias"])
        o = spec_step(pools, slots, acc, x["q"], x["k"], x["v"], g, beta, cu, config=config)
        ro = {dt: naive_spec_step(p, slots, acc, x["q"], x["k"], x["v"], g, beta, cu, dtype=dt)
              for dt, p in refs.items()}
    return o, ro, refs


@pytest.mark.parametrize("gated,key_dtype", [(True, torch.float32), (False, torch.float32), (True, torch.bfloat16)],
                         ids=["raw-gates", "given-gates", "raw-gates-bf16-keys"])
def test_spec_steps_match_the_loop_twin(gated, key_dtype):
    """The keys stashed in bf16 (a served bf16 model's page) are the raw keys exactly too."""
    gen = torch.Generator().manual_seed(int(gated))
    pools = page_pools(key_dtype=key_dtype)
    null_state = pools.state[0].clone()
    steps = [([4, 2, 0, 3, 2], [3, 5, 2, 0, -1], [1, 1, 1, 1, 1]),     # fresh slots: nothing pending
             ([1, 4, 3, 0, 4], [3, 5, 2, 6, 0], [3, 2, 1, 1, 1]),     # ragged windows, one idle row
             ([3, 4, 2, 1, 4], [5, 3, 6, 2, 7], [4, 1, 1, 3, 1])]     # slot 6 joined empty, 7 is fresh
    for step, (lens, slots, acc) in enumerate(steps if gated else steps[:2]):     # given gates: one fold is enough
        x, cu, slots = batch(gen, lens, slots, key_dtype=key_dtype)
        acc = torch.tensor(acc, device=DEVICE)
        o, ro, refs = run_step(pools, x, cu, slots, acc, gated)
        real = ~torch.isnan(ro[torch.float64][:, 0, 0])
        assert int(real.sum()) == sum(n for n, s in zip(lens, slots.tolist()) if s > 0)
        close(f"step {step}: outputs", o[real].cpu(), ro[torch.float64][real].cpu(), ro[torch.float32][real].cpu())
        check_slots(f"step {step}", pools, refs, {int(s) for s in slots if s > 0})
        assert torch.equal(pools.state[0].view(torch.int32), null_state.view(torch.int32)), "NULL block written"


@pytest.mark.parametrize("bv", sorted({bv for _, bv in SPEC_STEP_BV}))
def test_every_batch_config_matches_the_loop_twin(bv):
    """Each value tile the spec step picks by batch (``SPEC_STEP_BV``), forced at K = 48, V = 40 (a partial last
    tile; with BV = 16 the key heads' programs split the keys 3 ways, with 8 5 ways): two steps, the second folding."""
    dims = dict(H=2, HV=4, K=48, V=40)
    config = triton.Config({"BV": bv, "FOLD_ROWS": 1}, num_warps=1, num_stages=1)
    gen = torch.Generator().manual_seed(bv)
    pools = page_pools(dims=dims)
    for step, (lens, slots, acc) in enumerate([([3, 4, 0], [2, 5, -1], [1, 1, 1]), ([4, 2, 3], [5, 2, 3], [3, 2, 1])]):
        x, cu, slots = batch(gen, lens, slots, dims)
        o, ro, refs = run_step(pools, x, cu, slots, torch.tensor(acc, device=DEVICE), gated=True, config=config)
        real = ~torch.isnan(ro[torch.float64][:, 0, 0])
        close(f"BV={bv} step {step}: outputs", o[real].cpu(), ro[torch.float64][real].cpu(),
              ro[torch.float32][real].cpu())
        check_slots(f"BV={bv} step {step}", pools, refs, {int(s) for s in slots if s > 0})


def test_the_spec_step_config_follows_the_batch(monkeypatch):
    """Off the interpreter the value tile steps up with the batch as ``SPEC_STEP_BV`` says (under it: one config)."""
    monkeypatch.setattr(chain, "INTERPRET", False)
    picked = {B: chain.spec_step_config(B).kwargs["BV"] for B in (0, 1, 3, 4, 255, 256)}
    assert picked == {0: 8, 1: 8, 3: 8, 4: 16, 255: 16, 256: 16}, picked
    assert all(chain.spec_step_config(B).kwargs["FOLD_ROWS"] == 1 for B in picked)


def check_slots(what, pools, refs, slots):
    """The states and pending windows of these slots against the twins': the meta word exactly (length, half, no
    count left), u / g within the fp32 bound, the raw keys exactly."""
    for s in sorted(slots):
        assert int(pools.meta[s, 0]) == int(refs[torch.float64].meta[s, 0]), f"{what}: slot {s}: meta word"
        close(f"{what}: state of slot {s}", pools.state[s].cpu(), *(r.state[s].cpu() for r in refs.values()))
        L, u, k, g = pools.pending_window(s)
        if L:
            twins = [r.pending_window(s) for r in refs.values()]
            close(f"{what}: stash u of slot {s}", u.cpu(), *(w[1].cpu() for w in twins))
            close(f"{what}: stash g of slot {s}", g.cpu(), *(w[3].cpu() for w in twins))
            assert torch.equal(k.float(), twins[1][2].float()), f"{what}: stashed keys of slot {s}"


def test_stash_halves_alternate_over_steps_as_rows_join_flush_and_pad():
    """Four steps and a flush at K = 48, V = 40, HV = 3H (15 programs per key head, the last three with no key
    share): each row's window goes to the half its meta word does not name, rows join fresh or after a flush (half
    0 again), sit idle with a window pending, carry no tokens (a fold, and nothing pending after), pad on 0 and -1."""
    dims = dict(H=1, HV=3, K=48, V=40)
    gen = torch.Generator().manual_seed(13)
    pools = page_pools(dims=dims)
    steps = [([4, 3, 0], [1, 2, 0], [1, 1, 1]),       # fresh: both windows to half 1
             ([2, 3, 0], [1, 3, -1], [3, 1, 1]),      # 1 folds half 1 and writes half 0; 3 joins; 2 idles
             "flush",                                 # 2 flushed at node 1; 4 has nothing pending
             ([3, 0, 2], [2, 1, 3], [1, 2, 3]),       # 2 fresh again; 1 carries no tokens; 3 back to half 0
             ([1, 4, 2], [1, 3, 2], [1, 2, 3])]
    halves = []
    for step, spec in enumerate(steps):
        if spec == "flush":
            flush = torch.tensor([2, 0, 4, -1], dtype=torch.int32, device=DEVICE)
            refs = {dt: as_dtype(pools, dt) for dt in (torch.float64, torch.float32)}
            for dt, p in refs.items():
                naive_flush_slots(p, flush, 1, dtype=dt)
            flush_slots(pools, flush, 1)
        else:
            lens, slots, acc = spec
            x, cu, slots = batch(gen, lens, slots, dims)
            o, ro, refs = run_step(pools, x, cu, slots, torch.tensor(acc, device=DEVICE), gated=True)
            real = ~torch.isnan(ro[torch.float64][:, 0, 0])
            close(f"step {step}: outputs", o[real].cpu(), ro[torch.float64][real].cpu(),
                  ro[torch.float32][real].cpu())
        check_slots(f"step {step}", pools, refs, range(1, SLOTS))
        halves.append([(w >> LEN_BITS, w & ((1 << LEN_BITS) - 1)) for w in pools.meta[1:4, 0].tolist()])
    assert halves == [[(1, 4), (1, 3), (0, 0)], [(0, 2), (1, 3), (1, 3)], [(0, 2), (0, 0), (1, 3)],
                      [(0, 0), (1, 3), (0, 2)], [(1, 1), (0, 2), (1, 4)]], halves     # (half, length) of slots 1-3


def flush_case():
    """Pools after one gated spec step over slots 2, 4 and 5 (3, 4 and 3 tokens), and the slots to flush (6: nothing
    pending). Also benchmarks/flush_error_probe.py's input."""
    gen = torch.Generator().manual_seed(3)
    pools = page_pools()
    x, cu, slots = batch(gen, [3, 4, 3], [2, 4, 5])
    spec_step_gated(pools, slots, torch.ones(3, device=DEVICE), x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"],
                    x["dt_bias"], cu)
    return pools, torch.tensor([4, 0, 2, -1, 6, 5], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("accepted", [0, 2])
def test_flush_commits_the_accepted_node_without_a_host_sync(accepted):
    from torch.profiler import ProfilerActivity, profile

    pools, flush = flush_case()
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


def test_a_long_window_with_strong_decays_commits_within_the_fp32_bound():
    """16 pending nodes with decays summing to about -30, flushed at the last: the weights exp(G_a - G_i) take
    differences of large path sums (in fp32 the accepted node's own weight came out 1 ulp of G_a off 1 wherever the
    sum and the scan added in different orders: the H200's flush failure; numpy's pairwise sum does so from 8
    elements on)."""
    gen = torch.Generator().manual_seed(0)
    L = 16
    pools = ReconstructPools.empty(3, **DIMS, max_nodes=L, device=DEVICE)
    for x, lo, hi in ((pools.state, -1, 1), (pools.u, -1, 1), (pools.k, -1, 1), (pools.g, -4, 0)):
        x.copy_(torch.rand(x.shape, generator=gen) * (hi - lo) + lo)
    pools.meta[1:, 0] = L | (1 << LEN_BITS)
    flush = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    refs = {dt: as_dtype(pools, dt) for dt in (torch.float64, torch.float32)}
    for dt, p in refs.items():
        naive_flush_slots(p, flush, L - 1, dtype=dt)
    flush_slots(pools, flush, L - 1)
    for s in (1, 2):
        close(f"flushed state of slot {s}", pools.state[s].cpu(), *(r.state[s].cpu() for r in refs.values()))


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
    assert torch.equal(o[0], ref) and torch.equal(pools.meta, twin.meta)
    assert all(torch.equal(x, y) for x, y in zip(pools.pending_window(1)[1:], twin.pending_window(1)[1:]))


def test_spec_step_is_one_launch_and_no_torch_op(monkeypatch):
    monkeypatch.undo()     # conftest's NaN-filled torch.empty is a fill of its own
    from benchmarks import count_spec_step_ops as count

    step, flush = count.reconstruct_fns(4, 4)
    for what, fn in (("spec step", step), ("flush", flush)):
        with count.reconstruct_kernels(stub=True):
            ops, syncs = count.launches(fn)
        assert [k for k, _ in ops] == ["kernel chain_spec_step_kernel"] and not syncs, f"{what}: {ops}, {syncs}"


@pytest.mark.parametrize("widths", [(2, 2, 1), (3, 3, 3)])
def test_a_served_tree_step_is_three_launches_in_reconstruct_and_two_in_store_all(monkeypatch, widths):
    """The GPU's path of the plugin's tree hooks, counted with the kernels stubbed: the gates, the verify (one launch
    of the family a (2, 2, 1) or (3, 3, 3) window picks here) and the stash; the gates and the store-all kernel on
    vLLM's blocks. Around them only the accepted node's index building (a few tiny ops, no host sync); the torch
    gating, l2norm, casts and index_put of the stash (31 and 32 launches before 2026-12-04) are gone."""
    monkeypatch.undo()
    from benchmarks import count_spec_step_ops as count

    recon, store_all = count.tree_fns(widths, 4)
    with count.tree_kernels(stub=True):
        kinds = {what: count.launches(fn) for what, fn in (("reconstruct", recon), ("store_all", store_all))}
    for what, (ops, syncs) in kinds.items():
        kernels = sorted(k for k, _ in ops if k.startswith("kernel "))
        assert not syncs and len(ops) - len(kernels) <= 4, (what, ops)
        want = (["kernel gdn_gating_kernel", "kernel stash_window_kernel", "kernel tree_verify_path_kernel"]
                if what == "reconstruct" else ["kernel gdn_gating_kernel", "kernel store_all_verify_kernel"])
        assert kernels == want, (what, kernels)


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


def test_engine_profile_of_mixed_steps_is_its_own_kind_of_table(tmp_path):
    """``engine --mixed`` profiles steps that each prefill one arriving request beside the decodes: the engine
    holds the arrivals too, its table says so, and a table of mixed and decode-only reports together is refused."""
    import argparse
    import json

    from benchmarks import profile_serving_step as prof
    from benchmarks.vllm_serve_gpu import COMPILE

    args = argparse.Namespace(batches=[1, 64], steps=8, mixed=True)
    assert prof.max_num_seqs(args) == 72 and prof.max_num_seqs(argparse.Namespace(**{**vars(args), "mixed": False})) == 64
    assert set(COMPILE) == {"default", "decode", "piecewise", "eager"}   # the engine profile's --compile choices
    t = prof.kernel_table([("fused_moe_kernel", 20.0)], steps=1)
    meta = dict(acceptance_rates="0.8", device="h200", date="d", how="h", compile="decode")
    paths = []
    for mode, mixed in (("store_all", True), ("reconstruct", True), ("reconstruct", False)):
        paths.append(tmp_path / f"{mode}_{mixed}.json")
        paths[-1].write_text(json.dumps(dict(meta=dict(meta, mode=mode, mixed=mixed),
                                             batches={"16": dict(step_ms_median=200.0, **t)})))
    assert prof.main(["table", *map(str, paths[:2]), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "engine_mixed_h200_d.txt").read_text()
    assert text.startswith("Steps with one new request's prefill chunk beside the decodes") and "compile decode" in text
    with pytest.raises(SystemExit, match="2 kinds of step"):
        prof.main(["table", *map(str, paths), "--out", str(tmp_path / "out")])


def test_engine_profile_times_unprofiled_steps_apart(tmp_path, capsys):
    """``engine --timed-steps N`` times N decode steps without the profiler: their median and 10th / 90th
    percentiles per mode go into the table beside the profiled steps' host time; a negative count is refused."""
    import json

    from benchmarks import profile_serving_step as prof

    class Engine:
        def __init__(self):
            self.calls = 0

        def step(self):
            self.calls += 1
            return []

    engine = Engine()
    assert prof.timed_step(engine) >= 0 and engine.calls == 1
    assert prof.step_spread([]) == {}
    spread = prof.step_spread([float(x) for x in range(1, 12)])
    assert (spread["plain_step_ms_median"], spread["plain_step_ms_p10"], spread["plain_step_ms_p90"]) == (6.0, 2.0, 10.0)
    t = prof.kernel_table([("fused_moe_kernel", 20.0)], steps=1)
    meta = dict(acceptance_rates="0.8", device="h200", date="d", how="h", compile="decode")
    paths = []
    for mode, shift in (("store_all", 0.0), ("reconstruct", 1.0)):
        paths.append(tmp_path / f"{mode}.json")
        times = [x + shift for x in range(1, 12)]
        paths[-1].write_text(json.dumps(dict(meta=dict(meta, mode=mode), batches={
            "1": dict(step_ms_median=30.0, **t, **prof.step_spread(times))})))
    assert prof.main(["table", *map(str, paths), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "engine_h200_d.txt").read_text()
    assert "unprofiled, 11 steps: median [p10, p90] ms store_all 6.00 [2.00, 10.00], reconstruct 7.00 [3.00, 11.00]" in text
    with pytest.raises(SystemExit):
        prof.main(["engine", "--mode", "store_all", "--timed-steps", "-1", "--out", str(tmp_path)])
    assert "--timed-steps -1: expected 0 (none) or more" in capsys.readouterr().err


def test_engine_profile_loop_times_rounds_of_fresh_requests(tmp_path, monkeypatch):
    """``cmd_engine`` on a stand-in LLM: per batch, requests stepped past their prefill, the profiled steps, then
    ``--timed-steps`` unprofiled steps on them and on ``--timed-rounds - 1`` fresh batches, every batch aborted
    before the next; the report holds one median per round and the spread over all of them."""
    import argparse
    import gzip
    import json
    import os
    import sys
    import types

    from benchmarks import profile_serving_step as prof

    class Out:
        def __init__(self, rid, n):
            self.request_id, self.outputs = rid, [types.SimpleNamespace(token_ids=[0] * n)]

    class Engine:
        def __init__(self):
            self.live, self.steps, self.added = {}, 0, []

        def add_request(self, rid, prompt, sampling):
            self.live[rid] = 0
            self.added.append(rid)

        def step(self):
            self.steps += 1
            for rid in self.live:
                self.live[rid] += 1
            return [Out(rid, n) for rid, n in self.live.items()]

        def abort_request(self, ids):
            for rid in ids:
                self.live.pop(rid, None)

        def has_unfinished_requests(self):
            return bool(self.live)

    class LLM:
        def __init__(self, work):
            self.llm_engine, self.work = Engine(), work

        def start_profile(self, profile_prefix):
            self.prefix = profile_prefix

        def stop_profile(self):
            (self.work / "traces").mkdir(exist_ok=True)
            trace = self.work / "traces" / f"{self.prefix}.json.gz"
            event = {"cat": "kernel", "ph": "X", "name": "chain_spec_step_kernel", "dur": 5.0}
            trace.write_bytes(gzip.compress(json.dumps({"traceEvents": [event]}).encode()))
            os.utime(trace, (0, 0))        # written long ago: wait_for_traces takes it at once

    llms = []
    monkeypatch.setattr(prof, "make_llm", lambda args, work: llms.append(LLM(work)) or llms[-1])
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **k: k))
    monkeypatch.setattr(prof, "device_name", lambda smoke: "stand-in")
    args = argparse.Namespace(mode="store_all", batches=[1, 3], steps=2, timed_steps=4, timed_rounds=3, mixed=False,
                              prompt_len=8, max_model_len=64, acceptance_rates="0.8", gmu=0.9, compile="decode",
                              out=str(tmp_path))
    assert prof.cmd_engine(args) == 0
    report = json.loads(next(tmp_path.glob("engine_store_all_stand-in_*.json")).read_text())
    for B in ("1", "3"):
        row = report["batches"][B]
        assert len(row["plain_round_medians"]) == 3 and len(row["plain_step_ms"]) == 12 and len(row["step_ms"]) == 2
        assert row["kinds"] == {"gdn spec step": 2.5}
    added = llms[0].llm_engine.added
    assert len(added) == 3 * (1 + 3) and len(set(added)) == len(added) and not llms[0].llm_engine.live
    assert report["meta"]["timed_rounds"] == 3
