"""TreeWY commit: rebuild the accepted node's state in place from S0 and the pseudo-values.

Status: parity with ``naive_tree_commit`` (fp64) tested under the Triton 3.9 interpreter on CPU
(every node of chains, stars and random trees; GVA; awkward K, V; fp32 and bf16 state) and on an
H200 with Triton 3.6 at K = V = 128. Limits: T <= 128 (the tree's own limit); the path walk is a
scalar loop of depth(a) + 1 steps, each an fp32 outer product (no dot products, no tf32, no
bf16: the committed state does not drift). On a machine without CUDA, importing this module sets
TRITON_INTERPRET=1.

S_a = exp(G_a) S0 + sum over the root..a path of exp(G_a - G_i) u_i k_i^T, accumulated while
walking from a up to the root: the decay c starts at 0 and grows by g_i after node i, so node i
is weighted by exp(c) = exp(G_a - G_i) and S0 by exp(G_a) at the end. Grid (V / BV, B * HV):
each program reads its [BV, K] state tile once and writes it once; offsets are 64-bit, so a
state that is a slice of a large pool (any batch stride) is addressed correctly.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import triton
import triton.language as tl

from treewy.ops._triton import is_capturing
from treewy.ops.checks import check_commit_inputs, contiguous
from treewy.ops.common import MAX_KERNEL_NODES, _exp_rn, _program


@triton.jit(do_not_specialize=["stride_pb"])
def tree_commit_kernel(
    h, u, k, g, parents, accepted,
    stride_pb, stride_hb,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
):
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    m_v, m_k = o_v < V, o_k < K

    p_h = h + i_b64 * stride_hb + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    m_h = m_v[:, None] & m_k[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0).to(tl.float32)

    b_acc = tl.zeros([BV, BK], dtype=tl.float32)
    b_c = tl.zeros([BV], dtype=tl.float32)
    b_cur = tl.load(accepted + i_b).to(tl.int32)
    while b_cur >= 0:
        i_row = i_b64 * T + b_cur
        b_u = tl.load(u + (i_row * HV + i_hv) * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_k = tl.load(k + (i_row * H + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
        if USE_QK_L2NORM_IN_KERNEL:
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        b_acc += (_exp_rn(b_c) * b_u)[:, None] * b_k[None, :]
        b_c += tl.load(g + i_row * HV + i_hv).to(tl.float32)
        b_cur = tl.load(parents + i_b64 * stride_pb + b_cur)
    b_h = _exp_rn(b_c)[:, None] * b_h + b_acc
    tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=m_h)


def tree_commit_fwd(state, u, k, g, parents, stride_pb, accepted, use_qk_l2norm_in_kernel=False):
    """Launcher: inputs already validated; parents and accepted int32 on the state's device."""
    B, T, HV, V = u.shape
    H, K = k.shape[2], k.shape[3]
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), 16 if BK >= 128 else 32)
    grid = (triton.cdiv(V, BV), B * HV)
    tree_commit_kernel[grid](
        state, u, k, g, parents, accepted, stride_pb, state.stride(0),
        T=T, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        num_warps=4,
    )
    return state


def tree_commit(state, u, k, g, parents, accepted, use_qk_l2norm_in_kernel=False, allow_none=False):
    """Overwrite ``state`` [B, HV, V, K] with the state of each request's accepted node; returns it.

    Kernel twin of ``naive_tree_commit`` (same arguments; the reference returns a new tensor,
    this writes in place). u [B, T, HV, V] fp32 from ``tree_verify``; k [B, T, H, K] and
    g [B, T, HV] as given to it; parents a DraftTree, [T] or [B, T]; accepted int [B].
    Pass ``use_qk_l2norm_in_kernel`` as given to ``tree_verify``. ``allow_none``: accepted = -1
    leaves that request's state unchanged (see ``flush_pending``).
    """
    u, k, g = contiguous(u, k, g)
    par, stride_pb, acc = check_commit_inputs(state, u, k, g, parents, accepted, max_nodes=MAX_KERNEL_NODES,
                                              values=not is_capturing(), allow_none=allow_none)
    return tree_commit_fwd(state, u, k, g, par, stride_pb, acc, use_qk_l2norm_in_kernel)
