"""Forward passes of a transformers Qwen3.5 / Qwen3-Next hybrid, written over the model's own modules.

Three entry points share one set of layer functions:

- ``forward_sequence``: a causal pass over whole sequences (prefill and training); GDN layers use
  fla's chunk kernel on CUDA when it is installed, else a chunked closed form in torch.
- ``verify``: one tree window per request on top of the committed caches. GDN layers run the tree
  conv1d and either TreeWY verify (``reconstruct``) or the store-all recurrence (``store_all``)
  from the committed state; attention layers see the committed prefix plus the window's ancestor
  mask, at positions prefix length + depth.
- ``commit``: after acceptance, GDN and conv states move to the accepted node and the KV caches
  keep only the accepted path.

Layouts follow DESIGN.md section 3: q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV];
GDN state [B, HV, V, K] in fp32 (transformers' own cache is [B, HV, K, V]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treewy.models.backends import Ops
from treewy.models.cache import HybridCache
from treewy.models.layers import attn_window, conv_weight, gdn_inputs, gdn_output, gdn_project, gdn_sequence, mlp, rope
from treewy.models.spec import GDN_MODES, HybridSpec
from treewy.tree import ancestor_mask


def forward_sequence(spec: HybridSpec, input_ids: torch.Tensor, use_fla: bool | None = None,
                     return_states: bool = False):
    """Causal pass over input_ids [B, L] from empty caches.

    Returns hidden (after the final norm) [B, L, hidden] and, with ``return_states``, a dict
    {layer: (S [B, HV, V, K], conv [B, C, W - 1])} for GDN layers and {layer: (k, v)} for attention.
    """
    B, L = input_ids.shape
    h = spec.embed(input_ids)
    pos = torch.arange(L, device=input_ids.device)[None].expand(B, L)
    cos, sin = rope(spec, h, pos)
    states = {}
    for i, layer in enumerate(spec.layers):
        r = h
        x = layer.input_layernorm(h)
        if spec.kinds[i] == "gdn":
            x, S, conv = gdn_sequence(layer.linear_attn, x, use_fla)
            states[i] = (S, conv)
        else:
            x, k, v = attn_window(layer.self_attn, x, cos, sin)
            states[i] = (k, v)
        h = r + x
        h = h + mlp(layer, layer.post_attention_layernorm(h))
    h = spec.norm(h)
    return (h, states) if return_states else h


def prefill(spec: HybridSpec, cache: HybridCache, prompts: list[list[int]], device):
    """Run each prompt through the model into row b of the caches. Returns (hidden list [P_b, hidden],
    last logits [B, vocab])."""
    hidden = [None] * len(prompts)
    last = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for b, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(b)
    for L, rows in by_len.items():
        ids = torch.tensor([prompts[b] for b in rows], dtype=torch.long, device=device)
        h, states = forward_sequence(spec, ids, return_states=True)
        logits = spec.lm_head(h[:, -1])
        idx = torch.tensor(rows, device=device)
        for i, st in states.items():
            if spec.kinds[i] == "gdn":
                cache.ssm[i][idx, 0] = st[0].float()
                cache.conv[i][idx] = st[1].to(cache.conv[i].dtype)
            else:
                kv = cache.kv[i]
                kv.k[idx, :, :L] = st[0].to(kv.k.dtype)
                kv.v[idx, :, :L] = st[1].to(kv.v.dtype)
                kv.lens[idx] = L
        cache.lens[idx] = L
        for j, b in enumerate(rows):
            hidden[b] = h[j]
            last[b] = logits[j]
    return hidden, torch.stack(last)


# ----------------------------------------------------------------------------------------------
# Tree verify and commit
# ----------------------------------------------------------------------------------------------

@dataclass
class Pending:
    """What verify leaves for commit, per layer."""
    gdn: dict = field(default_factory=dict)   # layer -> (mode, tensors...)
    kv: dict = field(default_factory=dict)    # layer -> (k_win, v_win)
    transient_bytes: int = 0                  # per request: U (reconstruct) or the T snapshots (store_all)


def verify(spec: HybridSpec, cache: HybridCache, tokens: torch.Tensor, parents: torch.Tensor,
           mode: str, ops: Ops):
    """Run a tree window per request. tokens, parents [B, T] (parents validated, int64, on device).

    Returns (logits [B, T, vocab], hidden [B, T, hidden], Pending).
    """
    if mode not in GDN_MODES:
        raise ValueError(f"mode = {mode!r}: expected one of {GDN_MODES}")
    B, T = tokens.shape
    anc = ancestor_mask(parents)                                        # [B, T, T] inclusive
    depth = anc.sum(-1) - 1
    positions = cache.lens[:, None] + depth
    h = spec.embed(tokens)
    cos, sin = rope(spec, h, positions)
    pend = Pending()
    for i, layer in enumerate(spec.layers):
        r = h
        x = layer.input_layernorm(h)
        if spec.kinds[i] == "gdn":
            gdn = layer.linear_attn
            mixed, z, b, a = gdn_project(gdn, x)
            mixed = mixed.contiguous()
            y = ops.tree_conv1d(mixed, conv_weight(gdn), cache.conv[i], parents, gdn.conv1d.bias, "silu")
            q, k, v, g, beta = gdn_inputs(gdn, y, b, a)
            S0 = cache.committed_state(i)
            if mode == "reconstruct":
                o, u = ops.tree_verify(q, k, v, g, beta, S0, parents)
                pend.gdn[i] = ("reconstruct", mixed, u, k, g, S0)
                pend.transient_bytes += u.numel() * u.element_size() // B
            else:
                o, states = ops.store_all_verify(q, k, v, g, beta, S0, parents)
                pend.gdn[i] = ("store_all", mixed, states)
                pend.transient_bytes += states.numel() * states.element_size() // B
            x = gdn_output(gdn, o, z, x.dtype)
        else:
            x, kw, vw = attn_window(layer.self_attn, x, cos, sin, cache.kv[i].past(), anc)
            pend.kv[i] = (kw, vw)
        h = r + x
        h = h + mlp(layer, layer.post_attention_layernorm(h))
    h = spec.norm(h)
    return spec.lm_head(h), h, pend


def commit(spec: HybridSpec, cache: HybridCache, pend: Pending, parents: torch.Tensor,
           accepted: torch.Tensor, path: torch.Tensor, length: torch.Tensor, ops: Ops,
           live: torch.Tensor | None = None) -> None:
    """Move every cache to the accepted node. accepted, length [B]; path [B, n] (root..accepted, -1 padded).

    Requests with live = False keep their KV caches and lengths (their GDN rows are don't-care).
    """
    count = length if live is None else length * live.long()
    for i, entry in pend.gdn.items():
        mixed = entry[1]
        cache.conv[i] = ops.tree_conv1d_commit(mixed, cache.conv[i], parents, accepted).to(cache.conv[i].dtype)
        if entry[0] == "reconstruct":
            _, _, u, k, g, S0 = entry
            cache.ssm[i] = ops.tree_commit(S0, u, k, g, parents, accepted).float()[:, None]
        else:
            cache.ssm[i] = entry[2]  # the pool of T snapshots; the committed one is picked by slot
    if pend.gdn:
        any_entry = next(iter(pend.gdn.values()))
        cache.slot = accepted.clone() if any_entry[0] == "store_all" else torch.zeros_like(accepted)
    for i, (kw, vw) in pend.kv.items():
        cache.kv[i].append(kw, vw, path, count)
    cache.lens += count
