"""Parity of the Triton kernels with the fp64 references (CPU: Triton interpreter; GPU: marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from treewy.ops import (
    naive_tree_commit, naive_tree_recurrent, naive_tree_verify, store_all_commit, store_all_verify, tree_commit,
    tree_verify,
)
from treewy.bench.parity import O_TF32_TOL
from treewy.ops.verify.tuning import default_dot_precision
from treewy.testing import assert_close_fp32 as close
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(x, ref):
    """Relative RMS error of x against ref (both upcast to fp64)."""
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def random_tree(T: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]


def bfs_tree() -> list[int]:
    # level order of (2, 2): root, two children, then their children
    return [-1, 0, 0, 1, 1, 2, 2]


def make_inputs(B, T, H, HV, K, V, seed=0, state_dtype=torch.float32, dtype=torch.float32, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 4
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, V, K, generator=gen) * 0.3
    ins = [x.to(device, dtype) for x in (q, k, v, g, beta)] + [h0.to(device, state_dtype)]
    return ins


def as64(ins):
    return [x.double() for x in ins]


def refs(fn, ins, *rest):
    """fn (a reference) on the kernel's inputs in fp64 and in fp32: the error bound comes from the fp32 run."""
    return fn(*as64(ins), *rest), fn(*[x.float() for x in ins], *rest)


def commit_refs(S, us, k, g, parents, accepted):
    """naive_tree_commit in fp64 and in fp32, each from its own reference's u (us: the fp64 and the fp32 u)."""
    return tuple(naive_tree_commit(S.to(dt), u, k.to(dt), g.to(dt), parents, accepted)
                 for dt, u in zip((torch.float64, torch.float32), us))


# (id, B, H, HV, K, V, parents) -- awkward sizes, GVA 1x/2x/4x, chains, stars, trees
CASES = [
    ("chain3-gva2", 2, 2, 4, 32, 32, DraftTree.chain(3)),
    ("tree221-gva4-v48", 2, 1, 4, 16, 48, DraftTree.from_widths((2, 2, 1))),
    ("star6-k60-v20", 1, 2, 2, 60, 20, DraftTree.from_widths((6,))),
    ("bfs-order", 2, 1, 2, 32, 16, bfs_tree()),
    ("root-only", 3, 1, 1, 16, 16, DraftTree.chain(0)),
    ("tree333-v100", 1, 1, 1, 16, 100, DraftTree.from_widths((3, 3, 3))),
]


@pytest.mark.parametrize("name,B,H,HV,K,V,tree", CASES, ids=[c[0] for c in CASES])
def test_verify_and_commit_match_fp64(name, B, H, HV, K, V, tree):
    tree = tree if isinstance(tree, DraftTree) else DraftTree(tree)
    T = tree.num_nodes
    ins = make_inputs(B, T, H, HV, K, V, seed=T)
    o, u = tree_verify(*ins, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)
    assert o.dtype == ins[2].dtype and u.dtype == torch.float32
    close("o", o, ro, ro32)
    close("u", u, ru, ru32)
    for a in range(T):  # commit of every node
        acc = torch.full((B,), a)
        state = ins[5].clone()
        out = tree_commit(state, u, ins[1], ins[3], tree, acc)
        assert out is state
        close(f"state committed at node {a}", state, *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], tree, acc))


def test_tree_is_paths_for_random_per_request_topologies():
    B, T, H, HV, K, V = 3, 17, 1, 2, 32, 16
    gen = torch.Generator().manual_seed(3)
    parents = torch.tensor([random_tree(T, gen) for _ in range(B)], dtype=torch.int32)
    ins = make_inputs(B, T, H, HV, K, V, seed=5)
    o, u = tree_verify(*ins, parents.to(DEVICE))
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, parents)
    close("o", o, ro, ro32)
    close("u", u, ru, ru32)
    acc = torch.tensor([16, 7, 0])
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], parents, acc)
    close("state", state, *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], parents, acc))


def test_num_nodes_truncates_each_request():
    B, T, H, HV, K, V = 3, 8, 1, 2, 16, 32
    tree = DraftTree([-1, 0, 1, 1, 0, 4, 5, 2])
    ins = make_inputs(B, T, H, HV, K, V, seed=7)
    n = torch.tensor([8, 3, 0], dtype=torch.int32)
    o, u = tree_verify(*ins, tree, num_nodes=n.to(DEVICE))
    for b in range(B):
        nb = int(n[b])
        if nb == 0:
            assert torch.all(o[b] == 0) and torch.all(u[b] == 0)
            continue
        sub = [x[b:b + 1, :nb] for x in ins[:5]] + [ins[5][b:b + 1]]
        (ro, ru), (ro32, ru32) = refs(naive_tree_verify, sub, tree.parents[:nb])
        close(f"o of request {b}", o[b:b + 1, :nb], ro, ro32)
        close(f"u of request {b}", u[b:b + 1, :nb], ru, ru32)
        assert torch.all(o[b, nb:] == 0) and torch.all(u[b, nb:] == 0)


