"""Which kernel family serves a window: a pure function of host-side facts (T, B, whether the window is a
chain), so a CUDA-graph capture launches exactly what an eager call launches. README.md holds the table
as last measured."""

from __future__ import annotations

#: The kernel families ``tree_verify_fwd(kernel=...)`` can force: "chain" (one launch, chains only), "path"
#: (one launch, any tree) and "path_split" (any tree: the path kernel's tables in a launch of their own, once
#: per value head, then the streaming kernel).
KERNELS = ("chain", "path", "path_split")

#: Launches per GDN layer per step of each family.
LAUNCHES = {"chain": 1, "path": 1, "path_split": 2}


#: Smallest batch from which trees take the split launch: measured faster at B = 64 and 256 and slower at B = 1
#: (H200, 2026-11-30, benchmarks/results/targets_h200_2026-11-30_run6.txt, run8.log); B between 1 and 64 not measured.
SPLIT_MIN_BATCH = 64


def select_kernel(T: int, B: int, chain: bool) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size; other trees the path
    kernel in one launch below SPLIT_MIN_BATCH requests and in two (``path_split``) from there on. On the H200
    (2026-11-30): the chain kernel beat the path kernel on every chain row (5.25 vs 12.0 us at B = 1, 120.8 vs
    189.8 at B = 64, 463.5 vs 727.5 at B = 256; run 3); the split launch beat the single one at (3, 3, 3)
    B = 256 (1786.3 vs 2019.1 us), B = 64 (456.9 vs 514.9) and (2, 2, 2) B = 256 (649.5 vs 817.9), and lost at
    (3, 3, 3) B = 1 (18.7 vs 15.9; run 6)."""
    del T   # the choice does not need it today; kept so that a measured threshold can be added in one place
    if chain:
        return "chain"
    return "path_split" if B >= SPLIT_MIN_BATCH else "path"
