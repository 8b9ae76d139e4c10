"""Tree causal conv1d (depthwise, SiLU) in front of each GDN layer, and its commit.

Status: parity with ``naive_tree_conv1d`` / ``naive_tree_conv1d_commit`` tested under the Triton
3.9 interpreter on CPU (chains, stars, random trees, per-request topologies, W = 2 and 4, awkward
C). Not yet run on a GPU. Limits: T <= 128; W <= 8. On a machine without CUDA,
importing this module sets TRITON_INTERPRET=1.

A node's window is its own input and its W - 1 nearest ancestors' inputs, then the committed
conv state (oldest first) once the walk passes the root. Grid (C / BC, B): each program walks the
parent pointers of all its nodes at once, W steps. The commit is a gather of the accepted
path's last W - 1 inputs written in place into conv_state: no per-node windows are kept.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops._triton import is_capturing
from treewy.ops.checks import (
    check_accepted, check_contiguous, check_finite, check_kernel_device, check_kernel_dtype, check_kernel_nodes,
    check_shape, check_tensor, contiguous, conv_dims, kernel_parents,
)
from treewy.ops.common import MAX_KERNEL_NODES

MAX_CONV_WIDTH = 8


@triton.jit
def _row(b_tile, o_w, j):
    """Row j of a [BW, BC] tile as a [BC] vector (j a compile-time index)."""
    return tl.sum(tl.where(o_w[:, None] == j, b_tile, 0.0), 0)


@triton.jit
def _path_conv(p_x, p_par, w, bias, b_hist, o_t, o_w, o_c, m_t, m_c, C: tl.constexpr, W: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, USE_SILU: tl.constexpr):
    """[BT, BC]: each node's conv over its own root..node path (inputs p_x [T, C], parents p_par), the committed
    inputs b_hist [BW, BC] (oldest first) before the root; bias and SiLU applied."""
    b_cur = tl.where(m_t, o_t, -1)
    b_over = tl.zeros([BT], dtype=tl.int32)
    b_y = tl.zeros([BT, BC], dtype=tl.float32)
    for s in tl.static_range(W):
        b_w = tl.load(w + o_c * W + (W - 1 - s), mask=m_c, other=0).to(tl.float32)
        m_node = b_cur >= 0
        m_hist = (~m_node) & m_t & (b_over >= 1)
        b_v = tl.load(p_x + b_cur[:, None] * C + o_c[None, :], mask=m_node[:, None] & m_c[None, :],
                      other=0).to(tl.float32)
        for j in tl.static_range(W - 1):
            b_v += tl.where((m_hist & (W - 1 - b_over == j))[:, None], _row(b_hist, o_w, j)[None, :], 0.0)
        b_y += b_v * b_w[None, :]
        b_next = tl.load(p_par + b_cur, mask=m_node, other=-1)
        b_over = tl.where(m_node, (b_next < 0).to(tl.int32), b_over + 1)
        b_cur = tl.where(m_node, b_next, -1)
    if HAS_BIAS:
        b_y += tl.load(bias + o_c, mask=m_c, other=0).to(tl.float32)[None, :]
    if USE_SILU:
        b_y = b_y * tl.sigmoid(b_y)
    return b_y


@triton.jit(do_not_specialize=["stride_pb"])
def tree_conv1d_kernel(
    x, w, bias, cs, parents, y, stride_pb,
    T: tl.constexpr, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
    HAS_BIAS: tl.constexpr, USE_SILU: tl.constexpr,
):
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    i_b64 = i_b.to(tl.int64)
    o_t = tl.arange(0, BT)
    o_w = tl.arange(0, BW)
    o_c = i_c * BC + tl.arange(0, BC)
    m_t, m_c = o_t < T, o_c < C
    b_hist = tl.load(cs + i_b64 * C * (W - 1) + o_c[None, :] * (W - 1) + o_w[:, None],
                     mask=(o_w < W - 1)[:, None] & m_c[None, :], other=0).to(tl.float32)   # [BW, BC]
    b_y = _path_conv(x + i_b64 * T * C, parents + i_b64 * stride_pb, w, bias, b_hist, o_t, o_w, o_c, m_t, m_c,
                     C, W, BT, BC, HAS_BIAS, USE_SILU)
    tl.store(y + i_b64 * T * C + o_t[:, None] * C + o_c[None, :], b_y.to(y.dtype.element_ty),
             mask=m_t[:, None] & m_c[None, :])


@triton.jit(do_not_specialize=["stride_pb"])
def tree_conv1d_commit_kernel(
    x, cs, parents, accepted, stride_pb,
    T: tl.constexpr, C: tl.constexpr, W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
):
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    i_b64 = i_b.to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    o_w = tl.arange(0, BW)
    m_c = o_c < C
    m_cw = m_c[:, None] & (o_w[None, :] < W - 1)
    p_cs = cs + i_b64 * C * (W - 1) + o_c[:, None] * (W - 1) + o_w[None, :]
    b_old = tl.load(p_cs, mask=m_cw, other=0).to(tl.float32)
    b_new = b_old
    b_cur = tl.load(accepted + i_b).to(tl.int32)
    b_over = tl.full([], 0, tl.int32)
    for s in tl.static_range(W - 1):
        if b_cur >= 0:
            b_val = tl.load(x + (i_b64 * T + b_cur) * C + o_c, mask=m_c, other=0).to(tl.float32)
            b_next = tl.load(parents + i_b64 * stride_pb + b_cur)
            b_over = tl.where(b_next < 0, 1, 0)
            b_cur = b_next
        else:
            b_val = tl.sum(tl.where(o_w[None, :] == W - 1 - b_over, b_old, 0), 1)
            b_over = b_over + 1
        b_new = tl.where(o_w[None, :] == W - 2 - s, b_val[:, None], b_new)
    tl.store(p_cs, b_new.to(cs.dtype.element_ty), mask=m_cw)


@triton.jit(do_not_specialize=["stride_s", "stride_c", "stride_j", "stride_slot"])
def tree_conv_update_kernel(
    x, w, bias, cs, slots, accepted, parents, conv_src, y, stride_s, stride_c, stride_j, stride_slot,
    T: tl.constexpr, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
    HAS_BIAS: tl.constexpr, USE_SILU: tl.constexpr,
):
    """Request i_b's window (rows i_b T.. of the packed x) on pool slot slots[i_b] (<= 0: a padding row, whose
    outputs are written as zeros and whose slot is left alone), channels i_c BC..: fold, conv, stash in registers.
    The fold reads committed column j from stash column conv_src[a, j] - 1 (a = accepted[i_b], < 0 read as 0, whose
    row is the identity), before anything is written; the stash writes columns 0..W - 3 (the folded columns 1..W - 2)
    and W - 2..W - 3 + T (the window's inputs) after a barrier, so no program's read meets another thread's write."""
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    i_b64 = i_b.to(tl.int64)
    o_t = tl.arange(0, BT)
    o_w = tl.arange(0, BW)
    o_c = i_c * BC + tl.arange(0, BC)
    m_t, m_c = o_t < T, o_c < C
    m_tc = m_t[:, None] & m_c[None, :]
    p_x = x + i_b64 * T * C
    p_y = y + i_b64 * T * C + o_t[:, None] * C + o_c[None, :]
    i_s = tl.load(slots + i_b * stride_slot).to(tl.int64)
    if i_s <= 0:
        tl.store(p_y, tl.zeros([BT, BC], dtype=tl.float32).to(y.dtype.element_ty), mask=m_tc)
        return
    p_cs = cs + i_s * stride_s + o_c.to(tl.int64) * stride_c
    a = tl.maximum(tl.load(accepted + i_b), 0)
    m_w = o_w < W - 1
    b_src = tl.load(conv_src + a * (W - 1) + o_w, mask=m_w, other=1) - 1
    b_hist = tl.load(p_cs[None, :] + b_src[:, None].to(tl.int64) * stride_j, mask=m_w[:, None] & m_c[None, :],
                     other=0).to(tl.float32)   # [BW, BC]: the committed inputs after the fold, oldest first

    b_y = _path_conv(p_x, parents, w, bias, b_hist, o_t, o_w, o_c, m_t, m_c, C, W, BT, BC, HAS_BIAS, USE_SILU)
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_tc)

    b_xw = tl.load(p_x + o_t[:, None] * C + o_c[None, :], mask=m_tc, other=0)
    tl.debug_barrier()
    for j in tl.static_range(W - 2):
        tl.store(p_cs + j * stride_j, _row(b_hist, o_w, j + 1).to(cs.dtype.element_ty), mask=m_c)
    tl.store(p_cs[None, :] + (W - 2 + o_t[:, None]).to(tl.int64) * stride_j, b_xw.to(cs.dtype.element_ty),
             mask=m_tc)


