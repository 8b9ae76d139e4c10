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
#: bf16 state the dense kernel: each the faster at B = 64 and 256 in the kernel targets table (kind
#: "kernel_targets" of treewy/data/index.json; rows "333 B64 [path_split]" against "[path]", "chain3 B256 bf16
#: [dense]" against "[chain]"); smaller batches are not timed there.
SPLIT_MIN_BATCH = 64

#: Most nodes the dense kernel takes (its [BT, BT] tiles live in registers); wider trees take path_split.
DENSE_MAX_NODES = 64

#: (most nodes, smallest batch): trees of up to that many nodes take the dense kernel from that batch on, the path
#: kernel below it: where the dense kernel starts winning for (2,2,2) (15 nodes) and (3,3,3) (40 nodes) in the
#: batch crossover table (kind "batch_crossover" of treewy/data/index.json, rows by tree and B; tests/test_results.py
#: checks these against it).
DENSE_MIN_BATCH = ((16, 4), (DENSE_MAX_NODES, 8))


def dense_min_batch(T: int) -> int | None:
    """The smallest batch from which a tree of T nodes takes the dense kernel (None: wider than it takes)."""
    return next((b for nodes, b in DENSE_MIN_BATCH if T <= nodes), None)


def select_kernel(T: int, B: int, chain: bool, state_bf16: bool = False, exact: bool = False) -> str:
    """The kernel family for a window of T nodes over B requests; ``chain``: parents[t] = t - 1 for all;
    ``state_bf16``: the state is stored in bf16; ``exact``: products in exact fp32 (dot precision "ieee", as on
    GPUs without tf32), where the dense kernel is never chosen: its [BT, BT] fp32 products spill there, far slower
    than the path kernel (the "exact fp32 forced" rows of benchmarks/bench_kernels.py time it), so those windows
    keep the path families.

    Chains (decode windows, T = 1, included) take the chain kernel at every batch size, except over a bf16 state
    from SPLIT_MIN_BATCH requests on, where the dense kernel's state products take one bf16 pass. Other trees: the
    dense kernel from ``dense_min_batch(T)`` requests on, the path kernel in one launch below; trees wider than
    DENSE_MAX_NODES the path kernel below SPLIT_MIN_BATCH requests and its split launch from there on. Why, in the
    kernel targets table (kind "kernel_targets" of treewy/data/index.json): the dense kernel beats the split
    launch at (3, 3, 3) B = 64 and 256 and (2, 2, 2) B = 256 (rows "333 B64", "333 B256", "222 B256"), and the
    chain kernel beats it on fp32-state chains (rows "chain3 B*"); the batch crossover table says from which batch
    it beats the path kernel."""
    if chain:
        return "dense" if state_bf16 and not exact and B >= SPLIT_MIN_BATCH and T <= DENSE_MAX_NODES else "chain"
    dense_from = None if exact else dense_min_batch(T)
    if dense_from is not None:
        return "dense" if B >= dense_from else "path"
    return "path_split" if B >= SPLIT_MIN_BATCH else "path"
