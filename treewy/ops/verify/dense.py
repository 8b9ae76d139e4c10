"""Dense kernel: the WY form of a tree of up to 64 nodes, fla's chunked form with the ancestor mask, one program
per (request, value head) that forms (I + M)^-1 once and then streams the state's value tiles.

Status: parity with ``naive_tree_step`` (fp64) under the Triton interpreter on CPU (exact fp32 products) and, for
the tensor-core paths, through the tests marked ``gpu`` and benchmarks/bench_kernels.py. Limits: T <= 64 nodes
per request (``DENSE_MAX_NODES``); any depth.

Per program:

1. the walk (``common._ancestors``): the inclusive ancestor mask, the path cumsums G and the depth d;
2. the Gram tiles K K^T and Q K^T on tensor cores. bf16 keys are exact in bf16, so the products are exact and
   the sums fp32; fp32 keys take ``_dot_fp32``. Then M (strict ancestors) and P (ancestors or self);
3. (I + M)^-1 = (I - M)(I + M^2)(I + M^4)... up to M^(2^s) with 2^(s+1) > d: M is nilpotent along root paths
   (M^(d+1) = 0), so a depth-3 tree takes 2 products of [BT, BT] tiles and a chain of 64 takes 10. They feed
   the committed state: fp32-accurate (``_dot_fp32``). Then W = P (I + M)^-1 (outputs only, one pass);
4. per value tile of BV rows: the state tile [K, BV] is read, the pending commit folded in (``fold.py``) and
   written back; Xk = K S^T and Xq = Q S^T; R = beta v - ck Xk; u = (I + M)^-1 R and o = cq Xq + W R.

State products (``_state_dot``): with bf16 keys the fp32 state tile is split into bf16 parts S = S1 + S2 + S3
(24 mantissa bits), each product with the keys exact: three bf16 passes for Xk (it feeds u), two for Xq (2^-17,
outputs only), one each for a bf16 state. Other inputs take ``_dot_fp32``. "ieee" is exact fp32 throughout.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.common import _ancestors, _dot_fp32, _exp_rn, _inv_norm, _tf32_hi
from treewy.ops.verify.select import DENSE_MAX_NODES
from treewy.ops.verify.fold import (FOLD_PAD, FOLD_ROWS, _fold_row, _fold_slot, _fold_tile, _pending_key_scale,
                                         _pending_path, _request_bases)
from treewy.ops.verify.tuning import (
    AUTOTUNE_EXTRA, KEY, batch_bucket, capture_safe_pruning, fit_v, pending_args,
)

#: (BV, warps, stages, register cap) the kernel is tuned over, per precision and padded window BT. A cap below what
#: the compiler would take fits more programs per SM at the price of spills; the autotuner weighs the two.
CONFIGS = {
    ("tf32", 16): ((32, 4, 1, None), (32, 4, 1, 128), (64, 4, 1, None), (64, 4, 1, 168), (128, 8, 1, None)),
    ("tf32", 32): ((32, 4, 1, None), (32, 4, 1, 168), (64, 4, 1, None), (64, 8, 1, None)),
    ("tf32", 64): ((32, 4, 1, None), (32, 4, 1, 168), (16, 4, 1, None), (64, 4, 1, None), (64, 8, 1, None)),
    ("ieee", 16): ((32, 4, 1, None), (64, 4, 1, None)),
    ("ieee", 32): ((32, 4, 1, None), (32, 8, 1, None)),
    ("ieee", 64): ((16, 4, 1, None), (32, 8, 1, None)),
}


def config(bv, warps, stages, maxnreg=None):
    """A ``triton.Config`` of the kernel from a CONFIGS entry."""
    return triton.Config({"BV": bv}, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


def _config_key(c):
    return (c.kwargs["BV"], c.num_warps, c.num_stages, c.maxnreg)


def _configs():
    if INTERPRET:
        return [config(16, 4, 1)]
    return [config(*c) for c in sorted({c for cs in CONFIGS.values() for c in cs}, key=str)]


def _prune(configs, named_args, **kwargs):
    """The configs listed for the launch's precision and padded window (no wider than V)."""
    args = {**named_args, **kwargs}
    keep = CONFIGS[(args["DOT_PRECISION"], args["BT"])]
    return [c for c in fit_v(configs, named_args, **kwargs) if _config_key(c) in keep] or configs[:1]


