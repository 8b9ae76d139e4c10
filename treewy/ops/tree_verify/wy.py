"""WY kernels: a small V-independent kernel per (request, value head), then one streaming kernel over
value tiles on tensor cores. Two launches, both CUDA-graph capturable, no host sync.

Status: parity with ``naive_tree_step`` (fp64) and with the stage references (``reference.py``) under the
Triton interpreter on CPU (chains, stars, random per-request trees up to 40 nodes, num_nodes, GVA,
awkward K and V, keys normalized in the kernel, fp32 and bf16 state, mild and hard gates, 200 folded
steps; "ieee" and the "tf32" split code path). bf16 inputs and the tensor-core timings are checked on
the GPU by tests marked ``gpu`` and benchmarks/bench_kernels.py. Limits: T <= 128 nodes per request.

1. ``wy_prepare_kernel``, grid (B * HV): the ancestor walk, K K^T and Q K^T over key chunks, the decayed
   and masked M = diag(beta) (exp(G_t - G_i) k_t.k_i)_{i strict ancestor of t} and
   P = scale (exp(G_t - G_i) q_t.k_i)_{i ancestor-or-self of t}, and (I + M)^-1 by Horner's form of the
   finite Neumann series (depth products). Writes Minv [T, T], P [T, T], beta, ck = beta exp(G) / ||k||
   and cq = scale exp(G) / ||q|| per (request, head): 2 T^2 + 3 T floats.
2. ``wy_stream_kernel``, grid (V / BV, B * HV): per key chunk, the [BK, BV] state tile is read, the pending
   commit folded in (``fold.py``) and written back, and Xk = K S^T, Xq = Q S^T accumulated on tensor cores;
   then R = beta v - ck Xk, U = Minv R, O = cq Xq + P U. Xk, Minv R and K K^T feed the committed state and
   are fp32-accurate (``_dot_fp32``); Xq, P U and Q K^T feed only the bf16 outputs and take one tf32 pass.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.tree_verify.common import _ancestors, _dot_fp32, _program
from treewy.ops.tree_verify.fold import FOLD_ROWS, _fold_tile, _pending_key_scale, _pending_path, _request_bases
from treewy.ops.tree_verify.tuning import AUTOTUNE_EXTRA, KEY_DOTS, batch_bucket, fit_v, pending_args


def prep_size(T: int) -> int:
    """Floats the prepare kernel writes per (request, value head): Minv and P [T, T], beta, ck, cq [T]."""
    return 2 * T * T + 3 * T


@triton.jit(do_not_specialize=["T", "stride_pb"])
def wy_prepare_kernel(
    q, k, g, beta, parents, num_nodes, prep, stride_pb, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr, K_TF32: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_b64, i_h = i_b.to(tl.int64), i_hv // (HV // H)
    o_t = tl.arange(0, BT)
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b
    m_anc, b_G, n_depth = _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV)

    # K K^T first, then (I + M)^-1, then Q K^T and P: fewer [BT, BT] tiles live at once
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_nk = tl.zeros([BT], dtype=tl.float32)
    p_qk = (i_b64 * T + o_t) * H + i_h
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :],
                      other=0).to(tl.float32)
        b_A += _dot_fp32(b_k, tl.trans(b_k), DOT_PRECISION, SPLIT, K_TF32, K_TF32)
        if USE_QK_L2NORM_IN_KERNEL:
            b_nk += tl.sum(b_k * b_k, 1)
    b_rk = tl.zeros([BT], dtype=tl.float32) + 1.0
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = 1.0 / tl.sqrt(b_nk + 1e-6)

    # masked log-space decays: only ancestor pairs, G_t - G_i <= 0
    m_strict = m_anc & (o_t[:, None] != o_t[None, :])
    b_beta = tl.load(beta + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_M = tl.where(m_strict, tl.exp(tl.where(m_strict, b_G[:, None] - b_G[None, :], float("-inf"))) * b_A, 0.0)
    b_M = b_M * (b_beta * b_rk)[:, None] * b_rk[None, :]

    # (I + M)^-1 = I - M (I - M (I - ...)): M is nilpotent of order depth + 1
    b_I = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    b_Minv = b_I
    for _ in range(n_depth):
        b_Minv = b_I - _dot_fp32(b_M, b_Minv, DOT_PRECISION, SPLIT, False, False)

    p_prep = prep + i_bh.to(tl.int64) * (2 * T * T + 3 * T)
    o_tt = o_t[:, None] * T + o_t[None, :]
    m_tt = (o_t[:, None] < T) & (o_t[None, :] < T)
    m_T = o_t < T
    b_eG = tl.where(m_t, tl.exp(b_G), 0.0)
    tl.store(p_prep + o_tt, b_Minv, mask=m_tt)
    tl.store(p_prep + 2 * T * T + o_t, b_beta, mask=m_T)
    tl.store(p_prep + 2 * T * T + T + o_t, b_beta * b_eG * b_rk, mask=m_T)

    b_QK = tl.zeros([BT, BT], dtype=tl.float32)
    b_nq = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_QK = tl.dot(b_q, tl.trans(b_k), b_QK, input_precision=DOT_PRECISION)
        if USE_QK_L2NORM_IN_KERNEL:
            b_nq += tl.sum(b_q * b_q, 1)
    b_rq = tl.zeros([BT], dtype=tl.float32) + 1.0
    if USE_QK_L2NORM_IN_KERNEL:
        b_rq = 1.0 / tl.sqrt(b_nq + 1e-6)
    b_P = tl.where(m_anc, tl.exp(tl.where(m_anc, b_G[:, None] - b_G[None, :], float("-inf"))) * b_QK, 0.0)
    b_P = b_P * (scale * b_rq)[:, None] * b_rk[None, :]
    tl.store(p_prep + T * T + o_tt, b_P, mask=m_tt)
    tl.store(p_prep + 2 * T * T + 2 * T + o_t, scale * b_eG * b_rq, mask=m_T)


#: (BV, BK, warps, stages) the stream kernel is tuned over, per precision and padded window BT: each compiles
#: for sm_90 without spills with Triton 3.6 and 3.9 (benchmarks/compile_offline.py --all), except BT = 128.
#: One stage from BT = 64 on: there every two-stage config gave wrong outputs on the H200 with Triton 3.6
#: (0.9-7.7 % against 0.26 % for one stage; benchmarks/results/wy_stages_h200_2026-11-30.log).
STREAM_CONFIGS = {
    ("tf32", 16): ((32, 32, 4, 1), (64, 32, 8, 1), (32, 64, 4, 2)),
    ("tf32", 32): ((32, 32, 4, 1), (16, 32, 4, 1), (64, 32, 8, 1)),
    ("tf32", 64): ((32, 64, 4, 1), (32, 32, 4, 1), (64, 32, 8, 1)),
    ("tf32", 128): ((16, 32, 8, 1), (16, 16, 8, 1)),
    ("ieee", 16): ((32, 32, 4, 1), (16, 32, 4, 1)),
    ("ieee", 32): ((16, 32, 4, 1),),
    ("ieee", 64): ((16, 32, 8, 1),),
    ("ieee", 128): ((16, 16, 8, 1),),
}


def _config_key(c):
    return c.kwargs["BV"], c.kwargs["BK"], c.num_warps, c.num_stages


def _stream_configs():
    if INTERPRET:
        return [triton.Config({"BV": 16, "BK": 16}, num_warps=4)]
    shapes = sorted({cfg for cfgs in STREAM_CONFIGS.values() for cfg in cfgs})
    return [triton.Config({"BV": bv, "BK": bk}, num_warps=w, num_stages=s) for bv, bk, w, s in shapes]


def _prune_stream(configs, named_args, **kwargs):
    """The configs listed for the launch's precision and BT (and no wider than V)."""
    args = {**named_args, **kwargs}
    keep = STREAM_CONFIGS[(args["DOT_PRECISION"], args["BT"])]
    return [c for c in fit_v(configs, named_args, **kwargs) if _config_key(c) in keep] or configs[:1]


