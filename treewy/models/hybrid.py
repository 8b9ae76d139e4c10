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
import torch.nn.functional as F

from treewy.tree import ancestor_mask

GDN_MODES = ("reconstruct", "store_all")


# ----------------------------------------------------------------------------------------------
# The model's parts
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Op backends: the Triton kernels where importable and on GPU, else the torch references
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ops:
    name: str
    tree_verify: object       # (q, k, v, g, beta, S0, parents) -> (o, u)
    tree_commit: object       # (S0, u, k, g, parents, accepted) -> S_a
    store_all_verify: object  # (q, k, v, g, beta, S0, parents) -> (o, states [B, T, HV, V, K])
    tree_conv1d: object       # (x, weight, conv_state, parents, bias, activation) -> y
    tree_conv1d_commit: object  # (x, conv_state, parents, accepted) -> conv_state


def _torch_ops() -> Ops:
    from treewy.ops.naive import naive_tree_commit, naive_tree_recurrent, naive_tree_verify
    from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit
    return Ops("torch", naive_tree_verify, naive_tree_commit, naive_tree_recurrent, naive_tree_conv1d,
               naive_tree_conv1d_commit)


def get_ops(device, backend: str = "auto") -> Ops:
    """``backend``: "auto" (kernels on CUDA when ``treewy.ops`` has them, else torch), "torch" or "triton"."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend = {backend!r}: expected 'auto', 'torch' or 'triton'")
    ref = _torch_ops()
    if backend == "torch" or (backend == "auto" and torch.device(device).type != "cuda"):
        return ref
    try:
        from treewy.ops import store_all_verify, tree_commit, tree_conv1d, tree_verify
    except ImportError as e:
        if backend == "triton":
            raise ValueError("backend='triton' but treewy.ops has no tree_verify / tree_commit / "
                             f"store_all_verify / tree_conv1d kernels ({e}); use backend='torch'") from e
        return ref
    try:
        from treewy.ops import tree_conv1d_commit
    except ImportError:
        tree_conv1d_commit = ref.tree_conv1d_commit
    return Ops("triton", tree_verify, tree_commit, store_all_verify, tree_conv1d, tree_conv1d_commit)


# ----------------------------------------------------------------------------------------------
# Caches
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# GDN layer pieces
# ----------------------------------------------------------------------------------------------

def _gdn_project(gdn, x):
    """(mixed_qkv [B, T, C] before the conv, z [B, T, HV, V], b, a [B, T, HV])."""
    B, T, _ = x.shape
    if hasattr(gdn, "in_proj_qkv"):  # Qwen3.5: flat [q | k | v]
        mixed = gdn.in_proj_qkv(x)
        z = gdn.in_proj_z(x).reshape(B, T, -1, gdn.head_v_dim)
        return mixed, z, gdn.in_proj_b(x), gdn.in_proj_a(x)
    q, k, v, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))  # Qwen3-Next
    mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)
    return mixed, z, b, a


def _l2norm(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _gdn_inputs(gdn, y, b, a):
    """q, k (l2-normalised, fp32) [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] from the conv output."""
    B, T, _ = y.shape
    q, k, v = torch.split(y, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    q = _l2norm(q.reshape(B, T, -1, gdn.head_k_dim).float()).contiguous()
    k = _l2norm(k.reshape(B, T, -1, gdn.head_k_dim).float()).contiguous()
    v = v.reshape(B, T, -1, gdn.head_v_dim).float().contiguous()
    beta = b.float().sigmoid()
    g = -gdn.A_log.float().exp() * F.softplus(a.float() + gdn.dt_bias.float())
    return q, k, v, g, beta


def _gdn_output(gdn, o, z, dtype):
    B, T = o.shape[:2]
    o = gdn.norm(o.to(dtype).reshape(-1, gdn.head_v_dim), z.reshape(-1, gdn.head_v_dim))
    return gdn.out_proj(o.reshape(B, T, -1))


def _conv_weight(gdn):
    return gdn.conv1d.weight.squeeze(1)  # [C, W]


def chunk_gdn_torch(q, k, v, g, beta, initial_state=None, chunk: int = 64):
    """Causal gated delta rule over whole sequences by chunks, in closed form (differentiable).

    q, k [B, T, H, K] (normalised), v [B, T, HV, V], g, beta [B, T, HV]; state [B, HV, V, K].
    Returns (o [B, T, HV, V], final state [B, HV, V, K]); computes in fp32.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    r = HV // H
    scale = K ** -0.5
    q, k = (x.float().repeat_interleave(r, dim=2).transpose(1, 2) for x in (q, k))  # [B, HV, T, K]
    v, g, beta = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)
    S = q.new_zeros(B, HV, V, K) if initial_state is None else initial_state.float()
    outs = []
    for s in range(0, T, chunk):
        qc, kc, vc = q[:, :, s:s + chunk] * scale, k[:, :, s:s + chunk], v[:, :, s:s + chunk]
        gc, bc = g[:, :, s:s + chunk], beta[:, :, s:s + chunk]
        C = qc.shape[2]
        G = gc.cumsum(-1)                                               # [B, HV, C]
        diff = G[..., :, None] - G[..., None, :]
        incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        strict = incl.clone().fill_diagonal_(False)
        decay_s = torch.where(strict, diff, float("-inf")).exp()
        decay_i = torch.where(incl, diff, float("-inf")).exp()
        A = decay_s * (kc @ kc.transpose(-1, -2))
        R = bc[..., None] * (vc - G.exp()[..., None] * (kc @ S.transpose(-1, -2)))
        M = torch.eye(C, device=q.device) + bc[..., None] * A
        U = torch.linalg.solve_triangular(M, R, upper=False, unitriangular=True)   # [B, HV, C, V]
        outs.append(G.exp()[..., None] * (qc @ S.transpose(-1, -2)) + (decay_i * (qc @ kc.transpose(-1, -2))) @ U)
        w = (G[..., -1:] - G).exp()                                     # exp(G_last - G_i)
        S = G[..., -1].exp()[..., None, None] * S + (w[..., None] * U).transpose(-1, -2) @ kc
    return torch.cat(outs, 2).transpose(1, 2), S


