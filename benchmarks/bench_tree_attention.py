"""Tree attention for the softmax layers' verify (``treewy.ops.attention``) on a GPU, at the 35B-A3B's
full-attention sizes (D = 256, 16 query heads, 2 KV heads, bf16, block size 16): the kernel beside the torch
reference and beside torch SDPA with a dense mask over K/V gathered beforehand; and the accepted path's compaction.

    python -m benchmarks.bench_tree_attention --out $OUT

Kernels and SDPA: medians of CUDA-graph replays; the reference eagerly (it loops over requests on the host). Each
row carries the bytes the op must move (every request's prefix and window K/V once per KV head, q in, o out; for the
compaction the accepted path's K/V read and written), the roofline at the H200's 4.8 TB/s, the kernel's GB/s and the
ratios reference / kernel and SDPA / kernel, and the kernel's relative error against the fp64 reference. Writes
OUT/tree_attention_<gpu>_<date>.json and prints a line per case.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import log, write_measured
from treewy.ops import compact_accepted_kv, naive_tree_attention, tree_attention
from treewy.testing import rel_err
from treewy.tree import DraftTree

#: The H200's HBM bandwidth (the datasheet's figure) for the roofline.
PEAK_BYTES_PER_S = 4.8e12
HQ, HKV, D, BLOCK_SIZE = 16, 2, 256, 16
DEVICE = "cuda"
TREES = ((2, 2, 1), (2, 2, 2), (3, 3, 3))
BATCHES = (1, 32)
PREFIXES = (1024, 4096)


def make(tree: DraftTree, B: int, P: int, seed: int = 0):
    """B requests of ``tree`` after P committed tokens each, blocks shuffled over one pool, bf16 on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    n = tree.num_nodes
    per = -(-(P + n) // BLOCK_SIZE)
    pool = torch.randn(2, B * per + 1, BLOCK_SIZE, HKV, D, generator=gen).to(DEVICE, torch.bfloat16)
    table = torch.randperm(B * per + 1, generator=gen)[:B * per].reshape(B, per).to(DEVICE, torch.int32)
    return dict(q=torch.randn(B * n, HQ, D, generator=gen).to(DEVICE, torch.bfloat16), k_cache=pool[0],
                v_cache=pool[1], block_table=table, prefix_lens=torch.full((B,), P, dtype=torch.int32, device=DEVICE),
                cu_nodes=torch.arange(0, B * n + 1, n, dtype=torch.int32, device=DEVICE),
                parents=tree.parents.repeat(B).to(DEVICE, torch.int32))


def dense(case, tree: DraftTree, B: int, P: int):
    """SDPA's inputs: q [B, Hq, n, D], K/V gathered and expanded to the query heads [B, Hq, P + n, D] (what a dense
    attention call reads) and the mask [B, 1, n, P + n]."""
    n = tree.num_nodes
    pos = torch.arange(P + n, device=DEVICE)
    slots = (case["block_table"].long()[:, pos // BLOCK_SIZE], pos % BLOCK_SIZE)
    k, v = (case[x][slots].repeat_interleave(HQ // HKV, dim=2).transpose(1, 2).contiguous()
            for x in ("k_cache", "v_cache"))
    mask = torch.cat([torch.ones(n, P, dtype=torch.bool), tree.ancestor_mask()], dim=1).to(DEVICE)
    return case["q"].view(B, n, HQ, D).transpose(1, 2).contiguous(), k, v, mask.expand(B, 1, n, P + n)


def graph_us(fn) -> float:
    import triton

    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")


def eager_us(fn) -> float:
    import triton

    return 1e3 * triton.testing.do_bench(fn, warmup=2, rep=20, return_mode="median")


def attention_row(widths, B: int, P: int) -> dict:
    tree = DraftTree.from_widths(widths)
    n = tree.num_nodes
    case = make(tree, B, P)
    ours = graph_us(lambda: tree_attention(**case, max_nodes=n))
    ref = eager_us(lambda: naive_tree_attention(**case))
    q, k, v, mask = dense(case, tree, B, P)
    sdpa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    err = rel_err(tree_attention(**case), naive_tree_attention(**{x: t.double() if t.is_floating_point() else t
                                                                for x, t in case.items()}))
    nbytes = 2 * B * (P + n) * HKV * D * 2 + 2 * B * n * HQ * D * 2
    return dict(op="tree_attention", tree=str(widths), nodes=n, B=B, prefix=P, kernel_us=ours, reference_us=ref,
                sdpa_dense_mask_us=sdpa, bytes=nbytes, roofline_us=1e6 * nbytes / PEAK_BYTES_PER_S,
                kernel_GBps=nbytes / ours / 1e3, reference_over_kernel=ref / ours, sdpa_over_kernel=sdpa / ours,
                rel_err_vs_fp64=err)


def compact_row(widths, B: int, P: int) -> dict:
    tree = DraftTree.from_widths(widths)
    case = make(tree, B, P)
    path = tree.path(tree.num_nodes - 1)                     # the last leaf: the longest jumps in DFS order
    acc = torch.tensor([path] * B, dtype=torch.int32, device=DEVICE)
    n_acc = torch.full((B,), len(path), dtype=torch.int32, device=DEVICE)
    args = [case[x] for x in ("k_cache", "v_cache", "block_table", "prefix_lens", "cu_nodes")]
    us = graph_us(lambda: compact_accepted_kv(*args, acc, n_acc))
    nbytes = 2 * 2 * B * (len(path) - 1) * HKV * D * 2      # K and V of every moved token, read and written
    return dict(op="compact_accepted_kv", tree=str(widths), nodes=tree.num_nodes, B=B, prefix=P, kernel_us=us,
                bytes=nbytes, roofline_us=1e6 * nbytes / PEAK_BYTES_PER_S, kernel_GBps=nbytes / us / 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tree_attention.py times GPU kernels: it needs a CUDA GPU")
    rows = []
    for widths in TREES:
        for B in BATCHES:
            for P in PREFIXES:
                r = attention_row(widths, B, P)
                rows.append(r)
                log(f"attention {r['tree']} B = {B:2d} P = {P}: {r['kernel_us']:8.1f} us "
                    f"({r['kernel_GBps']:6.0f} GB/s, "
                    f"roofline {r['roofline_us']:6.1f} us), reference x{r['reference_over_kernel']:.1f}, "
                    f"SDPA x{r['sdpa_over_kernel']:.2f}, error {r['rel_err_vs_fp64']:.2e}")
            c = compact_row(widths, B, PREFIXES[-1])
            rows.append(c)
            log(f"compact   {c['tree']} B = {B:2d}: {c['kernel_us']:8.1f} us ({c['kernel_GBps']:6.0f} GB/s, "
                f"roofline {c['roofline_us']:6.2f} us)")
    write_measured(args.out, "tree_attention", rows, note="35B-A3B full attention (D 256, Hq 16, Hkv 2), bf16, "
                   "block size 16; kernels and SDPA CUDA-graph medians, the reference eager")


if __name__ == "__main__":
    main()
