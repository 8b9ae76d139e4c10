"""Handles on the parts of a loaded transformers Qwen3.5 / Qwen3-Next model that the tree forward needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GDN_MODES = ("reconstruct", "store_all")



@dataclass
class HybridSpec:
    """Handles on the parts of a loaded model the tree forward needs, and its dimensions."""
    model: torch.nn.Module
    embed: torch.nn.Module
    layers: list
    kinds: list[str]          # "gdn" | "attn" per layer
    norm: torch.nn.Module
    lm_head: torch.nn.Module
    rotary: torch.nn.Module
    config: object
    H: int                    # GDN key heads
    HV: int                   # GDN value heads
    K: int
    V: int
    W: int                    # conv kernel width
    C: int                    # conv channels (2 * H * K + HV * V)
    Hq: int                   # attention query heads
    Hkv: int
    D: int                    # attention head dim

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "gdn"]

    @property
    def attn_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "attn"]

    @property
    def state_block_bytes(self) -> int:
        """Bytes of one fp32 GDN state block [HV, V, K] (one request, one layer)."""
        return self.HV * self.V * self.K * 4


def spec_of(model) -> HybridSpec:
    """The HybridSpec of a model returned by ``treewy.models.load`` (cached on the model)."""
    spec = getattr(model, "_treewy_spec", None)
    if spec is not None:
        return spec
    base = model.model
    cfg = model.config
    kinds = ["gdn" if t == "linear_attention" else "attn" for t in cfg.layer_types]
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    spec = HybridSpec(
        model=model, embed=base.embed_tokens, layers=list(base.layers), kinds=kinds, norm=base.norm,
        lm_head=model.lm_head, rotary=base.rotary_emb, config=cfg,
        H=cfg.linear_num_key_heads, HV=cfg.linear_num_value_heads, K=cfg.linear_key_head_dim,
        V=cfg.linear_value_head_dim, W=cfg.linear_conv_kernel_dim,
        C=2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        + cfg.linear_num_value_heads * cfg.linear_value_head_dim,
        Hq=cfg.num_attention_heads, Hkv=cfg.num_key_value_heads, D=D,
    )
    model._treewy_spec = spec
    return spec