def test_qk_l2norm_in_kernel_matches_normalized_reference():
    B, T, H, HV, K, V = 2, 5, 1, 2, 32, 16
    tree = DraftTree.from_widths((2, 1))
    ins = make_inputs(B, T, H, HV, K, V, seed=11)
    ins[1] = ins[1] * 3.0  # unnormalized keys
    o, u = tree_verify(*ins, tree, use_qk_l2norm_in_kernel=True)
    n64, n32 = as64(ins), [x.float() for x in ins]
    for n in (n64, n32):  # q and k as the kernels normalize them, in each reference's dtype
        for i in (0, 1):
            n[i] = n[i] / torch.sqrt((n[i] ** 2).sum(-1, keepdim=True) + 1e-6)
    (ro, ru), (ro32, ru32) = naive_tree_verify(*n64, tree), naive_tree_verify(*n32, tree)
    close("o", o, ro, ro32)
    close("u", u, ru, ru32)
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([4, 2]), use_qk_l2norm_in_kernel=True)
    close("state", state, naive_tree_commit(n64[5], ru, n64[1], n64[3], tree, torch.tensor([4, 2])),
          naive_tree_commit(n32[5], ru32, n32[1], n32[3], tree, torch.tensor([4, 2])))


def test_bf16_state_is_read_and_committed():
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    tree = DraftTree.from_widths((3,))
    ins = make_inputs(B, T, H, HV, K, V, seed=13, state_dtype=torch.bfloat16)
    o, u = tree_verify(*ins, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)  # both read the same bf16 state exactly
    close("o", o, ro, ro32)
    close("u", u, ru, ru32)
    state = ins[5].clone()
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([2, 0]))
    ref = naive_tree_commit(ins[5].double(), ru, ins[1].double(), ins[3].double(), tree, torch.tensor([2, 0]))
    assert state.dtype == torch.bfloat16 and rel(state, ref) < 1e-2  # one bf16 rounding


def test_commit_into_pool_slice_with_batch_stride():
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    tree = DraftTree.chain(3)
    ins = make_inputs(B, T, H, HV, K, V, seed=17)
    pool = torch.randn(7, HV, V, K, device=DEVICE)
    pool[1], pool[4] = ins[5][0], ins[5][1]
    state = pool[1:5:3]  # two slots three apart: batch stride 3 * HV * V * K
    untouched = pool[[0, 2, 3, 5, 6]].clone()
    o, u = tree_verify(*ins[:5], state, tree)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, tree)
    close("o", o, ro, ro32)
    tree_commit(state, u, ins[1], ins[3], tree, torch.tensor([3, 1]))
    close("state", pool[1:5:3], *commit_refs(ins[5], (ru, ru32), ins[1], ins[3], tree, torch.tensor([3, 1])))
    assert torch.equal(pool[[0, 2, 3, 5, 6]], untouched)


STORE_CASES = [
    ("chain2-gva2-k60", 2, 1, 2, 60, 16, DraftTree.chain(2)),
    ("tree22-gva4", 1, 1, 4, 16, 20, DraftTree.from_widths((2, 2))),
    ("bfs-order", 1, 1, 1, 32, 16, bfs_tree()),
]