def tree_conv_update_fwd(x, conv_state, weight, bias, slots, accepted, parents, conv_src, activation="silu"):
    """One served tree step's conv on a serving pool, in place, in one launch (twin of ``naive_tree_conv_update``):
    y [B * T, C] in x's dtype. x [B * T, C] packed windows (contiguous); conv_state [S, C, L] any strides, L >= W - 2
    + T; weight [C, W]; bias [C] or None; slots int [B] (any stride; <= 0: padding rows, zeros out, slot untouched);
    accepted int32 [B] (the previous window's node); parents int32 [T]; conv_src int32 [T, W - 1]."""
    C, W = weight.shape
    T, B = parents.shape[0], slots.shape[0]
    dims = f"B = {B} slots, T = {T} nodes, C = {C} channels, conv width W = {W}"
    for name, t, shape in (("x", x, (B * T, C)), ("accepted", accepted, (B,)), ("conv_src", conv_src, (T, W - 1))):
        check_shape(name, t, shape, dims)
    if conv_state.shape[1] != C or conv_state.shape[2] < W - 2 + T:
        raise ValueError(f"conv_state has shape {tuple(conv_state.shape)}: expected [slots, C = {C}, >= W - 2 + T = "
                         f"{W - 2 + T}] (the committed columns, then the window's stash)")
    check_kernel_device(("x", x), ("conv_state", conv_state), ("weight", weight), ("slots", slots))
    check_contiguous("x", x)
    check_kernel_dtype("accepted", accepted, (torch.int32,))
    check_kernel_dtype("conv_src", conv_src, (torch.int32,))
    y = torch.empty(B * T, C, device=x.device, dtype=x.dtype)
    BC = min(64, triton.next_power_of_2(C))
    tree_conv_update_kernel[(triton.cdiv(C, BC), B)](
        x, weight, bias if bias is not None else weight, conv_state, slots, accepted, parents, conv_src, y,
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), slots.stride(0),
        T=T, C=C, W=W, BT=triton.next_power_of_2(T), BW=triton.next_power_of_2(max(W - 1, 1)), BC=BC,
        HAS_BIAS=bias is not None, USE_SILU=activation == "silu", num_warps=4,
    )
    return y


