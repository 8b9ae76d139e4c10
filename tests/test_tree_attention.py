"""The tree attention op folder (treewy/ops/attention): the softmax layers' verify over a paged KV cache, and the
compaction of the accepted path's K/V, kernels against their fp64 references; the references' own claims (a chain is
causal attention, the LSE merge of prefix and window is the one masked softmax); bad input at the door. GPU tests
(marked ``gpu``) repeat the parity at the 35B-A3B's attention sizes and replay both ops from a CUDA graph.

CPU: Triton interpreter, small awkward sizes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from treewy.ops import (
    compact_accepted_kv, naive_compact_accepted_kv, naive_tree_attention, naive_tree_attention_merged, tree_attention,
)
from treewy.testing import assert_close_fp32 as close
from treewy.testing import bfs_tree, random_tree, rel_err
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def cache_views(num_blocks, block_size, Hkv, D, dtype, layout, gen):
    """(k_cache, v_cache) [num_blocks, block_size, Hkv, D], NaN everywhere (a read of a slot no request owns poisons
    the output): "nhd" two tensors; "packed" and "packed_hnd" the K and V halves of one [.., 2D] tensor in vLLM
    0.26's FlashAttention layouts (kv_cache.transpose(1, 2).split(D, -1) of its NHD or HND stride order)."""
    if layout == "nhd":
        k, v = (torch.full((num_blocks, block_size, Hkv, D), float("nan"), dtype=dtype) for _ in range(2))
    else:
        shape = (num_blocks, block_size, Hkv, 2 * D) if layout == "packed" else (num_blocks, Hkv, block_size, 2 * D)
        kv = torch.full(shape, float("nan"), dtype=dtype)
        kv = kv if layout == "packed" else kv.transpose(1, 2)
        k, v = kv.split(D, dim=-1)
    return k.to(DEVICE), v.to(DEVICE)


