"""The TreeWY paper's published figures (arXiv 2608.20961; DESIGN.md section 4), in one place.

Measured by the paper's authors on B200 GPUs in vLLM. Everything that compares with the paper
(the sweep, the simulator, the notebooks) reads them from here.
"""

#: The tree shapes of the width sweep, as branching factors: N = 3, 6, 10, 14, 21, 30, 39 drafts.
SHAPES = ((1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3))

#: Acceptance length per step (Qwen3.5-35B-A3B, gmu 0.9, spec-bench, greedy, MTP drafts).
ACCEPTANCE = dict(zip(SHAPES, (3.23, 3.30, 3.38, 3.38, 3.41, 3.45, 3.58)))

#: Closed-loop concurrencies of the serving sweep.
CONCURRENCIES = (1, 8, 32, 64, 128, 256)

#: Serving sweep, TreeWY / store-all (> 1 favours TreeWY), geomean over 5 workloads; Qwen3.5-35B-A3B,
#: TP1, gmu 0.6, depth-3 MTP chain; one value per concurrency above.
SERVING_RATIOS = {
    "output throughput": (0.94, 1.02, 1.01, 1.00, 1.20, 1.40),
    "peak KV usage reduction": (2.43, 2.40, 2.45, 2.44, 1.64, 1.04),
    "p99 TTFT speedup": (1.02, 1.03, 1.02, 1.01, 5.62, 3.97),
    "TPOT speedup": (0.94, 1.02, 1.00, 0.99, 0.83, 0.60),
    "peak admitted requests": (1.00, 1.00, 1.00, 1.01, 1.45, 2.50),
}


def geometric_acceptance_rates(length: float, k: int) -> tuple[float, ...]:
    """Per-position unconditional acceptance rates (a_1 .. a_k) of a depth-``k`` chain whose every draft is accepted
    with the same probability ``alpha`` once its parent was (Leviathan et al.'s i.i.d. model: a_i = alpha ** i), with
    ``alpha`` chosen so that a step emits ``length`` tokens on average: 1 + alpha + ... + alpha ** k = length.

    One parameter, because the paper publishes one figure per chain (tokens per step), not a per-position profile;
    ``alpha`` is found by bisection (the sum rises monotonically in alpha on [0, 1])."""
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"length = {length}: a chain of {k} drafts emits 1 to {k + 1} tokens per step")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < length - 1 else (lo, mid)
    alpha = 0.0 if length == 1 else (lo + hi) / 2
    return tuple(alpha ** i for i in range(1, k + 1))


#: The acceptance that synthetic serving runs reproduce by default (``treewy serve --acceptance paper-35b``): the
#: paper's 35B depth-3 MTP chain, ACCEPTANCE[(1, 1, 1)] tokens per step, spread over positions by the rule above.
#: Other chain lengths keep its per-draft rate: a_i = PAPER_35B_ALPHA ** i.
PAPER_35B_CHAIN_RATES = geometric_acceptance_rates(ACCEPTANCE[(1, 1, 1)], 3)
PAPER_35B_ALPHA = PAPER_35B_CHAIN_RATES[0]
