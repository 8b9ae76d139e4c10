"""Pieces every tree-verify kernel shares: the grid program's indices, the ancestor walk, the masked
log-space decays, one gated delta rule step on a state tile, and the tf32 products with fp32 accuracy.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import triton
import triton.language as tl

#: Largest number of nodes (root + drafts) per request the kernels take.
MAX_KERNEL_NODES = 128


@triton.jit
def _program(H: tl.constexpr, HV: tl.constexpr):
    """(value tile, request, request as int64, value head, its key head) of a (V / BV, B * HV) grid program."""
    i_bh = tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    return tl.program_id(0), i_b, i_b.to(tl.int64), i_hv, i_hv // (HV // H)


@triton.jit
def _exp_rn(x):
    """exp(x) of fp32 or fp64 x, evaluated in fp64 and rounded once to fp32. A GPU's fp32 exp is ex2.approx
    (relative error up to 2^-22.5, about 3 units of fp32 roundoff), and a commit's decay exp(G_a) scales the whole
    state it writes. A few values per program."""
    return tl.exp(x.to(tl.float64)).to(tl.float32)


@triton.jit
def _inv_norm(b_ss):
    """1 / sqrt(b_ss + 1e-6), the l2 norm's scale from a sum of squares, with correctly rounded sqrt and division
    as the fp32 reference's torch ops have them (a GPU's plain ones are about 2 ulp each). A few values per node."""
    return tl.div_rn(b_ss * 0 + 1.0, tl.sqrt_rn(b_ss + 1e-6))


@triton.jit
def _gather(b_x, o_x, i):
    """b_x[i] for a scalar index i of a register vector (0 where i is out of range)."""
    return tl.sum(tl.where(o_x == i, b_x, 0), 0)


@triton.jit
def _ancestors(parents, g, i_b64, i_hv, o_t, m_t, stride_pb, T, HV: tl.constexpr):
    """(inclusive ancestor mask [BT, BT], path cumsum G [BT], depth): all nodes walk up at once in registers (the
    parents and decays loaded once, then ``tl.gather``: no memory round trip per level)."""
    b_par = tl.load(parents + i_b64 * stride_pb + o_t, mask=m_t, other=-1)
    b_g = tl.load(g + (i_b64 * T + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_G = b_g
    m_anc = (o_t[:, None] == o_t[None, :]) & m_t[:, None]
    b_cur = b_par
    while tl.max(b_cur, 0) >= 0:
        m_up = b_cur >= 0
        m_anc = m_anc | (o_t[None, :] == b_cur[:, None])
        b_up = tl.maximum(b_cur, 0)
        b_G += tl.where(m_up, tl.gather(b_g, b_up, 0), 0.0)
        b_cur = tl.where(m_up, tl.gather(b_par, b_up, 0), -1)
    n_depth = tl.max(tl.sum(m_anc.to(tl.int32), 1), 0) - 1
    return m_anc, b_G, n_depth


@triton.jit
def _node_qkv(q, k, v, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):
    """Node ``i_row``'s query (scaled), key and value tile in fp32, q and k normalized if asked."""
    b_q = tl.load(q + (i_row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_k = tl.load(k + (i_row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(v + (i_row * HV + i_hv) * V + o_v, mask=m_v, other=0).to(tl.float32)
    if USE_QK_L2NORM_IN_KERNEL:
        b_q = b_q * _inv_norm(tl.sum(b_q * b_q))
        b_k = b_k * _inv_norm(tl.sum(b_k * b_k))
    return b_q * scale, b_k, b_v


@triton.jit
def _recurrent_node(b_h, q, k, v, g, beta, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    USE_QK_L2NORM_IN_KERNEL: tl.constexpr):
    """One gated delta rule step of node ``i_row`` on the [BV, BK] state tile in registers:
    (S_t, u_t = beta (v - exp(g) S k), o_t = S_t (scale q))."""
    b_q, b_k, b_v = _node_qkv(q, k, v, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale, H, HV, K, V,
                              USE_QK_L2NORM_IN_KERNEL)
    b_beta = tl.load(beta + i_row * HV + i_hv).to(tl.float32)
    b_g = tl.load(g + i_row * HV + i_hv).to(tl.float32)
    return _delta_node(b_h, b_q, b_k, b_v, b_g, b_beta)


@triton.jit
def _delta_node(b_h, b_q, b_k, b_v, b_g, b_beta):
    """The gated delta rule step on a [BV, BK] state tile, q scaled and q, k normalized as the kernel wants them:
    (S_t, u_t, o_t)."""
    b_h *= _exp_rn(b_g)
    b_u = b_beta * (b_v - tl.sum(b_h * b_k[None, :], 1))
    b_h += b_u[:, None] * b_k[None, :]
    return b_h, b_u, tl.sum(b_h * b_q[None, :], 1)


@triton.jit
def _gates(g, beta, A_log, dt_bias, i_el, i_hv, mask, softplus_threshold, RAW_GATES: tl.constexpr):
    """(log decay, write strength) at flat index i_el = token * HV + i_hv (scalars or vectors): loaded from g and beta,
    or, with RAW_GATES, from the layer's raw gates in g (a) and beta (b) as vLLM's fused_sigmoid_gating computes them:
    -exp(A_log) * softplus(a + dt_bias), sigmoid(b) (``treewy.ops.gates.gdn_gating``)."""
    if RAW_GATES:
        x = tl.load(g + i_el, mask=mask, other=0).to(tl.float32) + tl.load(dt_bias + i_hv, mask=mask,
                                                                            other=0).to(tl.float32)
        b_sp = tl.where(x <= softplus_threshold, tl.log(1 + tl.exp(tl.minimum(x, softplus_threshold))), x)
        b_g = -tl.exp(tl.load(A_log + i_hv, mask=mask, other=0).to(tl.float32)) * b_sp
        return b_g, tl.sigmoid(tl.load(beta + i_el, mask=mask, other=0).to(tl.float32))
    return (tl.load(g + i_el, mask=mask, other=0).to(tl.float32),
            tl.load(beta + i_el, mask=mask, other=0).to(tl.float32))


@triton.jit
def _tf32_hi(b_x):
    """b_x rounded to its nearest tf32 value (10 mantissa bits): exact on the tensor cores; b_x - hi is
    the low part, at most 2^-11 |b_x|."""
    return ((b_x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _dot_fp32(b_a, b_b, b_acc, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, A_TF32: tl.constexpr,
              B_TF32: tl.constexpr):
    """b_acc + a @ b with fp32-level error for products that feed the committed state.

    "ieee": plain fp32 products (no tensor cores: the sm_75 path). "tf32" with SPLIT: each operand that is
    not already exact in tf32 (A_TF32 / B_TF32: bf16 or fp16 inputs are) is split into hi + lo and the
    cross terms are added, so the error is that of the lo parts' rounding, ~2^-21 relative: two tensor-core
    passes with bf16 keys, three with fp32 ones. "tf32" without SPLIT: one plain tf32 pass (~2^-11)."""
    if DOT_PRECISION == "ieee":
        return tl.dot(b_a, b_b, b_acc, input_precision="ieee")
    if not SPLIT:
        return tl.dot(b_a, b_b, b_acc, input_precision="tf32")
    if A_TF32:
        a_hi = b_a
    else:
        a_hi = _tf32_hi(b_a)
    if B_TF32:
        b_hi = b_b
    else:
        b_hi = _tf32_hi(b_b)
    b_c = tl.dot(a_hi, b_hi, b_acc, input_precision="tf32")
    if not B_TF32:
        b_c = tl.dot(a_hi, b_b - b_hi, b_c, input_precision="tf32")
    if not A_TF32:
        b_c = tl.dot(b_a - a_hi, b_hi, b_c, input_precision="tf32")
    return b_c
