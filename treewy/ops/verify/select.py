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


#: Smallest batch from which trees of more than DENSE_MAX_NODES nodes take the split path launch, and chains over a
#: bf16 state the dense kernel: measured faster at B = 64 and 256 (H200, 2026-11-30,
#: benchmarks/results/targets_h200_2026-11-30.txt); smaller batches not measured for those.
SPLIT_MIN_BATCH = 64

#: Most nodes the dense kernel takes (its [BT, BT] tiles live in registers); wider trees take path_split.
DENSE_MAX_NODES = 64

#: (most nodes, smallest batch): trees of up to that many nodes take the dense kernel from that batch on, the path
#: kernel below it. Measured (H200, 2026-12-01, benchmarks/results/batch_crossover_h200_2026-12-01.json): (2,2,2)
#: (15 nodes) path 10.04 vs dense 11.64 us at B = 1, 16.98 vs 12.00 at B = 4; (3,3,3) (40 nodes) 26.13 vs 29.59 at
#: B = 4, 55.85 vs 41.31 at B = 8.
DENSE_MIN_BATCH = ((16, 4), (DENSE_MAX_NODES, 8))


def dense_min_batch(T: int) -> int | None:
    """The smallest batch from which a tree of T nodes takes the dense kernel (None: wider than it takes)."""
    return next((b for nodes, b in DENSE_MIN_BATCH if T <= nodes), None)


def select_kernel(T: int, B: int, chain: bool, state_bf16: bool = False, exact: bool = False) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all;
    ``state_bf16``: the state is stored in bf16; ``exact``: products in exact fp32 (dot precision "ieee", as on
    GPUs without tf32), where the dense kernel is never chosen: its [BT, BT] fp32 products spill there (63824.7 us
    at (3, 3, 3) B = 256 against 4165.41 on the path kernel, H200, benchmarks/results/targets_h200_2026-12-01.txt
    and _run10.txt), so those windows keep the path families.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size, except over a bf16 state
    from SPLIT_MIN_BATCH requests on, where the dense kernel's state products take one bf16 pass (291.6 vs
    391.8 us for a chain of 4 at B = 256, H200, 2026-11-30). Other trees: the dense kernel from
    ``dense_min_batch(T)`` requests on, the path kernel in one launch below; trees wider than DENSE_MAX_NODES the
    path kernel below SPLIT_MIN_BATCH requests and its split launch from there on. On the H200 (benchmarks/NOTES.md
    v8, v9): the dense kernel beat the split launch at (3, 3, 3) B = 256 (1281.5 vs 1480.0 us), B = 64 (333.0 vs
    379.95) and (2, 2, 2) B = 256 (528.3 vs 651.87), and the path kernel from 8 requests at (3, 3, 3) and from 4
    at (2, 2, 2); the chain kernel beat it on chains (463.42 vs 476.7 us at B = 256)."""
    if chain:
        return "dense" if state_bf16 and not exact and B >= SPLIT_MIN_BATCH and T <= DENSE_MAX_NODES else "chain"
    dense_from = None if exact else dense_min_batch(T)
    if dense_from is not None:
        return "dense" if B >= dense_from else "path"
    return "path_split" if B >= SPLIT_MIN_BATCH else "path"
