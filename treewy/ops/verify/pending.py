"""A deferred commit: the previous window's accepted node, applied inside the next verify.

After a verify, TreeWY needs only the window's pseudo-values u, keys k, log decays g, topology and
the accepted node to rebuild the accepted state (``tree_commit``). Instead of rebuilding it at once
(one state read and one state write in a separate launch), keep those tensors as a
``PendingCommit`` and pass it to the next ``tree_verify(..., pending=...)``: the kernel reads the
committed state once, rebuilds the accepted state in registers, writes it back once and verifies
the new window from it. ``flush_pending`` (``treewy.ops.verify.kernel``) materializes a pending commit when the
state is needed now (the request finishes, is preempted, or its state is read by someone else).

accepted[b] = -1 means nothing is pending for request b (a new or idle slot): its state is left as is.
A leaf: the type and its one unpacking, importing nothing of the package.
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


def unpack(pending: PendingCommit) -> tuple:
    """(u, k, g, parents, accepted, use_qk_l2norm_in_kernel): the commit's arguments after the state, in the order
    ``tree_commit`` and ``naive_tree_commit`` take them. Every consumer of a PendingCommit reads it through here."""
    return pending.u, pending.k, pending.g, pending.parents, pending.accepted, pending.use_qk_l2norm_in_kernel