@triton.jit
def _input_dot(b_a, b_b, b_acc, DOT_PRECISION: tl.constexpr, EXACT: tl.constexpr, INPUT_BF16: tl.constexpr):
    """b_acc + a @ b for two tiles of keys or queries: bf16 ones on bf16 tensor cores (exact products, fp32
    sums); others through ``_dot_fp32`` (EXACT: fp32-level, else one tf32 pass)."""
    if INPUT_BF16 and DOT_PRECISION != "ieee":
        return tl.dot(b_a, b_b, b_acc)
    return _dot_fp32(b_a.to(tl.float32), b_b.to(tl.float32), b_acc, DOT_PRECISION, EXACT, False, False)


@triton.jit
def _state_dot(b_a, b_h, b_acc, PARTS: tl.constexpr, EXACT: tl.constexpr, DOT_PRECISION: tl.constexpr,
               SPLIT: tl.constexpr, INPUT_BF16: tl.constexpr, STATE_BF16: tl.constexpr):
    """b_acc + a @ h for keys or queries a [BT, BK] as loaded and a state tile h [BK, BV] in fp32. bf16 a (SPLIT
    mode): h as a sum of PARTS bf16 parts, each the rounding of what the ones before leave, each product exact
    (one part for a state stored in bf16, which is exact in it). Otherwise ``_dot_fp32``, fp32-level where EXACT
    and SPLIT, else one tf32 pass."""
    if INPUT_BF16 and DOT_PRECISION != "ieee" and SPLIT:
        b_p = b_h.to(tl.bfloat16)
        b_acc = tl.dot(b_a, b_p, b_acc)
        if not STATE_BF16:
            b_r = b_h
            for _ in tl.static_range(PARTS - 1):
                b_r = b_r - b_p.to(tl.float32)
                b_p = b_r.to(tl.bfloat16)
                b_acc = tl.dot(b_a, b_p, b_acc)
        return b_acc
    return _dot_fp32(b_a.to(tl.float32), b_h, b_acc, DOT_PRECISION, SPLIT and EXACT, INPUT_BF16, STATE_BF16)


@triton.jit
def _inverse(b_M, n_depth, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, BT: tl.constexpr):
    """(I + M)^-1 for M nilpotent along paths of at most n_depth + 1 nodes, as (I - M)(I + M^2)(I + M^4)...
    with fp32-level products (SPLIT)."""
    o_t = tl.arange(0, BT)
    b_X = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0) - b_M
    b_Mp = b_M
    n_span = 2   # paths of up to n_span nodes are inverted so far
    while n_span <= n_depth:
        b_Mp = _dot_fp32(b_Mp, b_Mp, tl.zeros([BT, BT], dtype=tl.float32), DOT_PRECISION, SPLIT, False, False)
        b_X = _dot_fp32(b_X, b_Mp, b_X, DOT_PRECISION, SPLIT, False, False)
        n_span *= 2
    return b_X


@triton.jit
def _apply_inverse(b_Xh, b_Xl, b_R, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr):
    """(I + M)^-1 R, fp32-level with SPLIT: the inverse comes split once per program (hi = b_Xh, lo = b_Xl; with
    "ieee" b_Xh is the inverse itself), R per value tile."""
    if DOT_PRECISION == "ieee" or not SPLIT:
        return tl.dot(b_Xh, b_R, input_precision=DOT_PRECISION)
    b_Rh = _tf32_hi(b_R)
    b_U = tl.dot(b_Xh, b_Rh, input_precision="tf32")
    b_U = tl.dot(b_Xh, b_R - b_Rh, b_U, input_precision="tf32")
    return tl.dot(b_Xl, b_Rh, b_U, input_precision="tf32")


