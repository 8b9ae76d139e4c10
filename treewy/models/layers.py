"""Layer pieces over the model's own modules: GDN projections, gates, chunked closed form, attention with RoPE, MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treewy.models.spec import HybridSpec
from treewy.ops.gates import gdn_gating, l2norm


def gdn_project(gdn, x):
    """(mixed_qkv [B, T, C] before the conv, z [B, T, HV, V], b, a [B, T, HV])."""
    B, T, _ = x.shape
    if hasattr(gdn, "in_proj_qkv"):  # Qwen3.5: flat [q | k | v]
        mixed = gdn.in_proj_qkv(x)
        z = gdn.in_proj_z(x).reshape(B, T, -1, gdn.head_v_dim)
        return mixed, z, gdn.in_proj_b(x), gdn.in_proj_a(x)
    q, k, v, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))  # Qwen3-Next
    mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)
    return mixed, z, b, a


def gdn_inputs(gdn, y, b, a):
    """q, k (l2-normalised, fp32) [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] from the conv output."""
    B, T, _ = y.shape
    q, k, v = torch.split(y, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    q = l2norm(q.reshape(B, T, -1, gdn.head_k_dim)).contiguous()
    k = l2norm(k.reshape(B, T, -1, gdn.head_k_dim)).contiguous()
    v = v.reshape(B, T, -1, gdn.head_v_dim).float().contiguous()
    g, beta = gdn_gating(gdn.A_log, a, b, gdn.dt_bias)
    return q, k, v, g, beta


def gdn_output(gdn, o, z, dtype):
    B, T = o.shape[:2]
    o = gdn.norm(o.to(dtype).reshape(-1, gdn.head_v_dim), z.reshape(-1, gdn.head_v_dim))
    return gdn.out_proj(o.reshape(B, T, -1))


def conv_weight(gdn):
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


def fla_chunk():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return None
    return chunk_gated_delta_rule


def chunk_gdn(q, k, v, g, beta, use_fla: bool | None = None):
    """Sequence GDN from a zero state: fla's chunk kernel on CUDA when available, else chunk_gdn_torch."""
    fn = fla_chunk() if (q.is_cuda and use_fla is not False) else None
    if fn is None:
        return chunk_gdn_torch(q, k, v, g, beta)
    r = v.shape[2] // q.shape[2]
    dt = torch.bfloat16 if torch.is_autocast_enabled() else v.dtype
    qe, ke = (x.repeat_interleave(r, dim=2).to(dt).contiguous() for x in (q, k))
    o, S = fn(qe, ke, v.to(dt).contiguous(), g.float().contiguous(), beta.to(dt).contiguous(),
              scale=q.shape[-1] ** -0.5, initial_state=None, output_final_state=True,
              use_qk_l2norm_in_kernel=False)
    return o.float(), S.float().transpose(-1, -2)  # fla keeps [B, HV, K, V]


def gdn_sequence(gdn, x, use_fla=None):
    """Whole-sequence GDN mixer from empty states. Returns (out, final state [B, HV, V, K], conv state)."""
    B, T, _ = x.shape
    mixed, z, b, a = gdn_project(gdn, x)
    W = gdn.conv_kernel_size
    w = conv_weight(gdn)
    y = F.conv1d(mixed.transpose(1, 2).to(w.dtype), w[:, None], gdn.conv1d.bias, padding=W - 1,
                 groups=mixed.shape[-1])[..., :T]
    y = F.silu(y).transpose(1, 2).to(x.dtype)
    conv_state = F.pad(mixed.transpose(1, 2), (max(0, W - 1 - T), 0))[..., -(W - 1):]
    q, k, v, g, beta = gdn_inputs(gdn, y, b, a)
    o, S = chunk_gdn(q, k, v, g, beta, use_fla)
    return gdn_output(gdn, o, z, x.dtype), S, conv_state



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


def attn_window(attn, x, cos, sin, past=None, win_mask=None):
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


def mlp(layer, x):
    out = layer.mlp(x)
    return out[0] if isinstance(out, tuple) else out
