"""The gated delta rule's pieces every op's reference builds on: the input preparation shared by the verify and
store-all references, one recurrent step (``gdn_step``, and as the paper writes it) and the path cumsum of the
log decays.

Shapes (DESIGN.md section 3): q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state
[B, HV, V, K]; parents a DraftTree, [T] or [B, T]. Value head j reads key head j // (HV // H).
"""

from __future__ import annotations

import torch

from treewy.ops.checks import check_gdn_inputs, check_scale


def prepare(q, k, v, g, beta, initial_state, parents, scale):
    """Validated inputs in q's dtype, keys and queries repeated per value head, the queries scaled:
    (dims, parents [B, T], q, k [B, T, HV, K], v, g, beta, initial_state)."""
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
