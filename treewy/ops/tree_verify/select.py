"""Which kernel family serves a window: a pure function of host-side facts (T, B, whether the window is a
chain), so a CUDA-graph capture launches exactly what an eager call launches. README.md holds the table
as last measured."""

from __future__ import annotations

#: The kernel families ``tree_verify_fwd(kernel=...)`` can force: "chain" (one launch, chains only) and
#: "wy" (prepare + stream, two launches, any tree).
KERNELS = ("chain", "wy")

#: Chains of at most this many requests take the chain kernel (one launch; latency-bound at small B),
#: larger chain batches the WY pair (tensor cores; the chain kernel is instruction-bound there).
CHAIN_KERNEL_MAX_BATCH = 4

#: Launches per GDN layer per step of each family.
LAUNCHES = {"chain": 1, "wy": 2}


def select_kernel(T: int, B: int, chain: bool) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all.

    Decode windows (T = 1) and chains of small batches take the chain kernel; everything else the WY pair."""
    if chain and (T == 1 or B <= CHAIN_KERNEL_MAX_BATCH):
        return "chain"
    return "wy"
