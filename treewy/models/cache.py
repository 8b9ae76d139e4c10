"""Per-request caches of the hybrid: attention KV (committed prefix) and GDN / conv states."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treewy.models.spec import HybridSpec


class KVCache:
    """Per-request key/value cache of one attention layer: k, v [B, Hkv, capacity, D], lens [B]."""

    def __init__(self, B: int, Hkv: int, capacity: int, D: int, dtype, device):
        self.k = torch.zeros(B, Hkv, capacity, D, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(B, dtype=torch.long, device=device)

    def past(self):
        """(k, v, valid [B, L]) over the longest committed prefix of the batch."""
        L = int(self.lens.max()) if self.lens.numel() else 0
        valid = torch.arange(L, device=self.k.device)[None] < self.lens[:, None]
        return self.k[:, :, :L], self.v[:, :, :L], valid

    def append(self, k_win: torch.Tensor, v_win: torch.Tensor, idx: torch.Tensor, count: torch.Tensor) -> None:
        """Write window nodes idx[b, :count[b]] (k_win, v_win [B, Hkv, T, D]) after each request's prefix."""
        n = idx.shape[1]
        take = (torch.arange(n, device=idx.device)[None] < count[:, None]) & (idx >= 0)
        b, i = take.nonzero(as_tuple=True)
        pos = self.lens[b] + i
        if pos.numel() and int(pos.max()) >= self.k.shape[2]:
            raise ValueError(f"KV cache full: capacity {self.k.shape[2]} positions; raise max_len")
        node = idx[b, i]
        self.k[b, :, pos] = k_win[b, :, node].to(self.k.dtype)
        self.v[b, :, pos] = v_win[b, :, node].to(self.v.dtype)
        self.lens += count


@dataclass
class HybridCache:
    """Everything a batch of requests keeps between steps.

    ssm[l]: [B, P, HV, V, K] fp32, the GDN state pool of GDN layer l; slot [B] says which of the P
    blocks is the committed state. reconstruct keeps P = 1; store_all keeps the P = T snapshots its
    verify wrote and commits by moving ``slot`` (no copy). conv[l]: [B, C, W - 1], oldest first.
    """
    ssm: dict = field(default_factory=dict)
    slot: torch.Tensor | None = None
    conv: dict = field(default_factory=dict)
    kv: dict = field(default_factory=dict)
    lens: torch.Tensor | None = None  # committed tokens per request [B]

    @classmethod
    def empty(cls, spec: HybridSpec, B: int, capacity: int, dtype, device) -> HybridCache:
        c = cls()
        for i in spec.gdn_layers:
            c.ssm[i] = torch.zeros(B, 1, spec.HV, spec.V, spec.K, dtype=torch.float32, device=device)
            c.conv[i] = torch.zeros(B, spec.C, spec.W - 1, dtype=dtype, device=device)
        for i in spec.attn_layers:
            c.kv[i] = KVCache(B, spec.Hkv, capacity, spec.D, dtype, device)
        c.slot = torch.zeros(B, dtype=torch.long, device=device)
        c.lens = torch.zeros(B, dtype=torch.long, device=device)
        return c

    def committed_state(self, layer: int) -> torch.Tensor:
        pool = self.ssm[layer]
        return pool[torch.arange(pool.shape[0], device=pool.device), self.slot]  # [B, HV, V, K]

    def gdn_state_bytes(self) -> int:
        """Bytes of GDN state blocks actually allocated per request, summed over GDN layers."""
        total = sum(t.numel() * t.element_size() for t in self.ssm.values())
        B = next(iter(self.ssm.values())).shape[0] if self.ssm else 1
        return total // B

    def conv_state_bytes(self) -> int:
        total = sum(t.numel() * t.element_size() for t in self.conv.values())
        B = next(iter(self.conv.values())).shape[0] if self.conv else 1
        return total // B
