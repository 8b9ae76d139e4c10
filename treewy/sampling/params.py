"""What a sampled decode needs besides the model: the warp of the logits, the acceptance rule and one
seeded stream of random numbers per device."""

from __future__ import annotations

import math

import torch

from treewy.accept import RULES
from treewy.tree import as_int


def warp(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
         ) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / temperature) over the top_k largest logits,
    then cut to the smallest set of most likely tokens whose mass reaches top_p, renormalized.
    logits [..., V] -> probs [..., V] (fp32, or fp64 for fp64 logits)."""
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    # divide the gaps to the largest logit, never the logits themselves: logits / temperature overflows
    # to inf (a NaN softmax) at tiny temperatures, while the gaps only run to -inf, and the largest logit
    # keeps 0 (exactly, also where the temperature is below the float's range), so the limit is the argmax
    top = x.amax(-1, keepdim=True)
    gap = x - torch.where(top.isfinite(), top, 0)
    x = torch.where(gap == 0, 0, gap / temperature)
    V = x.shape[-1]
    if top_k is not None and top_k < V:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    probs = x.softmax(-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = probs.sort(-1, descending=True)
        before = torch.cat([torch.zeros_like(sorted_p[..., :1]), sorted_p.cumsum(-1)[..., :-1]], -1)  # mass ahead
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(drop, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw_children(probs: torch.Tensor, w: int, replacement: bool, generator: torch.Generator | None = None
                  ) -> torch.Tensor:
    """w draws per row of probs [N, V] -> int64 [N, w]: i.i.d. (``replacement``: inverse CDF, the first token
    whose cumulative probability exceeds U x the row's total, so a token of probability 0 is never drawn) or
    without replacement in order (the exponential race: the w smallest E / p with E ~ Exp(1)); -1 where a row
    has fewer than w tokens of positive probability left to draw (i.i.d.: none, or a NaN). Neither syncs with the
    host, so a CUDA graph can hold them (torch.multinomial checks its input on the host)."""
    if replacement:
        cdf = probs.double().cumsum(-1)       # fp64: U x total < total, so the search stays inside the row
        total = cdf[:, -1:]
        u = torch.rand(probs.shape[0], w, dtype=torch.float64, device=probs.device, generator=generator)
        return torch.where(total > 0, torch.searchsorted(cdf, u * total, right=True), -1)
    e = torch.empty_like(probs).exponential_(generator=generator)
    keys = probs / e
    top = keys.topk(w, dim=-1)
    return torch.where(top.values > 0, top.indices, -1)


class Sampling:
    """Temperature (> 0), top_k, top_p, the acceptance rule (``treewy.accept.RULES``) and a seed.

    ``warp`` is applied to the target's logits and to the drafter's; ``generator(device)`` is the one
    random stream a decode uses on that device (seeded: the same seed reproduces a run on the same
    device; no seed: a fresh one per Sampling)."""

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, rule: str = "match", vocab: int | None = None):
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0 \
                or not math.isfinite(temperature):
            raise ValueError(f"temperature = {temperature!r}: a sampled decode needs a finite number > 0 "
                             "(temperature 0 is greedy decoding)")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k = {top_k!r}: expected None (no cut) or a positive integer such as 50")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0 < top_p <= 1):
            raise ValueError(f"top_p = {top_p!r}: expected None (no cut) or a number in (0, 1] such as 0.9")
        if seed is not None and (as_int(seed) is None or not 0 <= seed < 2 ** 63):
            raise ValueError(f"seed = {seed!r}: expected None or an integer in 0..2**63 - 1")
        if rule not in RULES:
            raise ValueError(f"rule = {rule!r}: expected one of {RULES} ('match': fixed-token children such as "
                             "top-w MTP or n-gram drafts; 'rrs' / 'rrs_wor': children sampled from the drafter "
                             "with / without replacement)")
        seed = None if seed is None else as_int(seed)
        self.temperature, self.top_k, self.top_p, self.seed, self.rule = float(temperature), top_k, top_p, seed, rule
        self.vocab = vocab  # the vocabulary size, for drafters that build q_draft themselves (n-gram)
        self._generators: dict[str, torch.Generator] = {}

    @property
    def sampled_children(self) -> bool:
        """The drafter samples children from its distribution (and must say what that distribution was)."""
        return self.rule != "match"

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return warp(logits, self.temperature, self.top_k, self.top_p)

    def generator(self, device) -> torch.Generator:
        device = torch.device(device)
        key = str(device)
        if key not in self._generators:
            g = torch.Generator(device)
            if self.seed is None:
                g.seed()
            else:
                g.manual_seed(self.seed)
            self._generators[key] = g
        return self._generators[key]

    def uniforms(self, shape, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(coins in [0, 1), draws in (0, 1]) of the given shape: what the acceptance rules consume."""
        u = torch.rand(2, *shape, generator=self.generator(device), device=device)
        return u[0], 1 - u[1]

    def __repr__(self) -> str:
        return (f"Sampling(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"seed={self.seed}, rule={self.rule!r})")


def sampling_of(temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                seed: int | None = None, rule: str = "match", vocab: int | None = None) -> Sampling | None:
    """None for temperature 0 (greedy, which uses none of the other arguments, but a bad one is still an
    error rather than ignored), else a validated Sampling."""
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0:
        Sampling(1.0, top_k, top_p, seed, rule, vocab)
        return None
    return Sampling(temperature, top_k, top_p, seed, rule, vocab)
