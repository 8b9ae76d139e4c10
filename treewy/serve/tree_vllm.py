"""The tree hooks of ``tree_plugin`` installed into vLLM 0.26 (issue 30, steps 1d to 1g): every vLLM name through
``vllm_adapter`` (checked per release by ``vllm_names``), every replaced function kept so that ``uninstall()`` puts
vLLM's back. Installed, in the order of vLLM's step:

1. positions: ``GPUModelRunner._prepare_inputs`` runs, then every full window's positions (and M-RoPE's three rows)
   become num_computed + depth (``tree_positions``); the slot mapping, built before, keeps num_computed + t;
2. the GDN layer's spec rows: its module's ``causal_conv1d_update`` spec call becomes ``tree_vllm_conv`` and its
   ``fused_sigmoid_gating_delta_rule_update`` spec call ``tree_spec_update`` (reconstruct, the layer's pools) or
   ``store_all_tree_update`` (vLLM's N + 1 blocks per request);
3. ``RejectionSampler.forward`` becomes ``tree_rejection_sample`` (synthetic per depth with TREEWY_TREE_RATES);
4. after the sampler (``GPUModelRunner._update_states_after_model_execute``): vLLM's per-request
   ``num_accepted_tokens`` becomes the accepted node + 1 (a chain's length, a tree's node), which vLLM moves with the
   request's row and hands to the GDN layers next step; that is all the GDN layers need to commit.

5. the softmax layers: the impl forward of each backend in ``vllm_adapter.TREE_ATTN_BACKENDS`` (FlashAttention's,
   and Triton's, which vLLM picks for fp32) runs the tree attention op on the full windows
   (``tree_window_attention``: prefix = seq_lens - T, vLLM's block table and query_start_loc, the layout's parents);
6. after the sampler, the KV compaction of every softmax layer on those backends (``compact_tree_kv``: the accepted
   path from num_computed + path[j] to num_computed + j, with its KV-cache group's block table), before the next
   step writes;
7. the n-gram drafter: ``NgramProposer.propose`` drafts the tree on the host (``ngram_tree_drafts``), N tokens per
   request in DFS order, -1 where nothing continues (the runner's input ids see 0 there; the sampler sees -1);
8. the MTP drafter: ``SpecDecodeBaseProposer.propose`` runs vLLM's first pass with each window's accepted path
   first (``accepted_first``; its ``_sample_draft_tokens`` hands over the root entries' MTP outputs), then
   ``tree_mtp.mtp_tree_passes``, every pass the drafter's model forward with ``DraftPass`` metadata (its attention:
   ``draft_pass_attention``, through the same attention overrides) and no slot mapping, so no draft K/V is written;
9. the memory profile: while ``GPUModelRunner._dummy_sampler_run`` warms the rejection sampler (one draft per
   request), the tree sampler samples that many full windows of random logits instead, so that the KV cache is sized
   with a tree step's sampler memory in hand.

The previous window's commit happens in the next forward, inside the graph: the GDN state's pending fold (as for
chains; reconstruct's ``meta`` says whether anything is pending), and the conv state's. vLLM's conv pool holds
W - 1 + N columns per slot: after a window, columns 0..W - 2 hold the committed inputs advanced by the root (always
accepted) and columns W - 1.. the inputs of nodes 1..N, so the next step's fold is one gather: fold, conv and stash
are one launch (``tree_conv_update_fwd``, reference ``naive_tree_conv_update``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch

from treewy.ops.conv import naive_tree_conv_update
from treewy.ops.verify.tuning import pin_first_configs
from treewy.serve import vllm_adapter as adapter
from treewy.serve.tree_plugin import (
    TreeServing, compact_tree_kv, ngram_tree_drafts, store_all_tree_update, tree_attention_spec,
    tree_from_env, tree_positions, tree_rejection_sample, tree_spec_update,
)
from treewy.serve.tree_mtp import TreePasses, mtp_tree_passes
from treewy.serve.tree_spec import TreeAcceptance, TreeLayout
from treewy.serve.tree_trace import (
    TreeTrace, leftmost_path_rows, pools_on_copies, spec_window_paths, stock_conv_on_copies, stock_spec_on_copies,
)

_INSTALLED: list[tuple[object, object]] = []   # (restore function, vLLM's original), in install order


@dataclass(frozen=True)
class _Windows:
    """A step's full tree windows, from ``_prepare_inputs``: their requests (device int64 [n]), each one's committed
    prefix (num_computed, device int64 [n]), whether every request of the step is one, and the step's requests."""
    rows: torch.Tensor
    num_computed: torch.Tensor
    all_full: bool
    num_reqs: int


