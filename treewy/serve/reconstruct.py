"""The reconstruct commit inside a serving engine's state pool: what the vLLM plugin runs, testable on CPU.

A request owns ONE pool slot per GDN layer (store-all owns 1 + k for a chain of k drafts). The slot
holds the state committed before the previous verify window and that window's stash: its
pseudo-values u, keys k, log decays g and length (a ``treewy.ops.PendingCommit`` kept in the pool).
A spec step is ONE kernel launch per layer and nothing else (``spec_step`` / ``spec_step_gated``:
``treewy.ops.verify.chain.chain_spec_step_kernel``): it reads the packed window and (gated) the
layer's raw gates, reads each request's slot, folds the pending commit into the state in registers
(the accepted node is ``num_accepted - 1``), writes the state back once, verifies the new window from
it and writes the new window's u / k / g / length into the stash. No host sync: the step runs inside
CUDA graphs. ``flush_slots`` is the same launch without a window. Each has a loop twin (``naive_*``).

Pools (per GDN layer; slots are the engine's block ids; slot 0 is vLLM's NULL block, used by padding
rows, whose state is read but never written):

    state   [slots, HV, V, K]       committed recurrent state (fp32 for Qwen3.5)
    u       [slots, T, HV, V]    fp32  the pending window's pseudo-values
    k       [slots, 2, T, H, K]  bf16  its raw keys as they arrived (the model's dtype: fp32 in an fp32 run;
                                       normalized in the kernel, as vLLM's kernels do), in one half
    g       [slots, 2, T, HV]    fp32  its log decays, in the same half
    meta    [slots, 1]           int32 its length (low LEN_BITS bits) and, in bit LEN_BITS, its half; 0 = nothing
                                       pending (during a launch the bits above count the programs that have read
                                       it: see chain_spec_step_kernel)

Keys and decays have two halves so that a step's programs can write the new window while they all still read
the pending one (the other half); u needs none: each program reads and writes only its own tile. Two halves of bf16
keys take the bytes one half of fp32 keys did, and the second half of decays fits in the page's padding for the
Qwen3.5 models, so the page and the requests a pool holds are what they were with one half. A tree window
(``tree_plugin``) always lives in half 0, whose meta word is its plain length.

Each tensor may be a strided view of a per-slot page (vLLM's layout: slot stride = page size), as
long as each slot's part is contiguous.

Windows arrive packed (varlen): tokens of request b are ``cu_seqlens[b]:cu_seqlens[b + 1]``; a
request may carry fewer than T tokens (fewer drafts). The kernel reads them where they are.

The conv1d in front of the layer is not here: vLLM's conv state already keeps a sliding window of
the last W - 1 + k inputs in one block and reads it at the accepted offset, so the plugin keeps
vLLM's conv path as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Bits of the meta word that hold the pending window's length; the next bit says which half holds it.
LEN_BITS = 8


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
              state_dtype=torch.float32, key_dtype=torch.float32, device="cpu") -> ReconstructPools:
        shapes, dtypes = stash_layout(H=H, HV=HV, K=K, V=V, max_nodes=max_nodes, key_dtype=key_dtype)
        stash = [torch.zeros(slots, *s, dtype=d, device=device) for s, d in zip(shapes, dtypes)]
        return cls(torch.zeros(slots, HV, V, K, dtype=state_dtype, device=device), *stash)

    @property
    def max_nodes(self) -> int:
        return self.u.shape[1]

    def pending_window(self, s: int):
        """(length, u [L, HV, V], k [L, H, K], g [L, HV]): slot s's pending window, read on the host."""
        L, half = meta_fields(int(self.meta[s, 0]))
        return L, self.u[s, :L], self.k[s, half, :L], self.g[s, half, :L]


def meta_fields(word: int) -> tuple[int, int]:
    """(length, half) of a meta word at rest."""
    return word & ((1 << LEN_BITS) - 1), (word >> LEN_BITS) & 1


def meta_word(length: int, half: int) -> int:
    """The meta word of a window of ``length`` nodes in ``half``; 0 for none, whichever half."""
    return length | (half << LEN_BITS) if length else 0


