"""Tree attention over a paged KV cache for the softmax layers' verify, and the compaction of the accepted path's K/V.

Status: parity with ``naive_tree_attention`` / ``naive_compact_accepted_kv`` (fp64) tested under the Triton 3.9
interpreter on CPU (ragged windows with empty requests, prefixes across block boundaries, shuffled block tables,
GQA 1/2/8, chains and bushy trees, fp32 and bf16 inputs, the packed K|V views of one cache tensor). The GPU tests
(``pytest -m gpu tests/test_tree_attention.py``: model sizes, bf16 on tensor cores, CUDA-graph replay) are written and
have not run yet. Limits: head dim D <= 256 per tile; q and the caches bf16, fp16 or fp32 with unit stride in D.
On a machine without CUDA, importing this module sets TRITON_INTERPRET=1.

``tree_attention``: grid (row blocks, B, Hkv); a program takes BQ query rows of one request and one KV head (rows
are node * group + query head within the group, so a GQA group shares every K/V tile it loads) and runs one online
softmax over the request's prefix (no mask, slots looked up in the block table token by token) and then over the
window's own K/V (read from the cache, where the engine wrote it before attention) under the inclusive ancestor
mask, built by walking parent pointers from a device tensor. Sizes come from tensors and every loop bound from
device data, so a launch captures into a CUDA graph; the grid's first axis only sets how many programs share a
request's row blocks (``max_nodes``), each program striding over them, so a wrong bound costs time, never results.

``compact_accepted_kv``: grid (B, Hkv); a program moves its request's accepted path token by token, forward.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import math

import torch
import triton
import triton.language as tl

from treewy.ops._triton import INTERPRET, is_capturing
from treewy.ops.checks import check_finite, check_kernel_device, check_kernel_dtype, check_scale
from treewy.ops.attention.checks import (
    INDEX_DTYPE, check_compact, check_index_values, check_parents_layout, paged_dims,
)
from treewy.tree import as_int

#: The dtypes the kernels take for q and the caches.
ATTENTION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Largest head dim one tile holds.
MAX_HEAD_DIM = 256


@triton.jit
def _load_kv(k_cache, v_cache, p_bt, o_pos, m_pos, i_hkv, o_d, m_d, stride_kb, stride_ks, stride_kh, stride_vb,
             stride_vs, stride_vh, BS: tl.constexpr, UPCAST: tl.constexpr):
    """K and V [BN, BD] of the request's tokens o_pos (masked rows 0), each slot looked up in its block table row."""
    b_blk = tl.load(p_bt + o_pos // BS, mask=m_pos, other=0).to(tl.int64)
    o_slot = o_pos % BS
    m_kv = m_pos[:, None] & m_d[None, :]
    b_k = tl.load(k_cache + (b_blk * stride_kb + o_slot * stride_ks + i_hkv * stride_kh)[:, None] + o_d[None, :],
                  mask=m_kv, other=0)
    b_v = tl.load(v_cache + (b_blk * stride_vb + o_slot * stride_vs + i_hkv * stride_vh)[:, None] + o_d[None, :],
                  mask=m_kv, other=0)
    if UPCAST:
        b_k, b_v = b_k.to(tl.float32), b_v.to(tl.float32)
    return b_k, b_v


@triton.jit
def _softmax_step(b_acc, b_m, b_l, b_q, b_k, b_v, m_s, qk_scale, UPCAST: tl.constexpr):
    """One online-softmax step over a K/V tile (base-2 scores): masked scores are -inf, and b_m starts finite, so a
    row with nothing visible yet keeps p = 0 and never computes inf - inf."""
    if UPCAST:
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")
    else:
        b_s = tl.dot(b_q, tl.trans(b_k))
    b_s = tl.where(m_s, b_s * qk_scale, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
    b_alpha = tl.exp2(b_m - b_m_new)
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    if UPCAST:
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p, b_v, input_precision="ieee")
    else:
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
    return b_acc, b_m_new, b_l


@triton.jit
def _ancestor_cols(p_par, b_node, o_j, n):
    """[BQ, BN] mask: window node o_j is b_node or one of its ancestors (b_node -1: none). All rows walk up at once;
    parents[t] < t ends every walk within n steps, and the bound keeps unvalidated parents (inside capture) from
    looping or reading past the request's nodes."""
    b_cur = b_node
    m_anc = b_cur[:, None] == o_j[None, :]
    n_step = tl.full([], 0, tl.int32)
    while (tl.max(b_cur, 0) >= 0) & (n_step < n):
        b_cur = tl.load(p_par + b_cur, mask=(b_cur >= 0) & (b_cur < n), other=-1)
        m_anc = m_anc | (b_cur[:, None] == o_j[None, :])
        n_step += 1
    return m_anc


@triton.jit
def tree_attention_kernel(
    q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, o, lse,
    stride_qn, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_on, stride_oh, stride_bt, stride_pb, qk_scale,
    Hq: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BQ: tl.constexpr, BN: tl.constexpr,
    BD: tl.constexpr, PACKED_PARENTS: tl.constexpr, HAS_LSE: tl.constexpr, UPCAST: tl.constexpr,
):
    i_m0, i_b, i_hkv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b64 = i_b.to(tl.int64)
    n_start = tl.load(cu_nodes + i_b)
    n = tl.load(cu_nodes + i_b + 1) - n_start
    n_pre = tl.load(prefix_lens + i_b)
    p_bt = block_table + i_b64 * stride_bt
    if PACKED_PARENTS:
        p_par = parents + n_start
    else:
        p_par = parents + i_b64 * stride_pb
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    for i_m in range(i_m0, tl.cdiv(n * G, BQ), tl.num_programs(0)):
        o_r = i_m * BQ + tl.arange(0, BQ)
        m_r = o_r < n * G
        b_node = tl.where(m_r, o_r // G, -1)
        i_head = i_hkv * G + o_r % G
        o_row = (n_start + tl.maximum(b_node, 0)).to(tl.int64)
        m_qd = m_r[:, None] & m_d[None, :]
        b_q = tl.load(q + (o_row * stride_qn + i_head * stride_qh)[:, None] + o_d[None, :], mask=m_qd, other=0)
        if UPCAST:
            b_q = b_q.to(tl.float32)
        b_acc = tl.zeros([BQ, BD], dtype=tl.float32)
        b_m = tl.full([BQ], -1e30, dtype=tl.float32)
        b_l = tl.zeros([BQ], dtype=tl.float32)
        for i_n in range(0, n_pre, BN):  # the committed prefix: every token visible
            o_pos = i_n + tl.arange(0, BN)
            m_pos = o_pos < n_pre
            b_k, b_v = _load_kv(k_cache, v_cache, p_bt, o_pos, m_pos, i_hkv, o_d, m_d, stride_kb, stride_ks,
                                stride_kh, stride_vb, stride_vs, stride_vh, BS, UPCAST)
            b_acc, b_m, b_l = _softmax_step(b_acc, b_m, b_l, b_q, b_k, b_v, m_pos[None, :], qk_scale, UPCAST)
        n_cols = tl.minimum(n, (i_m * BQ + BQ - 1) // G + 1)  # ancestors come first: none past the block's last node
        for i_j in range(0, n_cols, BN):  # the window: ancestors and self
            o_j = i_j + tl.arange(0, BN)
            m_j = o_j < n_cols
            b_k, b_v = _load_kv(k_cache, v_cache, p_bt, n_pre + o_j, m_j, i_hkv, o_d, m_d, stride_kb, stride_ks,
                                stride_kh, stride_vb, stride_vs, stride_vh, BS, UPCAST)
            m_s = _ancestor_cols(p_par, b_node, o_j, n) & m_j[None, :]
            b_acc, b_m, b_l = _softmax_step(b_acc, b_m, b_l, b_q, b_k, b_v, m_s, qk_scale, UPCAST)
        b_o = b_acc / tl.where(m_r, b_l, 1.0)[:, None]
        tl.store(o + (o_row * stride_on + i_head * stride_oh)[:, None] + o_d[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_qd)
        if HAS_LSE:
            b_lse = (b_m + tl.log2(tl.where(m_r, b_l, 1.0))) * 0.6931471805599453   # base 2 -> natural log
            tl.store(lse + o_row * Hq + i_head, b_lse, mask=m_r)


def _blocks(D: int, fp32: bool):
    """(BQ, BN, BD, num_warps): small tiles under the interpreter (a CPU pays per element); on the GPU the largest
    tiles whose fp32 accumulator compiles for sm_90 without spills (README.md, "The kernel"); fp32 inputs take exact
    fp32 products (no tensor cores) on smaller tiles."""
    BD = max(16, triton.next_power_of_2(D))
    if INTERPRET:
        return 16, 16, BD, 4
    if fp32:
        return (16, 16, BD, 8) if BD > 128 else (32, 16, BD, 4)
    return (32, 32, BD, 8) if BD > 128 else (64, 32, BD, 8)


def tree_attention_fwd(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale, max_nodes,
                       out, lse):
    """Launcher: inputs validated, index tensors int32 on the device; writes ``out`` (and ``lse`` when given)."""
    N, Hq, D = q.shape
    B = block_table.shape[0]
    BS, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    BQ, BN, BD, num_warps = _blocks(D, q.dtype == torch.float32)
    grid = (max(1, triton.cdiv(max_nodes * G, BQ)), B, Hkv)
    packed = parents.ndim == 1
    tree_attention_kernel[grid](
        q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, out, lse if lse is not None else out,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], out.stride(0), out.stride(1),
        block_table.stride(0), 0 if packed else parents.stride(0), scale * math.log2(math.e),
        Hq=Hq, G=G, D=D, BS=BS, BQ=BQ, BN=BN, BD=BD, PACKED_PARENTS=packed, HAS_LSE=lse is not None,
        UPCAST=INTERPRET or q.dtype == torch.float32, num_warps=num_warps,
    )
    return out


def _index(name: str, x: torch.Tensor, device, values: bool) -> torch.Tensor:
    """An index tensor as the kernels read it: int32 on the device, unit stride in its last dim."""
    if x.dtype == INDEX_DTYPE and x.device == device and (x.numel() <= 1 or x.stride(-1) == 1):
        return x
    if not values:
        raise ValueError(f"{name} must be an int32 tensor on the inputs' device with unit stride in its last dim "
                         "inside CUDA-graph capture; convert it before capturing")
    return x.to(device=device, dtype=INDEX_DTYPE).contiguous()


def _check_unit_stride(name: str, x: torch.Tensor) -> None:
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name} with shape {tuple(x.shape)} and strides {x.stride()} is not contiguous in its last "
                         "dim (the head dim); pass a view with unit stride there, e.g. x.contiguous()")


def _check_values(check_values) -> bool:
    """Whether to read index tensors on the host to check them: never inside CUDA-graph capture; otherwise
    ``check_values`` (None: yes). A server's per-step eager call passes False: its indices come from the engine and a
    host read would sync every step."""
    if check_values not in (None, True, False):
        raise ValueError(f"check_values = {check_values!r}: expected None, True or False")
    return not is_capturing() and check_values is not False


def tree_attention(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale=None, *, max_nodes=None,
                   return_lse=False, out=None, check_values=None):
    """Each window node's attention over its request's committed prefix and its own window ancestors, itself
    included (kernel twin of ``naive_tree_attention``, same arguments).

    q [total_nodes, Hq, D] packed (request b's nodes at rows cu_nodes[b]..cu_nodes[b + 1] - 1, topological order);
    k_cache, v_cache [num_blocks, block_size, Hkv, D], any strides with unit stride in D (vLLM's NHD or HND views, or
    the two halves of a packed K|V cache), the window's own K/V already written at tokens prefix_lens[b] + node;
    block_table [B, max_blocks]; prefix_lens [B]; cu_nodes [B + 1]; parents packed [total_nodes] or [B, T],
    window-local, -1 for the root. ``scale`` None gives D ** -0.5. ``max_nodes``: a bound on the nodes of any request
    that sizes the grid (None reads cu_nodes on the host; pass it inside CUDA-graph capture). ``out``: a
    [total_nodes, Hq, D] tensor to write into (a view of the engine's output buffer). Rows past cu_nodes[B] are not
    written. ``check_values``: False skips the host read of the index tensors (``_check_values``). Returns o in q's
    dtype, and with ``return_lse`` also the natural-log LSE [total_nodes, Hq] in fp32.
    """
    dims = paged_dims(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes)
    par = check_parents_layout(parents, dims, q.device)
    check_kernel_device(("q", q), ("k_cache", k_cache), ("v_cache", v_cache))
    check_kernel_dtype("q", q, ATTENTION_DTYPES)
    if dims.D > MAX_HEAD_DIM:
        raise ValueError(f"q has head dim D = {dims.D}; the kernel takes D <= {MAX_HEAD_DIM} "
                         "(use naive_tree_attention)")
    _check_unit_stride("k_cache", k_cache)
    _check_unit_stride("v_cache", v_cache)
    if q.shape[-1] > 1 and q.stride(-1) != 1:
        q = q.contiguous()
    scale = check_scale(scale, dims.D)
    values = _check_values(check_values)
    if values:
        n = check_index_values(dims, block_table, prefix_lens, cu_nodes, par)
        check_finite(q=q)
    if max_nodes is None:
        if not values:
            raise ValueError("max_nodes is None inside CUDA-graph capture or with check_values=False; pass a bound "
                             "on the nodes per request (the tree's node count)")
        max_nodes = int(n.max()) if n.numel() else 0
    elif as_int(max_nodes) is None or as_int(max_nodes) < 0:
        raise ValueError(f"max_nodes = {max_nodes!r}: expected a non-negative int (a bound on the nodes per "
                         "request; None reads it from cu_nodes)")
    if out is None:
        out = torch.empty_like(q)
    else:
        check_kernel_device(("out", out))
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(f"out is {tuple(out.shape)} {out.dtype} on {out.device}, expected q's "
                             f"{tuple(q.shape)} {q.dtype} on {q.device}")
        _check_unit_stride("out", out)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    idx = [_index(name, x, q.device, values) for name, x in (("block_table", block_table),
                                                              ("prefix_lens", prefix_lens), ("cu_nodes", cu_nodes),
                                                              ("parents", par))]
    tree_attention_fwd(q, k_cache, v_cache, *idx, scale, as_int(max_nodes), out, lse)
    return (out, lse) if return_lse else out


@triton.jit
def compact_accepted_kv_kernel(
    k_cache, v_cache, block_table, prefix_lens, accepted, accepted_len,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt, stride_ab,
    D: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr,
):
    # Step i copies token P + a_i to P + i, where a_0 = 0 < a_1 < ... are the accepted nodes, so a_i >= i.
    # No step reads what an earlier step wrote: step j reads P + a_j with a_j >= j, and the steps before it wrote
    # only P + 0 .. P + j - 1. A write can only land on a token an earlier step read (a_j = i for j < i); the
    # barrier orders every thread's read of step j before any thread's write of step i. So the forward copy in
    # place moves exactly what a copy of the original path would (the reference reads all sources first).
    i_b, i_hkv = tl.program_id(0), tl.program_id(1)
    i_b64 = i_b.to(tl.int64)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    p_bt = block_table + i_b64 * stride_bt
    n_pre = tl.load(prefix_lens + i_b)
    for i in range(0, tl.load(accepted_len + i_b)):
        a = tl.load(accepted + i_b64 * stride_ab + i)
        if a != i:
            i_src, i_dst = n_pre + a, n_pre + i
            b_src = tl.load(p_bt + i_src // BS).to(tl.int64)
            b_dst = tl.load(p_bt + i_dst // BS).to(tl.int64)
            p_k = k_cache + i_hkv * stride_kh + o_d
            p_v = v_cache + i_hkv * stride_vh + o_d
            b_k = tl.load(p_k + b_src * stride_kb + (i_src % BS) * stride_ks, mask=m_d)
            b_v = tl.load(p_v + b_src * stride_vb + (i_src % BS) * stride_vs, mask=m_d)
            tl.debug_barrier()
            tl.store(p_k + b_dst * stride_kb + (i_dst % BS) * stride_ks, b_k, mask=m_d)
            tl.store(p_v + b_dst * stride_vb + (i_dst % BS) * stride_vs, b_v, mask=m_d)


def compact_accepted_kv(k_cache, v_cache, block_table, prefix_lens, cu_nodes, accepted, accepted_len, *,
                        check_values=None):
    """Move each request's accepted path's K/V to consecutive tokens, in place: window node accepted[b, i] (root
    first, increasing) to token prefix_lens[b] + i, for i < accepted_len[b] (kernel twin of
    ``naive_compact_accepted_kv``, which returns new caches). One launch, grid (B, Hkv), loop bounds from device
    data: capturable. ``check_values``: False skips the host read of the index tensors (``_check_values``). Returns
    (k_cache, v_cache)."""
    values = _check_values(check_values)
    dims, acc, n_acc = check_compact(k_cache, v_cache, block_table, prefix_lens, cu_nodes, accepted, accepted_len,
                                     values=values)
    check_kernel_device(("k_cache", k_cache), ("v_cache", v_cache))
    check_kernel_dtype("k_cache", k_cache, ATTENTION_DTYPES)
    _check_unit_stride("k_cache", k_cache)
    _check_unit_stride("v_cache", v_cache)
    device = k_cache.device
    bt, pre = (_index(name, x, device, values) for name, x in (("block_table", block_table),
                                                                ("prefix_lens", prefix_lens)))
    acc, n_acc = _index("accepted", acc, device, values), _index("accepted_len", n_acc, device, values)
    grid = (dims.B, dims.Hkv)
    compact_accepted_kv_kernel[grid](
        k_cache, v_cache, bt, pre, acc, n_acc, *k_cache.stride()[:3], *v_cache.stride()[:3], bt.stride(0),
        acc.stride(0), D=dims.D, BS=dims.block_size, BD=triton.next_power_of_2(dims.D), num_warps=1,
    )
    return k_cache, v_cache
