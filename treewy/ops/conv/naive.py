"""Readable torch reference for the tree causal conv1d in front of each GDN layer.

A node's conv window is its own input plus its nearest ancestors' inputs along the root..node
path, falling back to the committed conv state near the root. Commit keeps the last
(W - 1) inputs of the accepted path: a gather, no per-node windows are stored.

x [B, T, C] (the conv inputs of every node), weight [C, W] (depthwise, W = 4 in Qwen3.5),
conv_state [B, C, W - 1] (the last W - 1 committed inputs, oldest first), parents a DraftTree,
[T] or [B, T].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treewy.ops.checks import check_accepted, check_finite, conv_dims
from treewy.tree import validate_parents


def _check_conv(x, weight, conv_state, parents):
    B, T, C, W = conv_dims(x, conv_state, weight)
    for name, t in (("x", x), ("weight", weight), ("conv_state", conv_state)):
        if not t.is_floating_point():
            raise ValueError(f"{name} has dtype {t.dtype}; expected a floating dtype (bf16, fp32 or fp64): "
                             f"cast with {name}.float()")
    check_finite(x=x, weight=weight, conv_state=conv_state)
    par = validate_parents(parents)
    if par.ndim == 1:
        par = par.expand(B, -1)
    if par.shape != (B, T):
        raise ValueError(f"parents describe trees of {par.shape[-1]} nodes, but x has T = {T}")
    return B, T, C, W, par.to(x.device)


def _windows(x, conv_state, par, W):
    """[B, T, C, W] inputs each node's window sees, oldest first."""
    B, T, C = x.shape
    rows = torch.arange(B, device=x.device)
    hist = conv_state.transpose(1, 2)                           # [B, W - 1, C], oldest first
    win = x.new_empty(B, T, W, C)
    for t in range(T):
        p = par[:, t]
        prev = torch.where((p >= 0)[:, None, None], win[rows, p.clamp(min=0)], torch.cat([hist[:, :1], hist], 1))
        win[:, t] = torch.cat([prev[:, 1:], x[:, t, None]], dim=1)  # drop the oldest, append this node
    return win.transpose(2, 3)


def naive_tree_conv1d(x, weight, conv_state, parents, bias=None, activation="silu"):
    """y [B, T, C]: the depthwise causal conv of every node over its own root..node path."""
    B, T, C, W, par = _check_conv(x, weight, conv_state, parents)
    win = _windows(x, conv_state.to(x.dtype), par, W)           # [B, T, C, W]
    y = (win * weight.to(x.dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(x.dtype)
    if activation == "silu":
        return F.silu(y)
    if activation is None:
        return y
    raise ValueError(f"activation = {activation!r}: expected 'silu' or None")


def naive_tree_conv1d_commit(x, conv_state, parents, accepted):
    """New conv state [B, C, W - 1]: the last W - 1 inputs on the root..accepted path."""
    B, T, C = x.shape
    W = conv_state.shape[-1] + 1
    _, _, _, _, par = _check_conv(x, x.new_zeros(C, W), conv_state, parents)
    a = check_accepted(accepted, B, T, x.device)
    win = _windows(x, conv_state.to(x.dtype), par, W)           # [B, T, C, W]
    return win[torch.arange(B, device=x.device), a, :, 1:].to(conv_state.dtype)


def naive_tree_conv_update(x, conv_state, weight, bias, slots, accepted, parents, conv_src, activation="silu"):
    """One served tree step's conv on a serving pool, in place (reference of ``tree_conv_update_fwd``): y [B * T, C].

    conv_state [S, C, L] holds, per slot, the committed inputs in columns 0..W - 2 after a prefill, or after a tree
    step the previous window's stash (columns 0..W - 3: the committed inputs but the oldest, W - 2..: the window's
    inputs, root first). ``conv_src`` [T, W - 1]: node a's last W - 1 inputs as indices into [committed (W - 1) |
    window (T)] (``TreeLayout.conv_src``); the stash dropped the oldest committed column, so index - 1 addresses it.
    1. the fold: columns 0..W - 2 become accepted[b]'s (< 0: as 0, the identity);
    2. every node's conv over its own path from those columns (``naive_tree_conv1d``);
    3. the stash: columns 0..W - 3 + T become the folded columns 1..W - 2, then the window's inputs.
    x [B * T, C]; slots int [B], accepted int [B], parents [T]. Slots <= 0 (padding rows) get zero outputs and their
    slot is left as it is."""
    B, T, W1 = slots.shape[0], conv_src.shape[0], weight.shape[1] - 1
    C = x.shape[-1]
    live = slots > 0
    s = slots.long()[live]
    src = (conv_src.long()[accepted.long().clamp(min=0)] - 1)[live]
    committed = conv_state[s].gather(2, src[:, None, :].expand(-1, C, W1))
    xw = x.reshape(B, T, C)[live]
    y = x.new_zeros(B, T, C)
    y[live] = naive_tree_conv1d(xw, weight, committed, parents, bias, activation)
    conv_state[s, :, : W1 - 1 + T] = torch.cat([committed[..., 1:], xw.transpose(1, 2).to(conv_state.dtype)], -1)
    return y.reshape(B * T, C)