class _Runtime:
    """What the installed hooks share in one process: the tree, one TreeServing per device, the last acceptance."""

    def __init__(self, widths, mode: str, rates):
        self.widths, self.mode, self.rates = tuple(widths), mode, rates
        self._serving: dict[torch.device, TreeServing] = {}
        self.last_accepted: torch.Tensor | None = None   # int64 [B]: the sampler's accepted node per request
        self.windows: _Windows | None = None             # this step's full windows (``_prepare_inputs``)
        self.last_windows: tuple | None = None           # (rows, TreeAcceptance): what the compaction moves
        self.drafter_windows: tuple | None = None        # the same, for the MTP drafter's first pass
        self.drafting = False                            # inside the MTP drafter's propose
        self.profiling = False                           # inside vLLM's memory profile of the samplers
        self.first_pass: list | None = None              # the first pass's root outputs, while propose runs it
        self._passes: dict[torch.device, TreePasses] = {}
        self.trace: TreeTrace | None = None              # TREEWY_TREE_TRACE: the first windows against vLLM's ops

    def serving(self, device) -> TreeServing:
        device = torch.device(device)
        if device not in self._serving:
            _not_capturing("the tree's tables")
            self._serving[device] = TreeServing(self.widths, self.mode, 2, device, self.rates)
        return self._serving[device]

    def passes(self, device) -> TreePasses:
        device = torch.device(device)
        if device not in self._passes:
            _not_capturing("the MTP tree passes' tables")
            self._passes[device] = TreePasses(self.serving(device).layout)
        return self._passes[device]


def _not_capturing(what: str) -> None:
    """The tables are built on first use with host-to-device copies, which a CUDA-graph capture refuses; vLLM 0.26's
    profile run (its sampler run) builds them before any capture, with or without --kv-cache-memory-bytes."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} were first needed inside a CUDA-graph capture, before vLLM's profile run built "
                           "them (a vLLM release whose start-up order differs from 0.26's): serve with "
                           "--enforce-eager, or build them first with tree_vllm.RUNTIME.serving(device)")


RUNTIME: _Runtime | None = None


def _replace(get, set_, owner, fn) -> None:
    original = get(owner)
    set_(owner, fn)
    _INSTALLED.append((lambda: set_(owner, original), original))


def install(mode: str, *, active_pools=lambda: None, environ=os.environ) -> None:
    """Install the hooks above for the tree of ``environ`` (TREEWY_TREE, TREEWY_TREE_RATES) in ``mode``.
    ``active_pools()``: the ReconstructPools of the GDN layer running now (reconstruct; None outside one)."""
    global RUNTIME
    tree = tree_from_env(environ)
    if tree is None:
        raise ValueError("tree_vllm.install needs TREEWY_TREE (treewy serve --tree W1,W2,... sets it)")
    uninstall()
    RUNTIME = _Runtime(tree[0], mode, tree[1])
    RUNTIME.trace = TreeTrace.from_env(environ)
    pin_first_configs(True)   # no config timing over vLLM's pools, in or out of its graphs
    gdn = adapter.gdn_module()
    _replace(adapter.conv_update, adapter.set_conv_update, gdn, _conv_route(adapter.conv_update(gdn), active_pools))
    _replace(adapter.spec_update, adapter.set_spec_update, gdn, _spec_route(adapter.spec_update(gdn), active_pools))
    sampler = adapter.sampler_class()
    _replace(lambda c: c.__dict__[adapter.SAMPLER_FORWARD], lambda c, f: setattr(c, adapter.SAMPLER_FORWARD, f),
             sampler, _sampler_forward)
    runner = adapter.runner_class()
    for cls, name, wrap in ((runner, adapter.PREPARE_INPUTS, _prepare_inputs),
                            (runner, adapter.AFTER_SAMPLE, _after_sample),
                            (runner, adapter.DUMMY_SAMPLER_RUN, _profiled),
                            *((impl, adapter.ATTN_FORWARD, _attention_forward)
                              for impl in adapter.attention_impl_classes()),
                            (adapter.ngram_proposer_class(), adapter.NGRAM_PROPOSE, lambda stock: _ngram_propose),
                            (adapter.proposer_class(), adapter.PROPOSE, _mtp_propose),
                            (adapter.proposer_class(), adapter.SAMPLE_DRAFT, _first_pass_sample)):
        _replace(lambda c, n=name: c.__dict__[n], lambda c, f, n=name: setattr(c, n, f), cls, wrap(cls.__dict__[name]))


def uninstall() -> None:
    """Put back every vLLM function ``install`` replaced."""
    global RUNTIME
    while _INSTALLED:
        _INSTALLED.pop()[0]()
    RUNTIME = None
    pin_first_configs(False)


def installed() -> list:
    """vLLM's originals that the installed hooks stand in for (for tests)."""
    return [original for _, original in _INSTALLED]


