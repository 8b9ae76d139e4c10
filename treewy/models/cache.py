"""Per-request caches of the hybrid: attention KV (committed prefix) and GDN / conv states."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treewy.models.spec import HybridSpec


class KVCache:
    """Per-request key/value cache of one attention layer: k, v [B, Hkv, capacity, D], lens [B].

    One position past ``capacity`` is a scratch slot that ``append`` writes its unused window
    entries to (never read), so appending needs no host sync.
    """

    def __init__(self, B: int, Hkv: int, capacity: int, D: int, dtype, device):
        self.capacity = capacity
        self.k = torch.zeros(B, Hkv, capacity + 1, D, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(B, dtype=torch.long, device=device)

    def past(self, L: int | None = None):
        """(k, v, valid [B, L]) over the first L positions; L defaults to the longest committed prefix
        (a host sync: callers that know it pass it)."""
        if L is None:
            L = int(self.lens.max()) if self.lens.numel() else 0
        valid = torch.arange(L, device=self.k.device)[None] < self.lens[:, None]
        return self.k[:, :, :L], self.v[:, :, :L], valid

    def append(self, k_win: torch.Tensor, v_win: torch.Tensor, idx: torch.Tensor, count: torch.Tensor) -> None:
        """Write window nodes idx[b, :count[b]] (k_win, v_win [B, Hkv, T, D]) after each request's prefix.

        The caller keeps every prefix within ``capacity`` (positions past it land in the scratch slot).
        """
        B, n = idx.shape
        i = torch.arange(n, device=idx.device)[None]
        take = (i < count[:, None]) & (idx >= 0)
        pos = torch.where(take, self.lens[:, None] + i, self.capacity).clamp(max=self.capacity)
        b = torch.arange(B, device=idx.device)[:, None].expand(B, n)
        node = idx.clamp(min=0)
        self.k[b, :, pos] = k_win[b, :, node].to(self.k.dtype)
        self.v[b, :, pos] = v_win[b, :, node].to(self.v.dtype)
        self.lens += count


@dataclass
class HybridCache:
    """Everything a batch of requests keeps between steps.

    ssm[l]: [B, P, HV, V, K] fp32, the GDN state pool of GDN layer l; slot [B] says which of the P
    blocks is the committed state. reconstruct keeps P = 1; store_all keeps the P = T snapshots its
    verify wrote and commits by moving ``slot`` (no copy). conv[l]: [B, C, W - 1], oldest first.
    pending[l]: reconstruct's deferred commit (a PendingCommit of the last window), applied to ssm[l]
    by the next verify, or by ``flush`` (``flush_op``) before anyone else reads the state.
    """
    ssm: dict = field(default_factory=dict)
    slot: torch.Tensor | None = None
    conv: dict = field(default_factory=dict)
    kv: dict = field(default_factory=dict)
    lens: torch.Tensor | None = None  # committed tokens per request [B]
    pending: dict = field(default_factory=dict)
    flush_op: object = None           # (state, pending) -> state, in place

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

    def state_view(self, layer: int) -> torch.Tensor:
        """The single state block [B, HV, V, K] of a reconstruct pool (a view: ops write it in place)."""
        return self.ssm[layer][:, 0]

    def defer(self, layer: int, pending, flush_op) -> None:
        """Record a layer's commit for the next verify (reconstruct); ``flush_op`` applies it on demand."""
        self.pending[layer] = pending
        self.flush_op = flush_op

    def flush(self, layer: int | None = None) -> None:
        """Apply the pending commit of one layer (all layers if None) to its state now."""
        for i in [layer] if layer is not None else list(self.pending):
            pending = self.pending.pop(i, None)
            if pending is not None:
                self.flush_op(self.state_view(i), pending)

    def committed_state(self, layer: int) -> torch.Tensor:
        """[B, HV, V, K]: the committed state (pending commit applied first); a view when P = 1."""
        self.flush(layer)
        pool = self.ssm[layer]
        if pool.shape[1] == 1:
            return self.state_view(layer)
        return pool[torch.arange(pool.shape[0], device=pool.device), self.slot]

    def gdn_state_bytes(self) -> int:
        """Bytes of GDN state blocks actually allocated per request, summed over GDN layers."""
        return _bytes_per_request(self.ssm)

    def conv_state_bytes(self) -> int:
        return _bytes_per_request(self.conv)


def _bytes_per_request(tensors: dict) -> int:
    """Bytes allocated in {layer: [B, ...] tensor} divided by the batch B."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    B = next(iter(tensors.values())).shape[0] if tensors else 1
    return total // B