@triton.autotune(configs=_stream_configs(), key=KEY_DOTS, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _prune_stream}, **AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_ppb", "stride_pu", "stride_pk", "stride_pg", "B_BUCKET"])
def wy_stream_kernel(
    q, k, v, h0, num_nodes, prep, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, T, PT, B_BUCKET,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BPT: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr,
    HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    K_TF32: tl.constexpr, FOLD_ROWS: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _request_bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb,
                                                stride_pu, stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b
    if HAS_PENDING:
        a, o_p, rank, n_path, b_C, b_w = _pending_path(0, 0, i_hv, pg, ppar, pacc, 0, PT, HV, BPT)
        b_w = b_w * _pending_key_scale(0, i_h, pk, o_p, rank, PT, H, K, BPT, PENDING_L2NORM)

    # state products over key chunks; each chunk of the state is read, folded and written once
    b_xk = tl.zeros([BT, BV], dtype=tl.float32)
    b_xq = tl.zeros([BT, BV], dtype=tl.float32)
    p_qk = (i_b64 * T + o_t) * H + i_h
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_h = h0 + i_hv * V * K + o_k[:, None] + o_v[None, :] * K
        m_h = m_k[:, None] & m_v[None, :]
        b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)  # [BK, BV]: S^T
        if HAS_PENDING:
            b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w, PT,
                             H, HV, K, V, FOLD_ROWS, True).to(p_h.dtype.element_ty)
            if a >= 0:
                tl.store(p_h, b_h, mask=m_h)
            b_h = b_h.to(tl.float32)  # verify from exactly the state that is stored
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_xk += _dot_fp32(b_k, b_h, DOT_PRECISION, SPLIT, K_TF32, False)
        b_xq = tl.dot(b_q, b_h, b_xq, input_precision=DOT_PRECISION)

    p_prep = prep + (i_b64 * HV + i_hv) * (2 * T * T + 3 * T)
    o_tt = o_t[:, None] * T + o_t[None, :]
    m_tt = (o_t[:, None] < T) & (o_t[None, :] < T)
    m_T = o_t < T
    b_Minv = tl.load(p_prep + o_tt, mask=m_tt, other=0)
    b_beta = tl.load(p_prep + 2 * T * T + o_t, mask=m_T, other=0)
    b_ck = tl.load(p_prep + 2 * T * T + T + o_t, mask=m_T, other=0)
    p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
    b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
    b_R = b_beta[:, None] * b_v - b_ck[:, None] * b_xk
    b_U = _dot_fp32(b_Minv, b_R, DOT_PRECISION, SPLIT, False, False)
    b_P = tl.load(p_prep + T * T + o_tt, mask=m_tt, other=0)
    b_cq = tl.load(p_prep + 2 * T * T + 2 * T + o_t, mask=m_T, other=0)
    b_o = tl.dot(b_P, b_U, b_cq[:, None] * b_xq, input_precision=DOT_PRECISION)
    m_store = m_T[:, None] & m_v[None, :]
    tl.store(u + p_tv, b_U, mask=m_store)
    tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