@triton.autotune(configs=_configs(), key=KEY + ["DOT_PRECISION", "SPLIT", "INPUT_BF16", "STATE_BF16"],
                 restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else capture_safe_pruning(_prune), **AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg",
                               "B_BUCKET"])
def tree_verify_dense_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx,
    stride_hb, stride_pb, stride_ppb, stride_pu, stride_pk, stride_pg, scale, T, PT, B_BUCKET,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BPT: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr,
    HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    INPUT_BF16: tl.constexpr, STATE_BF16: tl.constexpr, FOLD_ROWS: tl.constexpr, HAS_STATE_INDICES: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_b64 = i_b.to(tl.int64)
    i_h = i_hv // (HV // H)
    h0, pu, pk, pg, ppar, pacc = _request_bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb,
                                                stride_pu, stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b

    # the tree, the Gram tiles, M and P
    m_anc, b_G, n_depth = _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV)
    b_beta = tl.load(beta + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    p_qk = (i_b64 * T + o_t) * H + i_h
    m_tk = m_t[:, None] & m_k[None, :]
    b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0)
    b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0)
    m_eye = o_t[:, None] == o_t[None, :]
    # decays of ancestor pairs only (exp(G_t - G_i) <= 1), masked before the exponential
    b_dec = tl.where(m_anc, tl.exp(tl.where(m_anc, b_G[:, None] - b_G[None, :], float("-inf"))), 0.0)
    b_KK = _input_dot(b_k, tl.trans(b_k), tl.zeros([BT, BT], dtype=tl.float32), DOT_PRECISION, SPLIT, INPUT_BF16)
    b_rk = tl.where(m_t, 1.0, 0.0)
    b_rq = tl.where(m_t, 1.0, 0.0)
    if USE_QK_L2NORM_IN_KERNEL:
        b_rk = tl.where(m_t, _inv_norm(tl.sum(tl.where(m_eye, b_KK, 0.0), 1)), 0.0)
        b_qf = b_q.to(tl.float32)
        b_rq = tl.where(m_t, _inv_norm(tl.sum(b_qf * b_qf, 1)), 0.0)
    b_M = tl.where(m_eye, 0.0, (b_beta * b_rk)[:, None] * b_rk[None, :] * b_dec * b_KK)
    b_X = _inverse(b_M, n_depth, DOT_PRECISION, SPLIT, BT)
    b_QK = _input_dot(b_q, tl.trans(b_k), tl.zeros([BT, BT], dtype=tl.float32), DOT_PRECISION, False, INPUT_BF16)
    b_P = (scale * b_rq)[:, None] * b_rk[None, :] * b_dec * b_QK
    b_W = tl.dot(b_P, b_X, input_precision=DOT_PRECISION)
    if DOT_PRECISION == "ieee" or not SPLIT:
        b_Xh = b_X
        b_Xl = b_X
    else:
        b_Xh = _tf32_hi(b_X)
        b_Xl = b_X - b_Xh
    b_eG = tl.where(m_t, _exp_rn(b_G), 0.0)
    b_ck = b_beta * b_eG * b_rk
    b_cq = scale * b_eG * b_rq

    if HAS_PENDING:
        a, o_p, rank, n_path, b_C, b_w = _pending_path(0, 0, i_hv, pg, ppar, pacc, 0, PT, HV, BPT)
        b_w = b_w * _pending_key_scale(0, i_h, pk, o_p, rank, PT, H, K, BPT, PENDING_L2NORM)
        # the path's first FOLD_PAD rows selected once here, not in every value tile
        i_s0, b_w0 = _fold_slot(o_p, rank, b_w, 0)
        i_s1, b_w1 = _fold_slot(o_p, rank, b_w, 1)
        i_s2, b_w2 = _fold_slot(o_p, rank, b_w, 2)
        i_s3, b_w3 = _fold_slot(o_p, rank, b_w, 3)
    p_h = h0 + i_hv * V * K
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_h = m_k[:, None] & m_v[None, :]
        b_h = tl.load(p_h + o_v[None, :] * K + o_k[:, None], mask=m_h, other=0).to(tl.float32)   # [BK, BV]: S^T
        if HAS_PENDING:
            b_h = b_h * _exp_rn(b_C)
            b_h = _fold_row(b_h, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, i_s0, b_w0, H, HV, K, V)
            b_h = _fold_row(b_h, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, i_s1, b_w1, H, HV, K, V)
            b_h = _fold_row(b_h, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, i_s2, b_w2, H, HV, K, V)
            b_h = _fold_row(b_h, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, i_s3, b_w3, H, HV, K, V)
            if n_path > FOLD_PAD:
                b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w, PT,
                                 H, HV, K, V, FOLD_ROWS, True, FOLD_PAD)
            b_h = b_h.to(h0.dtype.element_ty)
            if a >= 0:
                tl.store(p_h + o_v[None, :] * K + o_k[:, None], b_h, mask=m_h)
            b_h = b_h.to(tl.float32)  # verify from exactly the state that is stored
        b_xk = _state_dot(b_k, b_h, tl.zeros([BT, BV], dtype=tl.float32), 3, True, DOT_PRECISION, SPLIT,
                          INPUT_BF16, STATE_BF16)   # feeds u: fp32-level
        b_xq = _state_dot(b_q, b_h, tl.zeros([BT, BV], dtype=tl.float32), 2, False, DOT_PRECISION, SPLIT,
                          INPUT_BF16, STATE_BF16)   # feeds only the outputs
        p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
        b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
        b_R = b_beta[:, None] * b_v - b_ck[:, None] * b_xk
        b_U = _apply_inverse(b_Xh, b_Xl, b_R, DOT_PRECISION, SPLIT)
        b_o = tl.dot(b_W, b_R, b_cq[:, None] * b_xq, input_precision=DOT_PRECISION)
        m_store = (o_t < T)[:, None] & m_v[None, :]
        tl.store(u + p_tv, b_U, mask=m_store)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


