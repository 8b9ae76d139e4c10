"""Tree speculation for a serving engine: a fixed tree's layout, its proposers and its acceptance, on the device.

A server drafts one fixed tree (``--tree 2,2,1``: the branching factors per level). Everything here is pure torch
over tensors built once per server (``TreeLayout``): no host sync, every output shape fixed by the input shapes, so
each function can be recorded into a CUDA graph and replayed. The functions equal the engine's own pieces
(``treewy.drafters``, ``treewy.accept``), which ``treewy.decode.generate`` runs, so a server built from them emits
what ``generate`` emits. The commit side (positions, KV compaction, conv rows, the pending fold) is in
``treewy.serve.tree_commit``; how it all plugs into vLLM 0.26 is in treewy/serve/README.md.

Shapes: B requests, T = N + 1 window nodes in DFS pre-order (node 0 the root: the last verified token), D the tree's
depth, V the vocabulary. Token -1 marks a node with nothing drafted (never accepted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from treewy.accept import greedy_fwd, sampled_fwd, sibling_rank, RULES
from treewy.serve.acceptance import conditional_rates
from treewy.tree import DraftTree, as_int, short_repr

#: What vLLM's rejection sampler writes past a request's emitted tokens (its PLACEHOLDER_TOKEN_ID).
PLACEHOLDER = -1

#: Qwen3.5's GDN conv kernel width (conv1d over q, k, v in front of each GDN layer).
CONV_WIDTH = 4


class TreeLayout:
    """Index tables of one fixed tree, as device tensors (built once per server from the widths).

    parents, depth, rank [T] int64 (rank: how many earlier siblings a node has); parents32 [T] int32 (the
    kernels' topology; ``rows(B)`` the same per request); anc [T, T] bool, inclusive ancestor mask (the attention mask
    among window tokens: row t attends to t's root..t path); path [T, D + 1] int64: node t's root..t path, -1 past
    depth(t) (an accepted node's emitted tokens, KV sources and conv rows are read through it); level_nodes[d]
    [n_d]: the nodes of depth d in DFS order; children[d] [n_d, widths[d]]: the children of each node of depth d;
    level_index [T]: a node's place among the nodes of its depth; conv_src [T, W - 1]: where the committed conv
    state of node t comes from (``treewy.serve.tree_commit.commit_conv_state``).
    """

    def __init__(self, widths, device="cpu", conv_width: int = CONV_WIDTH):
        if isinstance(widths, DraftTree):
            if widths.widths is None:
                raise ValueError(f"widths = {widths!r}: a served tree is given by its branching factors, e.g. "
                                 "DraftTree.from_widths((2, 2, 1)) or (2, 2, 1)")
            widths = widths.widths
        if isinstance(widths, str):
            raise ValueError(f"widths = {widths!r}: expected a sequence of branching factors such as (2, 2, 1); "
                             "treewy.tree.as_tree reads text")
        tree = DraftTree.from_widths(widths)  # names widths[level] when one is bad
        if tree.num_nodes == 1:
            raise ValueError("widths = (): a draft tree needs at least one level, e.g. (2, 2, 1) or (1, 1, 1) "
                             "for a chain of 3")
        W = as_int(conv_width)
        if W is None or W < 1:
            raise ValueError(f"conv_width = {conv_width!r}: expected the GDN conv kernel width, a positive integer "
                             f"such as {CONV_WIDTH}")
        self.tree, self.widths, self.conv_width = tree, tree.widths, W
        self.num_nodes, self.max_depth = tree.num_nodes, tree.max_depth
        self.device = torch.device(device)
        T, D = self.num_nodes, self.max_depth
        par = tree.parents.long()
        depth = tree.depth.long()
        paths = [tree.path(t) for t in range(T)]
        path = torch.full((T, D + 1), -1, dtype=torch.long)
        for t, p in enumerate(paths):
            path[t, : len(p)] = torch.tensor(p)
        levels = [torch.nonzero(depth == d).flatten() for d in range(D + 1)]
        level_index = torch.zeros(T, dtype=torch.long)
        for nodes in levels:
            level_index[nodes] = torch.arange(nodes.numel())
        children = [torch.stack([torch.nonzero(par == int(t)).flatten() for t in levels[d]])
                    for d in range(D)]
        # the committed conv state after node a (depth d) is the last W - 1 entries of [old state (W - 1), the
        # inputs along root..a]: entry j is column d + 1 + j of that row, an old column while it is below W - 1
        e = depth[:, None] + 1 + torch.arange(W - 1)[None]
        from_path = path.gather(1, (e - (W - 1)).clamp(min=0, max=D))
        conv_src = torch.where(e < W - 1, e, (W - 1) + from_path)

        self.parents = par.to(self.device)
        # "cuda" and "cuda:0" are one device: keep the indexed form tensors report, which the checks compare against
        self.device = dev = self.parents.device
        self.parents32 = par.to(dev, torch.int32).contiguous()
        self.depth = depth.to(dev)
        self.rank = sibling_rank(par[None])[0].to(dev)
        self.anc = tree.ancestor_mask().to(dev)
        self.path = path.to(dev)
        self.level_nodes = [x.to(dev) for x in levels]
        self.level_index = level_index.to(dev)
        self.children = [x.to(dev) for x in children]
        self.conv_src = conv_src.to(dev)
        self.conv_src32 = self.conv_src.to(torch.int32).contiguous()
        self._rows: dict[int, torch.Tensor] = {}

    @property
    def num_drafts(self) -> int:
        return self.num_nodes - 1

    @property
    def max_width(self) -> int:
        return max(self.widths)

    def rows(self, B: int) -> torch.Tensor:
        """parents as int64 [B, T] (what treewy.accept's walks index), kept per batch size: a CUDA graph captured
        for B requests reads the same tensor at every replay."""
        if B not in self._rows:
            self._rows[B] = self.parents[None].expand(B, -1).contiguous()
        return self._rows[B]

    def __repr__(self) -> str:
        return f"TreeLayout({self.widths}, device={str(self.device)!r})  # N = {self.num_drafts}"


def _check_batch(name: str, x, layout: TreeLayout, *, ndim: int, floating: bool, B: int | None = None,
                 trailing: str = ""):
    """x must be a tensor [B, T(, V)] on the layout's device: an error naming ``name`` and the expected shape."""
    T = layout.num_nodes
    want = f"[B, T{trailing}] = [{'B' if B is None else B}, {T}{trailing}]"
    kind = "floating" if floating else "integer"
    if (not isinstance(x, torch.Tensor) or x.ndim != ndim or x.shape[1] != T or x.dtype.is_floating_point != floating
            or x.dtype == torch.bool or (B is not None and x.shape[0] != B)):
        raise ValueError(f"{name} must be a{'n' if kind == 'integer' else ''} {kind} tensor {want} for the tree "
                         f"{layout.widths}, got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if x.device != layout.device:
        raise ValueError(f"{name} is on {x.device}, the layout on {layout.device}: build the TreeLayout on the "
                         "device the step runs on")
    return x


# ----------------------------------------------------------------------------------------------------------------
# Proposers
# ----------------------------------------------------------------------------------------------------------------

def propose_mtp_tree(logits_per_level: Sequence[torch.Tensor], layout: TreeLayout, roots: torch.Tensor
                     ) -> torch.Tensor:
    """The MTP head's tree: tokens [B, T] int64, column 0 the roots, every other node the top-w token of its
    parent's MTP logits (w = its level's width, siblings in descending logit order).

    How the levels are produced (``treewy.drafters.MTPDrafter``, which this equals on the same logits): the MTP
    module runs once per depth. Pass 0 is the root's entry (the root token with the target's hidden state at the
    token before it, after the entries of the tokens accepted last step); its logits are level 0, [B, 1, V], whose
    top-widths[0] tokens become the root's children. Pass d (d = 1 .. D - 1) runs one entry per drafted node of
    depth 1..d (the node's token with its *parent's* MTP output, position root + depth, attention over the MTP
    cache plus the node's own root..node path); the outputs at the depth-d nodes give level d, [B, n_d, V] (n_d =
    layout.level_nodes[d].numel(), DFS order), and the top-widths[d] tokens of each row become that node's
    children. So every node has its own MTP state and its own children: siblings' subtrees differ. Leaves
    (depth D) need no MTP pass.

    roots: int [B], the target's token at node 0 (last step's bonus).
    """
    D = layout.max_depth
    if isinstance(logits_per_level, torch.Tensor) or not isinstance(logits_per_level, Sequence) \
            or len(logits_per_level) != D:
        got = (f"a tensor of shape {tuple(logits_per_level.shape)}" if isinstance(logits_per_level, torch.Tensor)
               else short_repr(logits_per_level))
        raise ValueError(f"logits_per_level must be a list of {D} tensors, one per MTP pass of the tree "
                         f"{layout.widths} (level d: [B, n_d, V] at the nodes of depth d), got {got}")
    if not isinstance(roots, torch.Tensor) or roots.ndim != 1 or roots.dtype.is_floating_point:
        raise ValueError(f"roots must be an integer tensor [B] (the root token of each request), got "
                         f"{getattr(roots, 'dtype', type(roots).__name__)} {tuple(getattr(roots, 'shape', ()))}")
    B = roots.shape[0]
    V = None
    for d, lg in enumerate(logits_per_level):
        n = layout.level_nodes[d].numel()
        if (not isinstance(lg, torch.Tensor) or not lg.dtype.is_floating_point or lg.ndim != 3
                or tuple(lg.shape[:2]) != (B, n) or (V is not None and lg.shape[2] != V)):
            raise ValueError(f"logits_per_level[{d}] must be floating [B, n_{d}, V] = [{B}, {n}, "
                             f"{'V' if V is None else V}] (the MTP logits at the {n} node(s) of depth {d}), got "
                             f"{getattr(lg, 'dtype', type(lg).__name__)} {tuple(getattr(lg, 'shape', ()))}")
        V = lg.shape[2]
        if layout.widths[d] > V:
            raise ValueError(f"widths[{d}] = {layout.widths[d]} exceeds the vocabulary of logits_per_level[{d}] "
                             f"({V}): a node cannot have more distinct children than tokens")
    tokens = torch.full((B, layout.num_nodes), PLACEHOLDER, dtype=torch.long, device=roots.device)
    tokens[:, 0] = roots
    for d, lg in enumerate(logits_per_level):
        top = lg.topk(layout.widths[d], dim=-1).indices               # [B, n_d, w]: the engine's _TreePlan.fill
        tokens[:, layout.children[d].flatten()] = top.reshape(B, -1)
    return tokens


def propose_ngram_tree(context: torch.Tensor, lens: torch.Tensor, layout: TreeLayout, max_n: int = 4
                       ) -> torch.Tensor:
    """The engine's n-gram tree (``treewy.drafters.NgramDrafter.propose``) on the device: tokens [B, T] int64.

    context int [B, L]: each request's tokens so far, its last one (at lens - 1) the root; entries past lens are
    ignored. A node's children are the continuations of the longest n-gram (n = max_n .. 1) that ends the context
    plus the node's drafted path and occurred earlier in the context, most frequent first, the latest occurrence
    breaking ties; -1 where there are fewer continuations than children, and under a node without a token.

    Vectorized per level: every earlier position is tested against every node's suffix, then the matches of the
    chosen n are sorted by (token, position) to count them. That is O(B n_d L log L) work per level for a context
    buffer of L tokens, against a hash lookup per node on the host; vLLM 0.26 runs its own n-gram drafter on the
    host too (``vllm/v1/spec_decode/ngram_proposer.py``; the GPU one, ``ngram_proposer_gpu.py``, proposes one chain
    from the earliest match and counts nothing), so the served n-gram tree stays on the host and this twin is what
    a CUDA graph can hold where the context buffer is short.
    """
    max_n = _check_context(context, lens, layout, max_n)
    B, L = context.shape
    dev = context.device
    ctx = context.long()
    lens = lens.long()
    rows = torch.arange(B, device=dev)
    tokens = torch.full((B, layout.num_nodes), PLACEHOLDER, dtype=torch.long, device=dev)
    tokens[:, 0] = ctx[rows, (lens - 1).clamp(min=0)]
    e = torch.arange(L, device=dev)
    big = torch.iinfo(torch.long).max
    for d in range(layout.max_depth):
        nodes = layout.level_nodes[d]                                   # [m]
        m, w = nodes.numel(), layout.widths[d]
        # suffix[b, i, j]: the j-th token back from the end of context + node i's path (j = 0: the node itself)
        j = torch.arange(max_n, device=dev)
        path = layout.path[nodes]                                       # [m, D + 1]
        on_path = (d - j)[None, :].expand(m, -1)                        # depth of the j-th token back, if on the path
        path_tok = tokens[:, path.gather(1, on_path.clamp(min=0))]      # [B, m, max_n]
        ctx_at = (lens[:, None] - 1 - (j - d)[None, :])                 # [B, max_n]: its context index otherwise
        ctx_tok = ctx.gather(1, ctx_at.clamp(min=0, max=L - 1))
        suffix = torch.where((j < d)[None, None, :], path_tok, ctx_tok[:, None, :])
        exists = (j < d)[None, :] | (ctx_at >= 0)                       # [B, max_n]
        # eq[b, i, j, e]: the j-th token before position e equals the j-th suffix token
        before = ctx.gather(1, (e[None, :] - 1 - j[:, None]).clamp(min=0).reshape(1, -1).expand(B, -1))
        before = before.reshape(B, max_n, L)
        eq = (before[:, None] == suffix[..., None]) & ((e[None, :] - 1 - j[:, None]) >= 0)[None, None]
        in_ctx = (e[None, :] >= 1) & (e[None, :] < lens[:, None])     # [B, L]: continuation inside the context
        has_token = tokens[:, nodes] >= 0                               # [B, m]
        match = torch.zeros(B, m, L, dtype=torch.bool, device=dev)
        found = torch.zeros(B, m, dtype=torch.bool, device=dev)
        run = torch.ones(B, m, L, dtype=torch.bool, device=dev)
        grams = []
        for n in range(1, max_n + 1):
            run = run & eq[:, :, n - 1]
            ok = run & in_ctx[:, None] & (e >= n)[None, None] & exists[:, n - 1, None, None] & has_token[..., None]
            grams.append(ok)
        for ok in reversed(grams):                                      # the longest n with a match wins
            take = ok.any(-1) & ~found
            match = torch.where(take[..., None], ok, match)
            found = found | take
        key = torch.where(match, ctx[:, None, :] * L + e, big).sort(-1).values
        valid = key != big
        tok, pos = key // L, key % L
        # sorted: each token's matches form one run, the unmatched (big) at the end, whose quotient is no token
        same = tok[..., 1:] == tok[..., :-1]
        none = torch.zeros_like(same[..., :1])
        last = valid & ~torch.cat([same, none], -1)                      # a run's last entry: its latest position
        first = valid & ~torch.cat([none, same], -1)
        i = torch.arange(L, device=dev).expand_as(key)
        start = torch.cummax(torch.where(first, i, 0), -1).values
        score = torch.where(last, (i - start + 1) * L + pos, -1)      # (count, latest position), lexicographic
        k = min(w, L)
        top = score.topk(k, dim=-1)
        picked = torch.where(top.values >= 0, tok.gather(-1, top.indices), PLACEHOLDER)
        if k < w:
            picked = torch.cat([picked, picked.new_full((B, m, w - k), PLACEHOLDER)], -1)
        tokens[:, layout.children[d].flatten()] = picked.reshape(B, -1)
    return tokens


def _check_context(context, lens, layout, max_n):
    if not isinstance(context, torch.Tensor) or context.ndim != 2 or context.dtype.is_floating_point \
            or context.dtype == torch.bool:
        raise ValueError(f"context must be an integer tensor [B, L] of token ids, got "
                         f"{getattr(context, 'dtype', type(context).__name__)} {tuple(getattr(context, 'shape', ()))}")
    if not isinstance(lens, torch.Tensor) or lens.ndim != 1 or lens.shape[0] != context.shape[0] \
            or lens.dtype.is_floating_point:
        raise ValueError(f"lens must be an integer tensor [B] = [{context.shape[0]}] (tokens per request in "
                         f"context), got {getattr(lens, 'dtype', type(lens).__name__)} "
                         f"{tuple(getattr(lens, 'shape', ()))}")
    n = as_int(max_n)
    if n is None or n < 1:
        raise ValueError(f"max_n = {max_n!r}: the n-gram drafter needs an integer max_n >= 1")
    for name, x in (("context", context), ("lens", lens)):
        if x.device != layout.device:
            raise ValueError(f"{name} is on {x.device}, the layout on {layout.device}")
    return n


# ----------------------------------------------------------------------------------------------------------------
# Acceptance
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeAcceptance:
    """One step's outcome per request, fixed shapes. accepted [B] int64: the committed node; path [B, D + 1]
    int64: root..accepted, -1 padded; length [B] int64: tokens emitted = depth(accepted) + 1 (vLLM's
    num_accepted_tokens); bonus [B] int64: the token after the accepted node (the next root); output_token_ids
    [B, D + 1] int32: the emitted tokens (accepted drafts, then the bonus), -1 padded: what vLLM's rejection
    sampler returns as sampled_token_ids, D + 1 columns wide instead of N + 1."""

    accepted: torch.Tensor
    path: torch.Tensor
    length: torch.Tensor
    bonus: torch.Tensor
    output_token_ids: torch.Tensor


def _outcome(path, length, bonus, draft_tokens) -> TreeAcceptance:
    B, n = path.shape
    rows = torch.arange(B, device=path.device)
    accepted = path[rows, length - 1]
    col = torch.arange(n, device=path.device)[None]
    drafts = draft_tokens.gather(1, path.roll(-1, 1).clamp(min=0))                # column j: the draft at depth j + 1
    out = torch.where(col < length[:, None] - 1, drafts, PLACEHOLDER)
    out = torch.where(col == length[:, None] - 1, bonus[:, None], out)
    return TreeAcceptance(accepted, path, length, bonus, out.to(torch.int32))


def warp_rows(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """softmax(logits / temperature) per request, computed as ``treewy.sampling.params.warp`` does (gaps to the
    largest logit, divided), so a row equals warp(row, its temperature) bit for bit (rows at temperature 0 are
    divided by 1: the greedy walk serves them). logits [B, T, V], temperature [B] -> fp32 probs (fp64 for fp64
    logits). vLLM cuts top-k / top-p by setting the cut logits to -inf before: the same distribution as warp's
    cuts (bit for bit for top-k; top-p renormalizes in another order)."""
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    top = x.amax(-1, keepdim=True)
    gap = x - torch.where(top.isfinite(), top, 0)
    t = temperature.to(x.dtype)
    t = torch.where(t > 0, t, 1)[:, None, None]
    return torch.where(gap == 0, 0, gap / t).softmax(-1)


def accept_tree(target_logits: torch.Tensor, draft_tokens: torch.Tensor, layout: TreeLayout, temperature=0.0, *,
                coins: torch.Tensor | None = None, draws: torch.Tensor | None = None,
                generator: torch.Generator | None = None, q_draft: torch.Tensor | None = None,
                rule: str = "match") -> TreeAcceptance:
    """Tree acceptance of a batch: greedy where the temperature is 0, the distribution-exact rule ``rule`` of
    ``treewy.accept`` elsewhere (``match`` for fixed-token drafts such as top-w MTP and n-gram trees; ``rrs`` /
    ``rrs_wor`` for children drawn from the drafter, which need q_draft [B, T, V]).

    target_logits [B, T, V]: the target's logits after every window node (vLLM: logits[logits_indices] viewed
    [B, T, V]; the draft at node t is checked against the row of its parent, not of t - 1); draft_tokens int
    [B, T] (column 0 the root; -1: nothing drafted); temperature: a number for the whole batch (0: greedy, which
    then never computes a softmax) or a tensor [B] (vLLM's sampling_metadata.temperature; both walks run and each
    request keeps its own). coins [B, T] in [0, 1) and draws [B, T] in (0, 1] are the rules' uniforms; absent, they
    are drawn from ``generator`` as ``treewy.sampling.params.Sampling.uniforms`` draws them, so the same seeded
    generator reproduces ``treewy.decode.generate``'s decisions.

    Greedy is ``treewy.accept.greedy_fwd`` and sampling ``treewy.accept.sampled_fwd`` on the layout's tables, loops
    bounded by the tree's depth and width: no host sync, fixed shapes.
    """
    if rule not in RULES:
        raise ValueError(f"rule = {rule!r}: expected one of {RULES} ('match' for fixed-token children such as top-w "
                         "MTP or n-gram trees; 'rrs' / 'rrs_wor' for children sampled from the drafter)")
    _check_batch("target_logits", target_logits, layout, ndim=3, floating=True, trailing=", V")
    B = target_logits.shape[0]
    _check_batch("draft_tokens", draft_tokens, layout, ndim=2, floating=False, B=B)
    greedy_only = False
    if isinstance(temperature, torch.Tensor):
        if temperature.ndim != 1 or temperature.shape[0] != B or not temperature.dtype.is_floating_point:
            raise ValueError(f"temperature must be a number or a floating tensor [B] = [{B}], got "
                             f"{temperature.dtype} {tuple(temperature.shape)}")
        temp = temperature.to(target_logits.device)
    elif isinstance(temperature, (int, float)) and not isinstance(temperature, bool) \
            and math.isfinite(temperature) and temperature >= 0:
        greedy_only = temperature == 0
        temp = torch.full((B,), float(temperature), device=target_logits.device)
    else:
        raise ValueError(f"temperature = {temperature!r}: expected a finite number >= 0 (0: greedy) or a tensor [B]")
    if rule != "match" and not greedy_only:
        _check_batch("q_draft", q_draft, layout, ndim=3, floating=True, B=B, trailing=", V")
    draft = draft_tokens.long()
    par, D = layout.rows(B), layout.max_depth
    argmax = target_logits.argmax(-1)
    g = greedy_fwd(par, draft, argmax, D)
    if greedy_only:
        return _outcome(g.path, g.length, g.bonus, draft)
    if coins is None or draws is None:
        u = torch.rand(2, B, layout.num_nodes, generator=generator, device=target_logits.device)
        coins = u[0] if coins is None else coins
        draws = 1 - u[1] if draws is None else draws
    for name, x in (("coins", coins), ("draws", draws)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (B, layout.num_nodes) \
                or not x.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating tensor [B, T] = [{B}, {layout.num_nodes}] of uniform "
                             f"numbers, got {tuple(getattr(x, 'shape', ()))}")
    p = warp_rows(target_logits, temp)
    s = sampled_fwd(par, draft, p, q_draft, rule, coins, draws, D, layout.max_width, layout.rank[None].expand(B, -1))
    hot = (temp > 0)[:, None]
    path = torch.where(hot, s.path, g.path)
    length = torch.where(hot[:, 0], s.length, g.length)
    bonus = torch.where(hot[:, 0], s.bonus, g.bonus)
    return _outcome(path, length, bonus, draft)


# ----------------------------------------------------------------------------------------------------------------
# Synthetic acceptance (dummy weights)
# ----------------------------------------------------------------------------------------------------------------

class SyntheticAcceptance:
    """Acceptance at chosen per-depth rates for benchmarks on dummy weights (which accept nothing): the tree
    version of vLLM 0.26's synthetic rejection sampler (``vllm/v1/sample/rejection_sampler.py``, rates from
    ``vllm/config/speculative.py``'s ``synthetic_acceptance_rates``).

    rates: D *unconditional* rates a_1 >= ... >= a_D in [0, 1], a_d = P(the accepted node has depth >= d), vLLM's
    meaning per position. As vLLM does, they become conditional rates c_d = a_d / a_(d - 1) (0 after a 0): per
    step and request, starting at the root, a fresh uniform below c_d accepts a child at depth d, else the walk
    stops; so a step emits L = 1 + (accepted depth) tokens with E[L] = 1 + sum_d a_d and
    Var L = sum_d (2d - 1) a_d - (sum_d a_d)^2.

    Which child: uniform over its parent's w children (a second uniform per depth), not always the first. The
    expected length is the same either way, but the first child of every node is the DFS chain 0, 1, 2, ..., whose
    KV already sits where compaction puts it and whose pending fold reads consecutive stash rows: a benchmark that
    only ever accepts it would never time the copies and gathers a real tree's acceptance pays for. A chosen child
    without a token (-1) is rejected, as vLLM rejects a -1 draft. The accepted tokens are the drafts whatever the
    target says (the text changes); the bonus is the target's argmax at the accepted node.
    """

    def __init__(self, layout: TreeLayout, rates):
        D = layout.max_depth
        if isinstance(rates, torch.Tensor):
            rates = rates.tolist()
        if isinstance(rates, (str, bytes)) or not isinstance(rates, Sequence):
            raise ValueError(f"rates = {short_repr(rates)}: expected {D} per-depth acceptance rates, e.g. "
                             f"{tuple(round(0.8 ** (d + 1), 3) for d in range(D))}")
        if len(rates) != D:
            raise ValueError(f"rates has {len(rates)} entries for the tree {layout.widths} of depth {D}: give one "
                             "unconditional rate per depth (P(accepted depth >= d), d = 1..D)")
        vals = []
        for d, r in enumerate(rates):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= float(r) <= 1.0:
                raise ValueError(f"rates[{d}] = {r!r}: rates are probabilities in [0, 1]")
            vals.append(float(r))
        if any(b > a for a, b in zip(vals, vals[1:])):
            raise ValueError(f"rates = {tuple(vals)}: the rates are unconditional (depth >= d), so they cannot rise "
                             "with depth; give a non-increasing list, e.g. (0.9, 0.7, 0.4)")
        self.layout, self.rates = layout, tuple(vals)
        self.conditional = torch.tensor(conditional_rates(vals), dtype=torch.float64, device=layout.device)
        self._widths = torch.tensor(layout.widths, dtype=torch.float64, device=layout.device)

    @property
    def expected_length(self) -> float:
        return 1.0 + sum(self.rates)

    @property
    def variance(self) -> float:
        s = sum(self.rates)
        return sum((2 * d - 1) * a for d, a in enumerate(self.rates, start=1)) - s * s

    def __call__(self, draft_tokens: torch.Tensor, target_logits: torch.Tensor, *, uniforms: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> TreeAcceptance:
        """draft_tokens int [B, T]; target_logits [B, T, V] (only their argmax is read: the bonus); uniforms
        [B, D, 2] fp64 in [0, 1) (per depth: the accept test, the child choice), drawn from ``generator`` when
        absent (fp64, as vLLM draws its synthetic uniforms)."""
        lay = self.layout
        _check_batch("target_logits", target_logits, lay, ndim=3, floating=True, trailing=", V")
        B = target_logits.shape[0]
        _check_batch("draft_tokens", draft_tokens, lay, ndim=2, floating=False, B=B)
        D = lay.max_depth
        if uniforms is None:
            uniforms = torch.rand(B, D, 2, dtype=torch.float64, generator=generator, device=lay.device)
        elif not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != (B, D, 2) \
                or not uniforms.dtype.is_floating_point:
            raise ValueError(f"uniforms must be a floating tensor [B, D, 2] = [{B}, {D}, 2] in [0, 1), got "
                             f"{tuple(getattr(uniforms, 'shape', ()))}")
        draft = draft_tokens.long()
        rows = torch.arange(B, device=lay.device)
        cur = torch.zeros(B, dtype=torch.long, device=lay.device)
        live = torch.ones(B, dtype=torch.bool, device=lay.device)
        steps = [cur]
        for d in range(D):
            w = lay.widths[d]
            j = (uniforms[:, d, 1] * self._widths[d]).long().clamp(max=w - 1)
            # a stopped request's node is shallower; level sizes never shrink, so its index stays in range
            child = lay.children[d][lay.level_index[cur], j]               # [B]
            ok = live & (uniforms[:, d, 0] < self.conditional[d]) & (draft[rows, child] >= 0)
            cur = torch.where(ok, child, cur)
            live = ok
            steps.append(torch.where(ok, cur, -1))
        path = torch.stack(steps, 1)
        length = (path >= 0).sum(1)
        bonus = target_logits.argmax(-1)[rows, cur]
        return _outcome(path, length, bonus, draft)


def synthetic_accept_tree(layout: TreeLayout, rates, draft_tokens: torch.Tensor, target_logits: torch.Tensor, *,
                          uniforms: torch.Tensor | None = None, generator: torch.Generator | None = None
                          ) -> TreeAcceptance:
    """``SyntheticAcceptance(layout, rates)(draft_tokens, target_logits, ...)`` in one call (a server builds the
    SyntheticAcceptance once: its rates then live on the device)."""
    return SyntheticAcceptance(layout, rates)(draft_tokens, target_logits, uniforms=uniforms, generator=generator)