@pytest.mark.parametrize("name,B,H,HV,K,V,tree", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_all_matches_recurrence_and_treewy(name, B, H, HV, K, V, tree):
    T = len(tree)
    ins = make_inputs(B, T, H, HV, K, V, seed=19)
    o, states = store_all_verify(*ins, tree)
    (ro, rstates), (ro32, rstates32) = refs(naive_tree_recurrent, ins, tree)
    assert states.shape == (B, T, HV, V, K) and states.dtype == ins[5].dtype
    close("o", o, ro, ro32)
    close("states", states, rstates, rstates32)
    acc = torch.randint(0, T, (B,))
    state = ins[5].clone()
    store_all_commit(state, states, acc)
    assert torch.equal(state, states[torch.arange(B), acc]), "the commit copies the accepted snapshot"


# ---- validation at the door: one test per kind of mistake ----

def _small():
    return make_inputs(1, 3, 1, 2, 16, 16), DraftTree.chain(2)


def test_rejects_bad_shapes():
    ins, tree = _small()
    ins[2] = ins[2][..., :8].contiguous().unsqueeze(-1)
    with pytest.raises(ValueError, match="v"):
        tree_verify(*ins, tree)
    ins, tree = _small()
    with pytest.raises(ValueError, match="initial_state"):
        tree_verify(*ins[:5], ins[5].transpose(-1, -2).contiguous()[:, :, :8], tree)


def test_rejects_bad_dtypes():
    ins, tree = _small()
    with pytest.raises(ValueError, match="q has dtype torch.float64"):
        tree_verify(ins[0].double(), *ins[1:], tree)
    with pytest.raises(ValueError, match="u has dtype"):
        tree_commit(ins[5].clone(), ins[2].half(), ins[1], ins[3], tree, 0)


def test_rejects_cpu_tensors_without_interpreter(monkeypatch):
    import treewy.ops._triton as backend

    ins, tree = _small()
    monkeypatch.setattr(backend, "INTERPRET", False)
    ins = [x.cpu() for x in ins]
    with pytest.raises((ValueError, RuntimeError), match="CPU tensor"):
        tree_verify(*ins, tree)


def test_reads_non_contiguous_inputs_and_rejects_a_non_contiguous_state():
    """Inputs an op only reads may have any strides (copied where needed); the state it writes in place may
    not: a copy would lose the write."""
    ins, tree = _small()
    k = torch.stack([ins[1], torch.zeros_like(ins[1])], dim=-1)[..., 0]  # the same values at stride 2
    assert not k.is_contiguous() and torch.equal(k, ins[1])
    for a, b in zip(tree_verify(ins[0], k, *ins[2:], tree), tree_verify(*ins, tree)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not contiguous in its last 3 dims"):
        tree_verify(*ins[:5], ins[5].transpose(-1, -2), tree)


def test_rejects_trees_over_the_kernel_limit():
    T = 129
    ins = make_inputs(1, T, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="limit of 128"):
        tree_verify(*ins, list(range(-1, T - 1)))


def test_rejects_nan_gates_and_bad_topologies():
    ins, tree = _small()
    ins[3][0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="g holds 1 NaN"):
        tree_verify(*ins, tree)
    ins, _ = _small()
    with pytest.raises(ValueError, match="node 2 has parent 2"):
        tree_verify(*ins, [-1, 0, 2])
    with pytest.raises(ValueError, match="accepted"):
        tree_commit(ins[5].clone(), torch.zeros(1, 3, 2, 16, device=DEVICE), ins[1], ins[3], tree, 3)
    with pytest.raises(ValueError, match="num_nodes"):
        tree_verify(*ins, tree, num_nodes=torch.tensor([4]))


# ---- GPU only ----

@pytest.mark.gpu
def test_cuda_graph_replay_of_verify_and_commit_matches_eager():
    tree = DraftTree.from_widths((3, 3, 3))
    B, T, H, HV, K, V = 4, tree.num_nodes, 16, 32, 128, 128
    par = tree.parents.cuda()
    static = make_inputs(B, T, H, HV, K, V, seed=1, dtype=torch.bfloat16)
    static[3], static[4] = static[3].float(), static[4].float()
    state = static[5].clone()
    acc = torch.zeros(B, dtype=torch.int32, device="cuda")
    tree_verify(*static[:5], state, par)  # compile and autotune outside the capture
    tree_commit(state.clone(), torch.zeros(B, T, HV, V, device="cuda"), static[1], static[3], par, acc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # device parents inside a capture: the chain flag and depth are given, not read
        o, u = tree_verify(*static[:5], state, par, chain=False, max_depth=tree.max_depth)
        tree_commit(state, u, static[1], static[3], par, acc)
    for seed in (2, 3):
        new = make_inputs(B, T, H, HV, K, V, seed=seed, dtype=torch.bfloat16)
        new[3], new[4] = new[3].float(), new[4].float()
        a = torch.randint(0, T, (B,), dtype=torch.int32, device="cuda")
        for dst, src in zip(static[:5], new[:5]):
            dst.copy_(src)
        state.copy_(new[5])
        acc.copy_(a)
        graph.replay()
        torch.cuda.synchronize()
        eo, eu = tree_verify(*new, par)
        es = new[5].clone()
        tree_commit(es, eu, new[1], new[3], par, a)
        assert torch.equal(o, eo) and torch.equal(u, eu) and torch.equal(state, es)


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(1, 1, 1), (2, 2, 2), (3, 3, 3)], ids=str)
def test_bf16_within_twice_the_reference_bf16_error(widths):
    tree = DraftTree.from_widths(widths)
    B, T, H, HV, K, V = 8, tree.num_nodes, 16, 32, 128, 128
    ins = make_inputs(B, T, H, HV, K, V, seed=4)
    ref_o, ref_u = naive_tree_verify(*as64(ins), tree)
    bf = [x.bfloat16() for x in ins[:5]] + [ins[5]]
    o, u = tree_verify(*bf, tree)
    # the reference run in bf16: bf16 inputs, bf16 arithmetic
    bo, bu = naive_tree_verify(*[x.bfloat16() for x in ins], tree)
    assert rel(o, ref_o) <= 2 * rel(bo, ref_o)
    assert rel(u, ref_u) <= 2 * rel(bu, ref_u)


@pytest.mark.gpu
def test_largest_tree_and_64bit_state_offsets():
    T = 128
    B, H, HV, K, V = 2, 1, 4, 128, 128
    gen = torch.Generator().manual_seed(31)
    parents = torch.tensor([random_tree(T, gen) for _ in range(B)], dtype=torch.int32)
    ins = make_inputs(B, T, H, HV, K, V, seed=6)
    torch.backends.cuda.matmul.allow_tf32 = False
    o, u = tree_verify(*ins, parents)
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, ins, parents)
    if default_dot_precision("cuda") == "tf32":   # the outputs take one tf32 pass (they feed only bf16 outputs)
        assert rel(o, ro) < O_TF32_TOL
    else:
        close("o", o, ro, ro32)
    close("u", u, ru, ru32)
    # a state whose batch stride times the batch index passes 2**31 elements
    step = 2 ** 31 // (HV * V * K) + 1
    pool = torch.zeros(step + 1, HV, V, K, device="cuda", dtype=torch.bfloat16)  # 4.3 GB
    state = pool[0::step]
    assert state.shape[0] == 2 and state.stride(0) > 2 ** 31
    state.copy_(ins[5])
    (ro, ru), (ro32, ru32) = refs(naive_tree_verify, [*ins[:5], state], parents)
    o, u = tree_verify(*ins[:5], state, parents)
    close("u", u, ru, ru32)
    acc = torch.tensor([127, 64])
    ref = naive_tree_commit(state.double(), ru, ins[1].double(), ins[3].double(), parents, acc)
    tree_commit(state, u, ins[1], ins[3], parents, acc)
    assert rel(pool[step], ref[1]) < 1e-2 and rel(pool[0], ref[0]) < 1e-2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is only switched on without CUDA")
