"""The reconstruct commit inside a serving engine's state pool: what the vLLM plugin runs, testable on CPU.

A request owns ONE pool slot per GDN layer (store-all owns 1 + k for a chain of k drafts). The slot
holds the state committed before the previous verify window and that window's stash: its
pseudo-values u, keys k, log decays g and length (a ``treewy.ops.PendingCommit`` kept in the pool).
A spec step is ONE kernel launch per layer: ``tree_verify_fwd(..., pending=, state_indices=)`` reads
each request's slot, folds the pending commit into the state in registers (the accepted node is
``num_accepted - 1``), writes the state back once and verifies the new window from it; then the new
window's u / k / g / length replace the stash (small copies, T x V per head). No host sync: the step
runs inside CUDA graphs.

Pools (per GDN layer; slots are the engine's block ids; slot 0 is vLLM's NULL block, used by padding
rows, whose state is read but never written):

    state   [slots, HV, V, K]       committed recurrent state (fp32 for Qwen3.5)
    u       [slots, T, HV, V] fp32  the pending window's pseudo-values
    k       [slots, T, H, K]  fp32  its raw keys (normalized in the kernel, as vLLM's kernels do)
    g       [slots, T, HV]    fp32  its log decays
    meta    [slots, 1]        int32 its length; 0 = nothing pending

Each tensor may be a strided view of a per-slot page (vLLM's layout: slot stride = page size), as
long as each slot's part is contiguous.

Windows arrive packed (varlen): tokens of request b are ``cu_seqlens[b]:cu_seqlens[b + 1]``; a
request may carry fewer than T tokens (fewer drafts). They are gathered to [B, T] and back with
fixed-size index tensors.

The conv1d in front of the layer is not here: vLLM's conv state already keeps a sliding window of
the last W - 1 + k inputs in one block and reads it at the accepted offset, so the plugin keeps
vLLM's conv path as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.ops.pending import PendingCommit


@dataclass
class ReconstructPools:
    """The per-layer pools of the reconstruct mode (shapes in the module docstring)."""

    state: torch.Tensor
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    meta: torch.Tensor

    @classmethod
    def empty(cls, slots: int, *, H: int, HV: int, K: int, V: int, max_nodes: int,
              state_dtype=torch.float32, device="cpu") -> ReconstructPools:
        shapes, dtypes = stash_layout(H=H, HV=HV, K=K, V=V, max_nodes=max_nodes)
        stash = [torch.zeros(slots, *s, dtype=d, device=device) for s, d in zip(shapes, dtypes)]
        return cls(torch.zeros(slots, HV, V, K, dtype=state_dtype, device=device), *stash)

    @property
    def max_nodes(self) -> int:
        return self.u.shape[1]


def stash_layout(*, H: int, HV: int, K: int, V: int, max_nodes: int):
    """(shapes, dtypes) per slot of the stash tensors u, k, g, meta: what the plugin appends to vLLM's page."""
    T = max_nodes
    return ((T, HV, V), (T, H, K), (T, HV), (1,)), (torch.float32, torch.float32, torch.float32, torch.int32)


def chain_parents(T: int, device) -> torch.Tensor:
    """int32 [T]: the chain -1, 0, ..., T - 2 (made on the device: legal inside CUDA-graph capture)."""
    return torch.arange(-1, T - 1, device=device, dtype=torch.int32)


def pack_index(cu_seqlens: torch.Tensor, B: int, T: int):
    """Gather / scatter indices between packed tokens and [B, T] windows.

    Returns (src [B, T] int64: the packed token of each window slot, 0 past the row's length;
    live [B, T] bool; lens [B] int32)."""
    cu = cu_seqlens[: B + 1].long()
    lens = cu[1:] - cu[:-1]
    t = torch.arange(T, device=cu.device)
    live = t[None] < lens[:, None]
    src = torch.where(live, cu[:-1, None] + t[None], torch.zeros_like(live, dtype=torch.long))
    return src, live, lens.to(torch.int32)


