"""Readable references of tree attention over a paged KV cache, and of the compaction of the accepted path's K/V.

Same arguments, same order as the kernels (``kernel.py``); compute in q's dtype (pass fp64 for the reference of
record). Shapes: q [total_nodes, Hq, D], the window nodes of all requests packed (request b's at rows
cu_nodes[b]..cu_nodes[b + 1] - 1, in topological order); k_cache, v_cache [num_blocks, block_size, Hkv, D];
block_table [B, max_blocks]; prefix_lens [B] committed tokens; cu_nodes [B + 1]; parents packed [total_nodes] or
[B, T], window-local, -1 for the root. Token i of request b (the committed prefix, then the window: node j at
i = prefix_lens[b] + j) lives in slot i % block_size of block block_table[b, i // block_size].
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_finite, check_scale
from treewy.ops.attention.checks import check_compact, check_index_values, check_parents_layout, paged_dims
from treewy.tree import ancestor_mask


def _check(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents):
    dims = paged_dims(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes)
    par = check_parents_layout(parents, dims, q.device)
    check_index_values(dims, block_table, prefix_lens, cu_nodes, par)
    check_finite(q=q)
    return dims, par


def _requests(dims, block_table, prefix_lens, cu_nodes, parents):
    """Per request: (its rows of q, its token slots (block, offset) for prefix + window, prefix length, parents)."""
    cu, pre = cu_nodes.tolist(), prefix_lens.tolist()
    for b in range(dims.B):
        n, P = cu[b + 1] - cu[b], pre[b]
        pos = torch.arange(P + n, device=block_table.device)
        slots = (block_table[b, pos // dims.block_size].long(), pos % dims.block_size)
        par = parents[b, :n] if parents.ndim == 2 else parents[cu[b]:cu[b + 1]]
        yield slice(cu[b], cu[b + 1]), slots, P, par.long()


def _attend(q, k, v, mask, scale):
    """Masked softmax attention of q [n, Hq, D] over k, v [L, Hkv, D] (mask [n, L]): (o [n, Hq, D], lse [n, Hq]).
    A row that sees nothing gets o = 0 and lse = -inf (what the merge needs of an empty prefix)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # [L, Hq, D], head h reads h // group
    s = torch.einsum("nhd,lhd->hnl", q, k) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                               # [Hq, n]
    p = torch.where(torch.isfinite(lse)[..., None], (s - lse[..., None]).exp(), 0.0)
    return torch.einsum("hnl,lhd->nhd", p, v), lse.transpose(0, 1)


def _per_request(attend, q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale):
    """(o, lse) of ``attend(q_rows, k, v, P, parents, scale)`` run per request over its prefix + window K/V (the
    window's own K/V at rows P:), in q's dtype; rows of empty requests and past cu_nodes[B] are o = 0, lse = -inf."""
    dims, par = _check(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents)
    scale = check_scale(scale, dims.D)
    o = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=q.dtype, device=q.device)
    for rows, slots, P, p in _requests(dims, block_table, prefix_lens, cu_nodes, par):
        if p.numel():
            o[rows], lse[rows] = attend(q[rows], k_cache[slots].to(q.dtype), v_cache[slots].to(q.dtype), P, p, scale)
    return o, lse


def _masked(q, k, v, P, p, scale):
    """One softmax over the prefix (all visible) and the window (ancestors-or-self)."""
    mask = torch.cat([torch.ones(p.numel(), P, dtype=torch.bool, device=q.device), ancestor_mask(p)], dim=1)
    return _attend(q, k, v, mask, scale)


def _merged(q, k, v, P, p, scale):
    """The prefix unmasked and the window under the ancestor mask apart, then merged by log-sum-exp."""
    o_p, lse_p = _attend(q, k[:P], v[:P], torch.ones(p.numel(), P, dtype=torch.bool, device=q.device), scale)
    o_w, lse_w = _attend(q, k[P:], v[P:], ancestor_mask(p), scale)
    return merge_attention_states(o_p, lse_p, o_w, lse_w)


def naive_tree_attention(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale=None,
                         return_lse=False):
    """Each window node attends to its request's committed prefix and to its own ancestors in the window, itself
    included: one softmax over prefix + window under that mask. Returns o [total_nodes, Hq, D] in q's dtype (rows past
    cu_nodes[B] are 0), and with ``return_lse`` also the log-sum-exp of the scaled scores [total_nodes, Hq]."""
    o, lse = _per_request(_masked, q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale)
    return (o, lse) if return_lse else o


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """Attention over the union of two disjoint key sets from each set's (o, lse): lse = log(e^lse_a + e^lse_b) and
    o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b. o [..., Hq, D], lse [..., Hq]; a set a row cannot see has
    lse = -inf and weighs 0."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a, w_b = (lse_a - lse).exp(), (lse_b - lse).exp()
    return w_a[..., None] * o_a + w_b[..., None] * o_b, lse


def naive_tree_attention_merged(q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale=None,
                                return_lse=False):
    """The same attention in two parts merged by log-sum-exp: the prefix with no mask (what a paged attention
    backend computes for a query that sees the whole context), the window among itself under the inclusive
    ancestor mask, then ``merge_attention_states``. Equal to ``naive_tree_attention`` up to rounding."""
    o, lse = _per_request(_merged, q, k_cache, v_cache, block_table, prefix_lens, cu_nodes, parents, scale)
    return (o, lse) if return_lse else o


def naive_compact_accepted_kv(k_cache, v_cache, block_table, prefix_lens, cu_nodes, accepted, accepted_len):
    """The accepted path's K/V moved to consecutive slots: request b's window node accepted[b, i] (window-local, root
    first, increasing) goes to token prefix_lens[b] + i, for i < accepted_len[b]. Returns new caches (copies of the
    inputs with those slots written); every other slot is unchanged. The sources are read before anything is
    written, so this reference holds whatever the order of the path."""
    dims, acc, n_acc = check_compact(k_cache, v_cache, block_table, prefix_lens, cu_nodes, accepted, accepted_len,
                                     values=True)
    k_out, v_out = k_cache.clone(), v_cache.clone()
    bs = dims.block_size
    for b in range(dims.B):
        P, m = int(prefix_lens[b]), int(n_acc[b])
        src = P + acc[b, :m].long()
        dst = P + torch.arange(m, device=k_cache.device)
        src_slots = (block_table[b, src // bs].long(), src % bs)
        dst_slots = (block_table[b, dst // bs].long(), dst % bs)
        k_out[dst_slots] = k_cache[src_slots]
        v_out[dst_slots] = v_cache[src_slots]
    return k_out, v_out
