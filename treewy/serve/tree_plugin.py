"""The plugin's tree hooks: one small function per place where vLLM 0.26 runs a chain and a served tree must run
instead (treewy/serve/README.md, "Trees in vLLM 0.26"), each taking vLLM's own tensors in vLLM's layouts.

A served tree (``treewy serve --tree 2,2,1``: ``TREEWY_TREE``) runs as vLLM's chain of N = the tree's drafts, so the
scheduler reserves T = N + 1 slots per request, the drafts travel as N tokens per request in DFS order and every spec
row of a step is one window of T packed tokens. In the order of vLLM's step:

1. proposer: ``mtp_tree_drafts`` (the MTP head's top-w per level, from the level passes' logits) or
   ``ngram_tree_drafts`` (the n-gram tree on the host, where vLLM's own n-gram drafter runs) -> draft_token_ids [B, N];
2. ``tree_positions``: the window's RoPE positions by depth (vLLM writes num_computed + t; the KV slots stay t);
3. the model forward: ``tree_attention_spec`` for the softmax layers (prefix + the node's root..node path, over vLLM's
   paged KV), and in the GDN layers ``tree_conv`` (every node's conv over its own path, from the committed conv
   columns) then ``tree_spec_update`` (reconstruct: one state block per request, the previous window's accepted
   node folded into this verify from the slot's stash) or ``store_all_tree_update`` (N + 1 state blocks per request,
   one per node);
4. ``tree_rejection_sample``: ``accept_tree`` (or ``SyntheticAcceptance``) on the T logits of every request;
5. after acceptance, before the next forward: ``compact_tree_kv`` (the accepted path's K/V to consecutive slots),
   ``commit_tree_conv`` (the accepted path's last W - 1 conv inputs) and ``record_accepted`` (the node per slot, what
   the next fold and store-all's next read use); the scheduler advances each request by ``TreeAcceptance.length``.

Everything is pure torch over tensors built once per server (``TreeServing``), with no host sync, except the n-gram
drafter (host code, as vLLM's). On CUDA the GDN and attention hooks launch treewy's kernels; elsewhere they run the
readable references, which ``treewy.decode.generate`` runs too: so a CPU engine built from these hooks emits exactly
what ``generate`` emits (tests/test_serve_tree_plugin.py). The hooks assume full windows (every spec request T
tokens): vLLM cuts drafts only at a request's context end or the token budget.

What vLLM's classes call them is ``vllm_adapter``'s (names checked by ``vllm_names``); this module imports no vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from treewy.ops.gates import gdn_gating, l2norm
from treewy.ops.verify.pending import PendingCommit
from treewy.serve.launcher_command import DRAFTERS, ServeError, TREE_DRAFTER_ENV, TREE_ENV, TREE_RATES_ENV, parse_tree
from treewy.serve.reconstruct import ReconstructPools
from treewy.serve.tree_commit import commit_conv_state, kv_compaction, record_accepted, reset_accepted
from treewy.serve.tree_spec import (
    SyntheticAcceptance, TreeAcceptance, TreeLayout, accept_tree, propose_mtp_tree, propose_ngram_tree,
)
from treewy.tree import STATE_MODES

__all__ = ["TreeServing", "compact_tree_kv", "commit_tree_conv", "mtp_tree_drafts", "ngram_tree_drafts",
           "record_accepted", "reset_accepted", "store_all_tree_update", "tree_attention_spec", "tree_conv",
           "tree_drafter_from_env", "tree_from_env", "tree_positions", "tree_rejection_sample", "tree_spec_update"]


def tree_from_env(environ: Mapping[str, str] = os.environ) -> tuple[tuple[int, ...], tuple[float, ...] | None] | None:
    """(widths, per-depth synthetic rates or None) from the launcher's environment; None when no tree is served."""
    text = environ.get(TREE_ENV)
    if not text:
        return None
    try:
        widths = parse_tree(text, TREE_ENV)
    except ServeError as e:
        raise ValueError(str(e)) from None
    rates = environ.get(TREE_RATES_ENV)
    if not rates:
        return widths, None
    try:
        return widths, tuple(float(x) for x in rates.split(","))
    except ValueError:
        raise ValueError(f"{TREE_RATES_ENV}={rates!r}: expected comma-separated per-depth rates such as "
                         "0.9,0.7,0.5 (treewy serve --tree ... --acceptance writes them)") from None