# ------------------------------------------------------------------------------------------------------------------
# The GDN layer's spec rows
# ------------------------------------------------------------------------------------------------------------------

def tree_vllm_conv(layout: TreeLayout, x, conv_state, weight, bias=None, activation=None, *, conv_state_indices,
                   num_accepted_tokens, kernels: bool | None = None, **_) -> torch.Tensor:
    """vLLM's spec-row ``causal_conv1d_update`` on a tree window (its arguments): fold the previous window's
    accepted path (node = num_accepted_tokens - 1), every node's conv over its own path, stash this window. x
    [n, C] packed (n >= B * T: rows past B * T are padding and come back 0); conv_state [slots, C, W - 1 + N].
    ``kernels`` None (on CUDA) or True: one launch (``tree_conv_update_fwd``; on a CPU under the Triton
    interpreter); False: its reference ``naive_tree_conv_update``."""
    B, T = conv_state_indices.shape[0], layout.num_nodes
    if conv_state.shape[-1] < layout.conv_width - 2 + T:
        raise ValueError(f"conv_state has {conv_state.shape[-1]} columns per slot: a served tree needs W - 1 + N = "
                         f"{layout.conv_width - 2 + T} (num_speculative_tokens = N = {T - 1}; treewy serve --tree "
                         "sets it)")
    act = "silu" if activation is True else (activation or None)
    node = num_accepted_tokens[:B] - 1
    if x.is_cuda if kernels is None else kernels:
        from treewy.ops.conv.kernel import tree_conv_update_fwd
        y = tree_conv_update_fwd(x[: B * T].contiguous(), conv_state, weight, bias, conv_state_indices,
                                 node.to(torch.int32), layout.parents32, layout.conv_src32, act)
    else:
        y = naive_tree_conv_update(x[: B * T], conv_state, weight, bias, conv_state_indices, node, layout.parents32,
                                   layout.conv_src, act)
    if x.shape[0] == B * T:
        return y
    return torch.cat([y, y.new_zeros(x.shape[0] - B * T, y.shape[1])])


def _conv_route(stock, active_pools):
    def conv_update(*args, **kwargs):
        if RUNTIME is None or kwargs.get(adapter.NUM_ACCEPTED) is None:
            return stock(*args, **kwargs)
        layout = RUNTIME.serving(args[0].device).layout
        ref = stock_conv_on_copies(stock, args, kwargs) if _tracing() else None
        pools = active_pools() if ref is not None and RUNTIME.mode == "reconstruct" else None
        slots = kwargs[adapter.CONV_SLOTS]
        if pools is not None:
            RUNTIME.trace.page({"conv": args[1], **{n: getattr(pools, n) for n in ("state", "u", "k", "g", "meta")}})
            RUNTIME.trace.untouched("conv", args[1:2], pools.meta)
        y = tree_vllm_conv(layout, *args, **kwargs)
        if ref is not None:
            previous = kwargs[adapter.NUM_ACCEPTED] - 1
            RUNTIME.trace.compare("conv", y, ref, spec_window_paths(slots.shape[0], layout, y.device, previous))
        if pools is not None:
            RUNTIME.trace.leave("conv", slots, args[1:2])
        return y
    return conv_update


def _tracing() -> bool:
    """Whether this step's full windows are traced (TREEWY_TREE_TRACE, one of its first steps, no capture)."""
    return RUNTIME.trace is not None and RUNTIME.windows is not None and RUNTIME.trace.active


def tree_vllm_spec_update(serving: TreeServing, pools, **kwargs):
    """vLLM's spec-row kernel call on a tree window: ``tree_spec_update`` over the layer's pools (reconstruct: the
    stash's ``meta`` says whether a window is pending, vLLM's num_accepted_tokens - 1 is its accepted node) or
    ``store_all_tree_update`` over vLLM's state pool (the window starts from block num_accepted_tokens - 1)."""
    num_acc = kwargs[adapter.NUM_ACCEPTED]
    B = kwargs["cu_seqlens"].shape[0] - 1
    node = (num_acc[:B] - 1).to(torch.int32)
    if serving.mode == "store_all":
        return store_all_tree_update(kwargs[adapter.SPEC_INITIAL_STATE], serving, accepted=node, **kwargs)
    slots = kwargs["ssm_state_indices"][:B, 0].long().clamp(min=0)
    pending = pools.meta[slots, 0] > 0
    out = tree_spec_update(pools, serving, accepted=torch.where(pending, node, -1), **kwargs)
    # a Python number assigned through an index tensor is a host tensor copied to the device, which a CUDA-graph
    # capture refuses (it stopped every reconstruct tree server in vLLM's capture, 2026-12-04): the value goes in
    # as a kernel argument instead
    pools.meta[:, 0].index_fill_(0, slots, serving.layout.num_nodes)
    return out