def stash_layout(*, H: int, HV: int, K: int, V: int, max_nodes: int, key_dtype=torch.float32):
    """(shapes, dtypes) per slot of the stash tensors u, k, g, meta: what the plugin appends to vLLM's page (keys and
    decays in two halves: see the module docstring). The keys are the window's raw ones, stored as they came
    (``key_dtype``: the model's activations, bf16 when served, so that the two halves of bf16 keys take the bytes
    one half of fp32 keys did); u and the decays are computed in fp32 and kept so."""
    T = max_nodes
    if not 0 < T < 1 << LEN_BITS:
        raise ValueError(f"max_nodes = {T}: the meta word holds lengths 1 to {(1 << LEN_BITS) - 1}: serve fewer drafts")
    if key_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"key_dtype = {key_dtype}: expected the model's activation dtype, torch.bfloat16, "
                         "torch.float16 or torch.float32")
    return ((T, HV, V), (2, T, H, K), (2, T, HV), (1,)), (torch.float32, key_dtype, torch.float32, torch.int32)


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


def _launch_inputs(pools: ReconstructPools, slots, num_accepted, q, k, v, cu_seqlens, scale):
    """The kernel's view of a step: contiguous packed inputs (no copy where they are, as vLLM passes them), int32
    slots and counts, the default scale."""
    B = slots.shape[0]
    if cu_seqlens.shape[0] < B + 1:
        raise ValueError(f"cu_seqlens has {cu_seqlens.shape[0]} entries for {B} slots: expected B + 1 = {B + 1} "
                         "(pass the spec rows' query_start_loc[:B + 1])")
    HV, H = pools.state.shape[1], pools.k.shape[-2]
    if v.shape[-2] != HV or k.shape[-2] != H:
        raise ValueError(f"the window has {k.shape[-2]} key / {v.shape[-2]} value heads, the pools {H} / {HV}: under "
                         "tensor parallelism a rank's pages hold that rank's heads only (plugin.page_layout with the "
                         "rank's tensor_parallel_size)")
    q, k, v = (x.contiguous() for x in (q, k, v))
    return (q, k, v, cu_seqlens.to(torch.int32), slots.to(torch.int32), num_accepted[:B].to(torch.int32),
            q.shape[-1] ** -0.5 if scale is None else scale)


def spec_step(pools: ReconstructPools, slots: torch.Tensor, num_accepted: torch.Tensor, q, k, v, g, beta,
              cu_seqlens: torch.Tensor, *, scale: float | None = None, use_qk_l2norm_in_kernel: bool = True,
              config=None) -> torch.Tensor:
    """o [N, HV, V]: TreeWY verify of every request's chain window, the pending commit folded in, the new window
    stashed: one launch (``chain_spec_step_kernel``), no host sync. Reference: ``naive_spec_step``.

    slots int [B] (<= 0: a padding row: it does nothing and its tokens' outputs are left unwritten, as vLLM's
    store-all kernel leaves them); num_accepted int [B]: the previous window's accepted count (vLLM's
    ``num_accepted_tokens``; ignored where nothing is pending); q, k [N, H, K] and v [N, HV, V] packed by
    ``cu_seqlens`` [B + 1] (int32: a copy otherwise); g (log decay), beta [N, HV]. ``config``: a ``triton.Config``
    of the chain kernel (BV, FOLD_ROWS, warps, stages; default ``treewy.ops.verify.chain.spec_step_config(B)``, by batch).
    """
    from treewy.ops.verify.chain import chain_spec_step_fwd

    q, k, v, cu, slots, acc, scale = _launch_inputs(pools, slots, num_accepted, q, k, v, cu_seqlens, scale)
    return chain_spec_step_fwd(q, k, v, g.contiguous(), beta.contiguous(), None, None, cu, slots, acc, pools.state,
                               pools.u, pools.k, pools.g, pools.meta, scale, use_qk_l2norm_in_kernel, len_bits=LEN_BITS,
                               config=config)