def tree_drafter_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The served tree's drafter (one of ``DRAFTERS``), which the launcher sets beside TREEWY_TREE: it decides what
    the plugin must have installed (an n-gram tree needs no MTP passes)."""
    drafter = environ.get(TREE_DRAFTER_ENV)
    if drafter not in DRAFTERS:
        got = "unset" if drafter is None else f"{drafter!r}"
        raise ValueError(f"{TREE_DRAFTER_ENV} is {got}: expected one of {', '.join(DRAFTERS)} beside {TREE_ENV} "
                         "(treewy serve --tree ... --drafter sets both)")
    return drafter


class TreeServing:
    """What one server builds once for its tree: the layout on the device, the synthetic sampler (dummy weights),
    and ``slot_accepted`` (int32 [pool slots]: the accepted node of each slot's last window, -1 when nothing is
    pending), shared by the GDN layers of a KV-cache group, whose state slots are the same."""

    def __init__(self, widths, mode: str, num_slots: int, device="cpu", rates: Sequence[float] | None = None):
        if mode not in STATE_MODES:
            raise ValueError(f"mode = {mode!r}: expected one of {STATE_MODES}")
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 2:
            raise ValueError(f"num_slots = {num_slots!r}: expected the state pool's size, at least 2 (slot 0 is "
                             "vLLM's NULL block)")
        self.mode = mode
        self.layout = TreeLayout(widths, device)
        self.synthetic = None if rates is None else SyntheticAcceptance(self.layout, rates)
        self.slot_accepted = torch.full((num_slots,), -1, dtype=torch.int32, device=self.layout.device)

    @property
    def num_drafts(self) -> int:
        return self.layout.num_drafts


# ------------------------------------------------------------------------------------------------------------------
# 1. Proposer
# ------------------------------------------------------------------------------------------------------------------

def mtp_tree_drafts(level_logits: Sequence[torch.Tensor], layout: TreeLayout, roots: torch.Tensor) -> torch.Tensor:
    """draft_token_ids [B, N] int64 in DFS order from the MTP passes' logits (level d: [B, n_d, V] at the nodes of
    depth d; ``propose_mtp_tree``): what vLLM's proposer returns per request, N tokens."""
    return propose_mtp_tree(level_logits, layout, roots)[:, 1:]


def ngram_tree_drafts(contexts: Sequence[Sequence[int]], layout: TreeLayout, max_n: int = 4) -> torch.Tensor:
    """draft_token_ids [B, N] int64 on the host: the n-gram tree of every request's tokens so far (prompt and output,
    its last token the root), as ``treewy.drafters.NgramDrafter`` drafts it; -1 where there is no continuation
    (vLLM's sampler rejects a -1 draft). vLLM's n-gram proposer is host code too (``ngram_proposer.py``)."""
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence) or not contexts \
            or any(isinstance(c, (str, bytes)) or not isinstance(c, Sequence) or not c for c in contexts):
        raise ValueError("contexts must be a non-empty list of non-empty token-id lists (each request's tokens so "
                         "far, the root last)")
    cpu = TreeLayout(layout.widths, "cpu", layout.conv_width) if layout.device.type != "cpu" else layout
    L = max(len(c) for c in contexts)
    ctx = torch.zeros(len(contexts), L, dtype=torch.long)
    for b, c in enumerate(contexts):
        ctx[b, :len(c)] = torch.as_tensor(list(c), dtype=torch.long)
    lens = torch.tensor([len(c) for c in contexts])
    return propose_ngram_tree(ctx, lens, cpu, max_n)[:, 1:]


# ------------------------------------------------------------------------------------------------------------------
# 2. Positions
# ------------------------------------------------------------------------------------------------------------------

def tree_positions(positions: torch.Tensor, starts: torch.Tensor, layout: TreeLayout) -> None:
    """In place: the spec windows' positions become num_computed + depth(t). positions [num_tokens] as vLLM's runner
    wrote them (num_computed + t); starts int [B]: each window's first token (its root, at num_computed). The slot
    mapping, built before, keeps num_computed + t: siblings share a position, never a slot."""
    idx = starts.long()[:, None] + torch.arange(layout.num_nodes, device=starts.device)[None]    # [B, T]
    positions[idx] = positions[starts.long()][:, None] + layout.depth[None].to(positions.dtype)


# ------------------------------------------------------------------------------------------------------------------
# 3. The forward: softmax layers, then the GDN conv and step
# ------------------------------------------------------------------------------------------------------------------

