"""A tree step's bookkeeping in a serving engine: positions, KV slots, the KV compaction, the conv state and the
pending fold of the accepted path. Pure torch over a ``treewy.serve.tree_spec.TreeLayout``: no host sync, shapes
fixed by the inputs, so all of it records into a CUDA graph.

The window of a request with ``num_computed`` committed tokens: node t (DFS order) has RoPE position
num_computed + depth(t) and writes its KV at the request's logical slot num_computed + t (consecutive, as vLLM
lays a window out). Once node a is accepted, the scheduler counts the first depth(a) + 1 of those slots as
committed, so the KV of a's root..a path moves from num_computed + path[j] to num_computed + j (``kv_compaction``;
the path's first node is the root, already in place, and so is any prefix of the DFS-first chain). The GDN conv
state becomes the last W - 1 inputs along root..a (a gather: ``commit_conv_state``), and the GDN state's commit
is deferred: the pool slot keeps the window's stash (u, k, g) and a's node index, which the next ``tree_verify``
folds in (``pending_commit``; ``treewy/ops/verify/pending.py``). For chains the plugin reads vLLM's
num_accepted_tokens instead (``treewy.serve.reconstruct``): a chain's node is its length - 1, a tree's is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.ops.verify.pending import PendingCommit
from treewy.serve.tree_spec import TreeAcceptance, TreeLayout


def _int_rows(name: str, x, B: int | None = None, ndim: int = 1):
    if not isinstance(x, torch.Tensor) or x.ndim != ndim or x.dtype.is_floating_point or x.dtype == torch.bool \
            or (B is not None and x.shape[0] != B):
        want = "[B]" if ndim == 1 else "[B, blocks]"
        raise ValueError(f"{name} must be an integer tensor {want}{'' if B is None else f' with B = {B}'}, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    return x


def window_positions(layout: TreeLayout, num_computed: torch.Tensor) -> torch.Tensor:
    """int64 [B, T]: the RoPE position of every window node, num_computed + depth (vLLM's runner writes
    num_computed + t: the plugin overwrites its positions buffer with these, after the slot mapping is built)."""
    _int_rows("num_computed", num_computed)
    return num_computed.long()[:, None] + layout.depth[None]


def slots_of(block_table: torch.Tensor, logical: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical KV slots of logical token indices: block_table[b, i // block_size] * block_size + i % block_size
    (vLLM's ``BlockTable.compute_slot_mapping``). block_table int [B, blocks], logical int64 [B, n] -> int64."""
    _int_rows("block_table", block_table, ndim=2)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size = {block_size!r}: expected the KV cache's block size, a positive integer")
    blocks = block_table.long().gather(1, (logical // block_size).clamp(max=block_table.shape[1] - 1))
    return blocks * block_size + logical % block_size


def window_slots(layout: TreeLayout, num_computed: torch.Tensor, block_table: torch.Tensor, block_size: int
                 ) -> torch.Tensor:
    """int64 [B, T]: where node t's KV is written, the slot of logical index num_computed + t (not + depth: siblings
    share a position but not a slot)."""
    _int_rows("num_computed", num_computed, block_table.shape[0] if isinstance(block_table, torch.Tensor) else None)
    t = torch.arange(layout.num_nodes, device=layout.device)
    return slots_of(block_table, num_computed.long()[:, None] + t[None], block_size)


def kv_compaction(layout: TreeLayout, acc: TreeAcceptance, num_computed: torch.Tensor, block_table: torch.Tensor,
                  block_size: int, live: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 [B, D + 1] physical slots: the accepted path's KV moves from num_computed + path[j] to
    num_computed + j, j < length. Past the length, and for rows with ``live`` False (CUDA-graph padding), src ==
    dst: a copy of a slot onto itself, so the copy needs no mask. No dst is another entry's dst, and a src that is
    some dst is read before it is written when the copy gathers first (``compact_kv``)."""
    B = acc.path.shape[0]
    _int_rows("num_computed", num_computed, B)
    j = torch.arange(layout.max_depth + 1, device=layout.device)[None]
    keep = j < acc.length[:, None]
    if live is not None:
        keep = keep & live[:, None]
    base = num_computed.long()[:, None]
    dst = slots_of(block_table, base + j, block_size)
    src = torch.where(keep, slots_of(block_table, base + acc.path.clamp(min=0), block_size), dst)
    return src, dst


def compact_kv(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, dim: int = 0) -> None:
    """In place: cache's slot dst[i] takes slot src[i] along ``dim`` (a layer's KV cache viewed with one slot axis,
    e.g. vLLM's [2, num_blocks, block_size, H, D] as [2, num_blocks * block_size, H, D] with dim = 1). Gathers
    every source before writing any destination."""
    s, d = src.reshape(-1), dst.reshape(-1)
    cache.index_copy_(dim, d, cache.index_select(dim, s))


def conv_rows(layout: TreeLayout, accepted: torch.Tensor) -> torch.Tensor:
    """int64 [B, W - 1]: the committed conv state's columns after node ``accepted``, as indices into the
    concatenation [old conv state (W - 1 columns, oldest first) | the window's conv inputs (T nodes)]: index i < W - 1
    is old column i, index W - 1 + t is node t's input."""
    return layout.conv_src[accepted.long()]


def commit_conv_state(conv_state: torch.Tensor, x: torch.Tensor, layout: TreeLayout, accepted: torch.Tensor
                      ) -> torch.Tensor:
    """The new conv state [B, C, W - 1]: the last W - 1 inputs on root..accepted (``treewy.ops.conv``'s
    tree_conv1d_commit, as one gather). conv_state [B, C, W - 1]; x [B, T, C] the window's conv inputs."""
    W1 = layout.conv_width - 1
    if not isinstance(conv_state, torch.Tensor) or conv_state.ndim != 3 or conv_state.shape[-1] != W1:
        raise ValueError(f"conv_state must be [B, C, W - 1] = [B, C, {W1}] (the layout's conv_width is "
                         f"{layout.conv_width}), got {tuple(getattr(conv_state, 'shape', ()))}")
    B, C = conv_state.shape[:2]
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != (B, layout.num_nodes, C):
        raise ValueError(f"x must be the window's conv inputs [B, T, C] = [{B}, {layout.num_nodes}, {C}], got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    both = torch.cat([conv_state, x.transpose(1, 2).to(conv_state.dtype)], -1)    # [B, C, W - 1 + T]
    idx = conv_rows(layout, _int_rows("accepted", accepted, B))
    return both.gather(2, idx[:, None, :].expand(B, C, W1))


def record_accepted(slot_accepted: torch.Tensor, slots: torch.Tensor, acc: TreeAcceptance,
                    live: torch.Tensor | None = None) -> None:
    """In place: slot_accepted[slots[b]] = request b's accepted node (int32 [pool slots], shared by all GDN layers
    of a KV-cache group, whose block ids are the same), for the next verify's fold. Rows with ``live`` False and
    slots <= 0 (vLLM's NULL block, padding rows) write into slot 0, which no request owns."""
    B = _int_rows("slots", slots).shape[0]
    s = slots.long().clamp(min=0)
    if live is not None:
        s = torch.where(live, s, 0)
    slot_accepted.index_put_((s,), acc.accepted.to(slot_accepted.dtype)[:B])


def reset_accepted(slot_accepted: torch.Tensor, slots: torch.Tensor) -> None:
    """In place: nothing pending in these slots (a prefill wrote their state, or the request left and its pending
    window was flushed)."""
    slot_accepted[_int_rows("slots", slots).long().clamp(min=0)] = -1


def pending_commit(u: torch.Tensor, k: torch.Tensor, g: torch.Tensor, layout: TreeLayout,
                   slot_accepted: torch.Tensor, slots: torch.Tensor, *, use_qk_l2norm_in_kernel: bool = True
                   ) -> PendingCommit:
    """The PendingCommit that ``tree_verify_fwd(..., pending=..., state_indices=slots)`` folds: the stash pools u
    [slots, T, HV, V], k [slots, T, H, K], g [slots, T, HV] read at each request's slot, the tree's parents per
    request [B, T] int32 and the accepted node per request (int32 [B]; -1 where nothing is pending and for slots
    <= 0, whose state is left as it is)."""
    B = _int_rows("slots", slots).shape[0]
    acc = slot_accepted[slots.long().clamp(min=0)].to(torch.int32)
    acc = torch.where(slots > 0, acc, -1)
    parents = layout.parents32[None].expand(B, -1)
    return PendingCommit(u, k, g, parents, acc, use_qk_l2norm_in_kernel)


@dataclass(frozen=True)
class CommitPlan:
    """What a step hands on after acceptance: kv_src / kv_dst [B, D + 1] (``kv_compaction``), conv_index
    [B, W - 1] (``conv_rows``), num_accepted [B] (tokens emitted, vLLM's num_accepted_tokens: the scheduler advances
    num_computed_tokens by it), num_computed [B] after the step, next_root [B] (the bonus)."""

    kv_src: torch.Tensor
    kv_dst: torch.Tensor
    conv_index: torch.Tensor
    num_accepted: torch.Tensor
    num_computed: torch.Tensor
    next_root: torch.Tensor


def plan_commit(layout: TreeLayout, acc: TreeAcceptance, num_computed: torch.Tensor, block_table: torch.Tensor,
                block_size: int, live: torch.Tensor | None = None) -> CommitPlan:
    """Everything ``acc`` moves, in one call (rows with ``live`` False move nothing and advance by 0)."""
    src, dst = kv_compaction(layout, acc, num_computed, block_table, block_size, live)
    n = acc.length if live is None else acc.length * live.long()
    return CommitPlan(src, dst, conv_rows(layout, acc.accepted), n, num_computed.long() + n, acc.bonus)
