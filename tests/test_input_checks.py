"""The door every op shares (``treewy/ops/checks.py``): every bad input to the references and the kernels raises a
ValueError that names the argument and the fix. What one op alone refuses sits with that op's tests
(tests/test_verify.py, test_commit.py, test_store_all.py, test_conv.py)."""

import pytest
import torch

from treewy.ops import naive_tree_recurrent, naive_tree_verify
from treewy.testing import make_inputs, random_gdn_inputs
from treewy.tree import DraftTree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TREE = DraftTree.from_widths((2, 1))


def inputs():
    return random_gdn_inputs(TREE, B=2, H=2, HV=4, K=8, V=6, seed=0)


def call(op, **override):
    x = inputs()
    args = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=x.initial_state, parents=x.parents)
    args.update(override)
    return op(*args.values())


OPS = [naive_tree_verify, naive_tree_recurrent]


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state"])
def test_nan_in_any_input_raises(op, name):
    x = inputs()
    bad = getattr(x, name).clone()
    bad.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match=f"{name} holds 1 NaN"):
        call(op, **{name: bad})


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name,shape,match", [
    ("k", (2, 5, 2, 7), r"k has shape \(2, 5, 2, 7\), expected \(2, 5, 2, 8\)"),
    ("v", (2, 5, 3, 6), r"HV = 3 value heads, not a multiple of the H = 2"),
    ("g", (2, 5, 2), r"g has shape"),
    ("beta", (2, 3, 4), r"beta has shape"),
    ("initial_state", (2, 4, 8, 6), r"initial_state has shape .*\[B, HV, V, K\]"),
    ("q", (2, 4, 8), r"q has shape .* 4 dims"),
], ids=["k", "v-heads", "g", "beta", "state-layout", "q-ndim"])
def test_mismatched_shapes_raise(op, name, shape, match):
    with pytest.raises(ValueError, match=match):
        call(op, **{name: torch.zeros(shape, dtype=torch.float64)})


def test_parents_of_the_wrong_size_raise():
    with pytest.raises(ValueError, match="parents describe 3 nodes"):
        call(naive_tree_verify, parents=DraftTree.chain(2).parents)


def test_malformed_parents_raise():
    with pytest.raises(ValueError, match="node 3 has parent 3"):
        call(naive_tree_verify, parents=torch.tensor([-1, 0, 1, 3]))


def test_positive_gate_raises():
    x = inputs()
    with pytest.raises(ValueError, match="g is a log decay"):
        call(naive_tree_verify, g=-x.g)


def test_beta_out_of_range_raises():
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        call(naive_tree_verify, beta=inputs().beta + 1.5)


def test_integer_inputs_raise():
    with pytest.raises(ValueError, match="v has dtype torch.int64"):
        call(naive_tree_verify, v=torch.zeros(2, 5, 4, 6, dtype=torch.long))


def test_mixed_devices_raise():
    x = inputs()
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        call(naive_tree_verify, k=x.k.to("meta"))


# ---- numeric edge cases, references and kernels alike ----

def _kernel_ops():
    pytest.importorskip("triton")
    from treewy.ops import store_all_verify, tree_verify
    return [tree_verify, store_all_verify]


@pytest.mark.parametrize("scale,match", [(float("nan"), "scale = nan"), (float("inf"), "scale = inf"),
                                         (0.0, "scale = 0.0"), (-1.0, "scale = -1.0"), ("abc", "scale = 'abc'"),
                                         (True, "scale = True")], ids=str)
def test_scale_must_be_a_finite_positive_number(scale, match):
    x = inputs()   # on the kernels' device: there a CPU tensor is refused before the scale is looked at
    args = [t.to(DEVICE, torch.float32) for t in (x.q, x.k, x.v, x.g, x.beta, x.initial_state)] + [x.parents]
    for op in [naive_tree_verify, naive_tree_recurrent, *_kernel_ops()]:
        with pytest.raises(ValueError, match=match):
            op(*args, scale=scale)


