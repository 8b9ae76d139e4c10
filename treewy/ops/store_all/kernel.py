"""Store-all tree verify: the baseline today's engines use (a full state snapshot per node).

Status: parity with ``naive_tree_recurrent`` (fp64) tested under the Triton 3.9 interpreter on
CPU (fp32; GVA; awkward K, V; chains, stars, random trees; fp32 and bf16 state) and on an H200
with Triton 3.6. Limits: T <= 128; snapshots [B, T, HV, V, K] in the state's dtype (at B = 256,
T = 40, HV = 32, fp32 that is 21 GB); 64-bit offsets. On a machine without CUDA, importing this
module sets TRITON_INTERPRET=1.

The kernel is fla-core's fused_recurrent_gated_delta_rule (state_v_first) with one change: node t
starts from its parent's state. The state tile [BV, K] stays in registers while the tree runs
down a chain (parent == t - 1); a node whose parent is further back reloads that parent's
snapshot, which this program wrote itself. Every node writes its snapshot; commit is a select
(``store_all_commit``). Same launch shape as fla (BV = 8, one warp), so at T = 1 it runs like
fla's kernel with the final state stored.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import is_capturing
from treewy.ops.checks import check_accepted, check_gdn_kernel_inputs, check_scale, check_tensor, contiguous
from treewy.ops.common import MAX_KERNEL_NODES, _program, _recurrent_node


@triton.jit(do_not_specialize=["stride_pb", "stride_hb", "stride_bb", "stride_hs"])
def store_all_verify_kernel(
    q, k, v, g, beta, h0, parents, o, hs, blocks, start,
    stride_pb, stride_hb, stride_bb, stride_hs, scale,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_BLOCKS: tl.constexpr,
):
    """Without HAS_BLOCKS: request i_b starts from h0[i_b] and writes node t's snapshot to hs[i_b, t]. With it, hs
    is a serving pool of state blocks: node t's snapshot goes to block blocks[i_b, t] and the request starts from
    block blocks[i_b, start[i_b]] (the previous window's accepted node); a request whose block 0 is <= 0 (a CUDA
    graph's padding row, vLLM's null block) does nothing."""
    i_v, i_b, i_b64, i_hv, i_h = _program(H, HV)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_v[:, None] & m_k[None, :]
    o_h = o_v[:, None] * K + o_k[None, :]

    if HAS_BLOCKS:
        p_blk = blocks + i_b64 * stride_bb
        if tl.load(p_blk) <= 0:
            return
        i_s0 = tl.load(p_blk + tl.load(start + i_b)).to(tl.int64)
        b_h = tl.load(hs + i_s0 * stride_hs + i_hv * V * K + o_h, mask=m_h, other=0).to(tl.float32)
        p_hs = hs + i_hv * V * K
    else:
        b_h = tl.load(h0 + i_b64 * stride_hb + i_hv * V * K + o_h, mask=m_h, other=0).to(tl.float32)
        p_hs = hs + i_b64 * T * HV * V * K + i_hv * V * K
    p_par = parents + i_b64 * stride_pb
    for t in range(0, T):
        i_p = tl.load(p_par + t)
        if i_p != t - 1:
            tl.debug_barrier()
            if HAS_BLOCKS:
                p_src = p_hs + tl.load(p_blk + i_p).to(tl.int64) * stride_hs
            else:
                p_src = p_hs + i_p.to(tl.int64) * HV * V * K
            b_h = tl.load(p_src + o_h, mask=m_h, other=0).to(tl.float32)
        i_row = i_b64 * T + t
        b_h, _, b_o = _recurrent_node(b_h, q, k, v, g, beta, i_row, i_h, i_hv, o_k, m_k, o_v, m_v, scale,
                                      H, HV, K, V, USE_QK_L2NORM_IN_KERNEL)
        tl.store(o + (i_row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if HAS_BLOCKS:
            p_dst = p_hs + tl.load(p_blk + t).to(tl.int64) * stride_hs
        else:
            p_dst = p_hs + t * HV * V * K
        tl.store(p_dst + o_h, b_h.to(hs.dtype.element_ty), mask=m_h)


def store_all_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale,
                         use_qk_l2norm_in_kernel=False, states=None, blocks=None, start=None):
    """Launcher: inputs already validated. ``states`` may be a preallocated [B, T, HV, V, K] buffer.

    ``blocks`` int32 [B, T] (any row stride) and ``start`` int32 [B]: ``initial_state`` is a serving pool of state
    blocks [S, HV, V, K] (each block contiguous); request b starts from block blocks[b, start[b]] and writes node t's
    snapshot into block blocks[b, t] (rows whose block 0 is <= 0 are skipped); returns (o, initial_state)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BK = triton.next_power_of_2(K)
    BV = min(8, triton.next_power_of_2(V))
    o = torch.empty_like(v)
    pooled = blocks is not None
    if pooled:
        if not initial_state[0].is_contiguous():
            raise ValueError(f"initial_state has strides {tuple(initial_state.stride())}: a pool of state blocks "
                             "needs each block [HV, V, K] contiguous (any block stride)")
        states = initial_state
    elif states is None:
        states = initial_state.new_empty(B, T, HV, V, K)
    grid = (triton.cdiv(V, BV), B * HV)
    store_all_verify_kernel[grid](
        q, k, v, g, beta, initial_state, parents, o, states, blocks if pooled else parents,
        start if pooled else parents, stride_pb, initial_state.stride(0), blocks.stride(0) if pooled else 0,
        initial_state.stride(0), scale,
        T=T, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_BLOCKS=pooled, num_warps=1, num_stages=3,
    )
    return o, states


def store_all_verify(q, k, v, g, beta, initial_state, parents, scale=None, use_qk_l2norm_in_kernel=False):
    """Every node advances its parent's state and keeps a snapshot (kernel twin of ``naive_tree_recurrent``).

    Returns o [B, T, HV, V] in v's dtype and states [B, T, HV, V, K] in initial_state's dtype.
    """
    q, k, v, g, beta, initial_state = contiguous(q, k, v, g, beta, initial_state)
    dims, par, stride_pb, _ = check_gdn_kernel_inputs(q, k, v, g, beta, initial_state, parents,
                                                      max_nodes=MAX_KERNEL_NODES, values=not is_capturing())
    scale = check_scale(scale, dims.K)
    return store_all_verify_fwd(q, k, v, g, beta, initial_state, par, stride_pb, scale, use_qk_l2norm_in_kernel)


def store_all_commit(state, states, accepted):
    """Store-all commit: copy each request's accepted snapshot into ``state`` [B, HV, V, K] (in place)."""
    check_tensor("states", states)
    check_tensor("state", state, states.device, ref="states")
    if not state.is_floating_point() or not states.is_floating_point():
        raise ValueError(f"state has dtype {state.dtype} and states {states.dtype}; both must be floating (the "
                         "recurrent state is fp32 or bf16): an integer state would truncate every entry")
    B, T = states.shape[:2]
    if tuple(state.shape) != (B, *states.shape[2:]):
        raise ValueError(f"state has shape {tuple(state.shape)}, expected [B, HV, V, K] = "
                         f"{[B, *states.shape[2:]]} to match states {tuple(states.shape)}")
    a = accepted if is_capturing() else check_accepted(accepted, B, T, states.device)
    state.copy_(states[torch.arange(B, device=states.device), a.long()])
    return state