def _fla_chunk():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return None
    return chunk_gated_delta_rule


def chunk_gdn(q, k, v, g, beta, use_fla: bool | None = None):
    """Sequence GDN from a zero state: fla's chunk kernel on CUDA when available, else chunk_gdn_torch."""
    fn = _fla_chunk() if (q.is_cuda and use_fla is not False) else None
    if fn is None:
        return chunk_gdn_torch(q, k, v, g, beta)
    r = v.shape[2] // q.shape[2]
    dt = torch.bfloat16 if torch.is_autocast_enabled() else v.dtype
    qe, ke = (x.repeat_interleave(r, dim=2).to(dt).contiguous() for x in (q, k))
    o, S = fn(qe, ke, v.to(dt).contiguous(), g.float().contiguous(), beta.to(dt).contiguous(),
              scale=q.shape[-1] ** -0.5, initial_state=None, output_final_state=True,
              use_qk_l2norm_in_kernel=False)
    return o.float(), S.float().transpose(-1, -2)  # fla keeps [B, HV, K, V]


def _gdn_sequence(gdn, x, use_fla=None):
    """Whole-sequence GDN mixer from empty states. Returns (out, final state [B, HV, V, K], conv state)."""
    B, T, _ = x.shape
    mixed, z, b, a = _gdn_project(gdn, x)
    W = gdn.conv_kernel_size
    w = _conv_weight(gdn)
    y = F.conv1d(mixed.transpose(1, 2).to(w.dtype), w[:, None], gdn.conv1d.bias, padding=W - 1,
                 groups=mixed.shape[-1])[..., :T]
    y = F.silu(y).transpose(1, 2).to(x.dtype)
    conv_state = F.pad(mixed.transpose(1, 2), (max(0, W - 1 - T), 0))[..., -(W - 1):]
    q, k, v, g, beta = _gdn_inputs(gdn, y, b, a)
    o, S = chunk_gdn(q, k, v, g, beta, use_fla)
    return _gdn_output(gdn, o, z, x.dtype), S, conv_state


# ----------------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------------

def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x, cos, sin):
    """x [B, heads, T, D]; cos, sin [B, T, rot]: rotate the first ``rot`` channels (partial RoPE)."""
    cos, sin = cos[:, None], sin[:, None]
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat([xr * cos + _rotate_half(xr) * sin, xp], dim=-1)


