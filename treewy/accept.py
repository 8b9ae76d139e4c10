"""Greedy acceptance on a draft tree, batched over requests.

Start at the root; move to the first child whose draft token equals the target's argmax at the
current node; stop when none does. The stop node a is committed, the bonus token is the target's
argmax at a, and the acceptance length (tokens emitted this step) is depth(a) + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.tree import DraftTree, path_depth, validate_parents


@dataclass(frozen=True)
class GreedyAcceptance:
    accepted: torch.Tensor  # int64 [B], the committed node
    path: torch.Tensor      # int64 [B, max_depth + 1], root..accepted, padded with -1
    length: torch.Tensor    # int64 [B], tokens emitted this step = depth(accepted) + 1
    bonus: torch.Tensor     # int64 [B], target argmax at the accepted node

    def emitted(self, draft_tokens: torch.Tensor, b: int) -> list[int]:
        """Tokens request b emits this step: the accepted drafts (root excluded), then the bonus."""
        nodes = self.path[b, 1: int(self.length[b])]
        return draft_tokens[b, nodes].tolist() + [int(self.bonus[b])]


def greedy(tree, draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> GreedyAcceptance:
    """tree: a DraftTree, parents [T] or [B, T]; draft_tokens, target_argmax: int [B, T]
    (the token at each node, and the target model's argmax after each node)."""
    par = validate_parents(tree.parents if isinstance(tree, DraftTree) else tree)
    for name, x in (("draft_tokens", draft_tokens), ("target_argmax", target_argmax)):
        if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.ndim != 2:
            raise ValueError(f"{name} must be an integer tensor [B, T], got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    B, T = draft_tokens.shape
    if target_argmax.shape != (B, T):
        raise ValueError(f"target_argmax has shape {tuple(target_argmax.shape)}, expected [B, T] = [{B}, {T}] "
                         "like draft_tokens")
    if par.shape[-1] != T or (par.ndim == 2 and par.shape[0] != B):
        raise ValueError(f"the tree has parents of shape {tuple(par.shape)} but draft_tokens is [{B}, {T}]")
    depth = tree.max_depth if isinstance(tree, DraftTree) else int(path_depth(par).max())
    return greedy_fwd(par.to(draft_tokens.device).expand(B, T), draft_tokens, target_argmax, depth)


def greedy_fwd(parents: torch.Tensor, draft_tokens: torch.Tensor, target_argmax: torch.Tensor,
               max_depth: int) -> GreedyAcceptance:
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
    return GreedyAcceptance(accepted, path, length, target_argmax[rows, accepted])
