"""Readable torch references for tree verification of the gated delta rule.

Same arguments, same order as the kernels. They compute in q's dtype (fp64 in, fp64 out):
every other input is cast to it. Shapes (DESIGN.md section 3): q, k [B, T, H, K];
v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, V, K]; parents a DraftTree,
[T] or [B, T]. Value head j reads key head j // (HV // H).
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_accepted, check_gdn_inputs
from treewy.tree import ancestor_mask


def _prepare(q, k, v, g, beta, initial_state, parents, scale):
    dims, par = check_gdn_inputs(q, k, v, g, beta, initial_state, parents)
    dt = q.dtype
    r = dims.HV // dims.H
    qe = q.to(dt).repeat_interleave(r, dim=2)  # [B, T, HV, K]
    ke = k.to(dt).repeat_interleave(r, dim=2)  # [B, T, HV, K]
    scale = dims.K ** -0.5 if scale is None else scale
    return dims, par, qe * scale, ke, v.to(dt), g.to(dt), beta.to(dt), initial_state.to(dt)


def path_cumsum(g: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """G[b, t, h] = sum of g over the root..t path (t included). g [B, T, HV], parents [B, T]."""
    G = torch.zeros_like(g)
    B = g.shape[0]
    rows = torch.arange(B, device=g.device)
    for t in range(g.shape[1]):
        par = parents[:, t]
        prev = torch.where((par >= 0)[:, None], G[rows, par.clamp(min=0)], torch.zeros_like(g[:, 0]))
        G[:, t] = prev + g[:, t]
    return G


def naive_tree_recurrent(q, k, v, g, beta, initial_state, parents, scale=None):
    """Store-all semantics: every node advances its parent's state. Returns (o [B, T, HV, V], states [B, T, HV, V, K])."""
    dims, par, q, k, v, g, beta, S0 = _prepare(q, k, v, g, beta, initial_state, parents, scale)
    B, T = dims.B, dims.T
    rows = torch.arange(B, device=q.device)
    states = q.new_empty(B, T, dims.HV, dims.V, dims.K)
    o = q.new_empty(B, T, dims.HV, dims.V)
    for t in range(T):
        p = par[:, t]
        S = torch.where((p >= 0)[:, None, None, None], states[rows, p.clamp(min=0)], S0)  # [B, HV, V, K]
        kt, vt, qt = k[:, t], v[:, t], q[:, t]                                         # [B, HV, K|V]
        alpha, b = g[:, t].exp()[..., None, None], beta[:, t][..., None]
        S = alpha * S                                                   # decay
        u = b * (vt - (S @ kt[..., None]).squeeze(-1))                  # delta-rule write (pseudo-value)
        S = S + u[..., None] * kt[..., None, :]                         # S += u k^T
        states[:, t] = S
        o[:, t] = (S @ qt[..., None]).squeeze(-1)
    return o, states


def naive_tree_verify(q, k, v, g, beta, initial_state, parents, scale=None):
    """TreeWY closed form: one triangular solve per request and head. Returns (o [B, T, HV, V], u [B, T, HV, V])."""
    dims, par, q, k, v, g, beta, S0 = _prepare(q, k, v, g, beta, initial_state, parents, scale)
    G = path_cumsum(g, par).transpose(1, 2)                         # [B, HV, T]
    q, k, v, beta = (x.transpose(1, 2) for x in (q, k, v, beta))   # [B, HV, T, *]
    strict = ancestor_mask(par, inclusive=False)[:, None]           # [B, 1, T, T]
    incl = ancestor_mask(par, inclusive=True)[:, None]
    diff = G[..., :, None] - G[..., None, :]                        # G_t - G_i
    decay_strict = torch.where(strict, diff, float("-inf")).exp()  # mask before exp
    decay_incl = torch.where(incl, diff, float("-inf")).exp()
    A = decay_strict * (k @ k.transpose(-1, -2))                    # [B, HV, T, T]
    S0k = k @ S0.transpose(-1, -2)                                  # (S0 k_t)^T  [B, HV, T, V]
    R = beta[..., None] * (v - G.exp()[..., None] * S0k)
    U = torch.empty_like(R)
    for t in range(dims.T):                                         # forward substitution
        U[..., t, :] = R[..., t, :] - beta[..., t, None] * (A[..., t, :t, None] * U[..., :t, :]).sum(-2)
    o = G.exp()[..., None] * (q @ S0.transpose(-1, -2)) + (decay_incl * (q @ k.transpose(-1, -2))) @ U
    return o.transpose(1, 2), U.transpose(1, 2)


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
