"""Readable reference of the TreeWY commit: the accepted node's state rebuilt from S0 and the pseudo-values.

Same arguments, same order as ``tree_commit``; computes in u's dtype. Shapes: initial_state [B, HV, V, K];
u [B, T, HV, V] (from the verify); k [B, T, H, K]; g [B, T, HV]; parents a DraftTree, [T] or [B, T];
accepted int [B].
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_accepted, check_gdn_inputs
from treewy.ops.gdn import path_cumsum
from treewy.tree import ancestor_mask


def naive_tree_commit(initial_state, u, k, g, parents, accepted):
    """State of the accepted node a: exp(G_a) S0 + sum over the root..a path of exp(G_a - G_i) u_i k_i^T.

    initial_state [B, HV, V, K]; u [B, T, HV, V] from naive_tree_verify; k [B, T, H, K];
    g [B, T, HV]; accepted int [B]. Returns [B, HV, V, K] in u's dtype.
    """
    dt = u.dtype
    B, T, HV, V = u.shape
    K = k.shape[-1]
    dims, par = check_gdn_inputs(k, k, u, g, torch.zeros_like(g), initial_state, parents)
    a = check_accepted(accepted, B, T, u.device)
    ke = k.to(dt).repeat_interleave(HV // dims.H, dim=2)
    G = path_cumsum(g.to(dt), par)                                  # [B, T, HV]
    rows = torch.arange(B, device=u.device)
    on_path = ancestor_mask(par, inclusive=True)[rows, a]          # [B, T]
    Ga = G[rows, a]                                                 # [B, HV]
    w = torch.where(on_path[..., None], Ga[:, None] - G, float("-inf")).exp()  # exp(G_a - G_i) on the path
    S = Ga.exp()[..., None, None] * initial_state.to(dt)
    S = S + torch.einsum("bth,bthv,bthk->bhvk", w, u, ke)
    assert S.shape == (B, HV, V, K)
    return S
