"""The paper's serving tables (arXiv 2608.20961, B200, vLLM; DESIGN.md section 4): Table 1 (35B at TP1 gmu 0.6,
397B at TP8 gmu 0.75) and Table 3 (the higher budgets), ratio TreeWY / store-all per concurrency, geomean over 5
workloads. Keyed by (model, tp, gmu); the 35B gmu 0.6 entry is ``treewy.paper.SERVING_RATIOS`` itself."""

from __future__ import annotations

from treewy.paper import CONCURRENCIES, SERVING_RATIOS

_METRICS = tuple(SERVING_RATIOS)


def _table(tput, kv, ttft, tpot, admitted) -> dict[str, tuple[float, ...]]:
    return dict(zip(_METRICS, (tput, kv, ttft, tpot, admitted)))


PAPER_TABLES: dict[tuple[str, int, float], dict[str, tuple[float, ...]]] = {
    ("qwen3.5-35b-a3b", 1, 0.6): SERVING_RATIOS,
    ("qwen3.5-35b-a3b", 1, 0.75): _table((0.95, 0.98, 1.00, 1.00, 1.02, 1.18), (2.32, 2.44, 2.45, 2.48, 2.43, 1.62),
                                         (1.09, 1.00, 1.01, 0.94, 0.99, 4.61), (0.94, 1.00, 0.99, 1.00, 1.02, 0.80),
                                         (1.00, 1.00, 1.00, 1.00, 1.01, 1.46)),
    ("qwen3.5-35b-a3b", 1, 0.9): _table((0.93, 0.97, 0.98, 0.98, 1.00, 1.03), (2.32, 2.44, 2.45, 2.46, 2.48, 2.26),
                                        (0.91, 0.65, 1.06, 0.94, 0.99, 1.44), (0.93, 0.98, 0.98, 0.98, 0.99, 0.95),
                                        (1.00, 1.00, 1.00, 1.00, 1.00, 1.07)),
    ("qwen3.5-397b-a17b", 8, 0.75): _table((0.93, 0.97, 1.01, 1.01, 1.02, 1.15), (2.00, 2.19, 2.19, 2.19, 2.09, 1.61),
                                           (0.95, 1.08, 0.99, 1.00, 1.07, 3.35), (0.94, 0.96, 1.01, 1.02, 0.99, 0.90),
                                           (1.00, 1.00, 1.00, 1.00, 1.04, 1.24)),
    ("qwen3.5-397b-a17b", 8, 0.9): _table((0.93, 0.97, 0.99, 0.99, 0.99, 1.00), (2.00, 2.19, 2.19, 2.19, 2.22, 2.15),
                                          (0.95, 0.94, 0.94, 1.00, 0.98, 1.02), (0.92, 0.96, 0.99, 0.99, 0.99, 0.98),
                                          (1.00, 1.00, 1.00, 1.00, 1.00, 1.03)),
}

__all__ = ["CONCURRENCIES", "PAPER_TABLES"]
