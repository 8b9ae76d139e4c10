"""Path kernel: the WY form of any tree in one launch, with (I + M)^-1 and P applied along each node's root
path instead of as dense [T, T] products.

Status: parity with ``naive_tree_step`` (fp64) under the Triton interpreter on CPU (chains, stars, (2,2,2),
(3,3,3), random per-request trees, num_nodes, GVA, awkward K and V, keys normalized in the kernel, fp32 and
bf16 state, mild and hard gates, folded steps, a state pool); bf16 inputs and the tensor-core timings on the
GPU through tests marked ``gpu`` and benchmarks/bench_kernels.py. Limits: T <= 128 nodes per request; the
tables are [BT, BD] with BD = the depth bound + 1, so deep trees cost registers (see ``depth_block``).

M and P only link a node t to its root path a_0 = t, a_1 = parent, ..., a_d = root (d = depth of t):

    m_j(t) = M[t, a_j] = beta_t exp(G_t - G_{a_j}) k_t.k_{a_j},
    p_j(t) = P[t, a_j] = scale exp(G_t - G_{a_j}) q_t.k_{a_j}

(with 1 / ||k||, 1 / ||q|| when keys are normalized in the kernel). From (I + M)^-1 (I + M) = I, row t of the
inverse lives on the same path and follows by forward substitution along it, and so does row t of P (I + M)^-1:

    x_0(t) = 1,   x_j(t) = -sum_{i < j} x_i(t) m_{j-i}(a_i)                 ((I + M)^-1 [t, a_j])
    w_j(t) = sum_{i <= j} p_i(t) x_{j-i}(a_i)                                ((P (I + M)^-1) [t, a_j])

so that, with R = beta v - beta exp(G) K S^T and Xq = Q S^T,

    u_t = sum_j x_j(t) R[a_j],    o_t = scale exp(G_t) Xq_t + sum_j w_j(t) R[a_j].

Per program (request, value head, value tile): the tree, the path cumsums and the coefficient tables in
registers ([BT, BD]: the dot products k_t.k_{a_j} and q_t.k_{a_j} in exact fp32 from gathered rows), then per
key chunk the state tile is read, the pending commit folded in (``fold.py``) and written back, and K S^T
(fp32-accurate: ``_dot_fp32``, it feeds u) and Q S^T (one tf32 pass, it feeds only the bf16 outputs)
accumulate on tensor cores; then the path sums gather rows of R ((d + 1) gathers of a [BT, BV] tile). No
[T, T] tile, no (I + M)^-1 product, nothing written between launches. A window deeper than the tables hold
(depth >= BD) writes NaN outputs rather than wrong ones.

Split launch (family "path_split", ``path_fwd(split=True)``): the tables in a launch of their own, once per
(request, value head), read back by this kernel (``path_tables.py``). Pending windows of ``fold.HOIST_FOLD_SLOTS``
slots or more have their path rows selected once per program (``fold._fold_rows``) instead of in every state chunk.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET
from treewy.ops.common import _dot_fp32, _program
from treewy.ops.verify.fold import (FOLD_PAD, FOLD_ROWS, HOIST_FOLD_SLOTS, _fold_chunk, _fold_rows, _fold_tile,
                                         _pending_key_scale, _pending_path, _request_bases)
from treewy.ops.verify.path_tables import (COLUMN_TABLES_MIN_BT, TABLE_CONFIGS, _col, _load_tables,
                                           _path_sums_from_tables, _tables, _walk, depth_block, path_tables_kernel,
                                           table_cols)
from treewy.ops.verify.tuning import (
    AUTOTUNE_EXTRA, KEY_DOTS, batch_bucket, capture_safe_pruning, fit_v, pending_args,
)

#: (BV, BK, warps, stages, ROW_BK, PREFETCH) the kernel is tuned over, per precision and padded window BT: ROW_BK
#: is the key chunk of the coefficient tables' dot products (wider: fewer round trips, more registers), PREFETCH
#: issues each state chunk's load before the work on the one before (the first before the tree walk). Each
#: compiles for sm_90 without spills at depth 3 with Triton 3.9's ptxas, in one launch and (one-stage configs,
#: see _prune) as the split launch's streaming kernel (benchmarks/compile_offline.py --all checks every entry;
#: BT = 128 is not in its list). One stage from BT = 64 on: two-stage configs of the removed WY stream kernel gave
#: wrong outputs there with Triton 3.6 on the GPU.
CONFIGS = {
    ("tf32", 16): ((32, 64, 4, 2, 32, False), (64, 32, 4, 1, 32, False), (32, 64, 4, 1, 128, True),
                   (32, 128, 4, 1, 128, True), (32, 64, 4, 1, 32, True), (64, 32, 4, 1, 32, True),
                   (128, 32, 8, 1, 32, False), (128, 32, 4, 1, 32, False)),
    ("tf32", 32): ((32, 64, 4, 2, 32, False), (64, 32, 4, 1, 32, False), (16, 32, 4, 1, 32, False),
                   (32, 64, 4, 1, 64, True), (128, 32, 8, 1, 32, False)),
    ("tf32", 64): ((32, 32, 4, 1, 32, False), (16, 32, 4, 1, 32, False), (64, 32, 8, 1, 32, False),
                   (32, 64, 4, 1, 32, False), (32, 32, 4, 1, 32, True), (16, 32, 4, 1, 32, True),
                   (128, 32, 8, 1, 32, False), (64, 16, 4, 1, 32, False)),
    ("tf32", 128): ((16, 32, 8, 1, 16, False), (16, 16, 8, 1, 16, False)),
    ("ieee", 16): ((32, 32, 4, 1, 32, False), (16, 64, 4, 2, 32, False)),
    ("ieee", 32): ((32, 32, 4, 1, 32, False), (16, 64, 4, 2, 32, False)),
    ("ieee", 64): ((16, 32, 4, 1, 32, False), (32, 32, 4, 1, 32, False)),
    ("ieee", 128): ((16, 16, 8, 1, 16, False),),
}


def config(bv, bk, warps, stages, row_bk, prefetch):
    """A ``triton.Config`` of the kernel from a CONFIGS entry."""
    return triton.Config({"BV": bv, "BK": bk, "ROW_BK": row_bk, "PREFETCH": prefetch}, num_warps=warps,
                         num_stages=stages)


def _configs():
    if INTERPRET:  # one config (no timing under the interpreter); tests pass the other load order as config=
        return [config(16, 16, 4, 1, 16, True)]
    return [config(*c) for c in sorted({c for cs in CONFIGS.values() for c in cs})]


def _config_key(c):
    return (c.kwargs["BV"], c.kwargs["BK"], c.num_warps, c.num_stages, c.kwargs["ROW_BK"], c.kwargs["PREFETCH"])


#: The config a single request runs, per (precision, BT), instead of autotuning: one request's step is so short
#: that the autotuner's eager timings are mostly launch overhead, so its picks varied from run to run. These were
#: the fastest under CUDA graphs (benchmarks/profile_kernels.py times each config that way; rerun it to re-pick;
#: the "333 B1" and "chain3 B1" rows of the kernel targets table, treewy/data/index.json, time the picks).
SINGLE_REQUEST = {("tf32", 64): (32, 64, 4, 1, 32, False), ("tf32", 16): (32, 128, 4, 1, 128, True)}


def one_stage_only(has_tables: bool, bpt: int) -> bool:
    """Whether the streaming kernel may only run one-stage configs: two stages spill in the split launch's
    streaming kernel and with the hoisted fold of a pending window of ``bpt`` >= HOIST_FOLD_SLOTS slots
    (benchmarks/compile_offline.py --all)."""
    return has_tables or bpt >= HOIST_FOLD_SLOTS.value


def _prune(configs, named_args, **kwargs):
    """The configs listed for the launch's precision and padded window BT (and no wider than V); one request
    runs its SINGLE_REQUEST config where there is one; the split launch's streaming kernel, and any kernel folding
    a pending window of HOIST_FOLD_SLOTS slots or more, only one-stage ones."""
    args = {**named_args, **kwargs}
    key = (args["DOT_PRECISION"], args["BT"])
    keep = (SINGLE_REQUEST[key],) if args.get("B_BUCKET") == 1 and key in SINGLE_REQUEST else CONFIGS[key]
    if one_stage_only(bool(args.get("HAS_TABLES")), args.get("BPT", 0)):
        keep = tuple(c for c in keep if c[3] == 1)
    return [c for c in fit_v(configs, named_args, **kwargs) if _config_key(c) in keep] or configs[:1]


@triton.autotune(configs=_configs(), key=KEY_DOTS + ["BD", "HAS_TABLES"], restore_value=["h0"],
                 prune_configs_by=None if INTERPRET else capture_safe_pruning(_prune), **AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "PT", "stride_pb", "stride_ppb", "stride_pu", "stride_pk", "stride_pg",
                               "B_BUCKET"])
def tree_verify_path_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u, pu, pk, pg, ppar, pacc, state_idx, tab,
    stride_hb, stride_pb, stride_ppb, stride_pu, stride_pk, stride_pg, scale, T, PT, B_BUCKET,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BPT: tl.constexpr, ROW_BK: tl.constexpr, PREFETCH: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
    HAS_NUM_NODES: tl.constexpr, HAS_PENDING: tl.constexpr, PENDING_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, K_TF32: tl.constexpr, FOLD_ROWS: tl.constexpr,
    HAS_STATE_INDICES: tl.constexpr, HAS_TABLES: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    h0, pu, pk, pg, ppar, pacc = _request_bases(i_b, i_b64, h0, pu, pk, pg, ppar, pacc, state_idx, stride_hb,
                                                stride_pu, stride_pk, stride_pg, stride_ppb, HAS_STATE_INDICES)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    # PREFETCH: the first state chunk's load goes out before anything that waits on memory, each later one
    # while the chunk before is folded and multiplied
    p_h = h0 + i_hv * V * K + o_v[None, :] * K
    if PREFETCH:
        o_k0 = tl.arange(0, BK)
        b_h_next = tl.load(p_h + o_k0[:, None], mask=(o_k0 < K)[:, None] & m_v[None, :], other=0)
    n_b = tl.load(num_nodes + i_b) if HAS_NUM_NODES else T
    m_t = o_t < n_b
    if not HAS_TABLES:
        b_anc, b_G, b_beta, n_depth = _walk(parents, g, beta, i_b64, i_hv, m_t, stride_pb, T, HV, BT, BD)
    if HAS_PENDING:
        a, o_p, rank, n_path, b_C, b_w = _pending_path(0, 0, i_hv, pg, ppar, pacc, 0, PT, HV, BPT)
        b_w = b_w * _pending_key_scale(0, i_h, pk, o_p, rank, PT, H, K, BPT, PENDING_L2NORM)
        if BPT >= HOIST_FOLD_SLOTS:
            b_slot, b_uw = _fold_rows(i_hv, o_v, m_v, pu, o_p, rank, b_w, HV, V, FOLD_PAD)
    if not HAS_TABLES:
        b_x, b_wt, b_ck, b_cq = _tables(q, k, b_anc, b_G, b_beta, n_depth, i_b64, i_h, m_t, scale, T, H, K, BT, BD,
                                        ROW_BK, USE_QK_L2NORM_IN_KERNEL)
    p_qk = (i_b64 * T + o_t) * H + i_h

    # per key chunk: the state tile read, folded and written once; K S^T and Q S^T on tensor cores
    b_xk = tl.zeros([BT, BV], dtype=tl.float32)
    b_xq = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_h = m_k[:, None] & m_v[None, :]
        if PREFETCH:
            b_h = b_h_next.to(tl.float32)  # [BK, BV]: S^T
            b_h_next = tl.load(p_h + (o_k + BK)[:, None], mask=(o_k + BK < K)[:, None] & m_v[None, :], other=0)
        else:
            b_h = tl.load(p_h + o_k[:, None], mask=m_h, other=0).to(tl.float32)
        if HAS_PENDING:
            if BPT >= HOIST_FOLD_SLOTS:
                b_h = _fold_chunk(b_h, i_h, o_k, m_k, pk, b_slot, b_uw, b_C, H, K)
                if n_path > FOLD_PAD:
                    b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w,
                                     PT, H, HV, K, V, FOLD_ROWS, True, FOLD_PAD)
            else:
                b_h = _fold_tile(b_h, 0, i_hv, i_h, o_v, m_v, o_k, m_k, pu, pk, o_p, rank, n_path, b_C, b_w, PT,
                                 H, HV, K, V, FOLD_ROWS, True)
            b_h = b_h.to(h0.dtype.element_ty)
            if a >= 0:
                tl.store(p_h + o_k[:, None], b_h, mask=m_h)
            b_h = b_h.to(tl.float32)  # verify from exactly the state that is stored
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_xk = _dot_fp32(b_k, b_h, b_xk, DOT_PRECISION, SPLIT, K_TF32, False)
        b_xq = tl.dot(b_q, b_h, b_xq, input_precision=DOT_PRECISION)

    # R, then u and o as sums of gathered rows of R along each node's path
    p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
    b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0).to(tl.float32)
    if HAS_TABLES and BT >= COLUMN_TABLES_MIN_BT:  # path_tables_kernel's, read column by column
        b_U, b_o = _path_sums_from_tables(tab, i_b64, i_hv, o_t, m_t, b_v, b_xk, b_xq, T, HV, BT, BD, BV)
    else:
        if HAS_TABLES:  # path_tables_kernel's, read as [BT, BD] tiles
            b_anc, b_x, b_wt, b_ck, b_cq, b_beta = _load_tables(tab, i_b64, i_hv, o_t, m_t, T, HV, BD)
            n_depth = tl.max(tl.sum((b_anc >= 0).to(tl.int32), 1), 0) - 1
        b_R = b_beta[:, None] * b_v - b_ck[:, None] * b_xk
        b_U = _col(b_x, o_d, 0)[:, None] * b_R
        b_o = b_cq[:, None] * b_xq + _col(b_wt, o_d, 0)[:, None] * b_R
        for j in range(1, n_depth + 1):
            b_a = _col(b_anc, o_d, j)
            b_Ra = tl.gather(b_R, tl.broadcast_to(tl.maximum(b_a, 0)[:, None], [BT, BV]), 0)
            b_U += _col(b_x, o_d, j)[:, None] * b_Ra
            b_o += _col(b_wt, o_d, j)[:, None] * b_Ra
        if n_depth >= BD:  # the tables could not hold this window's paths: say so rather than be wrong
            b_U = b_U + float("nan")
            b_o = b_o + float("nan")
    m_store = (o_t < T)[:, None] & m_v[None, :]
    tl.store(u + p_tv, b_U, mask=m_store)
    tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


def path_fwd(q, k, v, g, beta, state, parents, stride_pb, num_nodes, pending, scale, use_qk_l2norm_in_kernel, o, u,
             dot_precision, max_depth=None, config=None, state_indices=None, split=False):
    """Launch the path kernel (inputs validated; parents int32 on the device; ``max_depth`` a bound on every
    request's depth, or None for T - 1). Writes o and u, folds ``pending`` into the state.

    ``split``: two launches, ``path_tables_kernel`` per (request, value head) and then the streaming kernel
    reading its tables (``HAS_TABLES``), instead of the tables in every program's prologue. ``config``
    pins the streaming kernel; the tables kernel then runs TABLE_CONFIGS[0]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT, BD = max(16, triton.next_power_of_2(T)), depth_block(T, max_depth)
    prec, tf32_split = ("ieee", False) if dot_precision == "ieee" else ("tf32", dot_precision == "tf32")
    pu, pk, pg, ppar, pacc, PT, stride_ppb, pl2, pending_strides = pending_args(pending, u)
    nn = num_nodes if num_nodes is not None else parents
    tab = u   # never read without HAS_TABLES
    if split:
        tab = torch.empty(B * HV * T * table_cols(BD), device=q.device, dtype=torch.float32)
        tfn, ttuned = (path_tables_kernel, {}) if config is None else (
            path_tables_kernel.fn, {"ROW_BK": TABLE_CONFIGS[0][0], "num_warps": TABLE_CONFIGS[0][1]})
        tfn[(B * HV,)](q, k, g, beta, parents, nn, tab, stride_pb, scale, T, batch_bucket(B), H=H, HV=HV, K=K,
                       BT=BT, BD=BD, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
                       HAS_NUM_NODES=num_nodes is not None, **ttuned)
    fn, tuned = (tree_verify_path_kernel, {}) if config is None else (tree_verify_path_kernel.fn,
                                                                        dict(config.all_kwargs()))
    fn[lambda meta: (triton.cdiv(V, meta["BV"]), B * HV)](
        q, k, v, g, beta, state, parents, nn, o, u,
        pu, pk, pg, ppar, pacc, u if state_indices is None else state_indices, tab,
        state.stride(0), stride_pb, stride_ppb, *pending_strides, scale, T, PT, batch_bucket(B),
        H=H, HV=HV, K=K, V=V, BT=BT, BD=BD,
        BPT=triton.next_power_of_2(max(PT, 2)), USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_NUM_NODES=num_nodes is not None, HAS_PENDING=pending is not None, PENDING_L2NORM=pl2,
        DOT_PRECISION=prec, SPLIT=tf32_split, K_TF32=k.dtype in (torch.bfloat16, torch.float16),
        FOLD_ROWS=FOLD_ROWS, HAS_STATE_INDICES=state_indices is not None, HAS_TABLES=split, **tuned,
    )
    return o, u
