"""Readable torch references for tree verification of the gated delta rule.

Same arguments, same order as the kernels. They compute in q's dtype (fp64 in, fp64 out):
every other input is cast to it. Shapes (DESIGN.md section 3): q, k [B, T, H, K];
v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, V, K]; parents a DraftTree,
[T] or [B, T]. Value head j reads key head j // (HV // H).
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_accepted, check_gdn_inputs, check_scale
from treewy.tree import ancestor_mask


def _prepare(q, k, v, g, beta, initial_state, parents, scale):
    dims, par = check_gdn_inputs(q, k, v, g, beta, initial_state, parents)
    dt = q.dtype
    r = dims.HV // dims.H
    qe = q.to(dt).repeat_interleave(r, dim=2)  # [B, T, HV, K]
    ke = k.to(dt).repeat_interleave(r, dim=2)  # [B, T, HV, K]
    scale = check_scale(scale, dims.K)
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


def gdn_step(S, k, v, g, beta):
    """One gated delta rule step in pseudo-value form: S' = alpha S + u k^T, u = beta (v - alpha S k).

    S [..., V, K]; k [..., K]; v [..., V]; g, beta [...]. Returns (S' [..., V, K], u [..., V]).
    Equal to alpha S (I - beta k k^T) + beta v k^T.
    """
    S = g.exp()[..., None, None] * S                                  # decay
    u = beta[..., None] * (v - (S @ k[..., None]).squeeze(-1))          # delta-rule write
    return S + u[..., None] * k[..., None, :], u


def gdn_step_textbook(S, k, v, g, beta):
    """The same step as written in the Gated DeltaNet paper: alpha S (I - beta k k^T) + beta v k^T."""
    eye = torch.eye(k.shape[-1], dtype=S.dtype, device=S.device)
    alpha, b = g.exp()[..., None, None], beta[..., None, None]
    return alpha * S @ (eye - b * k[..., :, None] * k[..., None, :]) + b * v[..., :, None] * k[..., None, :]


def naive_tree_recurrent(q, k, v, g, beta, initial_state, parents, scale=None):
    """Store-all semantics: every node advances its parent's state.
    Returns (o [B, T, HV, V], states [B, T, HV, V, K])."""
    dims, par, q, k, v, g, beta, S0 = _prepare(q, k, v, g, beta, initial_state, parents, scale)
    rows = torch.arange(dims.B, device=q.device)
    states = q.new_empty(dims.B, dims.T, dims.HV, dims.V, dims.K)
    for t in range(dims.T):
        p = par[:, t]
        S = torch.where((p >= 0)[:, None, None, None], states[rows, p.clamp(min=0)], S0)  # parent's state
        states[:, t], _ = gdn_step(S, k[:, t], v[:, t], g[:, t], beta[:, t])
    o = (states @ q[..., None]).squeeze(-1)                             # o_t = S_t (scale q_t)
    return o, states


def tree_system(k, v, g, beta, initial_state, parents):
    """The triangular system of one verify window, per request and value head (inputs already prepared).

    Returns (M, R, G): M = diag(beta) A [B, HV, T, T] with A[t, i] = exp(G_t - G_i) k_t.k_i for strict
    ancestors i of t (else 0), R [B, HV, T, V] = beta_t (v_t - exp(G_t) S0 k_t), G [B, HV, T] the path
    cumsum of g. The pseudo-values solve (I + M) U = R.
    """
    G = path_cumsum(g, parents).transpose(1, 2)                     # [B, HV, T]
    k, v, beta = (x.transpose(1, 2) for x in (k, v, beta))          # [B, HV, T, *]
    strict = ancestor_mask(parents, inclusive=False)[:, None]       # [B, 1, T, T]
    decay = torch.where(strict, G[..., :, None] - G[..., None, :], float("-inf")).exp()  # mask before exp
    M = beta[..., None] * decay * (k @ k.transpose(-1, -2))
    S0k = k @ initial_state.transpose(-1, -2)                       # (S0 k_t)^T  [B, HV, T, V]
    R = beta[..., None] * (v - G.exp()[..., None] * S0k)
    return M, R, G


def solve_forward(M, R):
    """U with (I + M) U = R for strictly lower-triangular M, one row at a time."""
    U = torch.empty_like(R)
    for t in range(R.shape[-2]):
        U[..., t, :] = R[..., t, :] - (M[..., t, :t, None] * U[..., :t, :]).sum(-2)
    return U


def solve_neumann(M, R, depth: int):
    """The same U by the finite Neumann series in Horner form: M^(depth+1) = 0 for a tree of that depth,
    so U = R - M(R - M(R - ...)) with ``depth`` products."""
    U = R
    for _ in range(depth):
        U = R - M @ U
    return U


def naive_tree_verify(q, k, v, g, beta, initial_state, parents, scale=None):
    """TreeWY closed form: one triangular solve per request and head. Returns (o [B, T, HV, V], u [B, T, HV, V])."""
    dims, par, q, k, v, g, beta, S0 = _prepare(q, k, v, g, beta, initial_state, parents, scale)
    M, R, G = tree_system(k, v, g, beta, S0, par)
    U = solve_forward(M, R)                                         # [B, HV, T, V]
    q, k = q.transpose(1, 2), k.transpose(1, 2)                     # [B, HV, T, K]
    incl = ancestor_mask(par, inclusive=True)[:, None]
    decay = torch.where(incl, G[..., :, None] - G[..., None, :], float("-inf")).exp()
    o = G.exp()[..., None] * (q @ S0.transpose(-1, -2)) + (decay * (q @ k.transpose(-1, -2))) @ U
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