def _spec_route(stock, active_pools):
    def spec_update(*args, **kwargs):
        if RUNTIME is None or args or kwargs.get(adapter.NUM_ACCEPTED) is None:
            return stock(*args, **kwargs)
        pools = active_pools() if RUNTIME.mode == "reconstruct" else None
        if RUNTIME.mode == "reconstruct" and pools is None:
            return stock(*args, **kwargs)
        serving = RUNTIME.serving(kwargs["q"].device)
        if _tracing() and pools is not None:
            return _traced_reconstruct(serving, pools, kwargs)
        ref = stock_spec_on_copies(stock, kwargs) if _tracing() else None
        out = tree_vllm_spec_update(serving, pools, **kwargs)
        if ref is not None:
            B = kwargs["cu_seqlens"].shape[0] - 1
            RUNTIME.trace.compare("gdn", out[0][0], ref, spec_window_paths(B, serving.layout, ref.device))
        return out
    return spec_update


def _traced_reconstruct(serving: TreeServing, pools, kwargs):
    """Reconstruct's traced GDN step: are its slots as its previous call left them, and does the served step equal
    its torch references run on copies of them (``tree_trace``'s gdn_untouched and gdn_reference records)?"""
    B, T = kwargs["cu_seqlens"].shape[0] - 1, serving.layout.num_nodes
    slots = kwargs["ssm_state_indices"][:B, 0]
    parts = (pools.state, pools.u, pools.k, pools.g)
    RUNTIME.trace.untouched("gdn", parts, pools.meta)
    copies, own = pools_on_copies(pools, slots)
    meta_before = copies.meta[1:, 0].clone()
    out = tree_vllm_spec_update(serving, pools, **kwargs)
    ref = tree_vllm_spec_update(serving, copies, **{**kwargs, "ssm_state_indices": own[:, None].expand(-1, T),
                                                    "kernels": False})
    RUNTIME.trace.reference(out[0][0], ref[0][0], pools, copies, slots, T, meta_before)
    RUNTIME.trace.leave("gdn", slots, parts)
    return out


# ------------------------------------------------------------------------------------------------------------------
# The sampler and the runner
# ------------------------------------------------------------------------------------------------------------------

def _draw_groups(rows: np.ndarray, generators: dict) -> list:
    """[(positions into ``rows``, generator)]: the requests without a generator of their own together (None: the
    device's global generator), then each that has one (vLLM's ``seed``) alone with it, as vLLM's rejection sampler
    draws a seeded request's numbers row by row, so that they do not depend on the batch."""
    own = [j for j, r in enumerate(rows.tolist()) if r in generators]
    rest = np.setdiff1d(np.arange(rows.size), own)
    alone = [(np.array([j]), generators[int(rows[j])]) for j in own]
    return [(rest, None), *alone] if rest.size else alone


def _in_window_order(parts: list, order: np.ndarray) -> TreeAcceptance:
    """One TreeAcceptance from ``parts``, whose rows, concatenated, are the windows ``order``."""
    inv = torch.as_tensor(np.argsort(order), device=parts[0].accepted.device)
    return TreeAcceptance(*(torch.cat([getattr(p, f.name) for p in parts])[inv] for f in dataclasses.fields(parts[0])))


