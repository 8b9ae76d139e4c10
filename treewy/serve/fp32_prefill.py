"""An fp32 prefill for vLLM's Qwen GDN layers, so that a model can be served with ``--dtype float32``.

vLLM's Triton prefill (fla's ``chunk_gated_delta_rule``) asserts "does not support float32", so vLLM 0.26
cannot start a GDN model in fp32 (seen on the GPU: benchmarks/results/vllm_h200_2026-11-30/session4_fp32/). With ``TREEWY_FP32_PREFILL=1`` the plugin
replaces that prefill (``ChunkGatedDeltaRule.forward_native``, what ``--gdn-prefill-backend triton`` runs)
by ``recurrent_prefill``: the gated delta rule token by token in the inputs' dtype (``treewy.ops.gdn.gdn_step``),
every sequence of the varlen batch at once. It is exact and slow (one step per prompt token per layer, with a
host sync for the sequence lengths, so prefills never run inside CUDA graphs): it exists for the equality check
of the two serving modes (benchmarks/vllm_serve_gpu.py ``tiny --dtype float32``), where two GDN kernels that
round differently agree far below the gap between the top two logits. Both modes get it, so their prefills agree
bit for bit and only the spec-decode kernels differ.
"""

from __future__ import annotations

import os

import torch

from treewy.ops.gdn import gdn_step
from treewy.serve import vllm_adapter as adapter
from treewy.serve.reconstruct import pack_index

ENV = "TREEWY_FP32_PREFILL"
_PATCHED = "_treewy_fp32_prefill"


def requested() -> bool:
    return os.environ.get(ENV, "0") == "1"


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrent_prefill(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, chunk_indices=None,
                      chunk_offsets=None, use_qk_l2norm_in_kernel=True, core_attn_out=None, **_):
    """The same arguments and results as fla's ``chunk_gated_delta_rule`` in vLLM: q, k [1, N, H, K] (or
    [B, L, ...] without ``cu_seqlens``), v [.., HV, V], g (log decay) and beta [.., HV], initial_state
    [B, HV, V, K]. Returns (o like v, the final states [B, HV, V, K] in fp32, or None)."""
    if cu_seqlens is None:
        B, L = q.shape[:2]
        cu = torch.arange(0, (B + 1) * L, L, device=q.device)
        q, k, v, g, beta = (x.reshape(1, B * L, *x.shape[2:]) for x in (q, k, v, g, beta))
    else:
        cu = cu_seqlens.long()
    N, H, K = q.shape[1:]
    HV = v.shape[2]
    B = cu.numel() - 1
    L = int((cu[1:] - cu[:-1]).max()) if B else 0
    dt = q.dtype
    src, live, _ = pack_index(cu, B, L)                                                  # [B, L]

    def padded(x):  # [1, N, ...] -> [B, L, ...]
        return x[0][src]

    qe, ke = padded(q).to(dt), padded(k).to(dt)
    if use_qk_l2norm_in_kernel:
        qe, ke = _l2norm(qe), _l2norm(ke)
    r = HV // H
    qe, ke = qe.repeat_interleave(r, dim=2) * K ** -0.5, ke.repeat_interleave(r, dim=2)     # [B, L, HV, K]
    ve, ge, be = padded(v).to(dt), padded(g).to(dt), padded(beta).to(dt)
    S = (initial_state.to(dt) if initial_state is not None
         else torch.zeros(B, HV, v.shape[-1], K, dtype=dt, device=q.device))
    o = torch.zeros(B, L, HV, v.shape[-1], dtype=dt, device=q.device)
    for i in range(L):
        S_next, _ = gdn_step(S, ke[:, i], ve[:, i], ge[:, i], be[:, i])
        S = torch.where(live[:, i, None, None, None], S_next, S)
        o[:, i] = (S @ qe[:, i, ..., None]).squeeze(-1)
    out = o[live][None].to(v.dtype)                                                          # [1, N, HV, V]
    if core_attn_out is not None:
        core_attn_out.reshape(-1)[: out.numel()].copy_(out.reshape(-1))
    if cu_seqlens is None:
        out = out.reshape(B, L, HV, -1)
    return out, (S.float() if output_final_state else None)


def install() -> None:
    """Point vLLM's Triton GDN prefill at ``recurrent_prefill`` (before any layer is built; re-entrant)."""
    op = adapter.prefill_op()
    if op.__dict__.get(_PATCHED):
        return

    def forward_native(self, *args, **kwargs):
        return recurrent_prefill(*args, **kwargs)

    adapter.set_prefill(op, forward_native)
    setattr(op, _PATCHED, True)
