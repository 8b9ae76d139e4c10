"""Acceptance on a draft tree, batched over requests: greedy (temperature 0) and sampled (temperature > 0).

Greedy: start at the root; move to the first child whose draft token equals the target's argmax at the
current node; stop when none does. The stop node a is committed, the bonus token is the target's argmax
at a, and the acceptance length (tokens emitted this step) is depth(a) + 1.

Sampled: the same walk, but each step emits tokens distributed exactly as sampling the target would
(``p_target``, the warped target distribution at every node). Three rules (``RULES``), each exact; the
argument is in treewy/sampling/README.md:

- ``match``: children are fixed tokens (top-w MTP drafts, n-gram drafts). Sample y ~ p_target at the
  current node; descend into the first child whose token is y; else stop and emit y as the bonus.
- ``rrs``: children were drawn i.i.d. from the drafter's distribution ``q_draft`` at their parent
  (SpecInfer's multi-draft recursive rejection sampling). Try the children in order: accept child x
  with probability min(1, r(x) / q(x)), where r starts as p_target; after a rejection, r becomes the
  residual norm(max(r - q, 0)). If every child is rejected, the bonus is sampled from r.
- ``rrs_wor``: children were drawn from ``q_draft`` without replacement (in order); the same walk with
  q for the j-th child renormalized over the tokens its earlier siblings did not take.

Random numbers come in per node, so a fast path and its readable twin given the same numbers take the
same decisions: ``coins[b, t]`` in [0, 1) tests child t; ``draws[b, t]`` in (0, 1] samples at node t
(the target in ``match``, the residual at the stop node in ``rrs``) by inverse CDF.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.tree import DraftTree, path_depth, validate_parents

RULES = ("match", "rrs", "rrs_wor")


@dataclass(frozen=True)
class Acceptance:
    accepted: torch.Tensor  # int64 [B], the committed node
    path: torch.Tensor      # int64 [B, max_depth + 1], root..accepted, padded with -1
    length: torch.Tensor    # int64 [B], tokens emitted this step = depth(accepted) + 1
    bonus: torch.Tensor     # int64 [B], the token after the accepted node (target argmax, or sampled)

    def emitted(self, draft_tokens: torch.Tensor, b: int) -> list[int]:
        """Tokens request b emits this step: the accepted drafts (root excluded), then the bonus."""
        nodes = self.path[b, 1: int(self.length[b])]
        return draft_tokens[b, nodes].tolist() + [int(self.bonus[b])]


GreedyAcceptance = Acceptance


def _check_tokens(tree, draft_tokens: torch.Tensor, **others):
    """Validated parents [B, T] on the tokens' device and the tree's depth."""
    par = validate_parents(tree.parents if isinstance(tree, DraftTree) else tree)
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype.is_floating_point or draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must be an integer tensor [B, T], got "
                         f"{getattr(draft_tokens, 'dtype', type(draft_tokens).__name__)} "
                         f"{tuple(getattr(draft_tokens, 'shape', ()))}")
    B, T = draft_tokens.shape
    for name, (x, floating, ndim) in others.items():
        if (not isinstance(x, torch.Tensor) or x.dtype.is_floating_point != floating or x.ndim != ndim
                or tuple(x.shape[:2]) != (B, T)):
            want = ("a floating" if floating else "an integer") + (" tensor [B, T, V]" if ndim == 3
                                                                    else " tensor [B, T]")
            raise ValueError(f"{name} must be {want} with [B, T] = [{B}, {T}] like draft_tokens, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if par.shape[-1] != T or (par.ndim == 2 and par.shape[0] != B):
        raise ValueError(f"the tree has parents of shape {tuple(par.shape)} but draft_tokens is [{B}, {T}]")
    depth = tree.max_depth if isinstance(tree, DraftTree) else int(path_depth(par).max())
    return par.to(draft_tokens.device, torch.long).expand(B, T), depth


def greedy(tree, draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    """tree: a DraftTree, parents [T] or [B, T]; draft_tokens, target_argmax: int [B, T]
    (the token at each node, and the target model's argmax after each node)."""
    par, depth = _check_tokens(tree, draft_tokens, target_argmax=(target_argmax, False, 2))
    return greedy_fwd(par, draft_tokens, target_argmax, depth)


def greedy_fwd(parents: torch.Tensor, draft_tokens: torch.Tensor, target_argmax: torch.Tensor,
               max_depth: int) -> Acceptance:
    """``greedy`` on inputs already validated: parents int64 [B, T] on the tokens' device; ``max_depth``
    bounds the walk (the tree's depth), so the walk never syncs with the host."""
    B, T = draft_tokens.shape
    dev = draft_tokens.device
    rows = torch.arange(B, device=dev)
    # match[b, t]: node t's token is what the target predicts after its parent
    match = torch.zeros(B, T, dtype=torch.bool, device=dev)
    match[:, 1:] = draft_tokens[:, 1:] == target_argmax.gather(1, parents[:, 1:].clamp(min=0))
    nodes = torch.arange(T, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    steps = [cur]
    for _ in range(max_depth):
        cand = (parents == cur[:, None]) & match            # matching children of the current node
        has = cand.any(1)
        first = torch.where(cand, nodes, T).min(1).values  # the first matching child
        cur = torch.where(has, first, cur)
        steps.append(torch.where(has, cur, -1))
    path = torch.stack(steps, 1)  # a stopped request keeps its node, so its later entries stay -1
    length = (path >= 0).sum(1)
    accepted = path[rows, length - 1]
    return Acceptance(accepted, path, length, target_argmax[rows, accepted])


def residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(r - q, 0)) over the last dim: what r has left once a draft from q was rejected (r itself
    where nothing is left, which happens only when r == q, whose drafts are never rejected)."""
    left = (r - q).clamp(min=0)
    total = left.sum(-1, keepdim=True)
    return torch.where(total > 0, left / torch.where(total > 0, total, 1), r)


def sample_categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: the index k with cdf[k - 1] < u * total <= cdf[k], for u in (0, 1] (never a
    zero-probability index). probs [..., V], u [...] -> int64 [...]."""
    cdf = probs.cumsum(-1)
    k = (cdf < u[..., None] * cdf[..., -1:]).sum(-1)
    return k.clamp(max=probs.shape[-1] - 1)


def sibling_rank(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, T]: how many earlier siblings each node has (children are tried in node order)."""
    T = parents.shape[-1]
    earlier = torch.ones(T, T, dtype=torch.bool, device=parents.device).tril(-1)
    return ((parents[:, :, None] == parents[:, None, :]) & earlier).sum(-1)


def sampled(tree, draft_tokens: torch.Tensor, p_target: torch.Tensor, q_draft: torch.Tensor | None = None,
            rule: str = "match", coins: torch.Tensor | None = None, draws: torch.Tensor | None = None,
            generator: torch.Generator | None = None) -> Acceptance:
    """Sampled acceptance. tree: a DraftTree, parents [T] or [B, T]; draft_tokens int [B, T] (-1: no
    token); p_target [B, T, V]: the (warped) target distribution after each node; q_draft [B, T, V]:
    the drafter's distribution at each node, which its children were drawn from (rules ``rrs`` and
    ``rrs_wor`` only); coins [B, T] in [0, 1) and draws [B, T] in (0, 1]: drawn with ``generator``
    when not given."""
    if rule not in RULES:
        raise ValueError(f"rule = {rule!r}: expected one of {RULES} ('match' for fixed-token children, "
                         "'rrs' / 'rrs_wor' for children sampled from the drafter with / without replacement)")
    checks = dict(p_target=(p_target, True, 3))
    if rule != "match":
        if q_draft is None:
            raise ValueError(f"rule = {rule!r} needs q_draft [B, T, V], the drafter's distribution at every node "
                             "(its children were sampled from it); use rule='match' for fixed-token children")
        checks["q_draft"] = (q_draft, True, 3)
    par, depth = _check_tokens(tree, draft_tokens, **checks)
    B, T = draft_tokens.shape
    V = p_target.shape[-1]
    if rule != "match" and q_draft.shape[-1] != V:
        raise ValueError(f"q_draft has {q_draft.shape[-1]} tokens per row, p_target {V}: both cover the vocabulary")
    if int(draft_tokens.max()) >= V:
        raise ValueError(f"draft_tokens holds {int(draft_tokens.max())}, outside the vocabulary 0..{V - 1} of p_target")
    if rule != "match":
        has = (draft_tokens >= 0) & (par >= 0)
        q_parent = q_draft.gather(1, par.clamp(min=0)[..., None].expand(B, T, V))       # q at each node's parent
        bad = has & (q_parent.gather(2, draft_tokens.clamp(min=0)[..., None])[..., 0] <= 0)
        if bad.any():
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"q_draft gives probability 0 to the token of node {t} (request {b}) at its parent: "
                             "the children must be drawn from q_draft; pass the distribution they were sampled from")
    dev = p_target.device
    if coins is None:
        coins = torch.rand(B, T, generator=generator, device=dev, dtype=p_target.dtype)
    if draws is None:
        draws = 1 - torch.rand(B, T, generator=generator, device=dev, dtype=p_target.dtype)
    for name, x in (("coins", coins), ("draws", draws)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (B, T):
            raise ValueError(f"{name} must be a tensor [B, T] = [{B}, {T}] of uniform numbers, got "
                             f"{tuple(getattr(x, 'shape', ()))}")
    width = int(sibling_rank(par).max()) + 1 if T > 1 else 0
    return sampled_fwd(par, draft_tokens, p_target, q_draft, rule, coins, draws, depth, width)


def sampled_fwd(parents: torch.Tensor, draft_tokens: torch.Tensor, p_target: torch.Tensor,
                q_draft: torch.Tensor | None, rule: str, coins: torch.Tensor, draws: torch.Tensor, max_depth: int,
                width: int, rank: torch.Tensor | None = None) -> Acceptance:
    """``sampled`` on inputs already validated: parents int64 [B, T] on the tokens' device; ``max_depth``
    and ``width`` (the most children of a node) bound the loops, so the walk never syncs with the host;
    ``rank``: ``sibling_rank(parents)``, when the caller keeps it."""
    B, T, V = p_target.shape
    dev = p_target.device
    rows = torch.arange(B, device=dev)
    nodes = torch.arange(T, device=dev)
    rank = sibling_rank(parents) if rank is None else rank
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    live = torch.ones(B, dtype=torch.bool, device=dev)
    bonus = torch.full((B,), -1, dtype=torch.long, device=dev)
    steps = [cur]
    for _ in range(max_depth):
        r = p_target[rows, cur]                                              # [B, V]
        nxt = torch.full((B,), -1, dtype=torch.long, device=dev)
        if rule == "match":
            y = sample_categorical(r, draws[rows, cur])
        else:
            q = q_draft[rows, cur]                                           # [B, V]
            taken = torch.zeros(B, V, dtype=torch.bool, device=dev)
        for j in range(width):
            cand = (parents == cur[:, None]) & (rank == j)
            c = torch.where(cand.any(1), torch.where(cand, nodes, 0).sum(1), -1)  # the j-th child, -1: none
            x = draft_tokens[rows, c.clamp(min=0)]
            has = live & (c >= 0) & (x >= 0) & (nxt < 0)
            x = x.clamp(min=0)
            if rule == "match":
                nxt = torch.where(has & (x == y), c, nxt)
                continue
            qj = q
            if rule == "rrs_wor":
                qj = torch.where(taken, 0, q)
                qj = qj / qj.sum(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)
            ok = has & (coins[rows, c.clamp(min=0)] * qj[rows, x] < r[rows, x])
            nxt = torch.where(ok, c, nxt)
            r = torch.where((has & ~ok)[:, None], residual(r, qj), r)
            taken[rows, x] |= has
        stop = live & (nxt < 0)
        if rule != "match":
            y = sample_categorical(r, draws[rows, cur])
        bonus = torch.where(stop, y, bonus)
        live = live & ~stop
        cur = torch.where(live, nxt, cur)
        steps.append(torch.where(live, cur, -1))
    last = sample_categorical(p_target[rows, cur], draws[rows, cur])  # walked to a leaf: sample the target there
    bonus = torch.where(live, last, bonus)
    path = torch.stack(steps, 1)
    length = (path >= 0).sum(1)
    return Acceptance(cur, path, length, bonus)


def sampled_ref(parents: list[int], draft_tokens: list[int], p_target: torch.Tensor, q_draft: torch.Tensor | None,
                rule: str, coins: list[float], draws: list[float]) -> tuple[list[int], int]:
    """One request, as plainly as possible: (the accepted path root..a, the bonus token). p_target,
    q_draft: [T, V]; the other arguments are plain lists. The twin of ``sampled_fwd``."""
    children = [[c for c in range(len(parents)) if parents[c] == t] for t in range(len(parents))]
    path = [0]
    while True:
        t = path[-1]
        r = p_target[t]
        if rule == "match":
            y = int(sample_categorical(r, torch.tensor(draws[t], dtype=r.dtype)))
            nxt = [c for c in children[t] if draft_tokens[c] == y]
            if not nxt:
                return path, y
            path.append(nxt[0])
            continue
        accepted = None
        taken: list[int] = []
        for c in children[t]:
            x = draft_tokens[c]
            if x < 0:
                continue
            q = q_draft[t].clone()
            if rule == "rrs_wor":
                q[taken] = 0
                q = q / q.sum()
            if coins[c] * q[x] < r[x]:  # accept x with probability min(1, r(x) / q(x))
                accepted = c
                break
            r = residual(r, q)
            taken.append(x)
        if accepted is None:
            return path, int(sample_categorical(r, torch.tensor(draws[t], dtype=r.dtype)))
        path.append(accepted)


def accept_draft(parents: torch.Tensor, max_depth: int, draft: torch.Tensor, logits: torch.Tensor, q_draft=None,
                 sampling=None, width=None, rank=None):
    """One window's acceptance as the engines run it: greedy against the target's argmax when ``sampling`` is None,
    else ``sampling``'s rule on its warped logits with its uniforms (a ``treewy.sampling.params.Sampling``)."""
    if sampling is None:
        return greedy_fwd(parents, draft, logits.argmax(-1), max_depth)
    coins, draws = sampling.uniforms(draft.shape, draft.device)
    return sampled_fwd(parents, draft, sampling.warp(logits), q_draft, sampling.rule, coins, draws, max_depth,
                       width, rank)


def sampled_walk_tables(tree, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """What ``sampled_fwd`` indexes with, built once per window shape: each node's rank among its siblings in
    ``rows`` (the window's parents) and the tree's widest fan-out."""
    kids = tree.parents.tolist()[1:]
    return sibling_rank(rows), max((kids.count(p) for p in set(kids)), default=0)
