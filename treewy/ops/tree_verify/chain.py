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
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.tree_verify.common import _program, _recurrent_node
from treewy.ops.tree_verify.fold import FOLD_ROWS, _fold_tile, _pending_key_scale, _pending_path, _request_bases
from treewy.ops.tree_verify.tuning import AUTOTUNE_EXTRA, KEY, batch_bucket, fit_v, pending_args


def _configs():
    if INTERPRET:
        return [triton.Config({"BV": 8, "FOLD_ROWS": FOLD_ROWS}, num_warps=1)]
    # BV = 16 spills with Triton 3.6 (benchmarks/compile_offline.py --all). FOLD_ROWS = 1 compiles to 64
    # registers against 95 at 4 (sm_90, k = 3 with a 4-node pending window): more one-warp programs per SM,
    # the leading suspect of the regression against v3 (benchmarks/NOTES.md); the autotuner measures both.
    return [triton.Config({"BV": 8, "FOLD_ROWS": rows}, num_warps=1, num_stages=s)
            for rows in (FOLD_ROWS, 1) for s in (3, 1)]


def fixed_config():
    """The config to pin where autotuning cannot run (a serving engine's state pool is too large to benchmark
    configs on): what the autotuner picked at B = 64 and 256 on the H200 (BV = 8 on one warp, fla's
    fused_recurrent layout, one path row per fold pass, one stage: "autotune chain" in
    benchmarks/results/targets_h200_2026-11-30_run5.log). Under the interpreter its one config."""
    if INTERPRET:
        return _configs()[0]
    return triton.Config({"BV": 8, "FOLD_ROWS": 1}, num_warps=1, num_stages=1)


@triton.autotune(configs=_configs(), key=KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": fit_v}, **AUTOTUNE_EXTRA)
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

