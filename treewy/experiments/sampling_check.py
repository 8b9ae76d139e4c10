"""Checks that sampled tree speculation keeps the target distribution: Pearson's chi-square test, a toy
target and drafter whose distributions are known exactly, and the tiny model's own second token.

The target and the drafter are Markov chains over a small vocabulary: after token a the target draws
the next token from ``p_next[a]`` and the drafter from ``q_next[a]``. Plain sampling gives every
sequence of L tokens after a start token the probability prod p_next[x_i, x_{i+1}]; speculation must
give the same, whatever the tree and the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from treewy.accept import sampled
from treewy.sampling.params import draw_children
from treewy.tree import DraftTree


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    draws: int
    cells: int   # cells after pooling the rare ones


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's goodness-of-fit test of ``counts`` [n] against cell probabilities ``probs`` [n]. Cells
    expected fewer than ``min_expected`` times are pooled into one (with the smallest cells above it
    until the pool reaches ``min_expected``); a count in a cell of probability 0 gives p = 0."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts.shape != probs.shape:
        raise ValueError(f"counts has {counts.numel()} cells, probs {probs.numel()}: one probability per cell")
    n = float(counts.sum())
    if n <= 0:
        raise ValueError("counts is empty: draw some samples first")
    if bool((counts[probs == 0] > 0).any()):
        return ChiSquare(math.inf, 0, 0.0, int(n), int((probs > 0).sum()))
    expected = probs * n
    order = expected.argsort()
    pooled_e, pooled_c, k = 0.0, 0.0, 0
    while k < len(order) and (pooled_e < min_expected or expected[order[k]] < min_expected):
        pooled_e += float(expected[order[k]])
        pooled_c += float(counts[order[k]])
        k += 1
    keep = order[k:]
    e = torch.cat([expected[keep], torch.tensor([pooled_e], dtype=torch.float64)]) if pooled_e > 0 else expected[keep]
    c = torch.cat([counts[keep], torch.tensor([pooled_c], dtype=torch.float64)]) if pooled_e > 0 else counts[keep]
    stat = float(((c - e) ** 2 / e).sum())
    dof = len(e) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))
    return ChiSquare(stat, dof, p, int(n), len(e))


def sequence_index(seqs: torch.Tensor, V: int) -> torch.Tensor:
    """int64 [n, L] token sequences -> their cell in 0..V**L - 1 (first token most significant)."""
    L = seqs.shape[-1]
    return (seqs * V ** torch.arange(L - 1, -1, -1)).sum(-1)


@dataclass
class ToyChain:
    p_next: torch.Tensor  # [V, V] fp64: the target's next-token distribution after each token
    q_next: torch.Tensor  # [V, V] fp64: the drafter's

    @classmethod
    def random(cls, V: int = 5, seed: int = 0, spread: float = 1.5) -> ToyChain:
        """Rows softmax(spread * z) with z ~ N(0, 1): peaked enough that drafts are often accepted,
        different enough between target and drafter that rejections are common."""
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(2, V, V, generator=g, dtype=torch.float64)
        x = (spread * z).softmax(-1)
        return cls(x[0], x[1])

    @property
    def vocab(self) -> int:
        return self.p_next.shape[0]

    def joint(self, start: int, length: int) -> torch.Tensor:
        """[V ** length]: the target's probability of each sequence of ``length`` tokens after ``start``."""
        probs = self.p_next[start]
        for _ in range(length - 1):  # sequence i ends with token i % V
            last = torch.arange(probs.numel()) % self.vocab
            probs = (probs[:, None] * self.p_next[last]).flatten()
        return probs

    def draft(self, tree: DraftTree, roots: torch.Tensor, rule: str, generator: torch.Generator) -> torch.Tensor:
        """tokens [n, T]: the drafter's tree after each root; top-w children for ``match``, sampled ones
        (i.i.d. or without replacement) for ``rrs`` / ``rrs_wor``."""
        n, T = roots.shape[0], tree.num_nodes
        tokens = torch.full((n, T), -1, dtype=torch.long)
        tokens[:, 0] = roots
        for t in range(T):
            kids = tree.children(t)
            if not kids:
                continue
            q = self.q_next[tokens[:, t].clamp(min=0)]
            if rule == "match":
                x = q.topk(len(kids), dim=-1).indices
            else:
                x = draw_children(q, len(kids), rule == "rrs", generator)
            tokens[:, kids] = torch.where(tokens[:, t:t + 1] >= 0, x, -1)
        return tokens

    def speculate(self, tree: DraftTree, rule: str, n: int, length: int, start: int = 0, seed: int = 0,
                  accept=sampled) -> tuple[torch.Tensor, float]:
        """Speculative sampling of n sequences of ``length`` tokens after ``start``, all n in parallel:
        (tokens [n, length], mean tokens per step). ``accept`` is the acceptance function (the tests
        pass deliberately wrong ones)."""
        g = torch.Generator().manual_seed(seed)
        out = torch.full((n, length), -1, dtype=torch.long)
        filled = torch.zeros(n, dtype=torch.long)
        roots = torch.full((n,), start, dtype=torch.long)
        rows = torch.arange(n)
        steps, emitted_total = 0, 0
        while bool((filled < length).any()):
            tokens = self.draft(tree, roots, rule, g)
            p = self.p_next[tokens.clamp(min=0)]
            q = self.q_next[tokens.clamp(min=0)]
            acc = accept(tree, tokens, p, q, rule, generator=g)
            for d in range(acc.path.shape[1]):          # the accepted drafts, then the bonus
                node = acc.path[:, d]
                ok = (d >= 1) & (node >= 0)
                tok = tokens[rows, node.clamp(min=0)]
                self._put(out, filled, ok, tok, length)
            self._put(out, filled, torch.ones(n, dtype=torch.bool), acc.bonus, length)
            roots = acc.bonus
            steps += 1
            emitted_total += int(acc.length.sum())
        return out, emitted_total / (steps * n)

    @staticmethod
    def _put(out, filled, ok, tok, length):
        ok = ok & (filled < length)
        idx = ok.nonzero()[:, 0]
        out[idx, filled[idx]] = tok[idx]
        filled += ok.long()