def _sampler_forward(self, metadata, draft_probs, logits, sampling_metadata):
    """RejectionSampler.forward for a served tree: requests with N drafts are tree windows (``tree_rejection_sample``
    on their T logits); requests with none (a prefill's last chunk) sample their one logit (greedy at temperature 0,
    else from the softmax at their temperature). A request with its own generator (vLLM's per-request ``seed``)
    draws everything random from it, alone; the others in one call from the global generator. Sampled tokens
    [B, D + 1], -1 padded; no logprobs. In vLLM's memory profile (one draft per request) it samples B full windows of
    random logits instead."""
    serving = RUNTIME.serving(logits.device)
    drafts, counts = adapter.spec_drafts(metadata)
    N, D = serving.num_drafts, serving.layout.max_depth
    if RUNTIME.profiling:
        counts = [N] * len(counts)
        drafts = torch.zeros(len(counts) * N, dtype=torch.int32, device=logits.device)
        logits = torch.randn(len(counts) * (N + 1), logits.shape[-1], dtype=logits.dtype, device=logits.device)
    bad = [c for c in counts if c not in (0, N)]
    if bad:
        raise ValueError(f"a served tree verifies full windows: {N} drafts per request or none, got {bad[0]} (vLLM "
                         "cuts drafts at a request's context end: serve with max_model_len beyond it)")
    temp = adapter.temperature(sampling_metadata)
    gens = {} if isinstance(temp, float) else adapter.generators(sampling_metadata)   # greedy requests have none
    dev = logits.device
    rows = np.repeat(np.arange(len(counts)), np.asarray(counts) + 1)
    tree = np.flatnonzero(np.asarray(counts) == N)
    out = torch.full((len(counts), D + 1), -1, dtype=torch.int32, device=dev)
    accepted = torch.zeros(len(counts), dtype=torch.int64, device=dev)
    if tree.size:
        draft = drafts.long().reshape(tree.size, N)
        parts, order = [], []
        for js, g in _draw_groups(tree, gens):
            win = logits[torch.as_tensor(np.flatnonzero(np.isin(rows, tree[js])), device=dev)].float()
            t = temp if isinstance(temp, float) else temp[torch.as_tensor(tree[js], device=dev)]
            parts.append(tree_rejection_sample(serving, draft[torch.as_tensor(js, device=dev)].reshape(-1), win, t,
                                               generator=g))
            order.append(js)
        acc = parts[0] if len(parts) == 1 else _in_window_order(parts, np.concatenate(order))
        at = torch.as_tensor(tree, device=dev)
        out[at], accepted[at] = acc.output_token_ids.to(torch.int32), acc.accepted
        RUNTIME.last_windows = (at, acc)
        if _tracing() and not RUNTIME.profiling:
            win = logits[torch.as_tensor(np.flatnonzero(np.isin(rows, tree)), device=dev)]
            RUNTIME.trace.sample(win.reshape(tree.size, N + 1, -1), draft, acc.accepted, out[at])
    plain = np.flatnonzero(np.asarray(counts) == 0)
    if plain.size:
        pl = logits[torch.as_tensor(np.flatnonzero(np.isin(rows, plain)), device=dev)].float()
        at = torch.as_tensor(plain, device=dev)
        if isinstance(temp, float):
            out[at, 0] = pl.argmax(-1).to(torch.int32)
        else:
            tp = temp[at].float()
            probs = torch.softmax(pl / tp.clamp(min=1e-6)[:, None], -1)
            for js, g in _draw_groups(plain, gens):
                # one row's multinomial is one exponential draw over the vocabulary, the draw vLLM's own sampler
                # makes per seeded row and its runner rewinds when it discards a partial prefill's token
                sel = torch.as_tensor(js, device=dev)
                drawn = torch.multinomial(probs[sel], 1, generator=g)[:, 0]
                out[at[sel], 0] = torch.where(tp[sel] > 0, drawn, pl[sel].argmax(-1)).to(torch.int32)
    RUNTIME.last_accepted = accepted
    return adapter.sampler_output(out)


def _profiled(stock):
    def dummy_sampler_run(self, hidden_states):
        """vLLM's profile of the samplers, leaving no acceptance behind: the first real step after it must not
        read the profile's windows as its own (on the H200 its MTP drafter did, 2026-12-02)."""
        saved = RUNTIME.last_accepted, RUNTIME.last_windows
        RUNTIME.profiling = True
        try:
            return stock(self, hidden_states)
        finally:
            RUNTIME.profiling = False
            RUNTIME.last_accepted, RUNTIME.last_windows = saved
    return dummy_sampler_run


def _prepare_inputs(stock):
    def prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = stock(self, scheduler_output, num_scheduled_tokens)
        RUNTIME.windows = None
        spec = result[1]
        if spec is not None:
            _, counts = adapter.spec_drafts(spec)
            positions = adapter.runner_positions(self)
            dev = positions[0].device
            layout = RUNTIME.serving(dev).layout
            n = len(counts)
            full = (np.asarray(counts) == layout.num_drafts) & (np.asarray(num_scheduled_tokens[:n]) ==
                                                                layout.num_nodes)
            starts = torch.as_tensor(np.asarray(adapter.runner_starts(self, n))[full], device=dev).long()
            RUNTIME.windows = _Windows(torch.as_tensor(np.flatnonzero(full), device=dev), positions[0][starts].long(),
                                       bool(full.all()), n)
            if full.any():
                for p in positions:
                    tree_positions(p, starts, layout)
                # a node with nothing drafted (-1, which the sampler rejects) is embedded as token 0
                idx = starts[:, None] + torch.arange(layout.num_nodes, device=dev)[None]
                ids = adapter.runner_input_ids(self)
                ids[idx] = ids[idx].clamp(min=0)
                if RUNTIME.trace is not None:
                    RUNTIME.trace.step(RUNTIME.windows.rows, positions[0], ids, starts, layout.num_nodes)
        return result
    return prepare_inputs


