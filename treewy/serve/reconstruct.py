"""The reconstruct commit as pure functions of tensors: what the vLLM plugin computes, testable on CPU.

A request owns ONE pool slot per GDN layer (store-all owns 1 + N). The slot holds the state
committed before the previous verify window, and a small stash of that window's pseudo-values
u, keys k and log decays g (the pending commit). The next verify step reads the accepted count,
folds the pending commit into the committed state (``naive_tree_commit``: the accepted node's
state), verifies the new window from it (``naive_tree_verify``), writes the folded state back and
stashes the new window's u / k / g. The state is read once and written once per step.

The conv1d in front of the layer works the same way: the slot keeps the last W - 1 committed conv
inputs plus the pending window's conv inputs; the fold is a gather along the accepted path.

Pools (per GDN layer; slots are vLLM block ids, slot 0 is the NULL block and is never touched):

    state   [slots, HV, V, K]       committed recurrent state (fp32 for Qwen3.5)
    conv    [slots, C, W - 1]       committed conv inputs, oldest first
    conv_x  [slots, Tmax, C]        the pending window's conv inputs
    u       [slots, Tmax, HV, V]    the pending window's pseudo-values (fp32)
    k       [slots, Tmax, H, K]     its keys (after l2norm)
    g       [slots, Tmax, HV]       its log decays
    meta    [slots, Tmax + 1] int32 meta[:, 0] = pending window length (0: nothing pending),
                                    meta[:, 1:] = its parent array

Per step, per request row b: ``block_idx[b]`` (<= 0: a padding row, skipped, output zero) and
``accepted[b]``, the node of the PENDING window that was accepted (for vLLM's chains:
``num_accepted_tokens - 1``; ignored when nothing is pending). Call order per step:
``conv_spec_step`` (reads the pending metadata), then ``gdn_spec_step`` (replaces it). After a
prefill wrote a slot's state directly, call ``reset_slots``.

``store_all_step`` is the twin the tests compare against: vLLM's store-all semantics (1 + N
slots per request, every node's state written, the next step reading the accepted snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.ops.naive import naive_tree_commit, naive_tree_recurrent, naive_tree_verify
from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit
from treewy.tree import validate_parents

BACKENDS = ("naive", "kernels", "auto")


@dataclass
class ReconstructPools:
    """The per-layer pools of the reconstruct mode (shapes in the module docstring)."""

    state: torch.Tensor
    conv: torch.Tensor
    conv_x: torch.Tensor
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    meta: torch.Tensor

    @classmethod
    def empty(cls, slots: int, *, H: int, HV: int, K: int, V: int, C: int, W: int, max_nodes: int,
              state_dtype=torch.float32, conv_dtype=torch.float32, stash_dtype=torch.float32,
              device="cpu") -> ReconstructPools:
        z = dict(device=device)
        return cls(
            state=torch.zeros(slots, HV, V, K, dtype=state_dtype, **z),
            conv=torch.zeros(slots, C, W - 1, dtype=conv_dtype, **z),
            conv_x=torch.zeros(slots, max_nodes, C, dtype=conv_dtype, **z),
            u=torch.zeros(slots, max_nodes, HV, V, dtype=stash_dtype, **z),
            k=torch.zeros(slots, max_nodes, H, K, dtype=stash_dtype, **z),
            g=torch.zeros(slots, max_nodes, HV, dtype=stash_dtype, **z),
            meta=torch.zeros(slots, max_nodes + 1, dtype=torch.int32, **z),
        )

    @property
    def max_nodes(self) -> int:
        return self.u.shape[1]


def stash_shapes(*, H: int, HV: int, K: int, V: int, C: int, max_nodes: int) -> dict[str, tuple[int, ...]]:
    """Per-slot shapes of the stash tensors (what the plugin appends to vLLM's Mamba page)."""
    return {"conv_x": (max_nodes, C), "u": (max_nodes, HV, V), "k": (max_nodes, H, K),
            "g": (max_nodes, HV), "meta": (max_nodes + 1,)}


def _resolve_backend(backend: str, device: torch.device):
    if backend not in BACKENDS:
        raise ValueError(f"backend = {backend!r}: expected one of {BACKENDS}")
    if backend == "naive" or (backend == "auto" and device.type != "cuda"):
        return naive_tree_verify, naive_tree_commit
    import treewy.ops as ops

    verify, commit = getattr(ops, "tree_verify", None), getattr(ops, "tree_commit", None)
    if verify is None or commit is None:
        if backend == "auto":
            return naive_tree_verify, naive_tree_commit
        raise ValueError("backend = 'kernels' needs treewy.ops.tree_verify and treewy.ops.tree_commit; "
                         "this checkout lacks one of them: use backend='naive'")
    return verify, commit


def _check_rows(block_idx, accepted, B: int, pools: ReconstructPools):
    block_idx = torch.as_tensor(block_idx, device=pools.state.device).long()
    accepted = torch.as_tensor(accepted, device=pools.state.device).long()
    if tuple(block_idx.shape) != (B,):
        raise ValueError(f"block_idx has shape {tuple(block_idx.shape)}, expected [B] = [{B}] (one slot per row)")
    if accepted.ndim == 0:
        accepted = accepted.expand(B)
    if tuple(accepted.shape) != (B,):
        raise ValueError(f"accepted has shape {tuple(accepted.shape)}, expected [B] = [{B}]")
    valid = block_idx > 0
    slots = block_idx[valid]
    if slots.numel() and int(slots.max()) >= pools.state.shape[0]:
        raise ValueError(f"block_idx holds slot {int(slots.max())}, but the pools have {pools.state.shape[0]} slots")
    if slots.unique().numel() != slots.numel():
        raise ValueError("block_idx names one slot for two rows; every request owns its own slot")
    return valid, slots, accepted[valid]


def _parents_rows(parents, B: int, T: int, device) -> torch.Tensor:
    par = validate_parents(parents)
    if par.ndim == 1:
        par = par.expand(B, -1)
    if tuple(par.shape) != (B, T):
        raise ValueError(f"parents describe trees of {par.shape[-1]} nodes for {par.shape[0]} rows, "
                         f"but the inputs have B = {B}, T = {T}")
    return par.to(device)


def _pending(pools: ReconstructPools, slots: torch.Tensor, acc: torch.Tensor):
    """(has [n] bool, length, parents [n, Tp], accepted [n]) of the pending windows, Tp = longest."""
    meta = pools.meta[slots].long()                                 # [n, Tmax + 1]
    length = meta[:, 0]
    has = length > 0
    Tp = int(length.max()) if slots.numel() else 0
    par = meta[:, 1:1 + max(Tp, 1)].clone()
    # rows whose pending window is shorter than Tp: pad with nodes hanging off the root (never on a path)
    col = torch.arange(par.shape[1], device=par.device)
    par = torch.where(col[None] < length[:, None].clamp(min=1), par, torch.zeros_like(par))
    par[:, 0] = -1
    if bool((has & ((acc < 0) | (acc >= length))).any()):
        bad = torch.nonzero(has & ((acc < 0) | (acc >= length)))[0, 0]
        raise ValueError(f"accepted = {int(acc[bad])} for slot {int(slots[bad])}, but its pending window "
                         f"has {int(length[bad])} nodes; vLLM passes num_accepted_tokens - 1 (>= 0)")
    return has, Tp, par, acc.clamp(min=0, max=max(Tp - 1, 0))


def _folded_state(pools, slots, acc, commit_fn):
    """[n, HV, V, K]: the committed state with the pending window's accepted node folded in."""
    S = pools.state[slots]
    has, Tp, par, a = _pending(pools, slots, acc)
    if not bool(has.any()):
        return S
    i = torch.nonzero(has).flatten()
    u, k, g = pools.u[slots[i], :Tp], pools.k[slots[i], :Tp], pools.g[slots[i], :Tp]
    dt = u.dtype
    Sa = commit_fn(S[i].to(dt), u, k.to(dt), g.to(dt), par[i], a[i])
    S = S.clone()
    S[i] = Sa.to(S.dtype)
    return S


def _folded_conv(pools, slots, acc):
    """[n, C, W - 1]: the committed conv inputs with the pending window's accepted path appended."""
    hist = pools.conv[slots]
    has, Tp, par, a = _pending(pools, slots, acc)
    if not bool(has.any()):
        return hist
    i = torch.nonzero(has).flatten()
    x = pools.conv_x[slots[i], :Tp]
    hist = hist.clone()
    hist[i] = naive_tree_conv1d_commit(x, hist[i].to(x.dtype), par[i], a[i]).to(hist.dtype)
    return hist


def reset_slots(pools: ReconstructPools, slots) -> None:
    """Forget the pending window of these slots (after a prefill wrote their state directly)."""
    s = torch.as_tensor(slots, device=pools.meta.device).long()
    s = s[s > 0]
    pools.meta[s, 0] = 0


def fold_pending(pools: ReconstructPools, block_idx, accepted, backend: str = "naive") -> None:
    """Commit the pending window of every listed slot in place (state and conv), leaving nothing pending.

    The spec path never needs this (the fold happens inside the next verify); a caller that is
    about to read a slot's state by other means (a plain-decode kernel, a test) does.
    """
    B = torch.as_tensor(block_idx).numel()
    valid, slots, acc = _check_rows(block_idx, accepted, B, pools)
    if slots.numel() == 0:
        return
    _, commit_fn = _resolve_backend(backend, pools.state.device)
    S = _folded_state(pools, slots, acc, commit_fn)
    hist = _folded_conv(pools, slots, acc)
    pools.state[slots] = S
    pools.conv[slots] = hist
    pools.meta[slots, 0] = 0


def conv_spec_step(pools: ReconstructPools, block_idx, accepted, x, weight, parents, bias=None,
                   activation="silu") -> torch.Tensor:
    """y [B, T, C]: the tree conv of the window x [B, T, C] (raw conv inputs) of every row.

    Folds the pending window's accepted path into the committed conv inputs, writes them back,
    and stashes x as the new pending conv inputs. The pending metadata (length, parents) is left
    for ``gdn_spec_step`` to read and replace.
    """
    if x.ndim != 3:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected [B, T, C]")
    B, T, C = x.shape
    if T > pools.max_nodes:
        raise ValueError(f"the window has T = {T} nodes but the stash holds {pools.max_nodes}; "
                         "size the pools for 1 + num_speculative_tokens nodes")
    valid, slots, acc = _check_rows(block_idx, accepted, B, pools)
    par = _parents_rows(parents, B, T, x.device)
    y = x.new_zeros(B, T, C)
    if slots.numel() == 0:
        return y
    hist = _folded_conv(pools, slots, acc)                          # [n, C, W - 1]
    xv = x[valid]
    y[valid] = naive_tree_conv1d(xv, weight, hist.to(x.dtype), par[valid], bias=bias, activation=activation)
    pools.conv[slots] = hist
    pools.conv_x[slots, :T] = xv.to(pools.conv_x.dtype)
    return y


def gdn_spec_step(pools: ReconstructPools, block_idx, accepted, q, k, v, g, beta, parents, scale=None,
                  backend: str = "naive") -> torch.Tensor:
    """o [B, T, HV, V]: TreeWY verify of every row's window with the pending commit folded in.

    q, k [B, T, H, K] (after l2norm); v [B, T, HV, V]; g, beta [B, T, HV]; parents [T] or [B, T].
    Writes the folded state into the row's slot and stashes the window's u, k, g and parents.
    Padding rows (block_idx <= 0) get zero outputs and touch no slot.
    """
    B, T = q.shape[:2]
    if T > pools.max_nodes:
        raise ValueError(f"the window has T = {T} nodes but the stash holds {pools.max_nodes}; "
                         "size the pools for 1 + num_speculative_tokens nodes")
    valid, slots, acc = _check_rows(block_idx, accepted, B, pools)
    par = _parents_rows(parents, B, T, q.device)
    HV, V = v.shape[2], v.shape[3]
    o = q.new_zeros(B, T, HV, V)
    if slots.numel() == 0:
        return o
    verify_fn, commit_fn = _resolve_backend(backend, q.device)
    S0 = _folded_state(pools, slots, acc, commit_fn)                # [n, HV, V, K]
    qv, kv, vv, gv, bv, pv = q[valid], k[valid], v[valid], g[valid], beta[valid], par[valid]
    dt = pools.u.dtype if q.dtype != torch.float64 else torch.float64
    o_v, u = verify_fn(qv.to(dt), kv.to(dt), vv.to(dt), gv.to(dt), bv.to(dt), S0.to(dt), pv, scale=scale)
    o[valid] = o_v.to(o.dtype)
    pools.state[slots] = S0.to(pools.state.dtype)
    pools.u[slots, :T] = u.to(pools.u.dtype)
    pools.k[slots, :T] = kv.to(pools.k.dtype)
    pools.g[slots, :T] = gv.to(pools.g.dtype)
    pools.meta[slots, 0] = T
    pools.meta[slots, 1:T + 1] = pv.to(torch.int32)
    return o


def store_all_step(state_pool, conv_pool, state_indices, num_accepted, x, weight, make_qkvgb, parents,
                   bias=None, activation="silu", scale=None):
    """vLLM's store-all, for trees: the twin ``conv_spec_step`` + ``gdn_spec_step`` are compared to.

    state_pool [slots, HV, V, K]; conv_pool [slots, C, W - 1] (a snapshot per node, like SGLang's
    intermediate conv windows); state_indices [B, Tmax] (the request's 1 + N slots, column 0 <= 0
    marks a padding row); num_accepted [B]: the previous window's accepted node + 1 (its
    snapshot is in column num_accepted - 1). x [B, T, C] raw conv inputs; make_qkvgb(y) maps the
    conv output to (q, k, v, g, beta). Writes every node's state and conv window to its column.
    Returns (y [B, T, C], o [B, T, HV, V]).
    """
    B, T, C = x.shape
    par = _parents_rows(parents, B, T, x.device)
    idx = torch.as_tensor(state_indices, device=x.device).long()
    valid = idx[:, 0] > 0
    rows = torch.nonzero(valid).flatten()
    src = idx[rows, torch.as_tensor(num_accepted, device=x.device).long()[rows] - 1]
    y = x.new_zeros(B, T, C)
    hist = conv_pool[src]
    y[rows] = naive_tree_conv1d(x[rows], weight, hist.to(x.dtype), par[rows], bias=bias, activation=activation)
    for t in range(T):
        conv_pool[idx[rows, t]] = naive_tree_conv1d_commit(x[rows], hist.to(x.dtype), par[rows],
                                                           torch.full((rows.numel(),), t)).to(conv_pool.dtype)
    q, k, v, g, beta = make_qkvgb(y)
    o = q.new_zeros(B, T, v.shape[2], v.shape[3])
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    o_r, states = naive_tree_recurrent(q[rows].to(dt), k[rows].to(dt), v[rows].to(dt), g[rows].to(dt),
                                       beta[rows].to(dt), state_pool[src].to(dt), par[rows], scale=scale)
    o[rows] = o_r.to(o.dtype)
    for t in range(T):
        state_pool[idx[rows, t]] = states[:, t].to(state_pool.dtype)
    return y, o
