"""The pending commit folded into a state tile, written once for every verify kernel.

The previous window's accepted node a gives S_a = exp(G_a) S0 + sum over the root..a path of
exp(G_a - G_i) u_i k_i^T (``treewy.ops.naive_flush``). A kernel that verifies from a state tile first
finds the path (``_pending_path``, in registers: the pending parents are loaded once), then folds the
path's rank-one updates into each [BV, BK] (or transposed [BK, BV]) tile it reads, in exact fp32 FMAs,
FOLD_ROWS rows per pass so that their loads are issued together, writes the tile back and verifies
from exactly what it stored.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import triton
import triton.language as tl

from treewy.ops.common import _exp_rn, _gather, _inv_norm

#: Path rows folded per pass of the fold loop: their u and k rows are loaded together (independent
#: loads), and a path of d + 1 rows takes ceil((d + 1) / FOLD_ROWS) passes. 4 covers every depth-3 tree.
FOLD_ROWS = 4

#: Path rows the path kernel selects once per program (``_fold_rows``) and folds per state chunk as a sum of
#: FOLD_PAD rank-one updates (``_fold_chunk``); rows past it (paths of 5 nodes or more) take ``_fold_tile``'s loop.
FOLD_PAD = tl.constexpr(4)

#: Pending windows of at least this many slots (BPT) fold through ``_fold_rows`` / ``_fold_chunk`` in the path
#: kernels; narrower ones row by row (``_fold_tile``), where selecting a row costs less than holding the
#: hoisted rows: on the H200 the hoist sped up the split launch for a (3,3,3) window (64 slots) and slowed it
#: for a (2,2,2) one (16 slots) at B = 256 (benchmarks/profile_kernels.py times both ways; the "333 B256" and
#: "222 B256" rows of the kernel targets table, treewy/data/index.json, time what ships).
HOIST_FOLD_SLOTS = tl.constexpr(32)


@triton.jit
def _request_bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb, stride_pu, stride_pk, stride_pg,
                   stride_ppb, HAS_STATE_INDICES: tl.constexpr):
    """Request i_b's state and pending-commit pointers, as row 0 of what the helpers below index: its pool
    slot state_idx[i_b] when given (a serving engine's pool: state and pending stash live there), else
    row i_b."""
    i_s = tl.load(state_idx + i_b).to(tl.int64) if HAS_STATE_INDICES else i_b64
    return (h0 + i_s * stride_hb, pu + i_s * stride_pu, pk + i_s * stride_pk, pg + i_s * stride_pg,
            ppar + i_b64 * stride_ppb, pacc + i_b)


@triton.jit
def _pending_path(i_b, i_b64, i_hv, pg, ppar, pacc, stride_ppb, PT, HV: tl.constexpr, BPT: tl.constexpr):
    """The pending accepted node and its root..a path over the BPT slots of the previous window:
    (a, slot offsets, each slot's rank on the path from the root (-1 off the path), path length, G_a,
    weights exp(G_a - G_i) [BPT], 0 off the path). a = -1: nothing pending (empty path, G_a = 0)."""
    a = tl.load(pacc + i_b)
    o_p = tl.arange(0, BPT)
    b_par = tl.load(ppar + i_b64 * stride_ppb + o_p, mask=o_p < PT, other=-1)
    on = o_p < 0
    cur = a
    while cur >= 0:
        on = on | (o_p == cur)
        cur = _gather(b_par, o_p, cur)
    b_gp = tl.load(pg + (i_b64 * PT + o_p) * HV + i_hv, mask=on, other=0).to(tl.float64)   # fp64: see below
    b_C = tl.sum(b_gp, 0)
    b_w = tl.where(on, _exp_rn(b_C - tl.cumsum(b_gp, 0)), 0.0)
    rank = tl.where(on, tl.cumsum(on.to(tl.int32), 0) - 1, -1)
    return a, o_p, rank, tl.sum(on.to(tl.int32), 0), b_C, b_w


@triton.jit
def _chain_pending_path(a, i_hv, pg, PT, HV: tl.constexpr, BPT: tl.constexpr):
    """``_pending_path`` of a chain window (parents t - 1, not stored): the path is slots 0..a, row pg's."""
    o_p = tl.arange(0, BPT)
    on = (o_p <= a) & (o_p < PT)
    # in fp64: G_a - G_i cancels, and a GPU sums and scans in different orders, so in fp32 even the accepted
    # node's weight exp(G_a - G_a) came out 1 ulp of G_a off 1 (9.2e-07 in one head of the flush test on the H200)
    b_gp = tl.load(pg + o_p * HV + i_hv, mask=on, other=0).to(tl.float64)
    b_C = tl.sum(b_gp, 0)
    b_w = tl.where(on, _exp_rn(b_C - tl.cumsum(b_gp, 0)), 0.0)
    return o_p, tl.where(on, o_p, -1), tl.sum(on.to(tl.int32), 0), b_C, b_w


@triton.jit
def _pending_key_scale(i_b64, i_h, pk, o_p, rank, PT, H: tl.constexpr, K: tl.constexpr, BPT: tl.constexpr,
                       PENDING_L2NORM: tl.constexpr):
    """1 / ||k_i|| for the path's keys when they are normalized in the kernel, else ones [BPT]."""
    b_n = tl.zeros([BPT], dtype=tl.float32)
    if PENDING_L2NORM:
        BKN: tl.constexpr = 32
        on = rank >= 0
        for i_k in range(0, tl.cdiv(K, BKN)):
            o_k = i_k * BKN + tl.arange(0, BKN)
            b_k = tl.load(pk + ((i_b64 * PT + o_p[:, None]) * H + i_h) * K + o_k[None, :],
                          mask=on[:, None] & (o_k < K)[None, :], other=0).to(tl.float32)
            b_n += tl.sum(b_k * b_k, 1)
        return _inv_norm(b_n)
    return b_n + 1.0


@triton.jit
def _fold_tile(b_h, i_b64, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w, PT,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, FOLD_ROWS: tl.constexpr,
               TRANSPOSED: tl.constexpr, FIRST_ROW: tl.constexpr = 0):
    """exp(G_a) S0 + sum over the path of w_i u_i k_i^T on a state tile: [BV, BK] (o_v, o_k), or [BK, BV]
    with TRANSPOSED. b_w holds exp(G_a - G_i) / ||k_i|| per slot. FIRST_ROW > 0: the decay and the rows before
    it are already folded (``_fold_chunk``), only the rest of the path is added."""
    if FIRST_ROW == 0:
        b_h = b_h * _exp_rn(b_C)
    for j0 in range(FIRST_ROW, n_path, FOLD_ROWS):
        for jj in tl.static_range(FOLD_ROWS):
            sel = rank == j0 + jj
            row = i_b64 * PT + tl.sum(tl.where(sel, o_p, 0), 0)
            b_u = tl.load(pu + (row * HV + i_hv) * V + o_v, mask=m_v & (o_v * 0 + j0 + jj < n_path),
                          other=0).to(tl.float32)
            b_k = tl.load(pk + (row * H + i_h) * K + o_k, mask=m_k & (o_k * 0 + j0 + jj < n_path),
                          other=0).to(tl.float32)
            b_u = b_u * tl.sum(tl.where(sel, b_w, 0.0), 0)
            if TRANSPOSED:
                b_h += b_k[:, None] * b_u[None, :]
            else:
                b_h += b_u[:, None] * b_k[None, :]
    return b_h


@triton.jit
def _fold_slot(o_p, rank, b_w, j):
    """(slot, weight exp(G_a - G_i) / ||k_i||) of the path's row j, slot -1 past the path: selected once per
    program by a kernel that folds several tiles, which then adds the row with ``_fold_row``."""
    sel = rank == j
    return tl.sum(tl.where(sel, o_p + 1, 0), 0) - 1, tl.sum(tl.where(sel, b_w, 0.0), 0)


@triton.jit
def _fold_row(b_h, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, slot, w, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr):
    """b_h + w u_slot k_slot^T on a [BK, BV] (S^T) tile, in exact fp32; nothing for slot -1."""
    i_s = tl.maximum(slot, 0)
    b_u = tl.load(pu + (i_s * HV + i_hv) * V + o_v, mask=m_v & (o_v * 0 + slot >= 0), other=0).to(tl.float32) * w
    b_k = tl.load(pk + (i_s * H + i_h) * K + o_k, mask=m_k & (o_k * 0 + slot >= 0), other=0).to(tl.float32)
    return b_h + b_k[:, None] * b_u[None, :]


@triton.jit
def _fold_rows(i_hv, o_v, m_v, pu, o_p, rank, b_w, HV: tl.constexpr, V: tl.constexpr, FOLD_PAD: tl.constexpr):
    """Once per program of a kernel that folds many chunks of one value tile: the path's first FOLD_PAD slots in
    rank order (-1 past the path) and their u rows times exp(G_a - G_i) / ||k_i|| ([FOLD_PAD, BV], 0 past the
    path). Selecting the rows once keeps the per-chunk fold free of reductions."""
    o_f = tl.arange(0, FOLD_PAD)
    sel = rank[None, :] == o_f[:, None]
    b_slot = tl.sum(tl.where(sel, o_p[None, :] + 1, 0), 1) - 1
    b_wf = tl.sum(tl.where(sel, b_w[None, :], 0.0), 1)
    on = b_slot >= 0
    b_u = tl.load(pu + (tl.maximum(b_slot, 0)[:, None] * HV + i_hv) * V + o_v[None, :],
                  mask=on[:, None] & m_v[None, :], other=0).to(tl.float32)
    return b_slot, b_u * b_wf[:, None]


@triton.jit
def _fold_chunk(b_h, i_h, o_k, m_k, pk, b_slot, b_uw, b_C, H: tl.constexpr, K: tl.constexpr):
    """exp(G_a) S0 + the path's first FOLD_PAD rank-one updates on a [BK, BV] chunk (k rows [FOLD_PAD, BK] with
    ``_fold_rows``' u rows, fp32 products summed over the rows)."""
    on = b_slot >= 0
    b_k = tl.load(pk + (tl.maximum(b_slot, 0)[:, None] * H + i_h) * K + o_k[None, :],
                  mask=on[:, None] & m_k[None, :], other=0).to(tl.float32)
    return b_h * _exp_rn(b_C) + tl.sum(b_k[:, :, None] * b_uw[:, None, :], 0)