def make_case(trees, prefix_lens, Hq, Hkv, D, block_size, dtype=torch.float32, layout="nhd", seed=0,
              num_blocks=None):
    """A batch's verify inputs: request b has window ``trees[b]`` (a DraftTree, parents list or None for no nodes)
    after ``prefix_lens[b]`` committed tokens; its blocks drawn at random from a pool of ``num_blocks`` (default: 3
    more than needed), and only its own slots written."""
    gen = torch.Generator().manual_seed(seed)
    pars = [torch.zeros(0, dtype=torch.int32) if t is None else DraftTree(t).parents for t in trees]
    n = [p.numel() for p in pars]
    B = len(trees)
    need = [(P + m + block_size - 1) // block_size for P, m in zip(prefix_lens, n)]
    max_blocks = max(need) + 1
    num_blocks = num_blocks or sum(need) + 3
    order = torch.randperm(num_blocks, generator=gen)
    block_table = torch.full((B, max_blocks), num_blocks + 7, dtype=torch.int32)  # unused entries out of range
    k_cache, v_cache = cache_views(num_blocks, block_size, Hkv, D, dtype, layout, gen)
    used = 0
    for b in range(B):
        block_table[b, :need[b]] = order[used:used + need[b]]
        used += need[b]
        L = prefix_lens[b] + n[b]
        pos = torch.arange(L)
        slots = (block_table[b, pos // block_size].long().to(DEVICE), (pos % block_size).to(DEVICE))
        k_cache[slots] = torch.randn(L, Hkv, D, generator=gen).to(DEVICE, dtype)
        v_cache[slots] = torch.randn(L, Hkv, D, generator=gen).to(DEVICE, dtype)
    q = torch.randn(sum(n), Hq, D, generator=gen).to(DEVICE, dtype)
    cu = torch.tensor([0] + n).cumsum(0).to(torch.int32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table.to(DEVICE),
                prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32).to(DEVICE), cu_nodes=cu.to(DEVICE),
                parents=torch.cat(pars).to(torch.int32).to(DEVICE))


def as_dtype(case, dtype):
    """The case's float tensors in ``dtype`` (the index tensors as they are), gathered to contiguous copies."""
    return {key: x.to(dtype) if x.is_floating_point() else x for key, x in case.items()}


def attention_refs(case, **kw):
    """naive_tree_attention (o, lse) in fp64 and in fp32 on the case's inputs."""
    return tuple(naive_tree_attention(**as_dtype(case, dt), return_lse=True, **kw)
                 for dt in (torch.float64, torch.float32))


def close_lowp(name, out, ref64, ref_lowp, factor=2.0):
    """A bf16 op within ``factor`` times the error of the same reference run in bf16 (both against fp64)."""
    err, bound = rel_err(out, ref64), factor * rel_err(ref_lowp, ref64)
    assert err <= bound, (f"{name}: error {err:.3g} against fp64 above {factor:g} x the bf16 reference's "
                          f"{bound / factor:.3g}")


T221, T333 = DraftTree.from_widths((2, 2, 1)), DraftTree.from_widths((3, 3, 3))

# (id, trees per request, prefix lengths, Hq, Hkv, D, block size, dtype, cache layout)
CASES = [
    ("chain-tree221-empty-gqa2", [DraftTree.chain(3), T221, None], [5, 17, 3], 4, 2, 32, 8, torch.float32, "nhd"),
    ("bushy43-random-gqa8-packed", [DraftTree.from_widths((4, 3)), "random9", DraftTree.from_widths((2, 2))],
     [0, 13, 31], 8, 1, 16, 16, torch.float32, "packed"),
    ("bfs-root-only-gqa1-d24-hnd", [bfs_tree(), DraftTree.chain(0), DraftTree.from_widths((3, 3))], [1, 7, 16],
     2, 2, 24, 4, torch.float32, "packed_hnd"),
    ("bf16-ragged-gqa4", [DraftTree.from_widths((2, 1)), None, "random6"], [9, 4, 22], 4, 1, 32, 8,
     torch.bfloat16, "nhd"),
]


def _trees(trees, seed):
    gen = torch.Generator().manual_seed(seed)
    return [random_tree(int(t[6:]), gen) if isinstance(t, str) else t for t in trees]


@pytest.mark.parametrize("name,trees,prefix,Hq,Hkv,D,bs,dtype,layout", CASES, ids=[c[0] for c in CASES])
def test_tree_attention_matches_fp64_reference(name, trees, prefix, Hq, Hkv, D, bs, dtype, layout):
    case = make_case(_trees(trees, 1), prefix, Hq, Hkv, D, bs, dtype, layout, seed=len(name))
    o, lse = tree_attention(**case, return_lse=True)
    (ro, rlse), (ro32, rlse32) = attention_refs(case)
    assert o.dtype == dtype and lse.dtype == torch.float32 and o.shape == case["q"].shape
    if dtype == torch.float32:
        close("o", o, ro, ro32)
    else:
        close_lowp("o", o, ro, naive_tree_attention(**case))
    close("lse", lse, rlse, rlse32)


def test_per_request_parent_rows_and_padding_rows():
    """parents as [B, T] rows (the verify op's per-request form) give the packed result; q rows past cu_nodes[B]
    (an engine's padded batch) are left as they were in ``out``."""
    trees = [T221, DraftTree.chain(2), None]
    case = make_case(trees, [6, 0, 11], 4, 2, 16, 8, seed=4)
    rows = torch.full((3, T221.num_nodes), -5, dtype=torch.int32)
    rows[0], rows[1, :3] = T221.parents, DraftTree.chain(2).parents
    ref = tree_attention(**case)
    q = torch.cat([case["q"], torch.randn(3, 4, 16).to(DEVICE)])
    out = torch.zeros_like(q)
    got = tree_attention(**{**case, "q": q, "parents": rows.to(DEVICE)}, out=out)
    assert got is out
    assert torch.equal(out[:-3], ref) and torch.equal(out[-3:], torch.zeros_like(out[-3:]))


def test_a_low_max_nodes_bound_costs_time_not_results():
    case = make_case([T221, DraftTree.chain(4)], [3, 9], 8, 2, 16, 4, seed=2)
    assert torch.equal(tree_attention(**case, max_nodes=1), tree_attention(**case))


def test_unchecked_indices_give_the_checked_result():
    """check_values=False (a server's eager step: no host read of the indices) computes what the checked call does,
    needs max_nodes, and a bad switch value is refused."""
    case = make_case([T221, DraftTree.chain(4)], [3, 9], 8, 2, 16, 4, seed=2)
    assert torch.equal(tree_attention(**case, max_nodes=T221.num_nodes, check_values=False), tree_attention(**case))
    with pytest.raises(ValueError, match="max_nodes is None .* check_values=False"):
        tree_attention(**case, check_values=False)
    with pytest.raises(ValueError, match="check_values = 'no'"):
        tree_attention(**case, check_values="no")


def test_chain_is_causal_attention_over_prefix_and_window():
    chain = DraftTree.chain(5)
    case = make_case([chain, chain], [7, 12], 4, 2, 16, 4, seed=3)
    o = tree_attention(**case)
    ref = naive_tree_attention(**as_dtype(case, torch.float64))
    for b, P in enumerate((7, 12)):
        pos = torch.arange(P + 6).to(DEVICE)
        slots = (case["block_table"][b].long()[pos // 4], pos % 4)
        k, v = (x[slots].double().repeat_interleave(2, dim=1).transpose(0, 1) for x in (case["k_cache"],
                                                                                         case["v_cache"]))
        q = case["q"][6 * b:6 * b + 6].double().transpose(0, 1)    # [Hq, n, D]
        causal = torch.ones(6, P + 6, dtype=torch.bool).tril(P)    # window node i sees tokens 0 .. P + i
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=causal.to(DEVICE)).transpose(0, 1)
        assert rel_err(ref[6 * b:6 * b + 6], sdpa) < 1e-13
        assert rel_err(o[6 * b:6 * b + 6], sdpa) < 1e-5


def test_lse_merge_of_prefix_and_window_is_the_masked_softmax():
    case = as_dtype(make_case([T333, None, DraftTree.from_widths((2, 3))], [0, 5, 19], 6, 3, 8, 4, seed=5),
                    torch.float64)
    o, lse = naive_tree_attention(**case, return_lse=True)
    mo, mlse = naive_tree_attention_merged(**case, return_lse=True)
    assert rel_err(mo, o) < 1e-14 and rel_err(mlse, lse) < 1e-14


def compact_case(paths, prefix, window, layout="nhd", bs=4, dtype=torch.float32):
    trees = [DraftTree.chain(w - 1) if w else None for w in window]
    case = make_case(trees, prefix, 2, 2, 24, bs, dtype, layout, seed=sum(prefix))
    A = max(len(p) for p in paths)
    acc = torch.tensor([p + [0] * (A - len(p)) for p in paths], dtype=torch.int32).to(DEVICE)
    n_acc = torch.tensor([len(p) for p in paths], dtype=torch.int32).to(DEVICE)
    return case, acc, n_acc


# (id, accepted paths, prefix lengths, window nodes, layout): overlap = a source slot is a later step's destination
COMPACT_CASES = [
    ("overlap-across-blocks", [[0, 2, 3, 5, 6], [0, 1, 4]], [3, 8], [9, 6], "nhd"),
    ("identity-root-only-empty", [[0, 1, 2], [0], []], [5, 0, 2], [4, 3, 2], "nhd"),
    ("far-jumps-packed", [[0, 7, 11, 12], [0, 3]], [6, 1], [13, 4], "packed"),
]


@pytest.mark.parametrize("name,paths,prefix,window,layout", COMPACT_CASES, ids=[c[0] for c in COMPACT_CASES])
def test_compact_moves_the_accepted_path_like_a_copy_of_the_original(name, paths, prefix, window, layout):
    case, acc, n_acc = compact_case(paths, prefix, window, layout)
    args = [case[k] for k in ("k_cache", "v_cache", "block_table", "prefix_lens", "cu_nodes")]
    rk, rv = naive_compact_accepted_kv(*args, acc, n_acc)
    k, v = case["k_cache"].clone(), case["v_cache"].clone()
    compact_accepted_kv(k, v, *args[2:], acc, n_acc)
    assert torch.equal(k.nan_to_num(7.0), rk.nan_to_num(7.0)) and torch.equal(v.nan_to_num(7.0), rv.nan_to_num(7.0))
    bt, bs = case["block_table"].long(), case["k_cache"].shape[1]
    for b, (path, P) in enumerate(zip(paths, prefix)):  # the reference's claim, token by token
        src, dst = (P + torch.tensor(x, dtype=torch.long) for x in (path, range(len(path))))
        assert torch.equal(rk[bt[b, dst // bs], dst % bs], case["k_cache"][bt[b, src // bs], src % bs])


def test_unchecked_compaction_moves_the_same_path():
    case, acc, n_acc = compact_case([[0, 2, 3], [0, 1]], [5, 2], [4, 3])
    args = [case[k] for k in ("k_cache", "v_cache", "block_table", "prefix_lens", "cu_nodes")]
    k1, v1, k2, v2 = (x.clone() for x in (case["k_cache"], case["v_cache"]) * 2)
    compact_accepted_kv(k1, v1, *args[2:], acc, n_acc)
    compact_accepted_kv(k2, v2, *args[2:], acc, n_acc, check_values=False)
    assert torch.equal(k1.nan_to_num(7.0), k2.nan_to_num(7.0)) and torch.equal(v1.nan_to_num(7.0), v2.nan_to_num(7.0))


def test_the_compacted_path_is_the_chain_the_accepted_path_was():
    """After the move the accepted path sits in consecutive tokens: attending over it as a chain window gives what
    its nodes got in the tree over the original slots."""
    tree = DraftTree.from_widths((2, 2))
    path = tree.path(6)                                               # [0, 4, 6]: root, second child, its second
    case = make_case([tree], [5], 4, 2, 16, 4, seed=9)
    before = tree_attention(**case)[path]
    acc = torch.tensor([path], dtype=torch.int32).to(DEVICE)
    k, v = case["k_cache"].clone(), case["v_cache"].clone()
    compact_accepted_kv(k, v, case["block_table"], case["prefix_lens"], case["cu_nodes"], acc,
                        torch.tensor([3], dtype=torch.int32).to(DEVICE))
    chain = dict(case, q=case["q"][path], k_cache=k, v_cache=v, cu_nodes=torch.tensor([0, 3]).to(DEVICE),
                 parents=DraftTree.chain(2).parents.to(DEVICE))
    ref = naive_tree_attention(**as_dtype(case, torch.float64))[path]
    assert rel_err(naive_tree_attention(**as_dtype(chain, torch.float64)), ref) < 1e-14
    assert rel_err(tree_attention(**chain), before) < 1e-6


# Bad input: each error names the argument (references and kernels share the door).
OPS = [naive_tree_attention, tree_attention]


def small_case():
    return make_case([DraftTree.from_widths((2,)), DraftTree.chain(1)], [3, 6], 4, 2, 8, 4, seed=0)


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("override,match", [
    (dict(q=torch.zeros(5, 4)), r"q has shape \(5, 4\), expected 3 dims"),
    (dict(q=torch.zeros(5, 3, 8)), r"Hq = 3 heads, not a multiple of the Hkv = 2"),
    (dict(q=torch.zeros(5, 4, 6)), r"q has head dim D = 6 but k_cache has 8"),
    (dict(v_cache=torch.zeros(9, 4, 2, 6)), r"v_cache has shape \(9, 4, 2, 6\), expected"),
    (dict(k_cache=torch.zeros(9, 4, 2)), r"k_cache has shape \(9, 4, 2\), expected 4 dims"),
    (dict(q=torch.zeros(5, 4, 8, dtype=torch.float16)), r"q has dtype torch.float16 but k_cache has torch.float32"),
    (dict(block_table=torch.zeros(2, 4)), r"block_table must hold integers"),
    (dict(prefix_lens=torch.zeros(3, dtype=torch.int32)), r"prefix_lens has shape \(3,\), expected \[2\]"),
    (dict(cu_nodes=torch.tensor([0, 3, 2], dtype=torch.int32)), r"cu_nodes = \[0, 3, 2\]: expected offsets"),
    (dict(cu_nodes=torch.tensor([0, 3, 9], dtype=torch.int32)), r"ending at most at the 5 rows of q"),
    (dict(prefix_lens=torch.tensor([3, -1], dtype=torch.int32)), r"prefix_lens holds \[3, -1\]"),
    (dict(prefix_lens=torch.tensor([3, 12], dtype=torch.int32)), r"request 1 needs 4 blocks"),
    (dict(parents=torch.tensor([-1, 0, 0, -1, 1], dtype=torch.int32)), r"parents of request 1: node 1 has parent 1"),
    (dict(parents=torch.tensor([-1, 2, 0, -1, 0], dtype=torch.int32)), r"parents of request 0: node 1 has parent 2"),
    (dict(parents=torch.tensor([-1, 0, 0], dtype=torch.int32)), r"parents has shape \(3,\), expected \[total_nodes\]"),
    (dict(q=torch.full((5, 4, 8), float("nan"))), r"q holds 160 NaN"),
], ids=["q-ndim", "gqa", "head-dim", "v-shape", "k-ndim", "dtype", "table-dtype", "prefix-shape", "cu-order",
        "cu-past-q", "prefix-negative", "too-few-blocks", "second-root", "not-topological", "parents-shape", "nan"])
def test_bad_input_names_the_argument(op, override, match):
    case = small_case()
    case.update({k: x.to(DEVICE) for k, x in override.items()})
    with pytest.raises(ValueError, match=match):
        op(**case)


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
def test_inputs_on_another_device_raise(op):
    case = small_case()
    case["block_table"] = case["block_table"].to("meta")
    with pytest.raises(ValueError, match="block_table is on meta but q is on"):
        op(**case)


def test_block_ids_outside_the_pool_raise():
    case = small_case()
    case["block_table"] = case["block_table"].clone()
    case["block_table"][1, 1] = 99
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 99 is not a block of the cache"):
        tree_attention(**case)


@pytest.mark.parametrize("override,match", [
    (dict(q=torch.zeros(5, 4, 8, dtype=torch.float64)), r"q has dtype torch.float64; the kernels take"),
    (dict(max_nodes=-1), r"max_nodes = -1: expected a non-negative int"),
    (dict(max_nodes=2.5), r"max_nodes = 2.5"),
    (dict(out=torch.zeros(5, 4, 4)), r"out is \(5, 4, 4\) torch.float32"),
], ids=["fp64", "max-nodes-negative", "max-nodes-float", "out-shape"])
def test_kernel_only_bad_input(override, match):
    case = small_case()
    if "q" in override:
        case.update(k_cache=case["k_cache"].double(), v_cache=case["v_cache"].double())
    case.update({k: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for k, x in override.items()})
    with pytest.raises(ValueError, match=match):
        tree_attention(**case)


@pytest.mark.parametrize("op", [naive_compact_accepted_kv, compact_accepted_kv], ids=lambda f: f.__name__)
@pytest.mark.parametrize("paths_lens,match", [
    (([[0, 2, 1], [0, 0, 0]], [3, 1]), r"accepted\[0, :3\] = \[0, 2, 1\]: expected window nodes root first"),
    (([[1, 2, 0], [0, 0, 0]], [2, 1]), r"accepted\[0, :2\] = \[1, 2\]"),
    (([[0, 1, 2], [0, 1, 2]], [3, 3]), r"accepted_len holds \[3, 3\]"),
    (([[0, 1, 2], [0, 0, 0]], [3]), r"accepted_len has shape \(1,\), expected \[2\]"),
    (([0, 1, 2], [3, 1]), r"accepted has shape \(3,\), expected \[B, max_accepted\]"),
], ids=["not-increasing", "not-root-first", "longer-than-window", "len-shape", "accepted-ndim"])
def test_bad_compaction_names_the_argument(op, paths_lens, match):
    case = small_case()
    acc, lens = (torch.tensor(x, dtype=torch.int32).to(DEVICE) for x in paths_lens)
    with pytest.raises(ValueError, match=match):
        op(case["k_cache"], case["v_cache"], case["block_table"], case["prefix_lens"], case["cu_nodes"], acc, lens)


# GPU: the 35B-A3B's full-attention layers (D = 256, 16 query heads, 2 KV heads), bf16 on tensor cores.

MODEL = dict(Hq=16, Hkv=2, D=256)


def model_case(tree, B, block_size, dtype=torch.bfloat16, seed=0, layout="packed", num_blocks=None):
    """B requests of one tree after prefixes of 1..4096 tokens (the first 4096), blocks from one pool."""
    gen = torch.Generator().manual_seed(seed)
    prefix = [4096] + torch.randint(1, 4097, (B - 1,), generator=gen).tolist()
    return make_case([tree] * B, prefix, **MODEL, block_size=block_size, dtype=dtype, layout=layout, seed=seed,
                     num_blocks=num_blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(2, 2, 1), (2, 2, 2), (3, 3, 3)], ids=lambda w: "x".join(map(str, w)))
@pytest.mark.parametrize("B,block_size", [(1, 16), (32, 16), (32, 1056)], ids=["B1-bs16", "B32-bs16", "B32-bs1056"])
def test_gpu_parity_at_model_sizes(widths, B, block_size):
    case = model_case(DraftTree.from_widths(widths), B, block_size, seed=B + len(widths))
    o, lse = tree_attention(**case, return_lse=True)
    (ro, rlse), (_, rlse32) = attention_refs(case)
    close_lowp("o", o, ro, naive_tree_attention(**case))
    close_lowp("lse", lse, rlse, naive_tree_attention(**case, return_lse=True)[1].float())


@pytest.mark.gpu
def test_gpu_fp32_parity_at_model_sizes():
    case = model_case(T333, 2, 16, dtype=torch.float32, seed=7, layout="nhd")
    o, lse = tree_attention(**case, return_lse=True)
    (ro, rlse), (ro32, rlse32) = attention_refs(case)
    close("o", o, ro, ro32)
    close("lse", lse, rlse, rlse32)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_of_attention_and_compaction_matches_eager():
    """One capture, replayed on new queries, caches, prefixes, block tables and accepted paths: the loops take
    their bounds from device data, so the replay computes what an eager call on the new inputs does."""
    B, tree, A, pool = 8, T333, T333.max_depth + 1, 8 * (4096 + 40) // 16 + 64
    static = model_case(tree, B, 16, seed=1, num_blocks=pool)
    keys = ("block_table", "prefix_lens", "cu_nodes")
    acc = torch.zeros(B, A, dtype=torch.int32, device="cuda")
    n_acc = torch.ones(B, dtype=torch.int32, device="cuda")
    tree_attention(**static, max_nodes=tree.num_nodes)            # compile outside the capture
    compact_accepted_kv(static["k_cache"].clone(), static["v_cache"].clone(), *[static[k] for k in keys], acc, n_acc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = tree_attention(**static, max_nodes=tree.num_nodes)
        compact_accepted_kv(static["k_cache"], static["v_cache"], *[static[k] for k in keys], acc, n_acc)
    gen = torch.Generator().manual_seed(5)
    for seed in (2, 3):
        new = model_case(tree, B, 16, seed=seed, num_blocks=pool)
        paths = [tree.path(int(torch.randint(0, tree.num_nodes, (1,), generator=gen))) for _ in range(B)]
        a = torch.tensor([p + [0] * (A - len(p)) for p in paths], dtype=torch.int32, device="cuda")
        m = torch.tensor([len(p) for p in paths], dtype=torch.int32, device="cuda")
        for key, x in new.items():
            static[key].copy_(x)
        acc.copy_(a)
        n_acc.copy_(m)
        graph.replay()
        torch.cuda.synchronize()
        eo = tree_attention(**new)
        compact_accepted_kv(new["k_cache"], new["v_cache"], *[new[k] for k in keys], a, m)
        assert torch.equal(o, eo)
        for key in ("k_cache", "v_cache"):
            assert torch.equal(static[key].nan_to_num(0), new[key].nan_to_num(0))