def _after_sample(stock):
    def after_sample(self, output_token_ids, scheduler_output):
        stock(self, output_token_ids, scheduler_output)
        accepted, RUNTIME.last_accepted = RUNTIME.last_accepted, None
        windows, RUNTIME.windows = RUNTIME.windows, None        # the drafter's passes are no tree windows
        moved, RUNTIME.last_windows = RUNTIME.last_windows, None
        RUNTIME.drafter_windows = moved        # the MTP drafter's first pass enters the accepted paths
        if accepted is None:
            return
        if adapter.uses_async_spec_decode(self):
            raise ValueError("a served tree needs async scheduling off (vLLM's async spec decode recounts "
                             "num_accepted_tokens as lengths; a tree's is the accepted node + 1): serve with "
                             "--no-async-scheduling")
        adapter.set_num_accepted(self, (accepted + 1).to(torch.int32))
        if moved is None or windows is None:
            return
        rows, acc = moved
        layout = RUNTIME.serving(accepted.device).layout
        for kv_cache, table, head in adapter.tree_kv_caches(self, accepted.shape[0]):
            k_cache, v_cache = adapter.split_kv_cache(kv_cache, head)
            compact_tree_kv(k_cache, v_cache, table[rows], windows.num_computed, acc, layout)
    return after_sample


# ------------------------------------------------------------------------------------------------------------------
# The softmax layers and their KV after acceptance
# ------------------------------------------------------------------------------------------------------------------

def tree_window_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                          layout: TreeLayout, scale: float, output: torch.Tensor,
                          rows: torch.Tensor | None = None) -> None:
    """In place: ``output`` [num_tokens, Hq, D] of the full windows becomes the tree attention over vLLM's paged KV
    (k_cache, v_cache [num_blocks, block_size, Hkv, D], the window's K/V already written at the slot mapping):
    prefix = seq_lens - T, vLLM's block table rows. rows None: every request of the batch is a window (the uniform
    batch a full CUDA graph replays; requests padded in with seq_lens below T read from prefix 0); else the requests
    ``rows`` (device int64), each window at its query_start_loc."""
    T = layout.num_nodes
    if rows is None:
        B = query_start_loc.shape[0] - 1
        o = tree_attention_spec(query[: B * T], k_cache, v_cache, block_table[:B], seq_lens[:B].clamp(min=T),
                                layout, scale)
        output[: B * T] = o.to(output.dtype)
        return
    idx = (query_start_loc[rows].long()[:, None] + torch.arange(T, device=query.device)[None]).reshape(-1)
    o = tree_attention_spec(query[idx].contiguous(), k_cache, v_cache, block_table[rows], seq_lens[rows], layout,
                            scale)
    output[idx] = o.to(output.dtype)


def _attention_forward(stock):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        head, scale, decoder = adapter.impl_dims(self)
        if RUNTIME is not None and isinstance(attn_metadata, DraftPass):   # an MTP tree pass
            k_cache, v_cache = adapter.split_kv_cache(kv_cache, head)
            o = draft_pass_attention(query, key, value, k_cache, v_cache, attn_metadata, scale)
            output[: o.shape[0]] = o.to(output.dtype)
            return output
        if RUNTIME is None or attn_metadata is None or not decoder or RUNTIME.drafting:
            # the MTP drafter's first pass is vLLM's causal attention over the accepted path
            return stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        n, max_q, qsl, seq_lens, table = adapter.attention_windows(attn_metadata)
        layout, windows = RUNTIME.serving(query.device).layout, RUNTIME.windows
        T = layout.num_nodes
        if windows is None:
            # no step of the runner's (a capture's dummy batch): windows by the batch's shape
            if not (max_q == T and n == (qsl.shape[0] - 1) * T):
                return stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
            rows = None
        elif windows.all_full:
            rows = None
        else:   # a mixed step (eager or piecewise): vLLM's attention for every row, then the windows' own
            stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
            if windows.rows.numel() == 0:
                return output
            rows = windows.rows
        k_cache, v_cache = adapter.split_kv_cache(kv_cache, head)
        tree_window_attention(query, k_cache, v_cache, table, seq_lens, qsl, layout, scale, output, rows)
        if _tracing():
            ref = torch.zeros_like(output)   # vLLM's causal attention: equal on the leftmost paths
            stock(self, layer, query, key, value, kv_cache, attn_metadata, ref, *args, **kwargs)
            starts = qsl[:-1][: windows.num_reqs] if rows is None else qsl[rows]
            RUNTIME.trace.compare("attention", output, ref, leftmost_path_rows(starts, layout.max_depth))
        return output
    return forward


