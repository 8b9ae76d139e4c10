"""Chain kernel: the gated delta rule node by node on a state tile in registers, the pending commit folded
in first. One launch, no tensor cores, exact fp32.

Status: parity with ``naive_tree_step`` (fp64) under the Triton interpreter on CPU (chains of 1-7 nodes,
pending from random per-request trees, idle slots, num_nodes, GVA, keys normalized in the kernel, fp32
and bf16 state, mild and hard gates) and, in the layout of session 2, on an H200. Limits: chains only
(parents[t] = t - 1, not read: the caller knows).

Grid (V / BV, B * HV), the launch shape of fla's fused_recurrent (state_v_first, one warp, BV = 8): each
program reads its [BV, K] state tile once, folds the pending commit (``fold.py``), writes it back, then
runs the window's nodes one after the other, writing o_t and u_t = beta_t (v_t - exp(g_t) S_{t-1} k_t)
and no state (the commit stays pending).

``chain_spec_step_kernel``: the same program on a serving engine's pool, the whole GDN spec step in one launch
(``treewy.serve.reconstruct.spec_step``): it reads the packed (varlen) window by cu_seqlens and, with RAW_GATES,
the layer's raw gates; it finds each row's pending node from the slot's stash length and vLLM's accepted count,
and writes the new window's stash (u, k, g, length) into the slot itself, the keys and decays into the half of the
slot's double buffer that the pending window does not hold (parity with the loop twins under the interpreter and,
on an H200 on 2026-12-02, for the spec steps: the flush at pending node 2 failed there, not yet explained:
benchmarks/results/gpu_tests_h200_2026-12-02.md).
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch

import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.common import _delta_node, _gates, _node_qkv, _program, _recurrent_node
from treewy.ops.verify.fold import (
    FOLD_ROWS,
    _chain_pending_path,
    _fold_tile,
    _pending_key_scale,
    _pending_path,
    _request_bases,
)
from treewy.ops.verify.tuning import (
    AUTOTUNE_EXTRA, KEY, batch_bucket, capture_safe_pruning, fit_v, pending_args,
)


def _configs():
    if INTERPRET:
        return [triton.Config({"BV": 8, "FOLD_ROWS": FOLD_ROWS}, num_warps=1)]
    # BV = 16 spills with Triton 3.6 (benchmarks/compile_offline.py --all). FOLD_ROWS = 1 compiles to 64
    # registers against 95 at 4 (sm_90, k = 3 with a 4-node pending window): more one-warp programs per SM
    # against fewer fold passes, which only timing settles; the autotuner measures both.
    return [triton.Config({"BV": 8, "FOLD_ROWS": rows}, num_warps=1, num_stages=s)
            for rows in (FOLD_ROWS, 1) for s in (3, 1)]


def fixed_config():
    """The config to pin where autotuning cannot run (a serving engine's state pool is too large to benchmark
    configs on): what the autotuner picked at B = 64 and 256 on the H200 (BV = 8 on one warp, fla's
    fused_recurrent layout, one path row per fold pass, one stage: the "autotune picks" of the kernel targets
    table, kind "kernel_targets" of treewy/data/index.json). Under the interpreter its one config."""
    if INTERPRET:
        return _configs()[0]
    return triton.Config({"BV": 8, "FOLD_ROWS": 1}, num_warps=1, num_stages=1)


#: The spec step's value tile by batch, (smallest batch, BV), from the H200 profile of 2026-12-02
#: (benchmarks/results/gdn_step_h200_2026-12-02_headeb74fad.txt, Qwen3.5-35B-A3B shapes, one warp, FOLD_ROWS = 1, one stage):
#: BV = 8 at B = 1 (8.8 us against 10.3 for BV = 16: twice the programs on the SMs), BV = 16 from B = 16 on (627 us
#: against 752 for BV = 8 at B = 256, within 2 % of the fastest config at 16 and 32). B = 2-15 was not timed: the
#: switch sits at 4, where BV = 16 launches as many programs as BV = 8 at B = 2.
SPEC_STEP_BV = ((1, 8), (4, 16))


def spec_step_config(batch: int):
    """The chain spec step's config for ``batch`` rows (``SPEC_STEP_BV``; under the interpreter its one config).
    Batch is a launch shape, fixed per CUDA graph, so the choice costs nothing inside one."""
    if INTERPRET:
        return _configs()[0]
    bv = max((entry for entry in SPEC_STEP_BV if entry[0] <= batch), default=SPEC_STEP_BV[0])[1]
    return triton.Config({"BV": bv, "FOLD_ROWS": 1}, num_warps=1, num_stages=1)


@triton.autotune(configs=_configs(), key=KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else capture_safe_pruning(fit_v), **AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_ppb", "stride_pu", "stride_pk", "stride_pg", "B_BUCKET"])
def tree_verify_chain_kernel(
    q, k, v, g, beta, h0, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, scale, T, PT, B_BUCKET,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BPT: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr,
    HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr, FOLD_ROWS: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _request_bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb,
                                                stride_pu, stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T

    p_h = h0 + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    m_h = m_v[:, None] & m_k[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)
    if HAS_PENDING:
        a, o_p, rank, n_path, b_C, b_w = _pending_path(0, 0, i_hv, pg, ppar, pacc, 0, PT, HV, BPT)
        b_w = b_w * _pending_key_scale(0, i_h, pk, o_p, rank, PT, H, K, BPT, PENDING_L2NORM)
        b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w, PT,
                         H, HV, K, V, FOLD_ROWS, False).to(p_h.dtype.element_ty)
        if a >= 0:
            tl.store(p_h, b_h, mask=m_h)
        b_h = b_h.to(tl.float32)  # verify from exactly the state that is stored

    for t in range(0, T):
        i_row = i_b64 * T + t
        p_tv = (i_row * HV + i_hv) * V + o_v
        if t < n_b:
            b_h, b_u, b_o = _recurrent_node(b_h, q, k, v, g, beta, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale,
                                            H, HV, K, V, USE_QK_L2NORM_IN_KERNEL)
        else:
            b_u = tl.zeros([BV], dtype=tl.float32)
            b_o = tl.zeros([BV], dtype=tl.float32)
        tl.store(u + p_tv, b_u, mask=m_v)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)


def chain_fwd(q, k, v, g, beta, state, num_nodes, pending, scale, use_qk_l2norm_in_kernel, o, u, config=None,
              state_indices=None):
    """Launch the chain kernel (inputs validated; ``pending`` a validated PendingCommit or None;
    ``state_indices``: see ``tree_verify_fwd``)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    pu, pk, pg, ppar, pacc, PT, stride_ppb, pl2, pending_strides = pending_args(pending, u)
    fn, tuned = (tree_verify_chain_kernel, {}) if config is None else (tree_verify_chain_kernel.fn,
                                                                         dict(config.all_kwargs()))
    fn[lambda meta: (triton.cdiv(V, meta["BV"]), B * HV)](
        q, k, v, g, beta, state, num_nodes if num_nodes is not None else pacc, o, u, pu, pk, pg, ppar, pacc,
        u if state_indices is None else state_indices, state.stride(0), stride_ppb, *pending_strides, scale, T, PT,
        batch_bucket(B),
        H=H, HV=HV, K=K, V=V, BT=triton.next_power_of_2(T), BK=triton.next_power_of_2(K),
        BPT=triton.next_power_of_2(max(PT, 2)), USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_NUM_NODES=num_nodes is not None, HAS_PENDING=pending is not None, PENDING_L2NORM=pl2,
        HAS_STATE_INDICES=state_indices is not None, **tuned,
    )
    return o, u