def tree_attention_spec(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor, layout: TreeLayout, scale: float) -> torch.Tensor:
    """The softmax layers' attention of B full windows (the tree attention backend's forward): o [B * T, Hq, D].
    q [B * T, Hq, D] packed; k_cache, v_cache [num_blocks, block_size, Hkv, D] holding the window's K/V already
    (vLLM writes them at the slot mapping before attending); seq_lens [B] = committed prefix + T."""
    B, T = block_table.shape[0], layout.num_nodes
    prefix = (seq_lens[:B] - T).to(torch.int32)
    cu = (torch.arange(B + 1, device=q.device) * T).to(torch.int32)
    parents = layout.parents32[None].expand(B, -1)
    if q.is_cuda:
        from treewy.ops.attention.kernel import tree_attention
        return tree_attention(q, k_cache, v_cache, block_table.to(torch.int32), prefix, cu, parents, scale,
                              max_nodes=T, check_values=False)   # the engine's indices: no host read
    from treewy.ops.attention.naive import naive_tree_attention
    return naive_tree_attention(q, k_cache, v_cache, block_table, prefix, cu, parents, scale)


def _ops(device):
    from treewy.models.backends import get_ops
    return get_ops(device)


def tree_conv(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              slots: torch.Tensor, layout: TreeLayout, activation: str | None = "silu") -> torch.Tensor:
    """The GDN conv of B full windows, every node over its own root..node path (``treewy.ops`` tree_conv1d): y
    [B * T, C]. x [B * T, C] packed conv inputs; conv_state vLLM's pool [slots, C, state_len] (dim first), whose
    columns 0..W - 2 hold the committed inputs (where vLLM's prefill writes them and its plain-decode update reads
    them: ``causal_conv1d.py``, state_len = width - 1, offset 0); weight [C, W]; slots int [B]."""
    B, T, W1 = slots.shape[0], layout.num_nodes, layout.conv_width - 1
    committed = conv_state[slots.long(), :, :W1]                                     # [B, C, W - 1]
    y = _ops(x.device).tree_conv1d(x.reshape(B, T, -1).contiguous(), weight, committed, layout.parents32,
                                        bias, activation)
    return y.reshape(B * T, -1)


def _window_inputs(q, k, v, A_log, a, b, dt_bias, B: int, T: int, use_qk_l2norm_in_kernel: bool):
    """vLLM's packed spec inputs ([1, B * T, heads, dim], raw gates [B * T, HV]) as [B, T, ...] windows: q, k
    l2-normalized (when vLLM asks the kernel to), v fp32, g and beta as its fused gating computes them; the same
    transforms ``treewy.models.layers.gdn_inputs`` applies, so the references here equal generate's numbers."""
    def win(x):
        return x.reshape(B, T, *x.shape[-2:])
    q, k = win(q[0]), win(k[0])
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g, beta = gdn_gating(A_log, a[: B * T], b[: B * T], dt_bias)   # vLLM passes every row's gates, spec rows first
    return (q.contiguous(), k.contiguous(), win(v[0]).float().contiguous(), g.reshape(B, T, -1).contiguous(),
            beta.reshape(B, T, -1).contiguous())


def _accepted(serving: TreeServing, slots: torch.Tensor, accepted) -> torch.Tensor:
    """int32 [B]: the previous window's accepted node per request (-1: nothing pending, and for slots <= 0), given
    (vLLM: from its num_accepted_tokens) or read from ``serving.slot_accepted`` at the slots."""
    acc = serving.slot_accepted[slots.clamp(min=0)] if accepted is None else accepted[: slots.shape[0]]
    return torch.where(slots > 0, acc.to(torch.int32), -1)


def _packed_windows(B: int, T: int, *xs):
    """vLLM's packed spec inputs [1, B * T, heads, dim] as contiguous [B, T, heads, dim] windows, in their dtype (no
    copy where they are contiguous already)."""
    return [x[0].reshape(B, T, *x.shape[-2:]).contiguous() for x in xs]