def prepare_block_k(K: int) -> int:
    """Key chunk of the prepare kernel."""
    return 16 if INTERPRET else min(64, max(16, triton.next_power_of_2(K)))


#: Warps of the prepare kernel per precision and padded window: the fewest without spills on sm_90 with
#: Triton 3.6 (benchmarks/compile_offline.py --all); "ieee" at BT = 64 spills 64 bytes with bf16 keys, and
#: BT = 128 spills with any.
PREPARE_WARPS = {("tf32", 16): 4, ("tf32", 32): 4, ("tf32", 64): 8, ("tf32", 128): 8,
                 ("ieee", 16): 4, ("ieee", 32): 8, ("ieee", 64): 8, ("ieee", 128): 8}


def prepare_warps(BT: int, dot_precision: str) -> int:
    """Warps of the prepare kernel (PREPARE_WARPS)."""
    return PREPARE_WARPS[(precision_flags(dot_precision)[0], BT)]


def precision_flags(dot_precision: str) -> tuple[str, bool]:
    """(tl.dot input_precision, SPLIT) of a ``dot_precision`` name (tuning.DOT_PRECISIONS)."""
    return ("ieee", False) if dot_precision == "ieee" else ("tf32", dot_precision == "tf32")


def wy_prepare_fwd(q, k, g, beta, parents, stride_pb, num_nodes, scale, use_qk_l2norm_in_kernel, dot_precision):
    """Launch the prepare kernel; returns its output, ``prep_size(T)`` fp32 per (request, value head)."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    BT = max(16, triton.next_power_of_2(T))
    prec, split = precision_flags(dot_precision)
    prep = torch.empty(B * HV * prep_size(T), device=q.device, dtype=torch.float32)
    wy_prepare_kernel[(B * HV,)](
        q, k, g, beta, parents, num_nodes if num_nodes is not None else parents, prep, stride_pb, scale, T,
        H=H, HV=HV, K=K, BT=BT, BK=prepare_block_k(K), USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_NUM_NODES=num_nodes is not None, DOT_PRECISION=prec, SPLIT=split,
        K_TF32=k.dtype in (torch.bfloat16, torch.float16), num_warps=prepare_warps(BT, dot_precision),
    )
    return prep


def wy_stream_fwd(q, k, v, state, num_nodes, prep, pending, use_qk_l2norm_in_kernel, o, u, dot_precision,
                  config=None, state_indices=None):
    """Launch the stream kernel over the prepare kernel's output; writes o and u, folds ``pending``."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    prec, split = precision_flags(dot_precision)
    pu, pk, pg, ppar, pacc, PT, stride_ppb, pl2, pending_strides = pending_args(pending, u)
    fn, tuned = (wy_stream_kernel, {}) if config is None else (wy_stream_kernel.fn, dict(config.all_kwargs()))
    fn[lambda meta: (triton.cdiv(V, meta["BV"]), B * HV)](
        q, k, v, state, num_nodes if num_nodes is not None else prep, prep, o, u, pu, pk, pg, ppar, pacc,
        u if state_indices is None else state_indices, state.stride(0), stride_ppb, *pending_strides, T, PT,
        batch_bucket(B),
        H=H, HV=HV, K=K, V=V, BT=max(16, triton.next_power_of_2(T)), BPT=triton.next_power_of_2(max(PT, 2)),
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, HAS_NUM_NODES=num_nodes is not None,
        HAS_PENDING=pending is not None, PENDING_L2NORM=pl2, DOT_PRECISION=prec, SPLIT=split,
        K_TF32=k.dtype in (torch.bfloat16, torch.float16), FOLD_ROWS=FOLD_ROWS,
        HAS_STATE_INDICES=state_indices is not None, **tuned,
    )
    return o, u


def wy_fwd(q, k, v, g, beta, state, parents, stride_pb, num_nodes, pending, scale, use_qk_l2norm_in_kernel, o, u,
           dot_precision, config=None, state_indices=None):
    """The two WY launches: prepare, then stream (inputs validated; parents int32 on the device)."""
    prep = wy_prepare_fwd(q, k, g, beta, parents, stride_pb, num_nodes, scale, use_qk_l2norm_in_kernel,
                          dot_precision)
    return wy_stream_fwd(q, k, v, state, num_nodes, prep, pending, use_qk_l2norm_in_kernel, o, u, dot_precision,
                         config=config, state_indices=state_indices)
