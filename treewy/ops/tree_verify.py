"""TreeWY tree verify: every node's output and pseudo-value in one launch, no per-node state.

Status: parity with ``naive_tree_verify`` (fp64) tested under the Triton 3.9 interpreter on CPU
(fp32; GVA HV = H, 2H, 4H; K, V from 16 to 100; chains, stars, random trees, per-request
topologies and node counts; fp32 and bf16 state) and on an H200 with Triton 3.6 (fp32 and bf16,
K = V = 128, B up to 256, the paper's tree shapes). Limits: T <= 128 nodes per request (the
Gram and mask tiles are BT x BT with BT = next_pow2(T), at least 16); dot products in "tf32x3"
on the GPU (fp32-level error, tensor cores), "ieee" under the interpreter; trees are padded to 16
rows, and the V-independent work is redone per value tile, so the kernel is far from the
bandwidth roofline (see benchmarks/results). On a machine without CUDA,
importing this module sets TRITON_INTERPRET=1 (see treewy/ops/_triton.py).

Grid (V / BV, B * HV): one program per request, value head and value tile. Each program walks
the parent pointers (a device tensor: no host branching, CUDA-graph capturable), builds the
inclusive ancestor mask and the path cumsum G, accumulates K K^T, Q K^T, K S0^T and Q S0^T over
key chunks, solves (I + diag(beta) A) U = R by the Horner form of the finite Neumann series (as
many dense products as the tree is deep) and writes o and u. The V-independent work is redone
per value tile.
"""

from __future__ import annotations

import inspect

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET, is_capturing
from treewy.ops.checks import check_gdn_kernel_inputs

#: Largest number of nodes (root + drafts) per request the verify kernel takes.
MAX_KERNEL_NODES = 128

#: Dot-product precision: "tf32x3" (three tf32 tensor-core passes, fp32-level error; the GPU
#: default), "ieee" (plain fp32, about 4x slower at these shapes), "tf32" (fast, ~1e-4 error).
DEFAULT_DOT_PRECISION = "ieee" if INTERPRET else "tf32x3"


def _configs():
    if INTERPRET:
        return [triton.Config({"BV": 32, "BK": 32}, num_warps=4)]
    return [triton.Config({"BV": bv, "BK": bk}, num_warps=w, num_stages=s)
            for bv in (16, 32, 64) for bk in (32,) for w in (4, 8) for s in (1,)]