def dense_fwd(q, k, v, g, beta, state, parents, stride_pb, num_nodes, pending, scale, use_qk_l2norm_in_kernel, o,
              u, dot_precision, config=None, state_indices=None):
    """Launch the dense kernel (inputs validated; parents int32 on the device; T <= DENSE_MAX_NODES). Writes o
    and u, folds ``pending`` into the state. ``config``: a ``triton.Config`` to launch instead of autotuning."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if T > DENSE_MAX_NODES:
        raise ValueError(f"the dense kernel takes windows of at most {DENSE_MAX_NODES} nodes, got T = {T}; use "
                         "kernel='path' or kernel=None")
    prec, split = ("ieee", False) if dot_precision == "ieee" else ("tf32", dot_precision == "tf32")
    pu, pk, pg, ppar, pacc, PT, stride_ppb, pl2, pending_strides = pending_args(pending, u)
    fn, tuned = (tree_verify_dense_kernel, {}) if config is None else (tree_verify_dense_kernel.fn,
                                                                         dict(config.all_kwargs()))
    bf16 = q.dtype == k.dtype == torch.bfloat16
    fn[(B * HV,)](
        q, k, v, g, beta, state, parents, num_nodes if num_nodes is not None else parents, o, u,
        pu, pk, pg, ppar, pacc, u if state_indices is None else state_indices,
        state.stride(0), stride_pb, stride_ppb, *pending_strides, scale, T, PT, batch_bucket(B),
        H=H, HV=HV, K=K, V=V, BT=max(16, triton.next_power_of_2(T)), BK=max(16, triton.next_power_of_2(K)),
        BPT=triton.next_power_of_2(max(PT, 2)), USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_NUM_NODES=num_nodes is not None, HAS_PENDING=pending is not None, PENDING_L2NORM=pl2,
        DOT_PRECISION=prec, SPLIT=split, INPUT_BF16=bf16, STATE_BF16=state.dtype == torch.bfloat16, FOLD_ROWS=FOLD_ROWS,
        HAS_STATE_INDICES=state_indices is not None, **tuned,
    )
    return o, u