def rope(spec: HybridSpec, x, positions):
    """cos, sin [B, T, rot] for text positions [B, T] from the rotary module's inverse frequencies.

    Qwen3.5's multimodal RoPE gives every section the same position for text, so it reduces to this;
    computed here because the rotary module's call signature differs across transformers versions.
    """
    inv = spec.rotary.inv_freq.to(device=x.device, dtype=torch.float32)
    freqs = positions[..., None].float() * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    scale = float(getattr(spec.rotary, "attention_scaling", 1.0) or 1.0)
    return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)


def _attn_window(attn, x, cos, sin, past=None, win_mask=None):
    """Gated attention of a window of T tokens.

    past: (k, v [B, Hkv, L, D], valid [B, L]) of the committed prefix, or None.
    win_mask: bool [B, T, T] (True = may attend) among window tokens; None = causal.
    Returns (out [B, T, hidden], k_win, v_win [B, Hkv, T, D]).
    """
    B, T, _ = x.shape
    D = attn.head_dim
    q, gate = torch.chunk(attn.q_proj(x).view(B, T, -1, 2 * D), 2, dim=-1)
    gate = gate.reshape(B, T, -1)
    q = attn.q_norm(q).transpose(1, 2)                                        # [B, Hq, T, D]
    k = attn.k_norm(attn.k_proj(x).view(B, T, -1, D)).transpose(1, 2)         # [B, Hkv, T, D]
    v = attn.v_proj(x).view(B, T, -1, D).transpose(1, 2)
    q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
    rep = q.shape[1] // k.shape[1]
    if past is None and win_mask is None:
        keys, vals, mask, causal = k, v, None, True
    else:
        if win_mask is None:
            win_mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().expand(B, T, T)
        if past is not None and past[0].shape[2] > 0:
            pk, pv, valid = past
            keys, vals = torch.cat([pk.to(k.dtype), k], 2), torch.cat([pv.to(v.dtype), v], 2)
            mask = torch.cat([valid[:, None, :].expand(B, T, -1), win_mask], dim=-1)
        else:
            keys, vals, mask = k, v, win_mask
        mask, causal = mask[:, None], False
    keys = keys.repeat_interleave(rep, dim=1) if rep > 1 else keys
    vals = vals.repeat_interleave(rep, dim=1) if rep > 1 else vals
    o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, is_causal=causal, scale=attn.scaling)
    o = o.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(gate)
    return attn.o_proj(o), k, v


def _mlp(layer, x):
    out = layer.mlp(x)
    return out[0] if isinstance(out, tuple) else out


# ----------------------------------------------------------------------------------------------
# Whole-sequence forward (prefill, training)
# ----------------------------------------------------------------------------------------------

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
            x, S, conv = _gdn_sequence(layer.linear_attn, x, use_fla)
            states[i] = (S, conv)
        else:
            x, k, v = _attn_window(layer.self_attn, x, cos, sin)
            states[i] = (k, v)
        h = r + x
        h = h + _mlp(layer, layer.post_attention_layernorm(h))
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
            mixed, z, b, a = _gdn_project(gdn, x)
            mixed = mixed.contiguous()
            y = ops.tree_conv1d(mixed, _conv_weight(gdn), cache.conv[i], parents, gdn.conv1d.bias, "silu")
            q, k, v, g, beta = _gdn_inputs(gdn, y, b, a)
            S0 = cache.committed_state(i)
            if mode == "reconstruct":
                o, u = ops.tree_verify(q, k, v, g, beta, S0, parents)
                pend.gdn[i] = ("reconstruct", mixed, u, k, g, S0)
                pend.transient_bytes += u.numel() * u.element_size() // B
            else:
                o, states = ops.store_all_verify(q, k, v, g, beta, S0, parents)
                pend.gdn[i] = ("store_all", mixed, states)
                pend.transient_bytes += states.numel() * states.element_size() // B
            x = _gdn_output(gdn, o, z, x.dtype)
        else:
            x, kw, vw = _attn_window(layer.self_attn, x, cos, sin, cache.kv[i].past(), anc)
            pend.kv[i] = (kw, vw)
        h = r + x
        h = h + _mlp(layer, layer.post_attention_layernorm(h))
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
