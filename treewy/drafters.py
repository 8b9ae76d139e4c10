"""Tree drafters: propose a token tree of a given topology for every request of a batch.

Protocol (what ``treewy.decode.generate`` calls):

- ``begin(model, prompts, hidden, roots, capacity)``: after prefill. ``hidden[b]`` is the target's hidden
  states over prompt b ([P_b, hidden], after the final norm); ``roots[b]`` the first generated token;
  ``capacity`` the most tokens a request's context will reach.
- ``propose(tree) -> tokens [B, T]``: the token at every node of ``tree`` (a DraftTree) per request;
  column 0 is the root. -1 marks a node the drafter has nothing for (never accepted).
- ``propose_sampled(tree, sampling) -> (tokens [B, T], q_draft [B, T, V])`` (optional; sampled decoding
  with the rules ``rrs`` / ``rrs_wor``): children drawn from the drafter's own distribution, i.i.d. or
  without replacement (``sampling.rule``); ``q_draft[b, t]`` is the distribution node t's children were
  drawn from, which the acceptance rule needs (treewy/sampling/README.md). Fixed-token drafts
  (``propose``) are verified at temperature > 0 by the rule ``match``, which needs no probabilities.
- ``advance(emitted, path_hidden)``: after acceptance. ``emitted[b]`` are the tokens request b
  emitted this step (accepted drafts, then the bonus, which is the next root); ``path_hidden[b]``
  the target's hidden states at the root..accepted nodes ([len(emitted[b]), hidden]).

Two drafters: ``MTPDrafter`` (Qwen3.5's mtp.* module, level by level, top-w at each level, its own
KV cache with the tree mask) and ``NgramDrafter`` (prompt lookup; model-free). Both also sample children:
MTP from its warped next-token distribution, n-gram from the continuation counts of its longest match.
"""

from __future__ import annotations

from typing import Protocol

import torch

from treewy.sampling.params import draw_children
from treewy.tree import DraftTree


class Drafter(Protocol):
    name: str

    def begin(self, model, prompts: list[list[int]], hidden: list[torch.Tensor], roots: list[int],
              capacity: int | None = None) -> None: ...

    def propose(self, tree: DraftTree) -> torch.Tensor: ...

    def propose_sampled(self, tree: DraftTree, sampling) -> tuple[torch.Tensor, torch.Tensor]: ...

    def advance(self, emitted: list[list[int]], path_hidden: list[torch.Tensor]) -> None: ...


def _children(tree: DraftTree) -> list[list[int]]:
    ch: list[list[int]] = [[] for _ in range(tree.num_nodes)]
    for t, p in enumerate(tree.parents.tolist()[1:], start=1):
        ch[p].append(t)
    return ch