def tree_conv1d_fwd(x, weight, conv_state, parents, stride_pb, bias=None, activation="silu"):
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.empty_like(x)
    BC = min(128, triton.next_power_of_2(C))
    grid = (triton.cdiv(C, BC), B)
    tree_conv1d_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state, parents, y, stride_pb,
        T=T, C=C, W=W, BT=triton.next_power_of_2(T), BW=triton.next_power_of_2(max(W - 1, 1)), BC=BC,
        HAS_BIAS=bias is not None, USE_SILU=activation == "silu", num_warps=4,
    )
    return y


def tree_conv1d_commit_fwd(x, conv_state, parents, stride_pb, accepted):
    B, T, C = x.shape
    W = conv_state.shape[-1] + 1
    BC = min(256, triton.next_power_of_2(C))
    grid = (triton.cdiv(C, BC), B)
    tree_conv1d_commit_kernel[grid](x, conv_state, parents, accepted, stride_pb,
                                    T=T, C=C, W=W, BW=triton.next_power_of_2(W - 1), BC=BC, num_warps=4)
    return conv_state


def _check_conv_kernel(x, weight, conv_state, parents, bias=None):
    B, T, C, W = conv_dims(x, conv_state, weight)
    named = [("x", x), ("conv_state", conv_state)] + [(n, t) for n, t in (("weight", weight), ("bias", bias))
                                                        if t is not None]
    if bias is not None:
        check_tensor("bias", bias, x.device, ref="x")
    check_kernel_device(*named)
    if not 2 <= W <= MAX_CONV_WIDTH:
        raise ValueError(f"the conv width is W = {W}; the kernel takes 2 <= W <= {MAX_CONV_WIDTH}")
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected [C] = [{C}]")
    for name, t in named:
        check_kernel_dtype(name, t, (torch.bfloat16, torch.float32))
    check_contiguous("conv_state", conv_state)   # written in place; the inputs arrive contiguous (``contiguous``)
    check_kernel_nodes(T, MAX_KERNEL_NODES)
    values = not is_capturing()
    if values:
        check_finite(**dict(named))
    par, stride_pb = kernel_parents(parents, B, T, x.device, values=values)
    return par, stride_pb, values


def tree_conv1d(x, weight, conv_state, parents, bias=None, activation="silu"):
    """y [B, T, C] in x's dtype: each node's depthwise causal conv over its root..node path (twin of
    ``naive_tree_conv1d``). x [B, T, C]; weight [C, W]; conv_state [B, C, W - 1] oldest first."""
    if activation not in ("silu", None):
        raise ValueError(f"activation = {activation!r}: expected 'silu' or None")
    x, weight, bias = contiguous(x, weight, bias)
    par, stride_pb, _ = _check_conv_kernel(x, weight, conv_state, parents, bias)
    return tree_conv1d_fwd(x, weight, conv_state, par, stride_pb, bias, activation)


def tree_conv1d_commit(x, conv_state, parents, accepted):
    """Write the last W - 1 inputs of each request's root..accepted path into ``conv_state`` in place
    and return it (twin of ``naive_tree_conv1d_commit``, which returns a new tensor)."""
    x = x.contiguous()
    par, stride_pb, values = _check_conv_kernel(x, None, conv_state, parents)
    B, T = x.shape[:2]
    if values:
        acc = check_accepted(accepted, B, T, x.device).to(torch.int32)
    else:
        acc = accepted
        if not (isinstance(acc, torch.Tensor) and acc.dtype == torch.int32 and tuple(acc.shape) == (B,)):
            raise ValueError("accepted must be an int32 [B] tensor on x's device inside CUDA-graph capture")
    return tree_conv1d_commit_fwd(x, conv_state, par, stride_pb, acc.contiguous())