def tree_spec_update(pools: ReconstructPools, serving: TreeServing, *, A_log, a, b, dt_bias, q, k, v, cu_seqlens,
                     ssm_state_indices, use_qk_l2norm_in_kernel=True, accepted=None, kernels: bool | None = None,
                     **_) -> tuple[torch.Tensor, None]:
    """Reconstruct: stands in for vLLM's spec kernel (its keywords, ``vllm_adapter.SPEC_UPDATE_PARAMS``) on a tree
    window. Per request, its one slot (column 0 of ssm_state_indices): the previous window's accepted node is folded
    from the slot's stash into the state (``pending_commit``), the tree is verified from it, and the window's u, raw
    keys and g replace the stash (keys normalized where they are read, as the chain step keeps them). ``accepted``
    int [B]: that node per request (-1: nothing pending); None: read from ``serving.slot_accepted``. ``kernels``:
    None (on CUDA) or True: three launches on the pools in place, the gates (``gdn_gating_fwd``), the verify with the
    fold inside and q, k normalized in it, the stash (``stash_window_fwd``); on a CPU they run under the Triton
    interpreter. False: the torch references over the requests' rows. Returns (o [1, B * T, HV, V], None)."""
    lay = serving.layout
    B, T = cu_seqlens.shape[0] - 1, lay.num_nodes
    acc = _accepted(serving, ssm_state_indices[:B, 0], accepted)
    pk, pg = pools.k[:, 0], pools.g[:, 0]      # a tree's window lives in the stash's half 0 (tree_vllm's meta word)
    l2 = use_qk_l2norm_in_kernel
    if q.is_cuda if kernels is None else kernels:   # the pools in place: three launches
        from treewy.ops.gates_kernel import gdn_gating_fwd
        from treewy.ops.verify.kernel import tree_verify_fwd
        from treewy.ops.verify.stash import stash_window_fwd
        slots = ssm_state_indices[:B, 0].to(torch.int32)
        qw, kw, vw = _packed_windows(B, T, q, k, v)
        g, beta = (x.reshape(B, T, -1) for x in gdn_gating_fwd(A_log, a[: B * T], b[: B * T], dt_bias))
        pend = PendingCommit(pools.u, pk, pg, lay.parents32, acc, l2)   # one topology: [T], batch stride 0
        o, u = tree_verify_fwd(qw, kw, vw, g, beta, pools.state, lay.parents32, 0, kw.shape[-1] ** -0.5, l2,
                               pending=pend, state_indices=slots, max_depth=lay.max_depth)
        stash_window_fwd(u, kw, g, slots, pools.u, pk, pg)
        return o.reshape(1, B * T, *o.shape[-2:]), None
    slots = ssm_state_indices[:B, 0].long()      # the references over the requests' rows, written back
    qn, kn, vw, g, beta = _window_inputs(q, k, v, A_log, a, b, dt_bias, B, T, l2)
    state = pools.state[slots]
    pend = PendingCommit(pools.u[slots], pk[slots], pg[slots], lay.parents32, acc, l2)
    o, u = _ops(q.device).tree_step(qn, kn, vw, g, beta, state, lay.parents32, pend, lay.max_depth)
    pools.state[slots] = state
    pools.u[slots], pk[slots], pg[slots] = u, k[0].reshape(B, T, *k.shape[-2:]), g    # the stash's dtypes
    return o.reshape(1, B * T, *o.shape[-2:]).to(v.dtype), None


def store_all_tree_update(state_pool: torch.Tensor, serving: TreeServing, *, A_log, a, b, dt_bias, q, k, v,
                          cu_seqlens, ssm_state_indices, use_qk_l2norm_in_kernel=True, accepted=None,
                          kernels: bool | None = None, **_) -> tuple[torch.Tensor, None]:
    """Store-all, the baseline: N + 1 state blocks per request (ssm_state_indices [B, >= T], one per node). The
    window starts from the block of the previous window's accepted node (column 0 after a prefill; ``accepted`` as
    for ``tree_spec_update``), every node's state is written to its own block. ``kernels`` None (on CUDA) or True:
    two launches, the gates and the store-all kernel reading and writing the blocks in place (as vLLM's store-all
    kernel does for chains; rows whose first block is <= 0 skipped); False: the torch reference over the requests'
    blocks. Returns (o [1, B * T, HV, V], None)."""
    lay = serving.layout
    B, T = cu_seqlens.shape[0] - 1, lay.num_nodes
    start = _accepted(serving, ssm_state_indices[:B, 0], accepted).clamp(min=0)
    if q.is_cuda if kernels is None else kernels:
        from treewy.ops.gates_kernel import gdn_gating_fwd
        from treewy.ops.store_all.kernel import store_all_verify_fwd
        qw, kw, vw = _packed_windows(B, T, q, k, v)
        g, beta = (x.reshape(B, T, -1) for x in gdn_gating_fwd(A_log, a[: B * T], b[: B * T], dt_bias))
        blocks = ssm_state_indices[:B, :T]
        blocks = blocks if blocks.dtype == torch.int32 else blocks.to(torch.int32)
        o, _ = store_all_verify_fwd(qw, kw, vw, g, beta, state_pool, lay.parents32, 0, kw.shape[-1] ** -0.5,
                                    use_qk_l2norm_in_kernel, blocks=blocks, start=start)
        return o.reshape(1, B * T, *o.shape[-2:]), None
    blocks = ssm_state_indices[:B, :T].long()
    qw, kw, vw, g, beta = _window_inputs(q, k, v, A_log, a, b, dt_bias, B, T, use_qk_l2norm_in_kernel)
    S0 = state_pool[blocks.gather(1, start.long()[:, None])[:, 0]]
    o, states = _ops(q.device).store_all_verify(qw, kw, vw, g, beta, S0, lay.parents32)
    state_pool[blocks] = states.to(state_pool.dtype)
    return o.reshape(1, B * T, *o.shape[-2:]).to(v.dtype), None