class MTPDrafter:
    """Drafts with the checkpoint's MTP module: the root's entry gives the level-1 tokens (top-w), each
    level-d node's entry (its token + its parent's entry output) gives its children's tokens."""

    name = "mtp"

    def __init__(self, model):
        from treewy.models.spec import spec_of
        from treewy.models.mtp import mtp_of
        self.mtp = mtp_of(model)
        if self.mtp is None:
            where = getattr(model, "treewy_path", "this checkpoint")
            raise ValueError(f"the MTP drafter needs mtp.* weights, but {where} has none; "
                             "use drafter='ngram' or a checkpoint with an MTP module")
        self.spec = spec_of(model)

    def begin(self, model, prompts, hidden, roots, capacity=None):
        from treewy.models.cache import KVCache
        B = len(prompts)
        dev = hidden[0].device
        dec = self.mtp.layers[0].self_attn
        cap = capacity or max(len(p) for p in prompts) + 4096
        self.cache = KVCache(B, self.spec.Hkv, cap, dec.head_dim, hidden[0].dtype, dev)
        self.cached = [0] * B  # entries in the MTP cache per request (the host's copy of cache.lens)
        # entry at position i + 1 pairs h_i with x_{i+1}; the last one pairs h_{P-1} with the root
        self.pending = [(hidden[b], list(prompts[b][1:]) + [int(roots[b])]) for b in range(B)]
        self.next_pos = torch.ones(B, dtype=torch.long, device=dev)  # position of the first pending entry
        self.roots = torch.tensor([int(r) for r in roots], device=dev)
        self.plans: dict[DraftTree, _TreePlan] = {}

    @torch.no_grad()
    def _flush(self):
        """Commit the pending entries (true target hidden states) into the MTP cache; return the root
        entries' outputs [B, hidden]."""
        from torch.nn.utils.rnn import pad_sequence

        from treewy.models.mtp import mtp_forward
        B = len(self.pending)
        dev = self.next_pos.device
        counts = [len(t) for _, t in self.pending]
        L = max(counts)
        if max(c + n for c, n in zip(self.cached, counts)) > self.cache.capacity:
            raise ValueError(f"the MTP drafter's cache is full ({self.cache.capacity} entries); pass a larger capacity")
        tok = torch.tensor([t + [0] * (L - len(t)) for _, t in self.pending], dtype=torch.long, device=dev)
        hid = pad_sequence([h[:len(t)] for h, t in self.pending], batch_first=True)
        n = torch.tensor(counts, device=dev)
        ar = torch.arange(L, device=dev)
        pos = self.next_pos[:, None] + ar
        valid = ar[None] < n[:, None]
        mask = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
        mask = mask | torch.eye(L, dtype=torch.bool, device=dev)[None]
        out, k, v = mtp_forward(self.spec, self.mtp, tok, hid, pos, self.cache.past(max(self.cached)), mask)
        self.cache.append(k, v, ar[None].expand(B, L), n)
        self.cached = [c + m for c, m in zip(self.cached, counts)]
        self.next_pos = self.next_pos + n
        self.pending = [None] * B
        return out[torch.arange(B, device=dev), n - 1]

    def _plan(self, tree: DraftTree) -> _TreePlan:
        if tree not in self.plans:
            self.plans[tree] = _TreePlan(tree, self.roots.device)
        return self.plans[tree]

    def propose(self, tree: DraftTree) -> torch.Tensor:
        return self._draft(tree, None)[0]

    def propose_sampled(self, tree: DraftTree, sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """Children drawn from the MTP head's distribution, warped like the target's (temperature, top_k,
        top_p); q_draft [B, T, V] holds that distribution at every node."""
        return self._draft(tree, sampling)

    @torch.no_grad()
    def _draft(self, tree: DraftTree, sampling):
        from treewy.models.mtp import mtp_forward
        spec = self.spec
        plan = self._plan(tree)
        B = self.roots.shape[0]
        root_out = self._flush()                                          # [B, hidden]
        tokens = torch.full((B, tree.num_nodes), -1, dtype=torch.long, device=self.roots.device)
        tokens[:, 0] = self.roots
        outs = root_out.new_zeros(B, tree.num_nodes, root_out.shape[-1])
        outs[:, 0] = root_out
        q = None
        if sampling is not None:
            q = torch.zeros(B, tree.num_nodes, spec.config.vocab_size, device=root_out.device)
        plan.fill(tokens, spec.lm_head(root_out)[:, None], plan.root_fill, q, plan.root, sampling)
        root_pos = self.next_pos - 1                                      # the root entry's position
        past = self.cache.past(max(self.cached))
        for lv in plan.levels:                                            # every drafted node up to depth d
            pos = root_pos[:, None] + lv.depth[None]
            out, _, _ = mtp_forward(spec, self.mtp, tokens[:, lv.nodes].clamp(min=0), outs[:, lv.parents], pos,
                                    past, lv.mask.expand(B, -1, -1))
            new = out[:, lv.new]
            outs[:, lv.new_nodes] = new
            plan.fill(tokens, spec.lm_head(new), lv.fill, q, lv.new_nodes, sampling)
        return tokens, q

    def advance(self, emitted, path_hidden):
        self.pending = [(path_hidden[b], list(emitted[b])) for b in range(len(emitted))]
        self.roots = torch.tensor([e[-1] for e in emitted], device=self.roots.device)


class _Level:
    """Index tensors of one MTP drafting pass: the nodes of depth 1..d and the depth-d nodes among them."""

    def __init__(self, tree: DraftTree, d: int, children: list[list[int]], device):
        depth = tree.depth.tolist()
        par = tree.parents.tolist()
        win = [t for t in range(tree.num_nodes) if 1 <= depth[t] <= d]
        new = [j for j, t in enumerate(win) if depth[t] == d]

        def ix(x):
            return torch.tensor(x, dtype=torch.long, device=device)

        self.nodes, self.parents, self.depth = ix(win), ix([par[t] for t in win]), ix([depth[t] for t in win])
        self.mask = tree.ancestor_mask()[self.nodes.cpu()][:, self.nodes.cpu()][None].to(device)
        self.new, self.new_nodes = ix(new), ix([win[j] for j in new])
        self.fill = _fill_groups([win[j] for j in new], children, device)


class _TreePlan:
    """What MTPDrafter.propose indexes with for one tree, built once: no per-step host-to-device copies."""

    def __init__(self, tree: DraftTree, device):
        children = _children(tree)
        self.root = torch.zeros(1, dtype=torch.long, device=device)
        self.root_fill = _fill_groups([0], children, device)
        self.levels = [_Level(tree, d, children, device) for d in range(1, tree.max_depth)]

    @staticmethod
    def fill(tokens, logits, groups, q=None, nodes=None, sampling=None):
        """tokens[:, children of node j] = the top-w tokens of logits[:, j], for nodes grouped by w; with
        ``sampling``, w draws from the warped distribution instead, which goes to q[:, nodes]."""
        B = tokens.shape[0]
        if sampling is not None:
            probs = sampling.warp(logits)                                 # [B, m, V]
            q[:, nodes] = probs
            gen = sampling.generator(tokens.device)
        for w, sel, child in groups:
            if sampling is None:
                top = logits[:, sel].topk(w, dim=-1).indices              # [B, m, w], distinct tokens
            else:
                p = probs[:, sel]
                top = draw_children(p.reshape(-1, p.shape[-1]), w, sampling.rule == "rrs", gen)
            tokens[:, child] = top.reshape(B, -1)


def _fill_groups(nodes: list[int], children: list[list[int]], device) -> list[tuple]:
    """(w, positions in ``nodes``, their children flattened) per child count w > 0."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for j, t in enumerate(nodes):
        if children[t]:
            sel, child = groups.setdefault(len(children[t]), ([], []))
            sel.append(j)
            child.extend(children[t])
    return [(w, torch.tensor(sel, device=device), torch.tensor(child, device=device))
            for w, (sel, child) in groups.items()]


class NgramDrafter:
    """Prompt lookup: a node's children are the most frequent continuations of the longest n-gram
    (n = max_n .. 1) ending at that node that occurred earlier in the request's context."""

    name = "ngram"

    def __init__(self, max_n: int = 4):
        if max_n < 1:
            raise ValueError(f"max_n = {max_n}: the n-gram drafter needs max_n >= 1")
        self.max_n = max_n

    def begin(self, model, prompts, hidden, roots, capacity=None):
        self.ctx = [list(p) + [int(r)] for p, r in zip(prompts, roots)]
        self.index = [dict() for _ in prompts]
        self.indexed = [0] * len(prompts)
        for b in range(len(prompts)):
            self._index(b)

    def _index(self, b: int) -> None:
        ctx, idx = self.ctx[b], self.index[b]
        for end in range(max(self.indexed[b], 1), len(ctx)):  # continuation ctx[end] of grams ending at end-1
            for n in range(1, self.max_n + 1):
                if end - n < 0:
                    break
                key = tuple(ctx[end - n:end])
                nxt = idx.setdefault(key, {})
                c, _ = nxt.get(ctx[end], (0, 0))
                nxt[ctx[end]] = (c + 1, end)
        self.indexed[b] = len(ctx)

    def _continuations(self, b: int, path: list[int]) -> dict[int, tuple[int, int]]:
        """token -> (count, last position) after the longest n-gram ending the context + path."""
        seq = self.ctx[b][-self.max_n:] + path
        for n in range(min(self.max_n, len(seq)), 0, -1):
            nxt = self.index[b].get(tuple(seq[-n:]))
            if nxt:
                return nxt
        return {}

    def _candidates(self, b: int, path: list[int]) -> list[int]:
        nxt = self._continuations(b, path)
        return [t for t, _ in sorted(nxt.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))]

    def propose(self, tree: DraftTree) -> torch.Tensor:
        return self._draft(tree, None)[0]

    def propose_sampled(self, tree: DraftTree, sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """Children drawn from the continuation counts of the longest match (count / total; temperature,
        top_k and top_p do not apply to counts); q_draft [B, T, V] holds those frequencies (zero rows
        where nothing matched, whose children carry no token)."""
        if sampling.vocab is None:
            raise ValueError("sampling.vocab is None: the n-gram drafter builds q_draft over the vocabulary; create "
                             "the Sampling with vocab=<the model's vocabulary size> (generate does)")
        return self._draft(tree, sampling)

    def _draft(self, tree: DraftTree, sampling):
        B, T = len(self.ctx), tree.num_nodes
        children = _children(tree)
        tokens = torch.full((B, T), -1, dtype=torch.long)
        q = None if sampling is None else torch.zeros(B, T, sampling.vocab)
        gen = None if sampling is None else sampling.generator("cpu")
        for b in range(B):
            paths: dict[int, list[int] | None] = {0: []}
            tokens[b, 0] = self.ctx[b][-1]
            for t in range(T):  # parents come first
                path = paths.get(t)
                if path is None or not children[t]:
                    for c in children[t]:
                        paths[c] = None
                    continue
                if sampling is None:
                    cands = self._candidates(b, path)
                else:
                    nxt = self._continuations(b, path)
                    if nxt:
                        q[b, t, list(nxt)] = torch.tensor([c for c, _ in nxt.values()], dtype=torch.float32)
                        q[b, t] /= q[b, t].sum()
                        cands = draw_children(q[b, t][None], len(children[t]), sampling.rule == "rrs", gen)[0].tolist()
                        cands = [x for x in cands if x >= 0]
                    else:
                        cands = []
                for j, c in enumerate(children[t]):
                    if j < len(cands):
                        tokens[b, c] = cands[j]
                        paths[c] = path + [cands[j]]
                    else:
                        paths[c] = None
        return tokens, q

    def advance(self, emitted, path_hidden):
        for b, e in enumerate(emitted):
            self.ctx[b].extend(int(t) for t in e)
            self._index(b)


def make_drafter(drafter, model) -> Drafter | None:
    """None, "mtp", "ngram" or a Drafter instance."""
    if drafter is None or drafter == "none":
        return None
    if drafter == "mtp":
        return MTPDrafter(model)
    if drafter == "ngram":
        return NgramDrafter()
    if isinstance(drafter, str):
        raise ValueError(f"drafter = {drafter!r}: expected 'mtp', 'ngram', None or a Drafter instance")
    for m in ("begin", "propose", "advance"):
        if not callable(getattr(drafter, m, None)):
            raise ValueError(f"drafter {drafter!r} has no {m}() method; see treewy.drafters.Drafter")
    return drafter
