"""The door of the tree attention ops (references and kernels alike): shapes, dtypes, devices and, outside CUDA-graph
capture, the values of the index tensors (a host sync), each error naming the argument and the fix."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.ops.checks import check_tensor
from treewy.tree import validate_parents

#: The index tensors' dtype inside CUDA-graph capture (outside it any integer dtype is converted).
INDEX_DTYPE = torch.int32


@dataclass(frozen=True)
class PagedDims:
    B: int
    num_blocks: int
    block_size: int
    max_blocks: int
    Hkv: int
    D: int
    N: int = 0       # rows of q (the window nodes of all requests packed, padding rows included)
    Hq: int = 0


def _check_int(name: str, x: torch.Tensor, shape: tuple, what: str) -> None:
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name} must hold integers (int32), got dtype {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {list(shape)} ({what})")


def cache_dims(k_cache, v_cache, block_table, prefix_lens, cu_nodes) -> PagedDims:
    """Check the paged cache and the per-request index tensors (metadata only, no host sync): k_cache, v_cache
    [num_blocks, block_size, Hkv, D] (any strides), block_table [B, max_blocks], prefix_lens [B], cu_nodes [B + 1]."""
    k_cache = check_tensor("k_cache", k_cache)
    for name, x in (("v_cache", v_cache), ("block_table", block_table), ("prefix_lens", prefix_lens),
                    ("cu_nodes", cu_nodes)):
        check_tensor(name, x, k_cache.device, ref="k_cache")
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache has shape {tuple(k_cache.shape)}, expected 4 dims [num_blocks, block_size, "
                         "Hkv, D] (vLLM's paged layout: split a packed cache into its K and V views first)")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache has shape {tuple(v_cache.shape)}, expected {tuple(k_cache.shape)} like k_cache")
    num_blocks, block_size, Hkv, D = k_cache.shape
    if min(block_size, Hkv, D) == 0:
        raise ValueError(f"k_cache has shape {tuple(k_cache.shape)}: block size, head count and head dim must be "
                         "at least 1")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not x.is_floating_point():
            raise ValueError(f"{name} has dtype {x.dtype}; expected a floating dtype (bf16, fp16, fp32 or fp64)")
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache has dtype {v_cache.dtype} but k_cache has {k_cache.dtype}; pass one layer's cache")
    if block_table.ndim != 2:
        raise ValueError(f"block_table has shape {tuple(block_table.shape)}, expected [B, max_blocks]")
    B, max_blocks = block_table.shape
    _check_int("block_table", block_table, (B, max_blocks), "[B, max_blocks]")
    _check_int("prefix_lens", prefix_lens, (B,), f"[B] = [{B}] committed tokens per request, B from block_table")
    _check_int("cu_nodes", cu_nodes, (B + 1,), f"[B + 1] = [{B + 1}] offsets of each request's nodes in q")
    return PagedDims(B, num_blocks, block_size, max_blocks, Hkv, D)


def paged_dims(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes) -> PagedDims:
    """``cache_dims`` and q [N, Hq, D]: same device and dtype as the cache, Hq a multiple of Hkv."""
    q = check_tensor("q", q)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("prefix_lens", prefix_lens), ("cu_nodes", cu_nodes)):
        check_tensor(name, x, q.device)
    dims = cache_dims(k_cache, v_cache, block_table, prefix_lens, cu_nodes)
    if q.ndim != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected 3 dims [total_nodes, Hq, D] (the window nodes of "
                         "all requests packed along dim 0)")
    N, Hq, D = q.shape
    if D != dims.D:
        raise ValueError(f"q has head dim D = {D} but k_cache has {dims.D}; pass the cache of this layer")
    if Hq == 0 or Hq % dims.Hkv != 0:
        raise ValueError(f"q has Hq = {Hq} heads, not a multiple of the Hkv = {dims.Hkv} heads of k_cache "
                         "(GQA needs Hq = Hkv * group)")
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q has dtype {q.dtype} but k_cache has {k_cache.dtype}; cast q to the cache's dtype")
    return PagedDims(dims.B, dims.num_blocks, dims.block_size, dims.max_blocks, dims.Hkv, D, N, Hq)


def check_parents_layout(parents, dims: PagedDims, device) -> torch.Tensor:
    """parents as a tensor on ``device``: packed [N] (request b's nodes at rows cu_nodes[b]..) or [B, T] (request
    b's node j at [b, j], the verify op's per-request form), window-local indices, -1 for the root."""
    p = parents if isinstance(parents, torch.Tensor) else torch.as_tensor(parents)
    check_tensor("parents", p, device)
    if p.dtype.is_floating_point or p.dtype == torch.bool or p.is_complex():
        raise ValueError(f"parents must hold integers (int32), got dtype {p.dtype}")
    if not (p.ndim == 1 and p.shape[0] == dims.N or p.ndim == 2 and p.shape[0] == dims.B):
        raise ValueError(f"parents has shape {tuple(p.shape)}, expected [total_nodes] = [{dims.N}] (packed like q) "
                         f"or [B, T] = [{dims.B}, T] (one row per request)")
    return p


def check_index_values(dims: PagedDims, block_table, prefix_lens, cu_nodes, parents=None) -> torch.Tensor:
    """The index tensors' values (host syncs): cu_nodes offsets within q, prefix lengths, block ids in the pool and
    enough of them per request, and (when given) each request's tree topological (parents[0] = -1, parents[t] < t).
    Returns the node count per request (int64, CPU)."""
    cu = cu_nodes.detach().to("cpu", torch.int64)
    n = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool((n < 0).any()) or (parents is not None and int(cu[-1]) > dims.N):
        raise ValueError(f"cu_nodes = {cu.tolist()}: expected offsets from 0, non-decreasing"
                         + (f", ending at most at the {dims.N} rows of q" if parents is not None else "")
                         + " (cu_nodes[b + 1] - cu_nodes[b] = nodes of request b)")
    pre = prefix_lens.detach().to("cpu", torch.int64)
    if bool((pre < 0).any()):
        raise ValueError(f"prefix_lens holds {pre.tolist()}; committed token counts must be >= 0")
    need = (pre + n + dims.block_size - 1) // dims.block_size
    if bool((need > dims.max_blocks).any()):
        b = int(torch.nonzero(need > dims.max_blocks)[0])
        raise ValueError(f"block_table has {dims.max_blocks} blocks per request but request {b} needs {int(need[b])} "
                         f"blocks of {dims.block_size} slots for its prefix_len {int(pre[b])} + {int(n[b])} nodes")
    bt = block_table.detach().to("cpu", torch.int64)
    bad = (torch.arange(dims.max_blocks)[None, :] < need[:, None]) & ((bt < 0) | (bt >= dims.num_blocks))
    if bool(bad.any()):
        b, j = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"block_table[{b}, {j}] = {int(bt[b, j])} is not a block of the cache "
                         f"(0..{dims.num_blocks - 1})")
    if parents is None:
        return n
    p = parents.detach().to("cpu", torch.int64)
    if p.ndim == 2 and bool((n > p.shape[1]).any()):
        raise ValueError(f"parents has T = {p.shape[1]} nodes per request but cu_nodes gives up to "
                         f"{int(n.max())}; widen the [B, T] rows or pack them [total_nodes]")
    for b in range(dims.B):
        seg = p[b, :int(n[b])] if p.ndim == 2 else p[int(cu[b]):int(cu[b + 1])]
        if seg.numel():
            validate_parents(seg, name=f"parents of request {b}", max_nodes=seg.numel())
    return n


def check_compact(k_cache, v_cache, block_table, prefix_lens, cu_nodes, accepted, accepted_len, *, values: bool):
    """Validate a compaction of the accepted paths; return (dims, accepted [B, A], accepted_len [B]).

    accepted [B, A]: request b's accepted window nodes, root first, increasing, in its first accepted_len[b]
    entries (the rest is ignored). ``values`` also checks the entries against cu_nodes and the block table (host
    syncs); without it (CUDA-graph capture) accepted and accepted_len must already be int32 on the cache's device.
    """
    dims = cache_dims(k_cache, v_cache, block_table, prefix_lens, cu_nodes)
    acc = accepted if isinstance(accepted, torch.Tensor) else torch.as_tensor(accepted)
    n_acc = accepted_len if isinstance(accepted_len, torch.Tensor) else torch.as_tensor(accepted_len)
    check_tensor("accepted", acc, k_cache.device, ref="k_cache")
    check_tensor("accepted_len", n_acc, k_cache.device, ref="k_cache")
    if acc.ndim != 2:
        raise ValueError(f"accepted has shape {tuple(acc.shape)}, expected [B, max_accepted] = [{dims.B}, A]")
    _check_int("accepted", acc, (dims.B, acc.shape[1]), f"[B, max_accepted] with B = {dims.B} from block_table")
    _check_int("accepted_len", n_acc, (dims.B,), f"[B] = [{dims.B}] accepted nodes per request")
    if not values:
        for name, x in (("accepted", acc), ("accepted_len", n_acc)):
            if x.dtype != INDEX_DTYPE:
                raise ValueError(f"{name} must be int32 inside CUDA-graph capture; convert it before capturing")
        return dims, acc, n_acc
    n = check_index_values(dims, block_table, prefix_lens, cu_nodes)
    a = acc.detach().to("cpu", torch.int64)
    m = n_acc.detach().to("cpu", torch.int64)
    if bool(((m < 0) | (m > a.shape[1]) | (m > n)).any()):
        raise ValueError(f"accepted_len holds {m.tolist()}; each must lie in 0..min(max_accepted = {a.shape[1]}, "
                         f"the request's nodes {n.tolist()})")
    for b in range(dims.B):
        path = a[b, :int(m[b])]
        if path.numel() and (int(path[0]) != 0 or bool((path[1:] <= path[:-1]).any()) or int(path[-1]) >= int(n[b])):
            raise ValueError(f"accepted[{b}, :{int(m[b])}] = {path.tolist()}: expected window nodes root first (0), "
                             f"increasing (DFS order along a path), below the request's {int(n[b])} nodes")
    return dims, acc.to(INDEX_DTYPE).contiguous(), n_acc.to(INDEX_DTYPE).contiguous()
