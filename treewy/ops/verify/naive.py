"""Readable torch references of tree verification: the closed form (``naive_tree_verify``), the step with a pending
commit flushed first (``naive_tree_step``, ``naive_flush``) and the path kernel's two halves written densely
(``path_tables_ref``, ``path_verify_ref``), so that its sparse path sums can be checked against an explicit
(I + M)^-1.

Same arguments, same order as the kernels (``tree_verify``; ``flush_pending``). They compute in q's dtype (fp64 in,
fp64 out): every other input is cast to it. Shapes (DESIGN.md section 3): q, k [B, T, H, K]; v [B, T, HV, V];
g, beta [B, T, HV]; initial_state [B, HV, V, K]; parents a DraftTree, [T] or [B, T]. Value head j reads key head
j // (HV // H). ``naive_tree_recurrent`` (``treewy.ops.store_all``) is the store-all truth all are tested against.
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_gdn_inputs
from treewy.ops.commit.naive import naive_tree_commit
from treewy.ops.gdn import path_cumsum, prepare
from treewy.ops.verify.pending import PendingCommit, unpack
from treewy.tree import ancestor_mask, path_depth


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
    dims, par, q, k, v, g, beta, S0 = prepare(q, k, v, g, beta, initial_state, parents, scale)
    M, R, G = tree_system(k, v, g, beta, S0, par)
    U = solve_forward(M, R)                                         # [B, HV, T, V]
    q, k = q.transpose(1, 2), k.transpose(1, 2)                     # [B, HV, T, K]
    incl = ancestor_mask(par, inclusive=True)[:, None]
    decay = torch.where(incl, G[..., :, None] - G[..., None, :], float("-inf")).exp()
    o = G.exp()[..., None] * (q @ S0.transpose(-1, -2)) + (decay * (q @ k.transpose(-1, -2))) @ U
    return o.transpose(1, 2), U.transpose(1, 2)


def naive_flush(state: torch.Tensor, pending: PendingCommit) -> torch.Tensor:
    """Reference of ``flush_pending``: a new tensor holding each request's accepted state (rows with accepted = -1
    unchanged)."""
    u, k, g, parents, accepted, use_qk_l2norm_in_kernel = unpack(pending)
    acc = torch.as_tensor(accepted, device=state.device).long()
    if acc.ndim != 1 or acc.shape[0] != state.shape[0]:
        raise ValueError(f"pending.accepted has shape {tuple(acc.shape)}, expected [B] = [{state.shape[0]}]")
    if use_qk_l2norm_in_kernel:
        k = k / (k.to(u.dtype).pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    S = naive_tree_commit(state, u, k, g, parents, acc.clamp(min=0))
    keep = (acc < 0)[:, None, None, None]
    return torch.where(keep, state.to(S.dtype), S)


def naive_tree_step(q, k, v, g, beta, state, parents, scale=None, pending: PendingCommit | None = None):
    """Reference of ``tree_verify(..., pending=...)``: flush the pending commit, then verify.

    Returns (o, u, state) where state is the flushed state the window was verified from (a new tensor).
    """
    if pending is not None:
        state = naive_flush(state, pending)
    o, u = naive_tree_verify(q, k, v, g, beta, state, parents, scale)
    return o, u, state


def _norm_scale(x, use_qk_l2norm_in_kernel):
    """1 / ||x|| per row (as the kernels normalize), or ones."""
    if not use_qk_l2norm_in_kernel:
        return torch.ones_like(x[..., 0])
    return 1.0 / (x.pow(2).sum(-1) + 1e-6).sqrt()


def path_tables_ref(q, k, g, beta, parents, scale=None, use_qk_l2norm_in_kernel=False):
    """The path kernel's tables, read off the dense inverse. ``path_verify_ref(..., *path_tables_ref(...))``
    equals ``naive_tree_verify``.

    Returns (anc [B, T, D] (a_0 = t, -1 past the root), x, w [B, HV, T, D], beta, ck = beta exp(G) / ||k||,
    cq = scale exp(G) / ||q|| [B, HV, T]) in fp64, D = depth + 1, from the dense matrices

    M[t, i] = beta_t exp(G_t - G_i) k^_t.k^_i (i a strict ancestor of t), P[t, i] = scale exp(G_t - G_i) q^_t.k^_i
    (i an ancestor of t or t), x_j(t) = (I + M)^-1 [t, a_j], w_j(t) = (P (I + M)^-1) [t, a_j]."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    dims, par = check_gdn_inputs(q, k, torch.zeros(B, T, HV, 1, dtype=q.dtype, device=q.device), g, beta,
                                 torch.zeros(B, HV, 1, K, dtype=q.dtype, device=q.device), parents, finite=False)
    par = par.expand(B, T).long() if par.ndim == 1 else par.long()
    q, k, g, beta = (x.double() for x in (q, k, g, beta))
    scale = K ** -0.5 if scale is None else scale
    rk, rq = _norm_scale(k, use_qk_l2norm_in_kernel), _norm_scale(q, use_qk_l2norm_in_kernel)   # [B, T, H]
    kh = (k * rk[..., None]).repeat_interleave(HV // H, dim=2).transpose(1, 2)                  # [B, HV, T, K]
    qh = (q * rq[..., None]).repeat_interleave(HV // H, dim=2).transpose(1, 2)
    G = path_cumsum(g, par).transpose(1, 2)                                                    # [B, HV, T]
    strict = ancestor_mask(par, inclusive=False)[:, None]                                      # [B, 1, T, T]
    incl = ancestor_mask(par, inclusive=True)[:, None]
    diff = G[..., :, None] - G[..., None, :]
    bt = beta.transpose(1, 2)                                                                  # [B, HV, T]
    M = bt[..., None] * torch.where(strict, diff, float("-inf")).exp() * (kh @ kh.transpose(-1, -2))
    P = scale * torch.where(incl, diff, float("-inf")).exp() * (qh @ kh.transpose(-1, -2))
    Minv = torch.linalg.inv(torch.eye(T, dtype=M.dtype, device=M.device) + M)
    D = int(path_depth(par).max()) + 1
    anc = torch.full((B, T, D), -1, dtype=torch.long, device=par.device)
    anc[..., 0] = torch.arange(T, device=par.device)
    for j in range(1, D):  # a_j = parent of a_{j-1}
        prev = anc[..., j - 1]
        anc[..., j] = torch.where(prev >= 0, torch.gather(par, 1, prev.clamp(min=0)), -1)
    idx = anc.clamp(min=0)[:, None].expand(B, HV, T, D)
    x = torch.where(anc[:, None] >= 0, torch.gather(Minv, 3, idx), 0.0)
    w = torch.where(anc[:, None] >= 0, torch.gather(P @ Minv, 3, idx), 0.0)
    eG = G.exp()
    ck = bt * eG * rk.repeat_interleave(HV // H, dim=2).transpose(1, 2)
    cq = scale * eG * rq.repeat_interleave(HV // H, dim=2).transpose(1, 2)
    return anc, x, w, bt, ck, cq


def path_verify_ref(q, k, v, state, anc, x, w, beta, ck, cq):
    """From the raw q, k (the normalization sits in ck, cq): Xk = K S^T, Xq = Q S^T, R = beta v - ck Xk, then
    u_t = sum_j x_j(t) R[a_j(t)] and o_t = cq_t Xq_t + sum_j w_j(t) R[a_j(t)]. Returns (o, u) [B, T, HV, V] fp64."""
    H, HV = q.shape[2], v.shape[2]
    kh = k.double().repeat_interleave(HV // H, dim=2).transpose(1, 2)                          # [B, HV, T, K]
    qh = q.double().repeat_interleave(HV // H, dim=2).transpose(1, 2)
    St = state.double().transpose(-1, -2)                                                     # [B, HV, K, V]
    R = beta[..., None] * v.double().transpose(1, 2) - ck[..., None] * (kh @ St)             # [B, HV, T, V]
    U = torch.zeros_like(R)
    O = cq[..., None] * (qh @ St)
    for j in range(anc.shape[-1]):
        a = anc[:, None, :, j].expand(*R.shape[:3])
        Ra = torch.where((a >= 0)[..., None], torch.gather(R, 2, a.clamp(min=0)[..., None].expand_as(R)), 0.0)
        U += x[..., j, None] * Ra
        O += w[..., j, None] * Ra
    return O.transpose(1, 2), U.transpose(1, 2)


def naive_stash_window(u, k, g, slots, pu, pk, pg) -> None:
    """Reference of ``stash_window_fwd`` (``stash.py``): request b's window u [T, HV, V], k [T, H, K], g [T, HV]
    into rows 0..T - 1 of slot slots[b] of the stash pools pu, pk, pg, in place, for every slot > 0."""
    T = u.shape[1]
    for b, s in enumerate(slots.tolist()):
        if s > 0:
            pu[s, :T], pk[s, :T], pg[s, :T] = u[b], k[b], g[b]
