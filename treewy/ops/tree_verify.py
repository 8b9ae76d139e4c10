"""TreeWY tree verify: every node's output and pseudo-value in one launch, no per-node state,
with the previous step's commit optionally folded in (``pending``).

Status: parity with ``naive_tree_verify`` / ``naive_tree_step`` (fp64) tested under the Triton
interpreter on CPU (fp32; GVA HV = H, 2H, 4H; awkward K, V; chains, stars, random trees;
per-request topologies and node counts; fp32 and bf16 state; 200 folded steps) and on an H200.
Limits: T <= 128 nodes per request.

Grid (V / BV, B * HV): one program per request, value head and value tile. Each program reads its
[BV, K] state tile once; with a pending commit it rebuilds the previous window's accepted state
in registers (exp(G_a) S0 + sum over the root..a path of exp(G_a - G_i) u_i k_i^T), writes it back
once and verifies the new window from it: per step and head one state read, one state write.

Four kernels; ``default_kernel`` picks the one measured fastest for the window:
- ``tree_verify_chain_kernel`` (chains): the recurrence node by node on the state tile, like fla's
  fused_recurrent, writing o and u and no state (exact fp32).
- ``tree_verify_fma_kernel`` (other windows of BT = next_pow2(T) <= 8): plain fp32 FMAs, no tensor
  cores. S k_t and S q_t are row reductions of the state tile; the system (I + M) U = R is solved by
  forward substitution (parents precede children, so M is strictly lower triangular).
- ``tree_verify_dot_kernel`` / ``tree_verify_dot_head_kernel`` (larger trees; per value tile, or one
  program per request and value head doing the V-independent work once): tensor-core dot products in
  "tf32x3" (fp32-level error) on the GPU, "ieee" under the interpreter; the solve is the finite
  Neumann series (as many products as the tree is deep).
All walk the parent pointers from a device tensor (CUDA-graph capturable, no host branching).
On a machine without CUDA, importing this module sets TRITON_INTERPRET=1 (see _triton.py).
"""

from __future__ import annotations

import inspect

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET, is_capturing
from treewy.ops.checks import check_gdn_kernel_inputs, check_pending

#: Largest number of nodes (root + drafts) per request the verify kernel takes.
MAX_KERNEL_NODES = 128

#: Largest padded window handled by the FMA kernel; larger windows use tensor-core dot products.
FMA_MAX_BT = 8

#: The kernels ``tree_verify_fwd(kernel=...)`` can force (None chooses "fma" or "dot" by window size).
KERNELS = ("fma", "dot", "dot_head", "chain")

#: Dot-product precision of the dot kernel: "tf32x3" (three tf32 tensor-core passes, fp32-level
#: error; the GPU default), "ieee" (plain fp32, slow at these shapes), "tf32" (fast, ~1e-4 error).
DEFAULT_DOT_PRECISION = "ieee" if INTERPRET else "tf32x3"


def _quick_bench(fn, quantiles=None):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_AUTOTUNE_PARAMS = inspect.signature(triton.autotune).parameters
# quick timing per config; best configs cached on disk across processes where Triton can
_AUTOTUNE_EXTRA = {**({"do_bench": _quick_bench} if "do_bench" in _AUTOTUNE_PARAMS else {}),
                   **({"cache_results": True} if "cache_results" in _AUTOTUNE_PARAMS else {})}
_KEY = ["B", "T", "H", "HV", "K", "V", "BT", "PT", "USE_QK_L2NORM_IN_KERNEL", "HAS_NUM_NODES", "HAS_PENDING",
        "DOT_PRECISION", "HAS_STATE_INDICES"]


def _fit_v(configs, named_args, **kwargs):
    V = {**named_args, **kwargs}["V"]
    return [c for c in configs if c.kwargs["BV"] <= max(16, triton.next_power_of_2(V))] or configs[:1]


def _prune_dot(configs, named_args, **kwargs):
    BT, K = ({**named_args, **kwargs}[n] for n in ("BT", "K"))
    out = [c for c in _fit_v(configs, named_args, **kwargs) if c.kwargs["BK"] <= max(16, triton.next_power_of_2(K))
           if not (BT >= 64 and c.kwargs["BV"] >= 64) and not (BT >= 128 and (c.kwargs["BV"] > 16 or c.num_warps < 8))]
    return out or configs[:1]


def _fma_configs():
    if INTERPRET:
        return [triton.Config({"BV": 16}, num_warps=4)]
    return [triton.Config({"BV": bv}, num_warps=w, num_stages=1)
            for bv, w in ((8, 1), (16, 2), (32, 4), (64, 4), (64, 8))]


def _dot_configs():
    if INTERPRET:
        return [triton.Config({"BV": 32, "BK": 32}, num_warps=4)]
    return [triton.Config({"BV": bv, "BK": bk}, num_warps=w, num_stages=1)
            for bv, bk, w in ((16, 32, 4), (32, 32, 4), (32, 32, 8), (64, 32, 8), (32, 64, 8))]


