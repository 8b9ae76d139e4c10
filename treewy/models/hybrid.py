"""Forward passes of a transformers Qwen3.5 / Qwen3-Next hybrid, written over the model's own modules.

Three entry points share one set of layer functions:

- ``forward_sequence``: a causal pass over whole sequences (prefill and training); GDN layers use
  fla's chunk kernel on CUDA when it is installed, else a chunked closed form in torch.
- ``verify``: one tree window per request on top of the committed caches. GDN layers run the tree
  conv1d and either TreeWY verify (``reconstruct``, with the previous step's commit folded in) or
  the store-all recurrence (``store_all``) from the committed state; attention layers see the
  committed prefix plus the window's ancestor mask, at positions prefix length + depth.
- ``commit``: after acceptance, conv states move to the accepted node, the KV caches keep only the
  accepted path, and the GDN state moves too: store_all picks the accepted snapshot, reconstruct
  leaves a pending commit for the next verify.

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
from treewy.ops.verify.pending import PendingCommit
from treewy.tree import DraftTree, ancestor_mask


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

@dataclass(frozen=True)
class Window:
    """A validated draft tree on the device, built once per ``generate``: what every step's verify,
    acceptance and commit read, so none of them converts or validates parents again."""
    parents: torch.Tensor   # int32 [T], contiguous: the ops' shared topology (batch stride 0)
    rows: torch.Tensor      # int64 [B, T]: the same parents per request (acceptance, gathers)
    anc: torch.Tensor       # bool [B, T, T]: inclusive ancestor mask (attention among window tokens)
    depth: torch.Tensor     # int64 [T]
    max_depth: int          # T - 1 for a chain: the verify runs the chain kernel, else the tree kernel

    @classmethod
    def of(cls, tree: DraftTree, B: int, device) -> Window:
        par = tree.parents.to(device=device, dtype=torch.int32).contiguous()
        anc = ancestor_mask(tree.parents).to(device)
        return cls(par, par.long()[None].expand(B, -1).contiguous(), anc[None].expand(B, -1, -1),
                   tree.depth.long().to(device), tree.max_depth)


@dataclass
class WindowOutputs:
    """What verify leaves for commit, per layer (the deferred GDN commit itself is a treewy.ops.PendingCommit)."""
    gdn: dict = field(default_factory=dict)   # layer -> (mode, tensors...)
    kv: dict = field(default_factory=dict)    # layer -> (k_win, v_win)
    transient_bytes: int = 0                  # per request: U (reconstruct) or the T snapshots (store_all)


def verify(spec: HybridSpec, cache: HybridCache, tokens: torch.Tensor, window: Window, mode: str, ops: Ops):
    """Run a tree window per request. tokens [B, T]; ``window`` the tree on the device.

    reconstruct verifies from the state with the previous step's pending commit folded in
    (``ops.tree_step``); store_all from the committed snapshot. One host sync: the longest committed
    prefix, which sizes the attention layers' past. The caller sizes the KV caches (``generate``: the
    longest prompt + max_new_tokens + T + 1 positions).

    Returns (logits [B, T, vocab], hidden [B, T, hidden], WindowOutputs).
    """
    if mode not in GDN_MODES:
        raise ValueError(f"mode = {mode!r}: expected one of {GDN_MODES}")
    L = int(cache.lens.max())
    positions = cache.lens[:, None] + window.depth
    h = spec.embed(tokens)
    cos, sin = rope(spec, h, positions)
    pend = WindowOutputs()
    for i, layer in enumerate(spec.layers):
        r = h
        x = layer.input_layernorm(h)
        if spec.kinds[i] == "gdn":
            x = _gdn_window(cache, layer.linear_attn, x, i, window, mode, ops, pend)
        else:
            x, kw, vw = attn_window(layer.self_attn, x, cos, sin, cache.kv[i].past(L), window.anc)
            pend.kv[i] = (kw, vw)
        h = r + x
        h = h + mlp(layer, layer.post_attention_layernorm(h))
    h = spec.norm(h)
    return spec.lm_head(h), h, pend


def _gdn_window(cache, gdn, x, i, window, mode, ops, pend):
    """One GDN layer over the window: tree conv1d, then TreeWY (reconstruct) or the store-all recurrence."""
    B = x.shape[0]
    mixed, z, b, a = gdn_project(gdn, x)
    mixed = mixed.contiguous()
    y = ops.tree_conv1d(mixed, conv_weight(gdn), cache.conv[i], window.parents, gdn.conv1d.bias, "silu")
    q, k, v, g, beta = gdn_inputs(gdn, y, b, a)
    if mode == "reconstruct":
        o, u = ops.tree_step(q, k, v, g, beta, cache.state_view(i), window.parents, cache.pending.pop(i, None),
                             window.max_depth)
        pend.gdn[i] = ("reconstruct", mixed, u, k, g)
        pend.transient_bytes += u.numel() * u.element_size() // B
    else:
        o, states = ops.store_all_verify(q, k, v, g, beta, cache.committed_state(i), window.parents)
        pend.gdn[i] = ("store_all", mixed, states)
        pend.transient_bytes += states.numel() * states.element_size() // B
    return gdn_output(gdn, o, z, x.dtype)


def commit(spec: HybridSpec, cache: HybridCache, pend: WindowOutputs, window: Window, accepted: torch.Tensor,
           path: torch.Tensor, length: torch.Tensor, ops: Ops, live: torch.Tensor | None = None,
           defer: bool = True) -> None:
    """Move every cache to the accepted node. accepted, length [B]; path [B, n] (root..accepted, -1 padded).

    reconstruct records the GDN commit as a PendingCommit that the next verify applies (``defer``;
    False applies it now); store_all moves ``slot`` to the accepted snapshot. Conv states and KV
    caches are committed at once. Requests with live = False keep their KV caches and lengths (their
    GDN rows are don't-care). No host sync.
    """
    count = length if live is None else length * live.long()
    acc32 = accepted.to(torch.int32)
    for i, entry in pend.gdn.items():
        cache.conv[i] = ops.tree_conv1d_commit(entry[1], cache.conv[i], window.parents, acc32)
        if entry[0] == "reconstruct":
            _, _, u, k, g = entry
            cache.defer(i, PendingCommit(u, k, g, window.parents, acc32), ops.flush)
            if not defer:
                cache.flush(i)
        else:
            cache.ssm[i] = entry[2]  # the pool of T snapshots; the committed one is picked by slot
    if pend.gdn:
        any_entry = next(iter(pend.gdn.values()))
        cache.slot = accepted.clone() if any_entry[0] == "store_all" else torch.zeros_like(accepted)
    for i, (kw, vw) in pend.kv.items():
        cache.kv[i].append(kw, vw, path, count)
    cache.lens += count
