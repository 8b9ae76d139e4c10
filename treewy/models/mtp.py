"""Qwen3.5's multi-token-prediction (MTP) module, in the checkpoint's own layout (``mtp.*``).

An MTP entry for position i + 1 combines the target's hidden state h_i (after the final norm) with
the embedding of token x_{i+1}: ``fc([pre_fc_norm_embedding(embed(x_{i+1})), pre_fc_norm_hidden(h_i)])``,
one full-attention decoder layer, ``norm``; the shared lm_head then predicts x_{i+2}. Deeper drafts
feed the entry's own output back in place of h.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from treewy.models.spec import HybridSpec
from treewy.models.layers import attn_window, mlp, rope


class MTP(nn.Module):
    """mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.{i}, mtp.norm."""

    def __init__(self, config, decoder_cls, norm_cls, num_layers: int = 1):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        cfg = copy.deepcopy(config)
        cfg.layer_types = ["full_attention"] * max(num_layers, len(config.layer_types))
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = norm_cls(h, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(h, eps=eps)
        self.layers = nn.ModuleList([decoder_cls(cfg, i) for i in range(num_layers)])
        self.norm = norm_cls(h, eps=eps)


def mtp_of(model) -> MTP | None:
    return getattr(model, "mtp", None)


def mtp_forward(spec: HybridSpec, mtp: MTP, tokens: torch.Tensor, hidden: torch.Tensor,
                positions: torch.Tensor, past=None, win_mask=None, layer: int = 0):
    """Entries for tokens [B, T] with the hidden states [B, T, hidden] they pair with.

    Returns (out [B, T, hidden] after mtp.norm, k, v [B, Hkv, T, D] of the window).
    """
    e = mtp.pre_fc_norm_embedding(spec.embed(tokens))
    x = mtp.fc(torch.cat([e, mtp.pre_fc_norm_hidden(hidden.to(e.dtype))], dim=-1))
    dec = mtp.layers[layer]
    cos, sin = rope(spec, x, positions)
    r = x
    a, k, v = attn_window(dec.self_attn, dec.input_layernorm(x), cos, sin, past, win_mask)
    x = r + a
    x = x + mlp(dec, dec.post_attention_layernorm(x))
    return mtp.norm(x), k, v
