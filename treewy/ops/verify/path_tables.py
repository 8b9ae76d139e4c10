"""The path kernel's tables: each node's root path, its rows of (I + M)^-1 and of P (I + M)^-1 (the derivation is
in ``path.py``), and the split launch's first kernel, which writes them once per (request, value head).

``_walk`` finds every node's ancestors and path cumsums at once in registers; ``_tables`` forms the dot products
along each path in exact fp32 and hands them to ``_path_coefficients``. The one-launch kernel runs both in every
program's prologue. The split launch (family "path_split", ``path_fwd(split=True)``) runs them in
``path_tables_kernel`` instead, which writes ``table_cols(BD)`` floats per node; the streaming kernel, with
``HAS_TABLES``, skips its prologue and reads them back after its state loop (``_load_tables``, or from BT =
``COLUMN_TABLES_MIN_BT`` on column by column: ``_path_sums_from_tables``), so narrow value tiles no longer repeat
it. The split launch serves wide trees from ``select.SPLIT_MIN_BATCH`` requests on (why: see there).
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.common import _exp_rn, _inv_norm
from treewy.ops.verify.tuning import AUTOTUNE_EXTRA, capture_safe_pruning

#: Padded windows from which the split launch's streaming kernel reads the tables column by column
#: (``_path_sums_from_tables``: no column picked out of a tile by a reduction); narrower ones read [BT, BD] tiles,
#: where the column loads cost registers: BT = 16, BV = 128 spilled that way for sm_90 (benchmarks/compile_offline.py).
COLUMN_TABLES_MIN_BT = tl.constexpr(32)

#: Depth bounds up to which the ancestors' key rows of a chunk are loaded in one unrolled batch (deeper tables
#: loop over them at run time).
UNROLL_DEPTH = tl.constexpr(8)

#: (ROW_BK, warps) the split launch's tables kernel is tuned over (the first: what a pinned launch runs).
TABLE_CONFIGS = ((32, 4),) if INTERPRET else ((32, 4), (64, 4), (32, 2), (64, 8))


def depth_block(T: int, max_depth: int | None) -> int:
    """BD, the columns of the coefficient tables: the next power of two above the window's largest depth
    (at least 2), or above T - 1 when the depth is not known (always enough, costlier for wide trees)."""
    d = T - 1 if max_depth is None else min(int(max_depth), T - 1)
    return triton.next_power_of_2(max(d + 1, 2))


@triton.jit
def _col(b_tab, o_d, j):
    """Column j of a [BT, BD] table, as a [BT] vector."""
    return tl.sum(tl.where(o_d[None, :] == j, b_tab, 0), 1)


@triton.jit
def _at(b_x, b_idx):
    """b_x[idx] for a [BT] vector and [BT] indices; 0 where idx < 0."""
    return tl.where(b_idx >= 0, tl.gather(b_x, tl.maximum(b_idx, 0), 0), 0)


@triton.jit
def _walk(parents, g, beta, i_b64, i_hv, m_t, stride_pb, T, HV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """(ancestors a_j [BT, BD]: a_0 = t, -1 past the root or num_nodes; path cumsums G and beta [BT]; depth), all
    nodes walked up at once in registers."""
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    b_par = tl.load(parents + i_b64 * stride_pb + o_t, mask=m_t, other=-1)
    b_g = tl.load(g + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_beta = tl.load(beta + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_anc = tl.where(o_d[None, :] == 0, tl.where(m_t, o_t, -1)[:, None], -1)
    b_G = b_g
    b_cur = b_par
    n_depth = 0
    while tl.max(b_cur, 0) >= 0:
        n_depth += 1
        b_anc = tl.where(o_d[None, :] == n_depth, b_cur[:, None], b_anc)
        b_G += _at(b_g, b_cur)
        b_cur = tl.where(b_cur >= 0, tl.gather(b_par, tl.maximum(b_cur, 0), 0), -1)
    return b_anc, b_G, b_beta, n_depth


@triton.jit
def _ancestor_dots(b_KK, b_QK, b_k, b_q, k, b_anc, o_d, j, i_b64, i_h, o_k, m_k, T, H: tl.constexpr,
                   K: tl.constexpr):
    """Add k_t.k_{a_j} and q_t.k_{a_j} over one key chunk to column j of the tables (exact fp32 FMAs; the
    ancestors' key rows are gathered from global memory, where this program just read them)."""
    b_a = _col(b_anc, o_d, j)
    b_ka = tl.load(k + ((i_b64 * T + tl.maximum(b_a, 0)) * H + i_h)[:, None] * K + o_k[None, :],
                   mask=(b_a >= 0)[:, None] & m_k[None, :], other=0).to(tl.float32)
    b_KK += tl.where(o_d[None, :] == j, tl.sum(b_k * b_ka, 1)[:, None], 0.0)
    b_QK += tl.where(o_d[None, :] == j, tl.sum(b_q * b_ka, 1)[:, None], 0.0)
    return b_KK, b_QK


@triton.jit
def _path_coefficients(b_anc, b_G, b_beta, b_KK, b_QK, b_qq, m_t, n_depth, scale, BD: tl.constexpr,
                       USE_QK_L2NORM_IN_KERNEL: tl.constexpr):
    """(x_j, w_j [BT, BD], beta exp(G) / ||k||, scale exp(G) / ||q|| [BT]) from the ancestors, the path
    cumsums and the dot-product tables (column 0: k_t.k_t and q_t.k_t; column j: with a_j's key)."""
    o_d = tl.arange(0, BD)
    b_rk = tl.where(m_t, 1.0, 0.0)
    b_rq = tl.where(m_t, 1.0, 0.0)
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = _inv_norm(_col(b_KK, o_d, 0))
        b_rq = _inv_norm(b_qq)
    # m_j(t) = M[t, a_j] and p_j(t) = P[t, a_j]: decays of ancestor pairs only, exp(G_t - G_a) <= 1
    b_m = tl.zeros(b_KK.shape, dtype=tl.float32)
    b_p = tl.where(o_d[None, :] == 0, (scale * b_rq * b_rk * _col(b_QK, o_d, 0))[:, None], 0.0)
    for j in range(1, n_depth + 1):
        b_a = _col(b_anc, o_d, j)
        m_a = b_a >= 0
        b_w = tl.where(m_a, tl.exp(tl.where(m_a, b_G - _at(b_G, b_a), float("-inf"))), 0.0) * _at(b_rk, b_a)
        b_m = tl.where(o_d[None, :] == j, (b_beta * b_rk * b_w * _col(b_KK, o_d, j))[:, None], b_m)
        b_p = tl.where(o_d[None, :] == j, (scale * b_rq * b_w * _col(b_QK, o_d, j))[:, None], b_p)

    # rows of (I + M)^-1 and of P (I + M)^-1 along each path
    b_x = tl.where((o_d[None, :] == 0) & m_t[:, None], 1.0, 0.0)
    for j in range(1, n_depth + 1):
        b_acc = tl.zeros(b_beta.shape, dtype=tl.float32)
        for i in range(0, j):
            b_acc += _col(b_x, o_d, i) * _at(_col(b_m, o_d, j - i), _col(b_anc, o_d, i))
        b_x = tl.where(o_d[None, :] == j, -b_acc[:, None], b_x)
    b_wt = tl.zeros(b_KK.shape, dtype=tl.float32)
    for j in range(0, n_depth + 1):
        b_acc = tl.zeros(b_beta.shape, dtype=tl.float32)
        for i in range(0, j + 1):
            b_acc += _col(b_p, o_d, i) * _at(_col(b_x, o_d, j - i), _col(b_anc, o_d, i))
        b_wt = tl.where(o_d[None, :] == j, b_acc[:, None], b_wt)
    b_eG = tl.where(m_t, _exp_rn(b_G), 0.0)
    return b_x, b_wt, b_beta * b_eG * b_rk, scale * b_eG * b_rq


@triton.jit
def _tables(q, k, b_anc, b_G, b_beta, n_depth, i_b64, i_h, m_t, scale, T, H: tl.constexpr, K: tl.constexpr,
            BT: tl.constexpr, BD: tl.constexpr, ROW_BK: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):
    """With the walk's ancestors and path cumsums, the rest of what a (request, value head) needs that does not
    depend on the state or the values: (x_j, w_j [BT, BD], beta exp(G) / ||k||, scale exp(G) / ||q|| [BT])."""
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    # each node's key and query against its own and its ancestors' keys, in exact fp32 (rows from global
    # memory, the ancestors' gathered; one chunk's loads issued together)
    b_KK = tl.zeros([BT, BD], dtype=tl.float32)
    b_QK = tl.zeros([BT, BD], dtype=tl.float32)
    b_qq = tl.zeros([BT], dtype=tl.float32)
    p_qk = (i_b64 * T + o_t) * H + i_h
    for i_k in range(0, tl.cdiv(K, ROW_BK)):
        o_k = i_k * ROW_BK + tl.arange(0, ROW_BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_KK += tl.where(o_d[None, :] == 0, tl.sum(b_k * b_k, 1)[:, None], 0.0)
        b_QK += tl.where(o_d[None, :] == 0, tl.sum(b_q * b_k, 1)[:, None], 0.0)
        if USE_QK_L2NORM_IN_KERNEL:
            b_qq += tl.sum(b_q * b_q, 1)
        if BD <= UNROLL_DEPTH:
            for j in tl.static_range(1, BD):
                b_KK, b_QK = _ancestor_dots(b_KK, b_QK, b_k, b_q, k, b_anc, o_d, j, i_b64, i_h, o_k, m_k, T, H, K)
        else:
            for j in range(1, n_depth + 1):
                b_KK, b_QK = _ancestor_dots(b_KK, b_QK, b_k, b_q, k, b_anc, o_d, j, i_b64, i_h, o_k, m_k, T, H, K)
    return _path_coefficients(b_anc, b_G, b_beta, b_KK, b_QK, b_qq, m_t, n_depth, scale, BD, USE_QK_L2NORM_IN_KERNEL)


@triton.jit
def _table_row(tab, i_b64, i_hv, o_t, T, HV: tl.constexpr, BD: tl.constexpr):
    """Pointers to the table rows of a (request, value head): ``table_cols(BD)`` floats per node, x_j, w_j and
    a_j (BD each), then beta, beta exp(G) / ||k|| and scale exp(G) / ||q||."""
    return tab + ((i_b64 * HV + i_hv) * T + o_t) * (3 * BD + 3)


@triton.jit
def _load_tables(tab, i_b64, i_hv, o_t, m_t, T, HV: tl.constexpr, BD: tl.constexpr):
    o_d = tl.arange(0, BD)
    p = _table_row(tab, i_b64, i_hv, o_t, T, HV, BD)
    b_x = tl.load(p[:, None] + o_d[None, :], mask=m_t[:, None], other=0)
    b_wt = tl.load(p[:, None] + BD + o_d[None, :], mask=m_t[:, None], other=0)
    b_anc = tl.load(p[:, None] + 2 * BD + o_d[None, :], mask=m_t[:, None], other=-1).to(tl.int32)
    b_beta = tl.load(p + 3 * BD, mask=m_t, other=0)
    b_ck = tl.load(p + 3 * BD + 1, mask=m_t, other=0)
    b_cq = tl.load(p + 3 * BD + 2, mask=m_t, other=0)
    return b_anc, b_x, b_wt, b_ck, b_cq, b_beta


@triton.jit
def _path_sums_from_tables(tab, i_b64, i_hv, o_t, m_t, b_v, b_xk, b_xq, T, HV: tl.constexpr, BT: tl.constexpr,
                           BD: tl.constexpr, BV: tl.constexpr):
    """(u, o) of the split launch's streaming kernel from the tables' columns, each loaded as a [BT] vector (no
    column picked out of a [BT, BD] tile). Every depth below BD is summed: past a node's depth its x_j and w_j
    are 0, and a window too deep for the tables has NaN ones (``path_tables_kernel``)."""
    p = _table_row(tab, i_b64, i_hv, o_t, T, HV, BD)
    b_beta = tl.load(p + 3 * BD, mask=m_t, other=0)
    b_ck = tl.load(p + 3 * BD + 1, mask=m_t, other=0)
    b_cq = tl.load(p + 3 * BD + 2, mask=m_t, other=0)
    b_R = b_beta[:, None] * b_v - b_ck[:, None] * b_xk
    b_U = tl.load(p, mask=m_t, other=0)[:, None] * b_R
    b_o = b_cq[:, None] * b_xq + tl.load(p + BD, mask=m_t, other=0)[:, None] * b_R
    for j in range(1, BD):
        b_a = tl.load(p + 2 * BD + j, mask=m_t, other=-1).to(tl.int32)
        b_Ra = tl.gather(b_R, tl.broadcast_to(tl.maximum(b_a, 0)[:, None], [BT, BV]), 0)
        b_U += tl.load(p + j, mask=m_t, other=0)[:, None] * b_Ra
        b_o += tl.load(p + BD + j, mask=m_t, other=0)[:, None] * b_Ra
    return b_U, b_o


def table_cols(bd: int) -> int:
    """Floats per node in the tables the split launch passes between its two kernels."""
    return 3 * bd + 3


@triton.autotune(configs=[triton.Config({"ROW_BK": r}, num_warps=w) for r, w in TABLE_CONFIGS],
                 key=["B_BUCKET", "BT", "BD", "H", "HV", "K", "USE_QK_L2NORM_IN_KERNEL", "HAS_NUM_NODES"],
                 prune_configs_by=None if INTERPRET else capture_safe_pruning(), **AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "stride_pb", "B_BUCKET"])
def path_tables_kernel(q, k, g, beta, parents, num_nodes, tab, stride_pb, scale, T, B_BUCKET, H: tl.constexpr,
                       HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, ROW_BK: tl.constexpr,
                       USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr):
    """The split launch's first kernel: per (request, value head), the tables the streaming kernel reads (the
    fused kernel's prologue, once per head instead of once per value tile). A window deeper than the tables
    hold gets NaN coefficients, hence NaN outputs."""
    i_bh = tl.program_id(0)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_b64 = i_b.to(tl.int64)
    i_h = i_hv // (HV // H)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b
    b_anc, b_G, b_beta, n_depth = _walk(parents, g, beta, i_b64, i_hv, m_t, stride_pb, T, HV, BT, BD)
    b_x, b_wt, b_ck, b_cq = _tables(q, k, b_anc, b_G, b_beta, n_depth, i_b64, i_h, m_t, scale, T, H, K, BT, BD,
                                    ROW_BK, USE_QK_L2NORM_IN_KERNEL)
    if n_depth >= BD:
        b_x = b_x + float("nan")
        b_wt = b_wt + float("nan")
    p = _table_row(tab, i_b64, i_hv, o_t, T, HV, BD)
    m_r = o_t < T
    tl.store(p[:, None] + o_d[None, :], b_x, mask=m_r[:, None])
    tl.store(p[:, None] + BD + o_d[None, :], b_wt, mask=m_r[:, None])
    tl.store(p[:, None] + 2 * BD + o_d[None, :], b_anc.to(tl.float32), mask=m_r[:, None])
    tl.store(p + 3 * BD, b_beta, mask=m_r)
    tl.store(p + 3 * BD + 1, b_ck, mask=m_r)
    tl.store(p + 3 * BD + 2, b_cq, mask=m_r)
