"""The GDN layer's input transforms, shared by the engine and the vLLM plugin's core."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gating(A_log, a, b, dt_bias, softplus_threshold: float = 20.0, dtype=torch.float32):
    """(g, beta) from the layer's raw gates, as transformers and vLLM's fused_sigmoid_gating compute them:
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); all in fp32 (``dtype``: fp64 for a reference)."""
    x = a.to(dtype) + dt_bias.to(dtype)
    g = -torch.exp(A_log.to(dtype)) * F.softplus(x, beta=1.0, threshold=softplus_threshold)
    return g, torch.sigmoid(b.to(dtype))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in fp32 (fla's l2norm, as vLLM's kernels apply it)."""
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)