@triton.jit
def _program(H: tl.constexpr, HV: tl.constexpr):
    """(value tile, request, request as int64, value head, its key head) of a (V / BV, B * HV) grid program."""
    i_bh = tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    return tl.program_id(0), i_b, i_b.to(tl.int64), i_hv, i_hv // (HV // H)


@triton.jit
def _bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu, stride_pk, stride_pg, stride_ppb,
           HAS_STATE_INDICES: tl.constexpr):
    """Request i_b's state and pending-commit pointers, as row 0 of what the helpers below index: its pool
    slot state_idx[i_b] when given (state and pending stash live there), else row i_b."""
    i_s = tl.load(state_idx + i_b).to(tl.int64) if HAS_STATE_INDICES else i_b64
    return (h0 + i_s * stride_hb, pu + i_s * stride_pu, pk + i_s * stride_pk, pg + i_s * stride_pg,
            ppar + i_b64 * stride_ppb, pacc + i_b)


@triton.jit
def _path(i_b, i_b64, i_hv, pg, ppar, pacc, stride_ppb, PT, HV: tl.constexpr, BPT: tl.constexpr):
    """The pending accepted node a and its root..a path over the BPT slots: (a, o_p, on-path mask, parents,
    G_a, weights exp(G_a - G_i) [BPT], 0 off the path).

    The path is found in registers (parents loaded once); G_i is the cumsum of g over the path in
    index order (ancestors precede descendants)."""
    a = tl.load(pacc + i_b)
    o_p = tl.arange(0, BPT)
    b_par = tl.load(ppar + i_b64 * stride_ppb + o_p, mask=o_p < PT, other=-1)
    on = o_p < 0
    cur = a
    while cur >= 0:
        on = on | (o_p == cur)
        cur = _gather(b_par, o_p, cur)
    b_gp = tl.load(pg + (i_b64 * PT + o_p) * HV + i_hv, mask=on, other=0).to(tl.float32)
    b_C = tl.sum(b_gp, 0)
    return a, o_p, on, b_par, b_C, tl.where(on, tl.exp(b_C - tl.cumsum(b_gp, 0)), 0.0)


@triton.jit
def _pending_path(i_b, i_b64, i_hv, o_v, m_v, pu, pg, ppar, pacc, stride_ppb, PT,
                  HV: tl.constexpr, V: tl.constexpr, BPT: tl.constexpr):
    """(a, on-path mask [BPT], rows, G_a, w_i u_i [BPT, BV]) for a [BV, BK] state tile (see ``_path``)."""
    a, o_p, on, _, b_C, b_w = _path(i_b, i_b64, i_hv, pg, ppar, pacc, stride_ppb, PT, HV, BPT)
    rows = i_b64 * PT + o_p
    b_u = tl.load(pu + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=on[:, None] & m_v[None, :], other=0)
    return a, on, rows, b_C, b_u.to(tl.float32) * b_w[:, None]


@triton.jit
def _pending_key_scale(on, rows, i_h, pk, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BPT: tl.constexpr,
                       PENDING_L2NORM: tl.constexpr):
    """1 / ||k_i|| for the path's keys when they are normalized in the kernel, else ones."""
    b_n = tl.zeros([BPT], dtype=tl.float32)
    if PENDING_L2NORM:
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            b_k = tl.load(pk + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=on[:, None] & (o_k < K)[None, :],
                          other=0).to(tl.float32)
            b_n += tl.sum(b_k * b_k, 1)
        return 1.0 / tl.sqrt(b_n + 1e-6)
    return b_n + 1.0


@triton.jit
def _pending(i_b, i_b64, i_hv, i_h, o_v, m_v, pu, pk, pg, ppar, pacc, stride_ppb, PT,
             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
             BPT: tl.constexpr, HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr):
    """Everything ``_state_tile`` needs to fold the pending commit into a value tile: (a, on-path mask,
    rows, G_a, w_i u_i, 1 / ||k_i||); placeholders when there is no pending commit."""
    if HAS_PENDING:
        a, on, rows, b_C, b_uw = _pending_path(i_b, i_b64, i_hv, o_v, m_v, pu, pg, ppar, pacc, stride_ppb, PT,
                                               HV, V, BPT)
        b_rpk = _pending_key_scale(on, rows, i_h, pk, H, K, BK, BPT, PENDING_L2NORM)
    else:
        a, on, rows, b_C, b_uw, b_rpk = 0, 0, 0, 0.0, 0.0, 0.0
    return a, on, rows, b_C, b_uw, b_rpk