def unpack_index(cu_seqlens: torch.Tensor, B: int, N: int, T: int):
    """(row, col) [N] int64: the window slot of each of N packed tokens (no host sync). Tokens past
    ``cu_seqlens[B]`` (a CUDA graph replayed for more tokens than the step has: vLLM pads the token count, and
    its padding requests have no tokens) get some valid slot: their outputs are padding too."""
    cu = cu_seqlens[: B + 1].long()
    j = torch.arange(N, device=cu.device)
    row = torch.searchsorted(cu[1:], j, right=True).clamp(max=B - 1)
    return row, (j - cu[row]).clamp(min=0, max=T - 1)


def _windows(x: torch.Tensor, src: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """[N, ...] packed tokens -> contiguous [B, T, ...], zeros past each row's length."""
    out = x[src]
    return out * live.reshape(*live.shape, *([1] * (x.dim() - 1))).to(out.dtype)


def spec_step(pools: ReconstructPools, slots: torch.Tensor, num_accepted: torch.Tensor, q, k, v, g, beta,
              cu_seqlens: torch.Tensor, *, scale: float | None = None, use_qk_l2norm_in_kernel: bool = True,
              config=None) -> torch.Tensor:
    """o [N, HV, V]: TreeWY verify of every request's chain window, the pending commit folded in.

    slots int [B] (<= 0: a padding row); num_accepted int [B]: the previous window's accepted count
    (vLLM's ``num_accepted_tokens``; ignored where nothing is pending); q, k [N, H, K] and v
    [N, HV, V] packed by ``cu_seqlens`` [B + 1]; g (log decay), beta [N, HV]. ``config``: a
    ``triton.Config`` of the chain kernel to launch without autotuning (an engine's pool is too
    large to benchmark configs on: ``treewy.ops.tree_verify.chain.fixed_config``).
    """
    from treewy.ops.tree_verify import tree_verify_fwd

    B, T, N = slots.shape[0], pools.max_nodes, q.shape[0]
    src, live, lens = pack_index(cu_seqlens, B, T)
    slot = slots.long().clamp(min=0)
    real = slots > 0
    pending_len = pools.meta[slot, 0]
    accepted = torch.where(real & (pending_len > 0), num_accepted[:B].long() - 1, -1).to(torch.int32)
    parents = chain_parents(T, q.device)
    qw, kw, vw = (_windows(x, src, live) for x in (q, k, v))
    gw, bw = _windows(g.float(), src, live), _windows(beta.float(), src, live)
    pend = PendingCommit(pools.u, pools.k, pools.g, parents, accepted, use_qk_l2norm_in_kernel)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, u = tree_verify_fwd(qw, kw, vw, gw, bw, pools.state, parents, 0, scale, use_qk_l2norm_in_kernel,
                           num_nodes=lens, pending=pend, kernel="chain", config=config, chain=True,
                           state_indices=slot.to(torch.int32))
    pools.u[slot] = u
    pools.k[slot] = kw.to(pools.k.dtype)
    pools.g[slot] = gw
    pools.meta[slot, 0] = torch.where(real, lens, 0)
    row, col = unpack_index(cu_seqlens, B, N, T)
    return o[row, col]


def flush_slots(pools: ReconstructPools, slots: torch.Tensor, accepted: int = 0) -> None:
    """Commit the pending window of these slots now (node ``accepted``), leaving nothing pending.

    For rows that leave the spec path with a pending window (vLLM runs them through its prefill or
    plain-decode kernels, which read the slot's state directly). Eager only: it syncs with the host.
    """
    s = slots.long()
    s = s[s > 0]
    s = s[pools.meta[s, 0] > 0]
    if s.numel() == 0:
        return
    from treewy.ops.tree_commit import tree_commit_fwd

    acc = torch.full((s.numel(),), accepted, dtype=torch.int32, device=s.device)
    state = pools.state[s]
    tree_commit_fwd(state, pools.u[s], pools.k[s], pools.g[s], chain_parents(pools.max_nodes, s.device), 0, acc,
                    True)
    pools.state[s] = state
    pools.meta[s, 0] = 0


def reset_slots(pools: ReconstructPools, slots: torch.Tensor) -> None:
    """Forget the pending window of these slots (a prefill wrote their state from scratch)."""
    s = slots.long()
    pools.meta[s[s > 0], 0] = 0