# ------------------------------------------------------------------------------------------------------------------
# The n-gram drafter
# ------------------------------------------------------------------------------------------------------------------

def _ngram_propose(self, num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                   slot_mappings=None):
    """NgramProposer.propose for a served tree: every request that sampled this step (and has room left) gets the
    n-gram tree of its tokens so far (``ngram_tree_drafts``), N tokens in DFS order, -1 where nothing continues;
    the others none. Host code, as vLLM's."""
    layout = RUNTIME.serving("cpu").layout
    max_n, max_len = adapter.ngram_limits(self)
    rows = [i for i, s in enumerate(sampled_token_ids) if len(s) and 0 < num_tokens_no_spec[i] < max_len]
    out: list[list[int]] = [[] for _ in sampled_token_ids]
    if rows:
        contexts = [token_ids_cpu[i, : num_tokens_no_spec[i]].tolist() for i in rows]
        for i, d in zip(rows, ngram_tree_drafts(contexts, layout, max_n).tolist()):
            out[i] = d
    return out


# ------------------------------------------------------------------------------------------------------------------
# The MTP drafter
# ------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftPass:
    """The attention metadata of one MTP tree pass, which its forward context gives every drafter layer: each
    request's root entry (``root`` int [B]: its index in the drafter's cache, the last of the prefix a pass attends
    to), the drafter's block table (``table`` [B, blocks]) and the pass's ancestor mask among its n nodes (``mask``
    [n, n]). Only the tree's attention override reads it (``draft_pass_attention``): it carries none of a backend's
    own metadata fields, and a backend whose forward the tree hooks do not replace fails on the first one it
    reads, naming the backends they do replace."""
    root: torch.Tensor
    table: torch.Tensor
    mask: torch.Tensor

    def __getattr__(self, name):   # only for names the dataclass lacks: what an attention backend's forward reads
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"'DraftPass' object has no attribute {name!r}: an MTP tree pass's metadata reached an attention "
            f"backend's own forward, which reads {name!r}; the tree hooks replace the forward of "
            f"{', '.join(adapter.tree_backend_names())} only (vllm_adapter.TREE_ATTN_BACKENDS): serve the tree with "
            "one of them (--attention-backend)")