@triton.jit
def _state_tile(h0, i_b64, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pk, a, on, rows, b_C, b_uw, b_rk,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BPT: tl.constexpr,
                HAS_PENDING: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The committed state's [BV, BK] tile in fp32. With a pending commit: exp(G_a) S0 + sum_i w_i u_i k_i^T
    over the path, written back (once per step) and returned exactly as stored."""
    p_h = h0 + i_b64 * stride_hb + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    m_h = m_v[:, None] & m_k[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)
    if HAS_PENDING:
        b_k = tl.load(pk + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=on[:, None] & m_k[None, :],
                      other=0).to(tl.float32) * b_rk[:, None]
        b_h = tl.exp(b_C) * b_h
        if BPT >= 16:
            b_h += tl.dot(tl.trans(b_uw), b_k, input_precision=DOT_PRECISION)
        else:
            o_p = tl.arange(0, BPT)
            for j in tl.static_range(BPT):
                u_j = tl.sum(tl.where(o_p[:, None] == j, b_uw, 0.0), 0)
                k_j = tl.sum(tl.where(o_p[:, None] == j, b_k, 0.0), 0)
                b_h += u_j[:, None] * k_j[None, :]
        b_h = b_h.to(p_h.dtype.element_ty)  # verify from exactly the state that is stored
        if a >= 0:
            tl.store(p_h, b_h, mask=m_h)
        b_h = b_h.to(tl.float32)
    return b_h


@triton.jit
def _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV: tl.constexpr):
    """(inclusive ancestor mask [BT, BT], path cumsum G [BT], depth): all nodes walk up at once."""
    p_par = parents + i_b64 * stride_pb
    p_g = g + i_b64 * T * HV + i_hv
    b_G = tl.load(p_g + o_t * HV, mask=m_t, other=0).to(tl.float32)
    m_anc = (o_t[:, None] == o_t[None, :]) & m_t[:, None]
    b_cur = tl.load(p_par + o_t, mask=m_t, other=-1)
    while tl.max(b_cur, 0) >= 0:
        m_up = b_cur >= 0
        m_anc = m_anc | (o_t[None, :] == b_cur[:, None])
        b_G += tl.load(p_g + b_cur * HV, mask=m_up, other=0).to(tl.float32)
        b_cur = tl.load(p_par + b_cur, mask=m_up, other=-1)
    n_depth = tl.max(tl.sum(m_anc.to(tl.int32), 1), 0) - 1
    return m_anc, b_G, n_depth


@triton.jit
def _decayed(m_anc, b_G, b_A, b_QK, beta, i_b64, i_hv, o_t, m_t, T, scale, HV: tl.constexpr):
    """M = diag(beta) (exp(G_t - G_i) K K^T on strict ancestors), P = scale exp(G_t - G_i) Q K^T on
    inclusive ancestors (masked before the exp: G_t - G_i <= 0 there), beta and exp(G): (M, P, beta, eG)."""
    m_strict = m_anc & (o_t[:, None] != o_t[None, :])
    b_diff = b_G[:, None] - b_G[None, :]
    b_beta = tl.load(beta + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_M = tl.where(m_strict, tl.exp(tl.where(m_strict, b_diff, float("-inf"))) * b_A, 0.0) * b_beta[:, None]
    b_P = tl.where(m_anc, tl.exp(tl.where(m_anc, b_diff, float("-inf"))) * b_QK, 0.0) * scale
    return b_M, b_P, b_beta, tl.exp(b_G)


@triton.jit
def _recurrent_node(b_h, q, k, v, g, beta, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    USE_QK_L2NORM_IN_KERNEL: tl.constexpr):
    """One gated delta rule step of node ``i_row`` on the [BV, BK] state tile in registers:
    (S_t, u_t = beta (v - exp(g) S k), o_t = S_t (scale q))."""
    b_q = tl.load(q + (i_row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_k = tl.load(k + (i_row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(v + (i_row * HV + i_hv) * V + o_v, mask=m_v, other=0).to(tl.float32)
    if USE_QK_L2NORM_IN_KERNEL:
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    b_beta = tl.load(beta + i_row * HV + i_hv).to(tl.float32)
    b_g = tl.load(g + i_row * HV + i_hv).to(tl.float32)
    b_h *= tl.exp(b_g)
    b_u = b_beta * (b_v - tl.sum(b_h * b_k[None, :], 1))
    b_h += b_u[:, None] * b_k[None, :]
    return b_h, b_u, tl.sum(b_h * b_q[None, :], 1)


@triton.autotune(configs=_fma_configs(), key=_KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _fit_v}, **_AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg"])
def tree_verify_fma_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_pb, stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, scale,
    B, T, PT, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BPT: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, HAS_PENDING: tl.constexpr,
    PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu,
                                        stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v, m_k = o_v < V, o_k < K
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b

    a, on, rows, b_C, b_uw, b_rpk = _pending(0, 0, i_hv, i_h, o_v, m_v, pu, pk, pg, ppar, pacc, stride_ppb, PT,
                                             H, HV, K, V, BK, BPT, HAS_PENDING, PENDING_L2NORM)
    b_h = _state_tile(h0, 0, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pk, a, on, rows, b_C, b_uw, b_rpk,
                      H, K, V, BPT, HAS_PENDING, DOT_PRECISION)
    m_anc, b_G, _ = _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV)

    # state and Gram products, one node at a time: row reductions of the tile, exact fp32
    p_qk_row = (i_b64 * T + o_t) * H + i_h
    m_tk = m_t[:, None] & m_k[None, :]
    b_K = tl.load(k + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
    b_Q = tl.load(q + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
    b_rk = tl.zeros([BT], dtype=tl.float32) + 1.0
    b_rq = tl.zeros([BT], dtype=tl.float32) + 1.0
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = 1.0 / tl.sqrt(tl.sum(b_K * b_K, 1) + 1e-6)
        b_rq = 1.0 / tl.sqrt(tl.sum(b_Q * b_Q, 1) + 1e-6)
        b_K = b_K * b_rk[:, None]
        b_Q = b_Q * b_rq[:, None]
    b_hk = tl.zeros([BT, BV], dtype=tl.float32)
    b_hq = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_QK = tl.zeros([BT, BT], dtype=tl.float32)
    for t in tl.static_range(BT):
        sel = o_t == t
        m_row_k = m_k & (tl.zeros([BK], dtype=tl.int32) + t < n_b)
        p_row = (i_b64 * T + t) * H * K + i_h * K + o_k
        k_t = tl.load(k + p_row, mask=m_row_k, other=0).to(tl.float32) * tl.sum(tl.where(sel, b_rk, 0.0), 0)
        q_t = tl.load(q + p_row, mask=m_row_k, other=0).to(tl.float32) * tl.sum(tl.where(sel, b_rq, 0.0), 0)
        b_hk = tl.where(sel[:, None], tl.sum(b_h * k_t[None, :], 1)[None, :], b_hk)
        b_hq = tl.where(sel[:, None], tl.sum(b_h * q_t[None, :], 1)[None, :], b_hq)
        b_A = tl.where(sel[None, :], tl.sum(b_K * k_t[None, :], 1)[:, None], b_A)
        b_QK = tl.where(sel[None, :], tl.sum(b_Q * k_t[None, :], 1)[:, None], b_QK)

    # masked log-space decays: only ancestor pairs, G_t - G_i <= 0
    b_M, b_P, b_beta, b_eG = _decayed(m_anc, b_G, b_A, b_QK, beta, i_b64, i_hv, o_t, m_t, T, scale, HV)
    p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
    b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
    b_R = b_beta[:, None] * (b_v - b_eG[:, None] * b_hk)
    b_O = b_eG[:, None] * b_hq * scale

    # forward substitution, row by row; o_t = eG_t S q_t + sum_{i <= t} P[t, i] u_i is final once u_t is
    b_U = tl.zeros([BT, BV], dtype=tl.float32)
    for t in tl.static_range(BT):
        sel = o_t == t
        m_row = tl.sum(tl.where(sel[:, None], b_M, 0.0), 0)
        p_row = tl.sum(tl.where(sel[:, None], b_P, 0.0), 0)
        u_t = tl.sum(tl.where(sel[:, None], b_R, 0.0), 0) - tl.sum(m_row[:, None] * b_U, 0)
        b_U = tl.where(sel[:, None], u_t[None, :], b_U)
        o_row = tl.sum(tl.where(sel[:, None], b_O, 0.0), 0) + tl.sum(p_row[:, None] * b_U, 0)
        p_row_tv = (i_b64 * T + t) * HV * V + i_hv * V + o_v
        m_row_v = m_v & (tl.zeros([BV], dtype=tl.int32) + t < T)
        tl.store(u + p_row_tv, u_t, mask=m_row_v)
        tl.store(o + p_row_tv, o_row.to(o.dtype.element_ty), mask=m_row_v)


def _prune_ki(configs, named_args, **kwargs):
    K = {**named_args, **kwargs}["K"]
    out = [c for c in _fit_v(configs, named_args, **kwargs) if c.kwargs["KI"] <= max(4, triton.next_power_of_2(K))]
    return out or configs[:1]


@triton.jit
def _state_tile_3d(h0, i_b, i_b64, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pu, pk, pg, ppar, pacc, stride_ppb, PT,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BPT: tl.constexpr,
                   HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr):
    """The committed state's value tile as [K / KI, BV, KI] fp32 (o_k: [K / KI, KI] key offsets). With a
    pending commit, exp(G_a) S0 + sum over the root..a path of exp(G_a - G_i) u_i k_i^T (``_path``; rank-1
    updates, exact fp32), written back once and returned as stored."""
    p_h = h0 + i_b64 * stride_hb + i_hv * V * K + o_v[None, :, None] * K + o_k[:, None, :]
    m_h = m_v[None, :, None] & m_k[:, None, :]
    b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)
    if HAS_PENDING:
        a, o_p, on, b_ppar, b_C, b_w = _path(i_b, i_b64, i_hv, pg, ppar, pacc, stride_ppb, PT, HV, BPT)
        b_h = b_h * tl.exp(b_C)
        if BPT <= 8:  # small windows: every slot's rows loaded at once (masked off the path), no serial walk
            for j in tl.static_range(BPT):
                on_j = _gather(on.to(tl.int32), o_p, j)
                row = i_b64 * PT + j
                b_pu = tl.load(pu + (row * HV + i_hv) * V + o_v, mask=m_v & (o_v * 0 + on_j > 0), other=0)
                b_pk = _key_row(pk, row, i_h, o_k, m_k & (o_k * 0 + on_j > 0), H, K, PENDING_L2NORM)
                b_h += (_gather(b_w, o_p, j) * b_pu.to(tl.float32))[None, :, None] * b_pk[:, None, :]
        else:
            cur = a
            while cur >= 0:
                row = i_b64 * PT + cur
                b_pu = tl.load(pu + (row * HV + i_hv) * V + o_v, mask=m_v, other=0).to(tl.float32)
                b_pk = _key_row(pk, row, i_h, o_k, m_k, H, K, PENDING_L2NORM)
                b_h += (_gather(b_w, o_p, cur) * b_pu)[None, :, None] * b_pk[:, None, :]
                cur = _gather(b_ppar, o_p, cur)
        b_h = b_h.to(p_h.dtype.element_ty)  # verify from exactly the state that is stored
        if a >= 0:
            tl.store(p_h, b_h, mask=m_h)
        b_h = b_h.to(tl.float32)
    return b_h


@triton.jit
def _gather(b_x, o_x, i):
    """b_x[i] for a scalar index i of a register vector (0 where i is out of range)."""
    return tl.sum(tl.where(o_x == i, b_x, 0), 0)


@triton.jit
def _key_row(k, row, i_h, o_k, m_k, H: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr):
    """Row ``row`` of a [rows, H, K] key (or query) tensor as a [KC, KI] fp32 tile, normalized if asked."""
    b_k = tl.load(k + (row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
    if L2NORM:
        b_k = b_k / tl.sqrt(tl.sum(tl.sum(b_k * b_k, 0), 0) + 1e-6)
    return b_k


@triton.jit
def _state_apply(b_h, b_x):
    """S x for a [KC, BV, KI] state tile and a [KC, KI] vector: the chunk axis first (in registers)."""
    return tl.sum(tl.sum(b_h * b_x[:, None, :], 0), 1)


def _chain_configs():
    if INTERPRET:
        return [triton.Config({"BV": 8, "KI": 4}, num_warps=1)]
    # KI = 128: one row across the warp's lanes (fla's layout); KI = 16, 32: a row over 4 or 8 lanes
    return [triton.Config({"BV": bv, "KI": ki}, num_warps=w, num_stages=s)
            for bv, ki, w, s in ((8, 128, 1, 1), (8, 128, 1, 3), (16, 128, 1, 3), (4, 32, 1, 1), (4, 32, 1, 3),
                                 (8, 32, 1, 3), (8, 16, 1, 3))]


@triton.autotune(configs=_chain_configs(), key=_KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _prune_ki}, **_AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg"])
def tree_verify_chain_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_pb, stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, scale,
    B, T, PT, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BPT: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, HAS_PENDING: tl.constexpr,
    PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_STATE_INDICES: tl.constexpr, KI: tl.constexpr,
):
    """Chains only (parents[t] = t - 1, not read): the recurrence node by node on the state tile in
    registers, as fla's fused_recurrent does, writing o_t and u_t = beta_t (v_t - exp(g_t) S_{t-1} k_t)
    and no state (the commit stays pending). The state tile is held as [K / KI, BV, KI]: KI = K puts a row
    across the warp's lanes (fla's layout), smaller KI a row over KI / 4 lanes with the K / KI chunks in
    registers (fewer shuffles per reduction, more registers); the autotuner picks."""
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu,
                                        stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    KC: tl.constexpr = BK // KI
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, KC)[:, None] * KI + tl.arange(0, KI)[None, :]
    m_v, m_k = o_v < V, o_k < K
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    b_h = _state_tile_3d(h0, 0, 0, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pu, pk, pg, ppar, pacc,
                         stride_ppb, PT, H, HV, K, V, BPT, HAS_PENDING, PENDING_L2NORM)
    for t in range(0, T):
        row = i_b64 * T + t
        p_tv = (row * HV + i_hv) * V + o_v
        if t < n_b:
            b_k = _key_row(k, row, i_h, o_k, m_k, H, K, USE_QK_L2NORM_IN_KERNEL)
            b_q = _key_row(q, row, i_h, o_k, m_k, H, K, USE_QK_L2NORM_IN_KERNEL) * scale
            b_v = tl.load(v + p_tv, mask=m_v, other=0).to(tl.float32)
            b_beta = tl.load(beta + row * HV + i_hv).to(tl.float32)
            b_h *= tl.exp(tl.load(g + row * HV + i_hv).to(tl.float32))
            b_u = b_beta * (b_v - _state_apply(b_h, b_k))
            b_h += b_u[None, :, None] * b_k[:, None, :]
            b_o = _state_apply(b_h, b_q)
        else:
            b_u = tl.zeros([BV], dtype=tl.float32)
            b_o = tl.zeros([BV], dtype=tl.float32)
        tl.store(u + p_tv, b_u, mask=m_v)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)


@triton.autotune(configs=_dot_configs(), key=_KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _prune_dot}, **_AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg"])
def tree_verify_dot_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_pb, stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, scale,
    B, T, PT, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BPT: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, HAS_PENDING: tl.constexpr,
    PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu,
                                        stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b

    a, on, rows, b_C, b_uw, b_rpk = _pending(0, 0, i_hv, i_h, o_v, m_v, pu, pk, pg, ppar, pacc, stride_ppb, PT,
                                             H, HV, K, V, BK, BPT, HAS_PENDING, PENDING_L2NORM)
    m_anc, b_G, n_depth = _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV)

    # Gram matrices and state products over key chunks; each state chunk is read (and, with a
    # pending commit, rebuilt and written) once
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_QK = tl.zeros([BT, BT], dtype=tl.float32)
    b_hk = tl.zeros([BT, BV], dtype=tl.float32)
    b_hq = tl.zeros([BT, BV], dtype=tl.float32)
    b_nk = tl.zeros([BT], dtype=tl.float32)
    b_nq = tl.zeros([BT], dtype=tl.float32)
    p_qk_row = (i_b64 * T + o_t) * H + i_h
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_h = _state_tile(h0, 0, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pk, a, on, rows, b_C, b_uw, b_rpk,
                          H, K, V, BPT, HAS_PENDING, DOT_PRECISION)
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_kt = tl.trans(b_k)
        b_ht = tl.trans(b_h)
        b_A += tl.dot(b_k, b_kt, input_precision=DOT_PRECISION)
        b_QK += tl.dot(b_q, b_kt, input_precision=DOT_PRECISION)
        b_hk += tl.dot(b_k, b_ht, input_precision=DOT_PRECISION)
        b_hq += tl.dot(b_q, b_ht, input_precision=DOT_PRECISION)
        if USE_QK_L2NORM_IN_KERNEL:
            b_nk += tl.sum(b_k * b_k, 1)
            b_nq += tl.sum(b_q * b_q, 1)
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = 1.0 / tl.sqrt(b_nk + 1e-6)
        b_rq = 1.0 / tl.sqrt(b_nq + 1e-6)
        b_A = b_A * b_rk[:, None] * b_rk[None, :]
        b_QK = b_QK * b_rq[:, None] * b_rk[None, :]
        b_hk = b_hk * b_rk[:, None]
        b_hq = b_hq * b_rq[:, None]

    b_M, b_P, b_beta, b_eG = _decayed(m_anc, b_G, b_A, b_QK, beta, i_b64, i_hv, o_t, m_t, T, scale, HV)

    p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
    b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
    b_R = b_beta[:, None] * (b_v - b_eG[:, None] * b_hk)
    # (I + M)^-1 R = R - M (R - M (R - ...)): M is nilpotent of order depth + 1
    b_U = b_R
    for _ in range(n_depth):
        b_U = b_R - tl.dot(b_M, b_U, input_precision=DOT_PRECISION)
    b_o = b_eG[:, None] * b_hq * scale + tl.dot(b_P, b_U, input_precision=DOT_PRECISION)

    m_store = (o_t[:, None] < T) & m_v[None, :]
    tl.store(u + p_tv, b_U, mask=m_store)
    tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


@triton.autotune(configs=_dot_configs(), key=_KEY, restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _prune_dot}, **_AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg"])
def tree_verify_dot_head_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_pb, stride_hb, stride_ppb, stride_pu, stride_pk, stride_pg, scale,
    B, T, PT, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BPT: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, HAS_PENDING: tl.constexpr,
    PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
):
    """The dot kernel with one program per (request, value head): the V-independent work (ancestors,
    K K^T, Q K^T and (I + M)^-1 by the Neumann series) is done once, then the value tiles stream
    through, U = (I + M)^-1 R taking one product per tile. Grid (1, B * HV)."""
    _, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu,
                                        stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b
    m_anc, b_G, n_depth = _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV)

    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_QK = tl.zeros([BT, BT], dtype=tl.float32)
    b_nk = tl.zeros([BT], dtype=tl.float32)
    b_nq = tl.zeros([BT], dtype=tl.float32)
    p_qk_row = (i_b64 * T + o_t) * H + i_h
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        b_k = tl.load(k + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_A += tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_QK += tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_nk += tl.sum(b_k * b_k, 1)
        b_nq += tl.sum(b_q * b_q, 1)
    b_rk = tl.zeros([BT], dtype=tl.float32) + 1.0
    b_rq = tl.zeros([BT], dtype=tl.float32) + 1.0
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = 1.0 / tl.sqrt(b_nk + 1e-6)
        b_rq = 1.0 / tl.sqrt(b_nq + 1e-6)
        b_A = b_A * b_rk[:, None] * b_rk[None, :]
        b_QK = b_QK * b_rq[:, None] * b_rk[None, :]

    b_M, b_P, b_beta, b_eG = _decayed(m_anc, b_G, b_A, b_QK, beta, i_b64, i_hv, o_t, m_t, T, scale, HV)
    # (I + M)^-1 = I - M (I - M (I - ...)): M is nilpotent of order depth + 1
    b_I = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    b_Minv = b_I
    for _ in range(n_depth):
        b_Minv = b_I - tl.dot(b_M, b_Minv, input_precision=DOT_PRECISION)

    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        a, on, rows, b_C, b_uw, b_rpk = _pending(0, 0, i_hv, i_h, o_v, m_v, pu, pk, pg, ppar, pacc, stride_ppb,
                                                 PT, H, HV, K, V, BK, BPT, HAS_PENDING, PENDING_L2NORM)
        b_hk = tl.zeros([BT, BV], dtype=tl.float32)
        b_hq = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_h = _state_tile(h0, 0, i_hv, i_h, o_v, m_v, o_k, m_k, stride_hb, pk, a, on, rows, b_C, b_uw,
                              b_rpk, H, K, V, BPT, HAS_PENDING, DOT_PRECISION)
            m_tk = m_t[:, None] & m_k[None, :]
            b_k = tl.load(k + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
            b_q = tl.load(q + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
            b_ht = tl.trans(b_h)
            b_hk += tl.dot(b_k, b_ht, input_precision=DOT_PRECISION)
            b_hq += tl.dot(b_q, b_ht, input_precision=DOT_PRECISION)
        b_hk = b_hk * b_rk[:, None]
        b_hq = b_hq * b_rq[:, None]
        p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
        b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
        b_R = b_beta[:, None] * (b_v - b_eG[:, None] * b_hk)
        b_U = tl.dot(b_Minv, b_R, input_precision=DOT_PRECISION)
        b_o = b_eG[:, None] * b_hq * scale + tl.dot(b_P, b_U, input_precision=DOT_PRECISION)
        m_store = (o_t[:, None] < T) & m_v[None, :]
        tl.store(u + p_tv, b_U, mask=m_store)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


#: The autotuned kernel behind each name of KERNELS.
KERNEL_FNS = {"fma": tree_verify_fma_kernel, "dot": tree_verify_dot_kernel, "dot_head": tree_verify_dot_head_kernel,
              "chain": tree_verify_chain_kernel}


def default_kernel(T: int, B: int, HV: int, chain: bool = False) -> str:
    """The verify kernel measured fastest for a window (H200, 2026-11-29, benchmarks/NOTES.md): "chain" for
    chains (every chain row: 447 vs 699 us at k = 3, B = 256; 5.5 vs 9.2 us at B = 1), "fma" for other
    windows of up to FMA_MAX_BT padded nodes, then "dot_head" with B * HV >= 512 programs (3726 vs 5275 us
    at (3,3,3), B = 256; 930 vs 1235 us at B = 59) and "dot" below (31 vs 86 us at B = 1)."""
    if chain:
        return "chain"
    if triton.next_power_of_2(max(T, 2)) <= FMA_MAX_BT:
        return "fma"
    return "dot_head" if B * HV >= 512 else "dot"


def tree_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale, use_qk_l2norm_in_kernel=False,
                    num_nodes=None, dot_precision=None, pending=None, kernel=None, config=None, chain=False,
                    state_indices=None):
    """Launcher: inputs already validated; parents int32 on the inputs' device. Returns (o, u fp32).

    ``pending``: a PendingCommit whose parents and accepted are int32 device tensors (validated), or
    None; ``initial_state`` is then updated in place. ``state_indices``: None (request b's state is
    ``initial_state[b]``, its pending u / k / g row b) or int32 [B] on the device: ``initial_state`` and
    the pending u / k / g are pools of slots (any slot stride, each slot contiguous) and request b's
    live in slot ``state_indices[b]`` (a serving engine's state pool; slots must be distinct). ``kernel``: "fma" or "dot" to override the
    choice by window size, "dot_head" (one program per request and value head, the V-independent
    work done once), or "chain" for windows known to be chains (parents[t] = t - 1, not checked
    here: ``tree_verify`` checks it). ``config``: a ``triton.Config`` of that kernel to launch instead
    of the autotuned one (profiling; a dot kernel's config names BK as well as BV).
    """
    if kernel not in KERNELS and kernel is not None:
        raise ValueError(f"kernel = {kernel!r}: expected None or one of {KERNELS}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = torch.empty_like(v)
    u = torch.empty(B, T, HV, V, device=v.device, dtype=torch.float32)
    BT = triton.next_power_of_2(max(T, 2))
    kernel = kernel or default_kernel(T, B, HV, chain)
    if kernel.startswith("dot"):
        BT = max(16, BT)
    if pending is not None:
        pu, pk, pg, ppar, pacc = pending.u, pending.k, pending.g, pending.parents, pending.accepted
        PT = pu.shape[1]
        stride_ppb = 0 if ppar.ndim == 1 else PT
        pl2 = pending.use_qk_l2norm_in_kernel
        pending_strides = (pu.stride(0), pk.stride(0), pg.stride(0))
    else:
        pu = pk = pg = ppar = pacc = u
        PT, stride_ppb, pl2, pending_strides = 1, 0, False, (0, 0, 0)
    fn = KERNEL_FNS[kernel]

    def grid(meta):
        return (1 if kernel == "dot_head" else triton.cdiv(V, meta["BV"]), B * HV)

    launch, tuned = (fn, {}) if config is None else (fn.fn, dict(config.all_kwargs()))
    launch[grid](
        q, k, v, g, beta, initial_state, parents, num_nodes if num_nodes is not None else parents, o, u,
        pu, pk, pg, ppar, pacc, u if state_indices is None else state_indices,
        stride_pb, initial_state.stride(0), stride_ppb, *pending_strides, scale,
        B=B, T=T, PT=PT, H=H, HV=HV, K=K, V=V, BT=BT,
        **({} if kernel.startswith("dot") else {"BK": triton.next_power_of_2(K)}),  # dot kernels tune BK
        BPT=triton.next_power_of_2(max(PT, 2)),
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, HAS_NUM_NODES=num_nodes is not None,
        HAS_PENDING=pending is not None, PENDING_L2NORM=pl2, DOT_PRECISION=dot_precision or DEFAULT_DOT_PRECISION,
        HAS_STATE_INDICES=state_indices is not None,
        **tuned,
    )
    return o, u


def tree_verify(q, k, v, g, beta, initial_state, parents, scale=None, use_qk_l2norm_in_kernel=False,
                num_nodes=None, pending=None, kernel=None):
    """Outputs and pseudo-values of every tree node in one launch (kernel twin of ``naive_tree_verify``).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (bf16 or fp32); initial_state
    [B, HV, V, K] (fp32 or bf16; any batch stride); parents a DraftTree, [T] or [B, T];
    num_nodes optional int [B]: request b uses nodes 0..num_nodes[b] - 1 (0 = inactive slot),
    the rest of its o and u is written as zeros. Returns o [B, T, HV, V] in v's dtype and
    u [B, T, HV, V] fp32.

    pending: a ``PendingCommit`` of the previous window (kernel twin of ``naive_tree_step``): the
    state is first overwritten in place with each request's pending accepted state (rows with
    accepted = -1 are left as they are), then the window is verified from it. The next step's
    pending commit is ``PendingCommit(u, k, g, parents, accepted)`` of this window.

    kernel: None (``default_kernel``: the chain kernel when every request's window is a chain, found
    from ``parents``), "fma", "dot", "dot_head" or "chain" (the node-by-node recurrence, chains only);
    see ``tree_verify_fwd``.

    While a CUDA graph is being captured only metadata is checked: pass int32 device tensors
    validated beforehand.
    """
    values = not is_capturing()
    dims, par, stride_pb, nn = check_gdn_kernel_inputs(q, k, v, g, beta, initial_state, parents, num_nodes,
                                                       max_nodes=MAX_KERNEL_NODES, values=values)
    if pending is not None:
        pending = check_pending(pending, initial_state, dims, max_nodes=MAX_KERNEL_NODES, values=values)
    chain = values and bool((par == torch.arange(-1, dims.T - 1, device=par.device, dtype=par.dtype)).all())
    if kernel == "chain" and values and not chain:
        raise ValueError("kernel='chain' needs every request's window to be a chain (parents[t] = t - 1); "
                         "leave kernel=None for trees")
    scale = dims.K ** -0.5 if scale is None else float(scale)
    return tree_verify_fwd(q, k, v, g, beta, initial_state, par, stride_pb, scale, use_qk_l2norm_in_kernel, nn,
                           pending=pending, kernel=kernel, chain=chain)
