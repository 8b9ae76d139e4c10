"""The ops the benchmarks time, the shapes they are timed at and the baselines beside them, in one place.

Each ``Op`` names its providers (ours first, then the baselines), builds its inputs at a ``Shape``, returns a
zero-argument step for a provider, and counts the bytes that step must move (``min_bytes``: the roofline is that
traffic at the H200's copy bandwidth, ``timing.COPY_BW``). ``measure`` times a step: the median of CUDA-graph
replays on a GPU; under ``smoke`` (CPU, Triton interpreter, tiny dimensions) one interpreted call, which is not a
timing. ``benchmarks/run.py`` is the command over this registry; ``benchmarks/bench_kernels.py`` times its rows
through it.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Callable

import torch

from treewy.bench.timing import COPY_BW, MODELS, make, min_bytes, step_fn
from treewy.tree import DraftTree

#: Tiny stand-ins under ``smoke``: one head of 16 x 16, and the batch sizes each real batch maps to.
SMOKE_DIMS = dict(H=1, HV=1, K=16, V=16, layers=1)
SMOKE_B = {256: 2, 64: 2, 1: 1}
#: Conv width of Qwen3.5's GDN layers (kernel 4 over q, k, v).
CONV_WIDTH = 4


@dataclass(frozen=True)
class Shape:
    """A named shape: a draft tree (branching factors per level), a batch, a model's GDN layer, a state dtype."""
    name: str
    widths: tuple[int, ...]
    B: int
    model: str = "35B-A3B"
    state_dtype: torch.dtype = torch.float32

    @property
    def tree(self) -> DraftTree:
        return DraftTree.from_widths(self.widths)

    def dims(self, smoke: bool = False) -> dict:
        return SMOKE_DIMS if smoke else MODELS[self.model]

    def batch(self, smoke: bool = False) -> int:
        return SMOKE_B.get(self.B, min(self.B, 2)) if smoke else self.B


SHAPES = {s.name: s for s in (
    Shape("333_B256", (3, 3, 3), 256), Shape("222_B256", (2, 2, 2), 256), Shape("chain3_B256", (1, 1, 1), 256),
    Shape("chain3_B256_bf16", (1, 1, 1), 256, state_dtype=torch.bfloat16), Shape("333_B64", (3, 3, 3), 64),
    Shape("chain3_B64", (1, 1, 1), 64), Shape("333_B1", (3, 3, 3), 1), Shape("chain3_B1", (1, 1, 1), 1),
    Shape("333_B256_397B", (3, 3, 3), 256, model="397B-A17B"),
)}


def _state_bytes(state_dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=state_dtype).element_size()


def _verify_inputs(tree, B, dims, state_dtype, device, input_dtype):
    return make(B, tree.num_nodes, dims["H"], dims["HV"], dims["K"], dims["V"], state_dtype, device=device,
                input_dtype=input_dtype)


def _verify_bytes(provider, tree, B, dims, state_dtype):
    return min_bytes(provider, tree, B, dims["H"], dims["HV"], dims["K"], dims["V"], _state_bytes(state_dtype))


def _commit_inputs(tree, B, dims, state_dtype, device, input_dtype):
    """The verify window's inputs plus a random accepted node per request."""
    x = _verify_inputs(tree, B, dims, state_dtype, device, input_dtype)
    gen = torch.Generator(device=device).manual_seed(B * 1000 + tree.num_nodes)
    acc = torch.randint(0, tree.num_nodes, (B,), generator=gen, device=device, dtype=torch.int32)
    return x, acc


def _commit_step(provider, inputs, tree, **kw):
    from treewy.ops.commit.kernel import tree_commit_fwd
    from treewy.ops.store_all.kernel import store_all_commit
    from treewy.ops.verify.naive import naive_tree_verify

    (q, k, v, g, beta, state), acc = inputs
    par = tree.parents.to(q.device, torch.int32)
    if provider == "treewy":
        _, u = naive_tree_verify(*(t.double() for t in (q, k, v, g, beta, state)), par)
        u = u.float()
        return lambda: tree_commit_fwd(state, u, k, g, par, 0, acc)
    if provider == "store_all":
        states = state[:, None].expand(-1, tree.num_nodes, -1, -1, -1).contiguous()
        return lambda: store_all_commit(state, states, acc)
    raise ValueError(f"provider = {provider!r}: expected treewy or store_all")


def _commit_bytes(provider, tree, B, dims, state_dtype):
    """The state read and written once; TreeWY also reads the accepted path's u, k and g."""
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    state = B * HV * V * K * _state_bytes(state_dtype) * 2
    if provider == "store_all":
        return state
    return state + B * (tree.max_depth + 1) * (HV * V * 4 + H * K * 2 + HV * 4)


def _conv_channels(dims) -> int:
    return 2 * dims["H"] * dims["K"] + dims["HV"] * dims["V"]   # q, k and v go through one conv


def _conv_inputs(tree, B, dims, state_dtype, device, input_dtype):
    C = _conv_channels(dims)
    gen = torch.Generator(device=device).manual_seed(B * 1000 + tree.num_nodes)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    return r(B, tree.num_nodes, C).to(input_dtype), r(C, CONV_WIDTH).to(input_dtype), \
        r(B, C, CONV_WIDTH - 1).to(input_dtype)