def spec_step_gated(pools: ReconstructPools, slots: torch.Tensor, num_accepted: torch.Tensor, q, k, v, A_log, a, b,
                    dt_bias, cu_seqlens: torch.Tensor, *, scale: float | None = None,
                    use_qk_l2norm_in_kernel: bool = True, softplus_threshold: float = 20.0,
                    config=None) -> torch.Tensor:
    """``spec_step`` from the layer's raw gates, as vLLM's fused_sigmoid_gating takes them: a, b [N, HV] (rows past
    N unused), A_log, dt_bias [HV]; g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) in the kernel
    (``treewy.ops.gates.gdn_gating``). Reference: ``naive_spec_step_gated``."""
    from treewy.ops.verify.chain import chain_spec_step_fwd

    q, k, v, cu, slots, acc, scale = _launch_inputs(pools, slots, num_accepted, q, k, v, cu_seqlens, scale)
    return chain_spec_step_fwd(q, k, v, a.contiguous(), b.contiguous(), A_log.contiguous(), dt_bias.contiguous(), cu,
                               slots, acc, pools.state, pools.u, pools.k, pools.g, pools.meta, scale,
                               use_qk_l2norm_in_kernel, len_bits=LEN_BITS, softplus_threshold=softplus_threshold,
                               config=config)


def vllm_spec_update(pools: ReconstructPools, *, A_log, a, b, dt_bias, q, k, v, cu_seqlens, ssm_state_indices,
                     num_accepted_tokens, use_qk_l2norm_in_kernel, config=None, **_):
    """What the plugin runs in place of vLLM's store-all spec kernel, called with its arguments (their names:
    ``vllm_adapter.SPEC_UPDATE_PARAMS``): (o [1, N, HV, V], None). vLLM's state indices are [B, k + 1] (store-all's
    blocks); the request's one slot is column 0."""
    B = cu_seqlens.shape[0] - 1
    o = spec_step_gated(pools, ssm_state_indices[:B, 0], num_accepted_tokens, q[0], k[0], v[0], A_log, a, b, dt_bias,
                        cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config)
    return o[None], None


def flush_slots(pools: ReconstructPools, slots: torch.Tensor, accepted: int = 0, *,
                use_qk_l2norm_in_kernel: bool = True) -> None:
    """Commit the pending window of these slots now (node ``accepted``), leaving nothing pending.

    For rows that leave the spec path with a pending window (vLLM runs them through its prefill or plain-decode
    kernels, which read the slot's state directly). One launch, no host sync (slots <= 0 and slots with nothing
    pending are left as they are), so it runs inside CUDA graphs. Reference: ``naive_flush_slots``.
    """
    from treewy.ops.verify.chain import chain_spec_step_fwd

    chain_spec_step_fwd(None, None, None, None, None, None, None, None, slots.to(torch.int32), None, pools.state,
                        pools.u, pools.k, pools.g, pools.meta, 1.0, use_qk_l2norm_in_kernel, len_bits=LEN_BITS,
                        accepted=accepted)


