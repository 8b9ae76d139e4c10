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
