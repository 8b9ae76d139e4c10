"""Readable fp64 references of the path kernel's two halves.

The whole op's references are ``treewy.ops.naive_tree_verify`` (the closed form) and
``treewy.ops.naive_tree_step`` (the pending commit flushed, then verify); ``naive_tree_recurrent`` is the
store-all truth both are tested against. Here the path kernel's math is written densely, so that its sparse
path sums can be checked against an explicit (I + M)^-1:

- ``path_tables_ref``: each node's ancestors a_j and the entries x_j = (I + M)^-1 [t, a_j] and
  w_j = (P (I + M)^-1) [t, a_j] the kernel builds along each path (here read off the dense inverse);
- ``path_verify_ref``: u_t = sum_j x_j R[a_j] and o_t = cq Xq_t + sum_j w_j R[a_j] from those tables.

``path_verify_ref(..., *path_tables_ref(...))`` equals ``naive_tree_verify``.
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_gdn_inputs
from treewy.ops.naive import path_cumsum
from treewy.tree import ancestor_mask, path_depth


def _norm_scale(x, use_qk_l2norm_in_kernel):
    """1 / ||x|| per row (as the kernels normalize), or ones."""
    if not use_qk_l2norm_in_kernel:
        return torch.ones_like(x[..., 0])
    return 1.0 / (x.pow(2).sum(-1) + 1e-6).sqrt()


def path_tables_ref(q, k, g, beta, parents, scale=None, use_qk_l2norm_in_kernel=False):
    """(anc [B, T, D] (a_0 = t, -1 past the root), x, w [B, HV, T, D], beta, ck = beta exp(G) / ||k||,
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