def naive_spec_step(pools: ReconstructPools, slots, num_accepted, q, k, v, g, beta, cu_seqlens, *,
                    scale: float | None = None, use_qk_l2norm_in_kernel: bool = True,
                    dtype=torch.float64) -> torch.Tensor:
    """Reference of ``spec_step`` (same arguments; a loop over rows and nodes in ``dtype``): updates ``pools`` as the
    kernel does and returns o [N, HV, V] in ``dtype``, NaN for the tokens the kernel leaves unwritten."""
    B, N = slots.shape[0], q.shape[0]
    H, HV = q.shape[1], v.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    src, live, lens = pack_index(cu_seqlens, B, pools.max_nodes)
    o = torch.full((N, HV, v.shape[2]), float("nan"), dtype=dtype, device=q.device)
    norm = _l2norm if use_qk_l2norm_in_kernel else (lambda x: x)
    for b in range(B):
        s, L = int(slots[b]), int(lens[b])
        if s <= 0:
            continue
        n_pend, half = meta_fields(int(pools.meta[s, 0]))
        if n_pend:
            _commit(pools, s, half, int(num_accepted[b]) - 1, use_qk_l2norm_in_kernel, dtype)
        S = pools.state[s].to(dtype)
        for t in range(L):
            j = int(src[b, t])
            kt = norm(k[j].to(dtype)).repeat_interleave(HV // H, 0)          # [HV, K]
            qt = norm(q[j].to(dtype)).repeat_interleave(HV // H, 0) * scale
            S = g[j].to(dtype).exp()[:, None, None] * S
            u = beta[j].to(dtype)[:, None] * (v[j].to(dtype) - torch.einsum("hvk,hk->hv", S, kt))
            S = S + u[:, :, None] * kt[:, None, :]
            o[j] = torch.einsum("hvk,hk->hv", S, qt)
            pools.u[s, t] = u.to(pools.u.dtype)
            pools.k[s, 1 - half, t] = k[j].to(pools.k.dtype)
            pools.g[s, 1 - half, t] = g[j].to(pools.g.dtype)
        pools.meta[s, 0] = meta_word(L, 1 - half)
    return o


def naive_spec_step_gated(pools: ReconstructPools, slots, num_accepted, q, k, v, A_log, a, b, dt_bias, cu_seqlens, *,
                          scale: float | None = None, use_qk_l2norm_in_kernel: bool = True,
                          softplus_threshold: float = 20.0, dtype=torch.float64) -> torch.Tensor:
    """Reference of ``spec_step_gated``: the gates in ``dtype``, then ``naive_spec_step``."""
    from treewy.ops.gates import gdn_gating

    N = q.shape[0]
    g, beta = gdn_gating(A_log, a[:N], b[:N], dt_bias, softplus_threshold, dtype=dtype)
    return naive_spec_step(pools, slots, num_accepted, q, k, v, g, beta, cu_seqlens, scale=scale,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, dtype=dtype)


def naive_flush_slots(pools: ReconstructPools, slots, accepted: int = 0, *, use_qk_l2norm_in_kernel: bool = True,
                      dtype=torch.float64) -> None:
    """Reference of ``flush_slots``: each slot > 0 with a pending window commits node ``accepted`` in ``dtype``."""
    for s in (int(x) for x in slots):
        n_pend, half = meta_fields(int(pools.meta[s, 0])) if s > 0 else (0, 0)
        if n_pend:
            _commit(pools, s, half, accepted, use_qk_l2norm_in_kernel, dtype)
            pools.meta[s, 0] = 0


def _commit(pools: ReconstructPools, s: int, half: int, a: int, use_qk_l2norm_in_kernel: bool, dtype) -> None:
    """state[s] <- exp(G_a) S0 + sum_{i <= a} exp(G_a - G_i) u_i k_i^T over slot s's stash, its keys and decays in
    ``half`` (a < 0: unchanged)."""
    if a < 0:
        return
    HV, H = pools.u.shape[2], pools.k.shape[-2]
    u, g = pools.u[s, : a + 1].to(dtype), pools.g[s, half, : a + 1].to(dtype)
    k = pools.k[s, half, : a + 1].to(dtype)
    k = (_l2norm(k) if use_qk_l2norm_in_kernel else k).repeat_interleave(HV // H, 1)    # [a + 1, HV, K]
    G = g.cumsum(0)
    S = G[-1].exp()[:, None, None] * pools.state[s].to(dtype)
    for i in range(a + 1):
        S = S + (G[-1] - G[i]).exp()[:, None, None] * u[i][:, :, None] * k[i][:, None, :]
    pools.state[s] = S.to(pools.state.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """fla's l2norm over the last dim (eps 1e-6), in x's dtype: what the kernels apply to q and k."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def reset_slots(pools: ReconstructPools, slots: torch.Tensor) -> None:
    """Forget the pending window of these slots (a prefill writes their state from scratch). No host sync, and no
    host value copied in (a CUDA-graph capture refuses that); slot 0 (the NULL block) holds nothing: no mask needed."""
    pools.meta[:, 0].index_fill_(0, slots.long().clamp(min=0), 0)
