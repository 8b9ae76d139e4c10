"""Readable reference of the store-all baseline: every node advances its parent's state by the recurrence and
keeps a snapshot. It is the truth the TreeWY references and kernels are tested against.

Same arguments, same order as ``store_all_verify``; computes in q's dtype (fp64 in, fp64 out). Shapes: q, k
[B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, V, K]; parents a DraftTree, [T] or [B, T].
"""

from __future__ import annotations

import torch

from treewy.ops.gdn import gdn_step, prepare


def naive_tree_recurrent(q, k, v, g, beta, initial_state, parents, scale=None):
    """Store-all semantics: every node advances its parent's state.
    Returns (o [B, T, HV, V], states [B, T, HV, V, K])."""
    dims, par, q, k, v, g, beta, S0 = prepare(q, k, v, g, beta, initial_state, parents, scale)
    rows = torch.arange(dims.B, device=q.device)
    states = q.new_empty(dims.B, dims.T, dims.HV, dims.V, dims.K)
    for t in range(dims.T):
        p = par[:, t]
        S = torch.where((p >= 0)[:, None, None, None], states[rows, p.clamp(min=0)], S0)  # parent's state
        states[:, t], _ = gdn_step(S, k[:, t], v[:, t], g[:, t], beta[:, t])
    o = (states @ q[..., None]).squeeze(-1)                             # o_t = S_t (scale q_t)
    return o, states