# ------------------------------------------------------------------------------------------------------------------
# 4. Rejection sampler
# ------------------------------------------------------------------------------------------------------------------

def tree_rejection_sample(serving: TreeServing, draft_token_ids: torch.Tensor, target_logits: torch.Tensor,
                          temperature=0.0, *, generator: torch.Generator | None = None) -> TreeAcceptance:
    """What the plugin's sampler returns in place of vLLM's chain rejection sampler. draft_token_ids [B * N] (vLLM's
    SpecDecodeMetadata.draft_token_ids, DFS order); target_logits [B * T, V] (the logits at its logits_indices, after
    vLLM's sampling constraints). Node t is checked against its parent's row (a chain checks draft i against row
    i - 1); under synthetic acceptance the per-depth rates decide. ``output_token_ids`` [B, D + 1] is vLLM's
    sampled_token_ids (-1 padded): the runner counts length = depth(accepted) + 1 tokens from it."""
    lay = serving.layout
    T = lay.num_nodes
    B = target_logits.shape[0] // T
    if target_logits.ndim != 2 or target_logits.shape[0] != B * T or draft_token_ids.numel() != B * (T - 1):
        raise ValueError(f"a tree step needs full windows: target_logits [B * T, V] with T = {T} and "
                         f"draft_token_ids [B * N] with N = {T - 1}, got {tuple(target_logits.shape)} and "
                         f"{tuple(draft_token_ids.shape)}")
    logits = target_logits.reshape(B, T, -1)
    draft = torch.cat([torch.full((B, 1), 0, dtype=torch.long, device=logits.device),   # the root: never checked
                       draft_token_ids.reshape(B, T - 1).long()], 1)
    if serving.synthetic is not None:
        return serving.synthetic(draft, logits, generator=generator)
    return accept_tree(logits, draft, lay, temperature, generator=generator)


# ------------------------------------------------------------------------------------------------------------------
# 5. After acceptance
# ------------------------------------------------------------------------------------------------------------------

def compact_tree_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    num_computed: torch.Tensor, acc: TreeAcceptance, layout: TreeLayout,
                    live: torch.Tensor | None = None) -> None:
    """In place, one softmax layer: each window's accepted path's K/V from num_computed + path[j] to
    num_computed + j, the slots the scheduler now counts as committed (rows with ``live`` False move nothing).
    k_cache, v_cache [num_blocks, block_size, Hkv, D], any strides (the two views of FlashAttention's packed cache,
    ``vllm_adapter.split_kv_cache``, or the halves of a [2, num_blocks, ...] cache); block_table [B, blocks] and
    num_computed [B]: the windows' rows. ``compact_accepted_kv`` on CUDA, ``kv_compaction``'s slots elsewhere."""
    if k_cache.is_cuda:
        from treewy.ops.attention.kernel import compact_accepted_kv
        B = num_computed.shape[0]
        length = acc.length if live is None else acc.length * live.long()
        cu = (torch.arange(B + 1, device=num_computed.device) * layout.num_nodes).to(torch.int32)
        compact_accepted_kv(k_cache, v_cache, block_table.to(torch.int32), num_computed.to(torch.int32), cu,
                            acc.path.clamp(min=0).to(torch.int32), length.to(torch.int32),
                            check_values=False)   # the engine's indices: no host read each step
        return
    bs = k_cache.shape[1]
    src, dst = kv_compaction(layout, acc, num_computed, block_table, bs, live)
    for cache in (k_cache, v_cache):   # the right side gathers every source before any slot is written
        cache[dst // bs, dst % bs] = cache[src // bs, src % bs]


def commit_tree_conv(conv_state: torch.Tensor, x: torch.Tensor, slots: torch.Tensor, layout: TreeLayout,
                     accepted: torch.Tensor) -> None:
    """In place: the committed conv columns 0..W - 2 of each slot become the last W - 1 inputs on root..accepted.
    x [B * T, C]: the window's conv inputs, as ``tree_conv`` received them."""
    W1, s = layout.conv_width - 1, slots.long()
    B = s.shape[0]
    new = commit_conv_state(conv_state[s, :, :W1], x.reshape(B, layout.num_nodes, -1), layout, accepted)
    conv_state[s, :, :W1] = new.to(conv_state.dtype)