@pytest.mark.parametrize("dim", ["H", "K", "HV", "V"])
def test_zero_heads_or_head_dims_name_the_dimension(dim):
    sizes = dict(B=1, T=3, H=1, HV=1, K=8, V=8)
    sizes[dim] = 0
    B, T, H, HV, K, V = sizes.values()
    args = (torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V), -torch.rand(B, T, HV),
            torch.rand(B, T, HV), torch.zeros(B, HV, V, K), [-1, 0, 0])
    for op in [naive_tree_verify, naive_tree_recurrent, *_kernel_ops()]:
        with pytest.raises(ValueError, match=f"has {dim} = 0"):
            op(*args)


def test_an_empty_batch_gives_empty_outputs():
    args = tuple(x.to(DEVICE) for x in (torch.randn(0, 3, 1, 8), torch.randn(0, 3, 1, 8), torch.randn(0, 3, 2, 4),
                                        -torch.rand(0, 3, 2), torch.rand(0, 3, 2), torch.zeros(0, 2, 4, 8))) + ([-1, 0, 0],)
    for op in [naive_tree_verify, *_kernel_ops()]:
        o = op(*args)[0]
        assert o.shape == (0, 3, 2, 4)


# ---- the kernels' door: shapes, dtypes, devices, strides, sizes, one test per kind of mistake ----

def _kernels():
    pytest.importorskip("triton")
    from treewy.ops import tree_commit, tree_verify
    return tree_verify, tree_commit


def _small():
    return make_inputs(1, 3, 1, 2, 16, 16), DraftTree.chain(2)


def test_rejects_bad_shapes():
    tree_verify, _ = _kernels()
    ins, tree = _small()
    ins[2] = ins[2][..., :8].contiguous().unsqueeze(-1)
    with pytest.raises(ValueError, match="v"):
        tree_verify(*ins, tree)
    ins, tree = _small()
    with pytest.raises(ValueError, match="initial_state"):
        tree_verify(*ins[:5], ins[5].transpose(-1, -2).contiguous()[:, :, :8], tree)


def test_rejects_bad_dtypes():
    tree_verify, tree_commit = _kernels()
    ins, tree = _small()
    with pytest.raises(ValueError, match="q has dtype torch.float64"):
        tree_verify(ins[0].double(), *ins[1:], tree)
    with pytest.raises(ValueError, match="u has dtype"):
        tree_commit(ins[5].clone(), ins[2].half(), ins[1], ins[3], tree, 0)


def test_rejects_cpu_tensors_without_interpreter(monkeypatch):
    tree_verify, _ = _kernels()
    import treewy.ops._triton as backend

    ins, tree = _small()
    monkeypatch.setattr(backend, "INTERPRET", False)
    ins = [x.cpu() for x in ins]
    with pytest.raises((ValueError, RuntimeError), match="CPU tensor"):
        tree_verify(*ins, tree)


def test_reads_non_contiguous_inputs_and_rejects_a_non_contiguous_state():
    """Inputs an op only reads may have any strides (copied where needed); the state it writes in place may
    not: a copy would lose the write."""
    tree_verify, _ = _kernels()
    ins, tree = _small()
    k = torch.stack([ins[1], torch.zeros_like(ins[1])], dim=-1)[..., 0]  # the same values at stride 2
    assert not k.is_contiguous() and torch.equal(k, ins[1])
    for a, b in zip(tree_verify(ins[0], k, *ins[2:], tree), tree_verify(*ins, tree)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not contiguous in its last 3 dims"):
        tree_verify(*ins[:5], ins[5].transpose(-1, -2), tree)


def test_rejects_trees_over_the_kernel_limit():
    tree_verify, _ = _kernels()
    T = 129
    ins = make_inputs(1, T, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="limit of 128"):
        tree_verify(*ins, list(range(-1, T - 1)))


def test_rejects_nan_gates_and_bad_topologies():
    tree_verify, tree_commit = _kernels()
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