@triton.jit(do_not_specialize=["PT", "stride_slots", "stride_s", "stride_pu", "stride_pk", "stride_pg", "stride_meta",
                               "accepted"])
def chain_spec_step_kernel(
    q, k, v, g, beta, A_log, dt_bias, cu_seqlens, slots, num_accepted, o, h0, pu, pk, pg, meta,
    stride_slots, stride_s, stride_pu, stride_pk, stride_pg, stride_meta, scale, softplus_threshold, accepted, PT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BPT: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, RAW_GATES: tl.constexpr, HAS_TOKENS: tl.constexpr,
    FOLD_ROWS: tl.constexpr, LEN_BITS: tl.constexpr, KEY_SHARE: tl.constexpr, BKS: tl.constexpr,
):
    """Row i_b of a spec step: tokens cu_seqlens[i_b]:cu_seqlens[i_b + 1] of the packed q, k, v [N, heads, dim],
    its state and stash in pool slot slots[i_b] (any stride: a column of vLLM's state indices; <= 0: a padding row,
    which does nothing, as in vLLM's store-all kernel). Pending node: num_accepted[i_b] - 1 (without HAS_TOKENS:
    ``accepted``, and no window: a flush) where the slot's stash length is > 0, else none.

    The slot's meta word holds the pending window's length (low LEN_BITS bits) and, in the bit above, which half of
    the double-buffered keys pk [2, PT, H, K] and decays pg [2, PT, HV] holds it. Every program reads that half and
    writes its share of the new window into the other one, which nobody reads during the launch: per token, the
    key head's KEY_SHARE-wide slice j (j = the program's rank among the value tiles and heads of its key head) and
    the decay of its value head where t % (V / BV) == i_v. Only the meta word is shared: each program counts itself
    in its high bits once it has read it, and the one that sees every other count there writes the new length and
    half (which clears the count). Each program writes its own u tile, which no other program reads.
    """
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    i_s = tl.load(slots + i_b * stride_slots).to(tl.int64)
    if i_s <= 0:
        return
    if HAS_TOKENS:
        bos = tl.load(cu_seqlens + i_b).to(tl.int64)
        n_b = (tl.load(cu_seqlens + i_b + 1) - bos).to(tl.int32)
        a = tl.load(num_accepted + i_b).to(tl.int32) - 1
    else:
        bos = i_b64 * 0
        n_b = 0
        a = accepted
    p_meta = meta + i_s * stride_meta
    w_meta = tl.load(p_meta)
    n_pend = w_meta & ((1 << LEN_BITS) - 1)
    if n_pend == 0:
        if n_b == 0:
            return
    a = tl.where(n_pend > 0, a, -1)
    half = (w_meta >> LEN_BITS) & 1
    h0, pu = h0 + i_s * stride_s, pu + i_s * stride_pu
    p_k, p_g = pk + i_s * stride_pk + half * PT * H * K, pg + i_s * stride_pg + half * PT * HV
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V

    p_h = h0 + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    m_h = m_v[:, None] & m_k[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)
    # counted once this program has read the meta word (the branch above needs its value), so the last to count
    # writes it after every read; relaxed: it waits for no other access and goes out while the state tile loads
    seen = tl.atomic_add(p_meta, 1 << (LEN_BITS + 1), sem="relaxed") >> (LEN_BITS + 1)
    o_p, rank, n_path, b_C, b_w = _chain_pending_path(a, i_hv, p_g, PT, HV, BPT)
    b_w = b_w * _pending_key_scale(0, i_h, p_k, o_p, rank, PT, H, K, BPT, USE_QK_L2NORM_IN_KERNEL)
    b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, p_k, o_p, rank, n_path, b_C, b_w, PT,
                     H, HV, K, V, FOLD_ROWS, False).to(p_h.dtype.element_ty)
    if a >= 0:
        tl.store(p_h, b_h, mask=m_h)
    b_h = b_h.to(tl.float32)  # verify from exactly the state that is stored

    for t in range(0, n_b):
        i_row = bos + t
        b_q, b_k, b_v = _node_qkv(q, k, v, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale, H, HV, K, V,
                                  USE_QK_L2NORM_IN_KERNEL)
        b_g, b_beta = _gates(g, beta, A_log, dt_bias, i_row * HV + i_hv, i_hv, True, softplus_threshold, RAW_GATES)
        b_h, b_u, b_o = _delta_node(b_h, b_q, b_k, b_v, b_g, b_beta)
        tl.store(pu + (t * HV + i_hv) * V + o_v, b_u, mask=m_v)
        tl.store(o + (i_row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)

    if HAS_TOKENS:
        # this program's share of the window's raw keys and decays, from lines the node loop has just read: after
        # the loop, as in it they held registers through the recurrence (benchmarks/compile_offline.py's compiler)
        NV: tl.constexpr = (V + BV - 1) // BV
        o_c = ((i_hv % (HV // H)) * NV + i_v) * KEY_SHARE + tl.arange(0, BKS)
        m_c = (tl.arange(0, BKS) < KEY_SHARE) & (o_c < K)
        pk_new = pk + i_s * stride_pk + (1 - half) * PT * H * K
        pg_new = pg + i_s * stride_pg + (1 - half) * PT * HV
        o_t = tl.arange(0, BPT)
        m_t = o_t < n_b
        m_kt = m_t[:, None] & m_c[None, :]
        b_kc = tl.load(k + ((bos + o_t[:, None]) * H + i_h) * K + o_c[None, :], mask=m_kt, other=0)
        tl.store(pk_new + (o_t[:, None] * H + i_h) * K + o_c[None, :], b_kc.to(pk_new.dtype.element_ty), mask=m_kt)
        m_g = m_t & (o_t % NV == i_v)
        b_gc, _ = _gates(g, beta, A_log, dt_bias, (bos + o_t) * HV + i_hv, i_hv + o_t * 0, m_g, softplus_threshold,
                         RAW_GATES)
        tl.store(pg_new + o_t * HV + i_hv, b_gc, mask=m_g)
    if seen == tl.num_programs(0) * HV - 1:
        tl.store(p_meta, tl.where(n_b > 0, n_b | ((1 - half) << LEN_BITS), 0))


def chain_spec_step_fwd(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, slots, num_accepted, state, pu, pk, pg, meta,
                        scale, use_qk_l2norm_in_kernel, *, len_bits, softplus_threshold=20.0, accepted=0,
                        config=None):
    """Launch ``chain_spec_step_kernel`` (inputs validated by the caller): returns o [N, HV, V] in v's dtype, the
    tokens of padding rows (and past cu_seqlens[B]) left unwritten. With q None: a flush (no window; pending node
    ``accepted``; k, v, g, beta, A_log, dt_bias, cu_seqlens, num_accepted unused). g, beta: the log decays and write
    strengths [N, HV], or the raw gates a, b with A_log, dt_bias [HV] given. pk [slots, 2, T, H, K], pg
    [slots, 2, T, HV]: the two halves of the stash's keys and decays, each slot's contiguous; ``len_bits``: where the
    meta word's half bit sits (``treewy.serve.reconstruct.LEN_BITS``)."""
    B = slots.shape[0]
    HV, V, K = state.shape[1], state.shape[2], state.shape[3]
    H, T = pk.shape[3], pu.shape[1]
    assert pk.shape[1:3] == (2, T) and pg.shape[1:3] == (2, T), "the stash's keys and decays come in two halves"
    tokens = q is not None
    o = torch.empty_like(v) if tokens else None
    c = dict((config or spec_step_config(B)).all_kwargs())
    BV = c.pop("BV")
    share = triton.cdiv(K, triton.cdiv(V, BV) * (HV // H))    # programs per key head split its keys evenly
    chain_spec_step_kernel[(triton.cdiv(V, BV), B * HV)](
        *((q, k, v, g, beta) if tokens else (state,) * 5), *((A_log, dt_bias) if A_log is not None else (state,) * 2),
        cu_seqlens if tokens else slots, slots, num_accepted if tokens else slots, o if tokens else state, state,
        pu, pk, pg, meta, slots.stride(0), state.stride(0), pu.stride(0), pk.stride(0), pg.stride(0), meta.stride(0),
        scale, softplus_threshold, accepted, T,
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, BPT=triton.next_power_of_2(max(T, 2)),
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, RAW_GATES=A_log is not None, HAS_TOKENS=tokens,
        LEN_BITS=len_bits, KEY_SHARE=share, BKS=triton.next_power_of_2(share), **c,
    )
    return o
