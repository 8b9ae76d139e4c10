"""Which kernel family serves a window: a pure function of host-side facts (T, B, whether the window is a
chain), so a CUDA-graph capture launches exactly what an eager call launches. README.md holds the table
as last measured."""

from __future__ import annotations

#: The kernel families ``tree_verify_fwd(kernel=...)`` can force: "chain" (one launch, chains only) and "path"
#: (one launch, any tree).
KERNELS = ("chain", "path")

#: Launches per GDN layer per step of each family.
LAUNCHES = {"chain": 1, "path": 1}


def select_kernel(T: int, B: int, chain: bool) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size, other trees the path
    kernel. On the H200 (2026-11-30, benchmarks/results/targets_h200_2026-11-30_run3.log) the chain kernel beat
    the path kernel on every chain row (5.25 vs 12.0 us at B = 1, 120.8 vs 189.8 at B = 64, 463.5 vs 727.5 at
    B = 256), and the path kernel beat the WY pair it replaced on every tree row but (2, 2, 2), B = 256 (827.9
    vs 817.9 us): (3, 3, 3) 15.4 vs 27.5 us at B = 1, 553.4 vs 697.6 at B = 64, 2212.0 vs 2738.2 at B = 256."""
    del T, B   # the choice needs neither today; kept so that a measured threshold can be added in one place
    return "chain" if chain else "path"
