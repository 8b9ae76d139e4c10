"""A deferred commit: the previous window's accepted node, applied inside the next verify.

After a verify, TreeWY needs only the window's pseudo-values u, keys k, log decays g, topology and
the accepted node to rebuild the accepted state (``tree_commit``). Instead of rebuilding it at once
(one state read and one state write in a separate launch), keep those tensors as a
``PendingCommit`` and pass it to the next ``tree_verify(..., pending=...)``: the kernel reads the
committed state once, rebuilds the accepted state in registers, writes it back once and verifies
the new window from it. ``flush_pending`` materializes a pending commit when the state is needed
now (the request finishes, is preempted, or its state is read by someone else).

accepted[b] = -1 means nothing is pending for request b (a new or idle slot): its state is left as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PendingCommit:
    """The previous window of a batch, enough to rebuild each request's accepted state.

    u [B, T, HV, V] fp32 (from ``tree_verify``); k [B, T, H, K] and g [B, T, HV] as given to it;
    parents [T] or [B, T] (a DraftTree or int tensor); accepted int [B], -1 = nothing pending.
    Keep these tensors alive and unchanged until the commit is applied: the next verify must write
    its own u into a new tensor.
    """
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    parents: object
    accepted: torch.Tensor
    use_qk_l2norm_in_kernel: bool = False


def naive_flush(state: torch.Tensor, pending: PendingCommit) -> torch.Tensor:
    """Reference: a new tensor holding each request's accepted state (rows with accepted = -1 unchanged)."""
    from treewy.ops.naive import naive_tree_commit

    acc = torch.as_tensor(pending.accepted, device=state.device).long()
    if acc.ndim != 1 or acc.shape[0] != state.shape[0]:
        raise ValueError(f"pending.accepted has shape {tuple(acc.shape)}, expected [B] = [{state.shape[0]}]")
    k = pending.k
    if pending.use_qk_l2norm_in_kernel:
        k = k / (k.to(pending.u.dtype).pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    S = naive_tree_commit(state, pending.u, k, pending.g, pending.parents, acc.clamp(min=0))
    keep = (acc < 0)[:, None, None, None]
    return torch.where(keep, state.to(S.dtype), S)


def naive_tree_step(q, k, v, g, beta, state, parents, pending: PendingCommit | None = None, scale=None):
    """Reference of ``tree_verify(..., pending=...)``: flush the pending commit, then verify.

    Returns (o, u, state) where state is the flushed state the window was verified from (a new tensor).
    """
    from treewy.ops.naive import naive_tree_verify

    if pending is not None:
        state = naive_flush(state, pending)
    o, u = naive_tree_verify(q, k, v, g, beta, state, parents, scale)
    return o, u, state


def flush_pending(state: torch.Tensor, pending: PendingCommit) -> torch.Tensor:
    """Apply a pending commit now, in place (kernel twin of ``naive_flush``); returns ``state``.

    Rows whose accepted node is -1 are left unchanged. Use it when the state must be materialized:
    the request finishes or is preempted, or someone else reads the state.
    """
    from treewy.ops.tree_commit import tree_commit

    return tree_commit(state, pending.u, pending.k, pending.g, pending.parents, pending.accepted,
                       use_qk_l2norm_in_kernel=pending.use_qk_l2norm_in_kernel, allow_none=True)
