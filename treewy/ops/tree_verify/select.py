"""Which kernel family serves a window: a pure function of host-side facts (T, B, whether the window is a
chain), so a CUDA-graph capture launches exactly what an eager call launches. README.md holds the table
as last measured."""

from __future__ import annotations

#: The kernel families ``tree_verify_fwd(kernel=...)`` can force: "chain" (one launch, chains only), "path"
#: (one launch, any tree) and "wy" (prepare + stream, two launches, any tree).
KERNELS = ("chain", "path", "wy")

#: Launches per GDN layer per step of each family.
LAUNCHES = {"chain": 1, "path": 1, "wy": 2}


def select_kernel(T: int, B: int, chain: bool) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size, trees the WY pair: on
    the H200 (2026-11-30, benchmarks/results/targets_h200_2026-11-30.txt) the chain kernel beat the WY pair on
    every chain row: 5.6 vs 13.3 us at B = 1, 141 vs 184 us at B = 64, 546 vs 715 us at B = 256 (bf16 state:
    425 vs 637 us)."""
    del T, B   # the choice needs neither today; kept so that a measured threshold can be added in one place
    return "chain" if chain else "path"
