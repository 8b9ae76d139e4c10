"""Which kernel family serves a window: a pure function of host-side facts (T, B, whether the window is a
chain), so a CUDA-graph capture launches exactly what an eager call launches. README.md holds the table
as last measured."""

from __future__ import annotations

#: The kernel families ``tree_verify_fwd(kernel=...)`` can force: "chain" (one launch, chains only), "dense" (one
#: launch, trees of up to 64 nodes: (I + M)^-1 formed once per value head, then the value tiles streamed), "path"
#: (one launch, any tree) and "path_split" (any tree: the path kernel's tables in a launch of their own, once
#: per value head, then the streaming kernel).
KERNELS = ("chain", "dense", "path", "path_split")

#: Launches per GDN layer per step of each family.
LAUNCHES = {"chain": 1, "dense": 1, "path": 1, "path_split": 2}


#: Smallest batch from which trees take a per-value-head launch (dense, or path_split past DENSE_MAX_NODES) rather
#: than the one-launch path kernel: measured faster at B = 64 and 256 and slower at B = 1 (H200, 2026-11-30,
#: benchmarks/results/targets_h200_2026-11-30.txt); B between 1 and 64 not measured.
SPLIT_MIN_BATCH = 64

#: Most nodes the dense kernel takes (its [BT, BT] tiles live in registers); wider trees take path_split.
DENSE_MAX_NODES = 64


def select_kernel(T: int, B: int, chain: bool, state_bf16: bool = False) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all;
    ``state_bf16``: the state is stored in bf16.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size, except over a bf16 state
    from SPLIT_MIN_BATCH requests on, where the dense kernel's state products take one bf16 pass (291.6 vs
    391.8 us for a chain of 4 at B = 256, H200, 2026-11-30); other trees the path
    kernel in one launch below SPLIT_MIN_BATCH requests, and from there on the dense kernel (up to DENSE_MAX_NODES
    nodes) or the split path launch. On the H200 (2026-11-30, benchmarks/NOTES.md v8): the dense kernel beat the
    split launch at (3, 3, 3) B = 256 (1281.5 vs 1480.0 us), B = 64 (333.0 vs 379.95) and (2, 2, 2) B = 256 (528.3
    vs 651.87), and lost to the path kernel at (3, 3, 3) B = 1 (28.5 vs 13.73); the chain kernel beat it on chains
    (463.42 vs 476.7 us at B = 256)."""
    if chain:
        return "dense" if state_bf16 and B >= SPLIT_MIN_BATCH and T <= DENSE_MAX_NODES else "chain"
    if B < SPLIT_MIN_BATCH:
        return "path"
    return "dense" if T <= DENSE_MAX_NODES else "path_split"
