"""Readable fp64 references of the tree-verify kernels, stage by stage.

The whole op's references are ``treewy.ops.naive_tree_verify`` (the closed form) and
``treewy.ops.naive_tree_step`` (the pending commit flushed, then verify); ``naive_tree_recurrent`` is the
store-all truth both are tested against. Here are the WY kernels' two stages with the kernels' arguments
in the kernels' order, so each stage is tested on its own:

- ``wy_prepare_ref``: what ``wy_prepare_kernel`` writes per (request, value head);
- ``wy_stream_ref``: what ``wy_stream_kernel`` computes from it and the (already folded) state.

``wy_stream_ref(..., *wy_prepare_ref(...))`` equals ``naive_tree_verify``.
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_gdn_inputs
from treewy.ops.naive import path_cumsum
from treewy.tree import ancestor_mask


def _norm_scale(x, use_qk_l2norm_in_kernel):
    """1 / ||x|| per row (as the kernels normalize), or ones."""
    if not use_qk_l2norm_in_kernel:
        return torch.ones_like(x[..., 0])
    return 1.0 / (x.pow(2).sum(-1) + 1e-6).sqrt()


def wy_prepare_ref(q, k, g, beta, parents, scale=None, use_qk_l2norm_in_kernel=False):
    """Stage 1, per request and value head: (Minv [B, HV, T, T] = (I + M)^-1, P [B, HV, T, T],
    beta [B, HV, T], ck = beta exp(G) / ||k||, cq = scale exp(G) / ||q||) in fp64.

    M[t, i] = beta_t exp(G_t - G_i) k^_t.k^_i for i a strict ancestor of t, P[t, i] = scale exp(G_t - G_i)
    q^_t.k^_i for i an ancestor of t or t itself (k^, q^ normalized when asked), 0 elsewhere."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    dims, par = check_gdn_inputs(q, k, torch.zeros(B, T, HV, 1, dtype=q.dtype, device=q.device), g, beta,
                                 torch.zeros(B, HV, 1, K, dtype=q.dtype, device=q.device), parents, finite=False)
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
    eG = G.exp()
    ck = bt * eG * rk.repeat_interleave(HV // H, dim=2).transpose(1, 2)
    cq = scale * eG * rq.repeat_interleave(HV // H, dim=2).transpose(1, 2)
    return Minv, P, bt, ck, cq


def wy_stream_ref(q, k, v, state, Minv, P, beta, ck, cq):
    """Stage 2 from the raw q, k (the normalization sits in ck, cq): Xk = K S^T, Xq = Q S^T,
    R = beta v - ck Xk, U = Minv R, O = cq Xq + P U. Returns (o, u) [B, T, HV, V] in fp64."""
    H, HV = q.shape[2], v.shape[2]
    kh = k.double().repeat_interleave(HV // H, dim=2).transpose(1, 2)                          # [B, HV, T, K]
    qh = q.double().repeat_interleave(HV // H, dim=2).transpose(1, 2)
    St = state.double().transpose(-1, -2)                                                     # [B, HV, K, V]
    R = beta[..., None] * v.double().transpose(1, 2) - ck[..., None] * (kh @ St)
    U = Minv @ R
    O = cq[..., None] * (qh @ St) + P @ U
    return O.transpose(1, 2), U.transpose(1, 2)


def unpack_prep(prep: torch.Tensor, B: int, HV: int, T: int):
    """The prepare kernel's output (flat, ``wy.prep_size(T)`` floats per request and head) as the tensors
    ``wy_prepare_ref`` returns: (Minv, P [B, HV, T, T], beta, ck, cq [B, HV, T])."""
    x = prep.view(B, HV, -1)
    TT = T * T
    return (x[..., :TT].view(B, HV, T, T), x[..., TT:2 * TT].view(B, HV, T, T), x[..., 2 * TT:2 * TT + T],
            x[..., 2 * TT + T:2 * TT + 2 * T], x[..., 2 * TT + 2 * T:])