def toy_check(rule: str, tree=(3, 2), draws: int = 20000, length: int = 3, seed: int = 1, accept=sampled
              ) -> tuple[ChiSquare, float]:
    """The first ``length`` tokens of ``draws`` speculative runs on ``ToyChain.random(5, seed=0)`` against
    the chain's exact joint distribution: (the test, mean tokens per step)."""
    toy = ToyChain.random(5, seed=0)
    seqs, per_step = toy.speculate(DraftTree.from_widths(tree), rule, draws, length, seed=seed, accept=accept)
    counts = torch.bincount(sequence_index(seqs, toy.vocab), minlength=toy.vocab ** length)
    return chi_square(counts, toy.joint(0, length)), per_step


@torch.no_grad()
def second_token_check(model, prompt: list[int], drafter: str, rule: str, draws: int = 500, top_k: int = 4,
                       temperature: float = 1.0, tree=(3,), seed: int = 0) -> tuple[ChiSquare, float]:
    """``draws`` requests of one prompt, two tokens each: the first is sampled after prefill, the second is
    the first one the tree decides (an accepted depth-1 draft or the bonus at the root). Their joint counts
    against the model's own p(x1) p(x2 | x1) from a plain causal forward: (the test, tokens per step)."""
    from treewy.decode import generate
    from treewy.models.hybrid import forward_sequence
    from treewy.models.spec import spec_of
    from treewy.sampling.params import warp

    spec = spec_of(model)
    dev = next(model.parameters()).device
    h = forward_sequence(spec, torch.tensor([prompt], device=dev))
    p1 = warp(spec.lm_head(h[:, -1]).double(), temperature, top_k)[0].cpu()
    first = p1.nonzero()[:, 0]
    h = forward_sequence(spec, torch.tensor([prompt + [int(x)] for x in first], device=dev))
    p2 = warp(spec.lm_head(h[:, -1]).double(), temperature, top_k).cpu()
    V = p1.numel()
    joint = torch.zeros(V, V, dtype=torch.float64)
    joint[first] = p1[first, None] * p2
    res = generate(model, [prompt] * draws, drafter=drafter, tree=tree, max_new_tokens=2, temperature=temperature,
                   top_k=top_k, seed=seed, rule=rule, commit="store_all")
    got = torch.tensor([t[:2] for t in res.tokens])
    counts = torch.bincount(got[:, 0] * V + got[:, 1], minlength=V * V)
    return chi_square(counts, joint.flatten()), res.acceptance_length