def test_triton_imported_before_treewy_is_a_clear_error():
    """Without CUDA, triton imported before treewy would leave the interpreter off: say so, don't crash in a kernel."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", "import triton; import treewy.ops.verify.kernel"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "import treewy before triton" in r.stderr
    ok = subprocess.run([sys.executable, "-c", "import treewy, triton, treewy.ops"], env=env, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr


def test_offline_compile_reports_registers_and_sass():
    """benchmarks/compile_offline.py compiles the verify kernels for sm_90 without a GPU (Triton's ptxas): the
    chain kernel, the path kernel on tensor cores (one launch, and the split launch's two kernels) and the dense
    kernel at a (2,2,2) window, without spills."""
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(root), "TRITON_DEFAULT_FP_FUSION": "1"}
    tool = str(root / "benchmarks" / "compile_offline.py")
    for args, mma in ((["--kernel", "chain", "--BV", "8", "--K", "64", "--V", "64"], False),
                      (["--kernel", "path", "--T", "4", "--BV", "32", "--BK", "64", "--warps", "4"], True),
                      (["--kernel", "path", "--split", "--T", "40", "--BV", "32", "--BK", "32", "--warps", "4"], True),
                      (["--kernel", "tables", "--T", "40", "--warps", "4"], False),
                      (["--kernel", "dense", "--T", "15", "--BV", "32", "--warps", "4"], True)):
        out = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        rep = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        assert rep["registers"] > 0 and rep["stack"] == 0 and rep["LDG"] > 0 and rep["STG"] > 0 and rep["total"] > 100
        assert (rep["HMMA"] + rep["HGMMA"] > 0) == mma
    bad = subprocess.run([sys.executable, tool], capture_output=True, text=True,
                         env={**env, "TRITON_INTERPRET": "1"}, timeout=120)
    assert bad.returncode != 0 and "TRITON_INTERPRET=0" in bad.stderr