def draft_pass_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, md: DraftPass, scale: float) -> torch.Tensor:
    """o [B * n, Hq, D] (fp32): each pass node's attention over its request's drafter cache up to the root entry
    (all of it visible) and over the pass's own K/V (key, value [B * n, Hkv, D], request-major) under the ancestor
    mask: one softmax, its two parts merged by log-sum-exp. The cache part is the tree attention op with every node
    a one-node window whose own token is the root entry (prefix = root): the op reads a window's K/V from the cache,
    and a pass's K/V are never written there (vLLM's slots past the root belong to the next verify window)."""
    from treewy.ops.attention.naive import merge_attention_states
    B, n = md.root.shape[0], md.mask.shape[0]
    dev, Hq, Hkv = query.device, query.shape[1], key.shape[1]
    q = query[: B * n]
    req = torch.arange(B, device=dev).repeat_interleave(n)
    table, prefix = md.table[req], md.root[req]
    cu = torch.arange(B * n + 1, dtype=torch.int32, device=dev)
    roots = torch.full((B * n,), -1, dtype=torch.int32, device=dev)
    if q.is_cuda:
        from treewy.ops.attention.kernel import tree_attention
        o_c, lse_c = tree_attention(q, k_cache, v_cache, table.to(torch.int32), prefix.to(torch.int32), cu, roots,
                                    scale, max_nodes=1, return_lse=True, check_values=False)
    else:
        from treewy.ops.attention.naive import naive_tree_attention
        o_c, lse_c = naive_tree_attention(q, k_cache, v_cache, table, prefix, cu, roots, scale, return_lse=True)
    qw = q.float().reshape(B, n, Hq, -1)
    kw, vw = (x[: B * n].float().reshape(B, n, Hkv, -1).repeat_interleave(Hq // Hkv, dim=2) for x in (key, value))
    s = torch.einsum("bihd,bjhd->bhij", qw, kw) * scale
    s = s.masked_fill(~md.mask[None, None], float("-inf"))
    lse_w = torch.logsumexp(s, -1)                                  # [B, Hq, n], finite: a node sees itself
    o_w = torch.einsum("bhij,bjhd->bihd", (s - lse_w[..., None]).exp(), vw)
    o, _ = merge_attention_states(o_c.float(), lse_c.float(), o_w.reshape(B * n, Hq, -1),
                                  lse_w.transpose(1, 2).reshape(B * n, Hq))
    return o


def accepted_first(num_tokens: int, starts: torch.Tensor, acc: TreeAcceptance) -> torch.Tensor:
    """int64 [num_tokens]: the gather that puts each window's accepted path first (row start + j takes row
    start + path[j], j < length; every other row stays), so vLLM's first pass, which enters a window's rows in order
    (each row's hidden state with the next row's token, the bonus after the last accepted), enters root..accepted.
    starts int [R]: the windows' first rows."""
    idx = torch.arange(num_tokens, device=starts.device)
    j = torch.arange(acc.path.shape[1], device=starts.device)[None]
    dst = starts.long()[:, None] + j
    idx[dst] = torch.where(j < acc.length[:, None], starts.long()[:, None] + acc.path.clamp(min=0), dst)
    return idx


def _first_pass_sample(stock):
    def sample_draft_tokens(self, hidden_states, sampling_metadata):
        """While the tree's propose runs vLLM's first pass: keep its input, the root entries' MTP outputs [B, H]
        (the tree's top-w come from them), and skip the argmax."""
        if RUNTIME is None or RUNTIME.first_pass is None:
            return stock(self, hidden_states, sampling_metadata)
        RUNTIME.first_pass.append(hidden_states)
        return torch.zeros(hidden_states.shape[0], dtype=torch.long, device=hidden_states.device), None
    return sample_draft_tokens


def _mtp_propose(stock):
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None):
        """SpecDecodeBaseProposer.propose for a served MTP tree: vLLM's first pass (propose itself with one draft
        token, on the inputs with each window's accepted path first: ``accepted_first``), then ``mtp_tree_passes``
        from the root entries' outputs; draft_token_ids [B, N] int64, DFS order. A pass is the drafter's model
        forward with ``DraftPass`` as every drafter layer's metadata (its attention: ``draft_pass_attention``) and
        no slot mapping: no draft K/V enters vLLM's cache."""
        moved, RUNTIME.drafter_windows = RUNTIME.drafter_windows, None
        args = (mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings)
        dev = target_hidden_states.device
        N = RUNTIME.serving(dev).num_drafts
        if num_speculative_tokens == 0:   # vLLM's first pass alone (its drafter KV kept in step), no drafts
            return stock(self, 0, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                         token_indices_to_sample, common_attn_metadata, sampling_metadata, *args)
        if num_speculative_tokens != N:
            raise ValueError(f"num_speculative_tokens = {num_speculative_tokens}: a served tree drafts its N = {N} "
                             "nodes every step (treewy serve --tree sets num_speculative_tokens to N)")
        qsl, table = adapter.common_windows(common_attn_metadata)
        if moved is not None:
            if token_indices_to_sample is None:
                raise ValueError("the MTP tree drafter needs vLLM's padded drafter batch (the default): serve "
                                 "without disable_padded_drafter_batch in --speculative-config")
            rows, acc = moved
            idx = accepted_first(target_token_ids.shape[0], qsl[rows], acc)
            target_token_ids, target_hidden_states = target_token_ids[idx], target_hidden_states[idx]
            target_positions = target_positions[..., idx]
        elif token_indices_to_sample is None:   # what vLLM's first pass samples then: each request's last row
            token_indices_to_sample = qsl[1:] - 1
        RUNTIME.drafting, RUNTIME.first_pass = True, []
        try:
            stock(self, 1, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                  token_indices_to_sample, common_attn_metadata, sampling_metadata, *args)
            root_out = RUNTIME.first_pass[-1]
            RUNTIME.first_pass = None
            pos = target_positions[0] if target_positions.ndim == 2 else target_positions
            root_pos = pos[token_indices_to_sample.long()].long()
            mrope = adapter.proposer_uses_mrope(self)

            def entry(tokens, hidden, positions, mask):
                B, n = tokens.shape
                p = positions.reshape(-1)
                p = p[None].expand(3, -1).contiguous() if mrope else p
                out = adapter.draft_forward(self, tokens.reshape(-1).to(torch.int32), p, hidden.reshape(B * n, -1),
                                            DraftPass(root_pos, table, mask))
                return out.reshape(B, n, -1)

            return mtp_tree_passes(entry, lambda h: adapter.draft_logits(self, h), root_out, next_token_ids.long(),
                                   root_pos, RUNTIME.passes(dev))
        finally:
            RUNTIME.drafting, RUNTIME.first_pass = False, None
            adapter.set_proposer_num_spec(self, num_speculative_tokens)   # the first pass recorded 1
    return propose