def _prune(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    BT, V = args["BT"], args["V"]
    out = [c for c in configs
           if c.kwargs["BV"] <= max(16, triton.next_power_of_2(V))
           and not (BT >= 64 and c.kwargs["BV"] >= 64)
           and not (BT >= 128 and (c.kwargs["BV"] > 16 or c.num_warps < 8))]
    return out or configs[:1]


def _quick_bench(fn, quantiles=None):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_AUTOTUNE_EXTRA = {"do_bench": _quick_bench} if "do_bench" in inspect.signature(triton.autotune).parameters else {}


@triton.autotune(configs=_configs(), key=["B", "T", "H", "HV", "K", "V", "BT", "USE_QK_L2NORM_IN_KERNEL",
                                          "HAS_NUM_NODES", "DOT_PRECISION"],
                 prune_configs_by=None if INTERPRET else {"early_config_prune": _prune}, **_AUTOTUNE_EXTRA)
@triton.jit(do_not_specialize=["T", "stride_pb", "stride_hb"])
def tree_verify_kernel(
    q, k, v, g, beta, h0, parents, num_nodes, o, u,
    stride_pb, stride_hb, scale,
    B, T, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_NUM_NODES: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    i_b64 = i_b.to(tl.int64)

    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    if HAS_NUM_NODES:
        n_b = tl.load(num_nodes + i_b)
        m_t = o_t < n_b
    else:
        m_t = o_t < T

    # ancestors and path cumsum: walk every node's parent pointers up to the root at once
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
    m_strict = m_anc & (o_t[:, None] != o_t[None, :])

    # Gram matrices and state products over key chunks
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_QK = tl.zeros([BT, BT], dtype=tl.float32)
    b_hk = tl.zeros([BT, BV], dtype=tl.float32)
    b_hq = tl.zeros([BT, BV], dtype=tl.float32)
    b_nk = tl.zeros([BT], dtype=tl.float32)
    b_nq = tl.zeros([BT], dtype=tl.float32)
    p_qk_row = (i_b64 * T + o_t) * H + i_h
    p_h0 = h0 + i_b64 * stride_hb + i_hv * V * K
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_q = tl.load(q + p_qk_row[:, None] * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_h = tl.load(p_h0 + o_v[:, None] * K + o_k[None, :], mask=m_v[:, None] & m_k[None, :],
                      other=0).to(tl.float32)
        b_kt = tl.trans(b_k)
        b_A += tl.dot(b_k, b_kt, input_precision=DOT_PRECISION)
        b_QK += tl.dot(b_q, b_kt, input_precision=DOT_PRECISION)
        b_ht = tl.trans(b_h)
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

    # masked log-space decays: only ancestor pairs, G_t - G_i <= 0
    b_diff = b_G[:, None] - b_G[None, :]
    b_beta = tl.load(beta + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_M = tl.where(m_strict, tl.exp(tl.where(m_strict, b_diff, float("-inf"))) * b_A, 0.0) * b_beta[:, None]
    b_P = tl.where(m_anc, tl.exp(tl.where(m_anc, b_diff, float("-inf"))) * b_QK, 0.0) * scale
    b_eG = tl.exp(b_G)

    p_tv = (i_b64 * T + o_t[:, None]) * HV * V + i_hv * V + o_v[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    b_v = tl.load(v + p_tv, mask=m_tv, other=0).to(tl.float32)
    b_R = b_beta[:, None] * (b_v - b_eG[:, None] * b_hk)
    # (I + M)^-1 R = R - M (R - M (R - ...)): M is nilpotent of order depth + 1
    b_U = b_R
    for _ in range(n_depth):
        b_U = b_R - tl.dot(b_M, b_U, input_precision=DOT_PRECISION)
    b_o = b_eG[:, None] * b_hq * scale + tl.dot(b_P, b_U, input_precision=DOT_PRECISION)

    m_store = (o_t[:, None] < T) & m_v[None, :]
    tl.store(u + p_tv, b_U, mask=m_store)
    tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_store)


def tree_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale, use_qk_l2norm_in_kernel=False,
                    num_nodes=None, dot_precision=None):
    """Launcher: inputs already validated; parents int32 on the inputs' device. Returns (o, u fp32)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = torch.empty_like(v)
    u = torch.empty(B, T, HV, V, device=v.device, dtype=torch.float32)

    def grid(meta):
        return (triton.cdiv(V, meta["BV"]), B * HV)

    tree_verify_kernel[grid](
        q, k, v, g, beta, initial_state, parents, num_nodes if num_nodes is not None else parents, o, u,
        stride_pb, initial_state.stride(0), scale,
        B=B, T=T, H=H, HV=HV, K=K, V=V, BT=max(16, triton.next_power_of_2(T)),
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, HAS_NUM_NODES=num_nodes is not None,
        DOT_PRECISION=dot_precision or DEFAULT_DOT_PRECISION,
    )
    return o, u


def tree_verify(q, k, v, g, beta, initial_state, parents, scale=None, use_qk_l2norm_in_kernel=False,
                num_nodes=None):
    """Outputs and pseudo-values of every tree node in one launch (kernel twin of ``naive_tree_verify``).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (bf16 or fp32); initial_state
    [B, HV, V, K] (fp32 or bf16; any batch stride); parents a DraftTree, [T] or [B, T];
    num_nodes optional int [B]: request b uses nodes 0..num_nodes[b] - 1 (0 = inactive slot),
    the rest of its o and u is written as zeros. Returns o [B, T, HV, V] in v's dtype and
    u [B, T, HV, V] fp32. While a CUDA graph is being captured only metadata is checked: pass
    int32 device tensors validated beforehand.
    """
    dims, par, stride_pb, nn = check_gdn_kernel_inputs(q, k, v, g, beta, initial_state, parents, num_nodes,
                                                       max_nodes=MAX_KERNEL_NODES, values=not is_capturing())
    scale = dims.K ** -0.5 if scale is None else float(scale)
    return tree_verify_fwd(q, k, v, g, beta, initial_state, par, stride_pb, scale, use_qk_l2norm_in_kernel, nn)