def _conv_step(provider, inputs, tree, **kw):
    from treewy.ops.conv.kernel import tree_conv1d_fwd

    if provider != "treewy":
        raise ValueError(f"provider = {provider!r}: expected treewy")
    x, weight, conv_state = inputs
    par = tree.parents.to(x.device, torch.int32)
    return lambda: tree_conv1d_fwd(x, weight, conv_state, par, 0)


def _conv_bytes(provider, tree, B, dims, state_dtype):
    """x read and y written (bf16), the conv state and the weights read."""
    C = _conv_channels(dims)
    return 2 * (2 * B * tree.num_nodes * C + B * C * (CONV_WIDTH - 1) + C * CONV_WIDTH)


@dataclass(frozen=True)
class Op:
    """One op: ``providers`` (ours first, then baselines); ``inputs(tree, B, dims, state_dtype, device,
    input_dtype)``; ``step(provider, inputs, tree, **kw)`` -> a zero-argument callable; ``min_bytes(provider, tree,
    B, dims, state_dtype)``; ``needs``: provider -> the module it imports (skipped with a note where missing);
    ``chains_only``: providers that take chains only."""
    name: str
    doc: str
    providers: tuple[str, ...]
    inputs: Callable
    step: Callable
    min_bytes: Callable
    needs: dict
    chains_only: tuple[str, ...] = ()


OPS = {op.name: op for op in (
    Op("verify", "one GDN layer's verify step: TreeWY with the previous commit folded in; treewy_eager is verify "
       "then tree_commit; store_all writes a snapshot per node; fla is fla-core's fused_recurrent over the window "
       "as a sequence (no rollback)",
       ("treewy", "treewy_eager", "store_all", "fla"), _verify_inputs,
       lambda provider, x, tree, **kw: step_fn(provider, x, tree, **kw), _verify_bytes, {"fla": "fla"}, ("fla",)),
    Op("commit", "the accepted node's state rebuilt from S0 and u (tree_commit alone); store_all copies the "
       "accepted snapshot (engines that index slots pay nothing)",
       ("treewy", "store_all"), _commit_inputs, _commit_step, _commit_bytes, {}),
    Op("conv", "the tree conv1d over q, k, v in front of a GDN layer (width 4, SiLU)",
       ("treewy",), _conv_inputs, _conv_step, _conv_bytes, {}),
)}


def get_op(name: str) -> Op:
    if name not in OPS:
        raise ValueError(f"op = {name!r}: expected one of {', '.join(OPS)}")
    return OPS[name]


def get_shape(name: str) -> Shape:
    if name not in SHAPES:
        raise ValueError(f"shape = {name!r}: expected one of {', '.join(SHAPES)}")
    return SHAPES[name]


def measure(fn, smoke: bool = False) -> float:
    """Microseconds: the median of CUDA-graph replays; under ``smoke`` one interpreted call after a first one
    (not a timing)."""
    if smoke:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    from treewy.bench.timing import bench

    return bench(fn)


def skip_reason(op: Op, provider: str, tree: DraftTree) -> str | None:
    if provider not in op.providers:
        raise ValueError(f"provider = {provider!r}: op {op.name} takes {', '.join(op.providers)}")
    if provider in op.chains_only and tree.max_depth != tree.num_nodes - 1:
        return f"{provider} takes chains only"
    if provider in op.needs and importlib.util.find_spec(op.needs[provider]) is None:
        return f"{op.needs[provider]} not importable"
    return None


def run(op_name: str, shape: Shape | str, provider: str, smoke: bool = False, **kw) -> dict:
    """One row: the op at the shape through the provider, its time, bytes, roofline and derived GB/s (``us`` is
    None and ``note`` says why when the provider cannot run it)."""
    op = get_op(op_name)
    shape = get_shape(shape) if isinstance(shape, str) else shape
    tree, B, dims = shape.tree, shape.batch(smoke), shape.dims(smoke)
    nbytes = op.min_bytes(provider, tree, B, dims, shape.state_dtype)
    row = dict(op=op.name, provider=provider, shape=shape.name, tree=str(shape.widths), T=tree.num_nodes, B=B,
               **{d: dims[d] for d in ("H", "HV", "K", "V")}, state_dtype=str(shape.state_dtype).removeprefix("torch."),
               us=None, min_bytes=nbytes, roofline_us=nbytes / COPY_BW * 1e6, gbps=None, roofline_fraction=None,
               **{k: v for k, v in kw.items() if v is not None})
    note = skip_reason(op, provider, tree)
    if note is None and smoke and provider in op.needs:
        note = f"{provider} not run under smoke"
    if note:
        return {**row, "note": note}
    snapshots = B * tree.num_nodes * dims["HV"] * dims["V"] * dims["K"] * _state_bytes(shape.state_dtype)
    if not smoke and provider == "store_all" and snapshots * 1.1 > torch.cuda.mem_get_info()[0]:
        return {**row, "note": "snapshots do not fit on the device for one layer"}
    device = "cpu" if smoke else "cuda"
    x = op.inputs(tree, B, dims, shape.state_dtype, device, torch.float32 if smoke else torch.bfloat16)
    us = measure(op.step(provider, x, tree, **kw), smoke)
    del x
    if not smoke:
        torch.cuda.empty_cache()   # the next row's inputs and snapshots need the room
    return {**row, "us": us, "gbps": nbytes / (us * 1e-6) / 1e9, "roofline_fraction": row["roofline_us"] / us}


__all__ = ["OPS", "SHAPES", "SMOKE_B", "SMOKE_DIMS", "Op", "Shape", "get_op", "get_shape", "measure", "run",
           "skip_reason"]
