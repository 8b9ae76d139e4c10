"""Torch ops that launch device work in one GDN layer's spec step, counted on CPU with the torch profiler.

    .venv/bin/python -m benchmarks.count_spec_step_ops [--stub] [--vllm-src DIR] [--B 4] [--T 4] [--out FILE]

Runs, once each under ``torch.profiler`` (CPU activity), what one GDN layer does per spec step in each mode:

- reconstruct: the plugin's stand-in for vLLM's spec kernel (``treewy.serve.reconstruct.vllm_spec_update``;
  before it existed, ``gdn_gating`` then ``spec_step``, the count in benchmarks/results/spec_step_ops_cpu_*.txt), and
  ``flush_slots`` as the plugin runs it on a step that also carries prefill or plain-decode rows;
- store_all: vLLM 0.26's ``fused_sigmoid_gating_delta_rule_update`` called as its Qwen GDN layer calls it for the
  spec rows (``--vllm-src``: a folder holding ``vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py``,
  e.g. ``/tmp/site`` on the GPU machine or the shared payload unpacked with ``cat vllm026.part-a vllm026.part-b |
  xz -dc | tar x -C DIR ./vllm/third_party``; without it, an importable vLLM; else that mode is left out).

A Triton launch counts as one ``kernel`` op (what runs inside the interpreter is not counted; ``--stub`` skips it).
Every other op counted is an innermost aten op that is not a view or an allocation: on a GPU each launches a
kernel. Ops that make the host wait for the device (bool indexing, nonzero, item) are counted apart as syncs.
Each launch is attributed to the top-level aten op it ran under (``aten::to`` -> a dtype cast, ``aten::index``
-> a gather, ...). The counts depend on the code path, not on the sizes, so small head sizes are used.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import treewy  # noqa: F401  (before triton: the interpreter switch where there is no GPU)

#: aten ops that move no data: views, shape queries and allocations without a fill.
NO_LAUNCH = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view", "aten::reshape", "aten::_reshape_alias",
    "aten::_unsafe_view", "aten::slice", "aten::select", "aten::expand", "aten::expand_as", "aten::as_strided",
    "aten::t", "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::alias",
    "aten::detach", "aten::detach_", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::narrow", "aten::unbind", "aten::contiguous", "aten::to",
    "aten::_to_copy", "aten::clone", "aten::result_type", "aten::size", "aten::stride", "aten::numel",
    "aten::broadcast_tensors", "aten::_has_compatible_shallow_copy_type", "aten::set_", "aten::view_as",
    "aten::flatten", "aten::unflatten", "aten::new_empty", "aten::new_empty_strided", "aten::is_nonzero",
}
#: aten ops that wait for the device (a host sync on a GPU).
SYNC = {"aten::nonzero", "aten::_local_scalar_dense", "aten::item", "aten::masked_select", "aten::nonzero_static"}
LAUNCH_TAG = "launch::"

KINDS = {  # top-level op -> kind in the table
    "aten::to": "dtype cast", "aten::_to_copy": "dtype cast", "aten::float": "dtype cast", "aten::long": "dtype cast",
    "aten::int": "dtype cast", "aten::copy_": "copy", "aten::contiguous": "copy", "aten::clone": "copy",
    "aten::index": "gather", "aten::index_select": "gather", "aten::gather": "gather",
    "aten::index_put_": "scatter (index_put_)", "aten::index_put": "scatter (index_put_)",
    "aten::index_copy_": "scatter (index_put_)", "aten::mul": "multiply", "aten::arange": "index building",
    "aten::where": "index building", "aten::clamp": "index building", "aten::searchsorted": "index building",
    "aten::lt": "index building", "aten::gt": "index building", "aten::sub": "index building",
    "aten::add": "elementwise", "aten::zeros_like": "fill", "aten::full": "fill", "aten::zeros": "fill",
    "aten::fill_": "fill", "aten::zero_": "fill",
}


class Launch:
    """A Triton kernel (``kernel[grid](...)``) recorded as one launch; with ``stub`` it is not run."""

    def __init__(self, kernel, name, stub):
        self.kernel, self.name, self.stub = kernel, name, stub

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            with record_function(LAUNCH_TAG + self.name):
                if not self.stub:
                    return self.kernel[grid](*args, **kwargs)
        return run

    def __getattr__(self, item):  # an autotuned kernel's ``.fn`` (a pinned config) is recorded too
        attr = getattr(self.kernel, item)
        return Launch(attr, self.name, self.stub) if item == "fn" else attr


def launches(fn):
    """[(kind, op)] of the device work ``fn()`` launches, and [op] of its host syncs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("root"):
            fn()
    events = prof.events()
    root = next(e for e in events if e.name == "root")

    def counted(e):  # under root (not another thread's op) and not inside a launch
        p = e.cpu_parent
        while p is not None and p is not root:
            if p.name.startswith(LAUNCH_TAG):
                return False
            p = p.cpu_parent
        return p is root

    def computes(e):
        return e.name.startswith(LAUNCH_TAG) or (e.name.startswith("aten::") and e.name not in NO_LAUNCH
                                                  and e.name not in SYNC)

    def has_computing_child(e):  # a launch is a leaf: what the interpreter runs inside it is not counted
        return not e.name.startswith(LAUNCH_TAG) and any(computes(c) or has_computing_child(c) for c in e.cpu_children)

    def top(e):
        while e.cpu_parent is not root:
            e = e.cpu_parent
        return e

    out, syncs = [], []
    for e in events:
        if not counted(e):
            continue
        if e.name in SYNC:
            syncs.append(top(e).name)
        elif computes(e) and not has_computing_child(e):
            t = top(e)
            kind = "kernel " + e.name.removeprefix(LAUNCH_TAG) if e.name.startswith(LAUNCH_TAG) else \
                KINDS.get(t.name, "elementwise")
            out.append((kind, t.name))
    return out, syncs


def table(title, ops, syncs) -> str:
    by_kind = collections.Counter(k for k, _ in ops)
    lines = [f"{title}: {len(ops)} launches, {len(syncs)} host syncs"]
    lines += [f"  {n:4d}  {kind}" for kind, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))]
    if syncs:
        lines.append("  syncs under: " + ", ".join(f"{op} x{n}" for op, n in collections.Counter(syncs).items()))
    return "\n".join(lines)


def shapes(B, T):
    """A step of B requests (ragged: row 1 carries one token fewer; one padding row on slot 0) in vLLM's layout."""
    H, HV, K, V = 2, 4, 16, 16
    gen = torch.Generator().manual_seed(0)
    lens = [T] * B
    lens[min(1, B - 1)] = max(1, T - 1)
    lens[-1] = 0
    N = sum(lens)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)
    slots = torch.arange(1, B + 1, dtype=torch.int32)
    slots[-1] = 0
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(A_log=r(HV), dt_bias=r(HV), a=r(N, HV).to(torch.bfloat16), b=r(N, HV).to(torch.bfloat16),
             q=r(1, N, H, K).to(torch.bfloat16), k=r(1, N, H, K).to(torch.bfloat16),
             v=r(1, N, HV, V).to(torch.bfloat16), cu_seqlens=cu,
             ssm_state_indices=slots[:, None] + torch.zeros(1, T, dtype=torch.int32),
             num_accepted_tokens=torch.full((B,), 2, dtype=torch.int32))
    return dict(H=H, HV=HV, K=K, V=V), x


@contextlib.contextmanager
def recorded(module, names, stub):
    """The named Triton kernels of ``module`` recorded as launches (``Launch``) while inside, restored after."""
    saved = {n: getattr(module, n) for n in names}
    try:
        for n, kernel in saved.items():
            setattr(module, n, Launch(kernel, n, stub))
        yield
    finally:
        for n, kernel in saved.items():
            setattr(module, n, kernel)


def reconstruct_fns(B, T):
    """(the plugin's spec step, the flush it runs on steps with non-spec rows) on one layer's pools."""
    from treewy.serve.reconstruct import ReconstructPools, flush_slots, vllm_spec_update

    d, x = shapes(B, T)
    pools = ReconstructPools.empty(B + 1, max_nodes=T, **d)
    pools.meta[1:, 0] = T        # every real slot holds a pending window of T nodes
    non_spec = x["ssm_state_indices"][:, 0].clone()
    return (lambda: vllm_spec_update(pools, **x, use_qk_l2norm_in_kernel=True)), lambda: flush_slots(pools, non_spec)


def reconstruct_kernels(stub):
    from treewy.ops.verify import chain
    return recorded(chain, ["chain_spec_step_kernel"], stub)


def _vllm_module(src):
    """vLLM 0.26's fused_sigmoid_gating module: imported from vLLM, or loaded from its file under ``src`` with
    ``vllm.triton_utils`` standing in for vLLM's import of triton."""
    rel = "vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py"
    if src is None:
        with contextlib.suppress(ImportError):
            return importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        return None
    path = Path(src) / rel
    if not path.is_file():
        raise SystemExit(f"count_spec_step_ops: error: --vllm-src {src} has no {rel}")
    import triton
    import triton.language as tl
    shim = types.ModuleType("vllm.triton_utils")
    shim.tl, shim.triton = tl, triton
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.triton_utils"] = shim
    spec = importlib.util.spec_from_file_location("vllm026_fused_sigmoid_gating", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def store_all_fn(B, T, src):
    """(store-all's spec step as vLLM's Qwen GDN layer calls it, its module), or (None, None) without vLLM."""
    mod = _vllm_module(src)
    if mod is None:
        return None, None
    d, x = shapes(B, T)
    state = torch.zeros(B * T + 1, d["HV"], d["V"], d["K"])
    idx = torch.arange(1, B * T + 1, dtype=torch.int32).reshape(B, T)   # store-all: T blocks per request
    idx[-1] = 0
    args = {k: x[k] for k in ("A_log", "a", "b", "dt_bias", "q", "k", "v", "num_accepted_tokens")}
    return (lambda: mod.fused_sigmoid_gating_delta_rule_update(
        **args, initial_state=state, inplace_final_state=True, cu_seqlens=x["cu_seqlens"], ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True)), mod


def tree_fns(widths, B):
    """(reconstruct's tree spec step, store-all's) as the plugin runs them on a GPU (``tree_spec_update`` on the
    pools in place; ``store_all_tree_update`` with the Triton ops) for B full windows of ``widths``' tree, one a
    padding row on slot 0, every real slot holding a pending accepted node off the leftmost path."""
    from treewy.serve import tree_plugin
    from treewy.serve.reconstruct import ReconstructPools

    serving = tree_plugin.TreeServing(widths, "reconstruct", B + 1)
    T = serving.layout.num_nodes
    d, x = shapes(B, T)
    N = B * T
    gen = torch.Generator().manual_seed(1)
    x.update(q=torch.randn(1, N, d["H"], d["K"], generator=gen).to(torch.bfloat16),
             k=torch.randn(1, N, d["H"], d["K"], generator=gen).to(torch.bfloat16),
             v=torch.randn(1, N, d["HV"], d["V"], generator=gen).to(torch.bfloat16),
             a=torch.randn(N, d["HV"], generator=gen).to(torch.bfloat16),
             b=torch.randn(N, d["HV"], generator=gen).to(torch.bfloat16),
             cu_seqlens=torch.arange(B + 1, dtype=torch.int32) * T)
    slots = torch.arange(1, B + 1, dtype=torch.int32)
    slots[-1] = 0
    pools = ReconstructPools.empty(B + 1, max_nodes=T, **d)
    accepted = torch.full((B,), T - 1, dtype=torch.int32)          # the last DFS node: off the leftmost path
    spec = {k: x[k] for k in ("A_log", "a", "b", "dt_bias", "q", "k", "v", "cu_seqlens")}
    blocks = torch.arange(1, B * T + 1, dtype=torch.int32).reshape(B, T)
    blocks[-1] = 0
    state_pool = torch.zeros(B * T + 1, d["HV"], d["V"], d["K"])
    return ((lambda: tree_plugin.tree_spec_update(pools, serving, ssm_state_indices=slots[:, None], accepted=accepted,
                                                  kernels=True, **spec)),
            (lambda: tree_plugin.store_all_tree_update(state_pool, serving, ssm_state_indices=blocks,
                                                       accepted=accepted, kernels=True, **spec)))


@contextlib.contextmanager
def tree_kernels(stub):
    """Every Triton kernel a tree spec step may launch, recorded."""
    from treewy.ops import gates_kernel
    from treewy.ops.store_all import kernel as store_all
    from treewy.ops.verify import dense, path, stash

    with recorded(path, ["tree_verify_path_kernel", "path_tables_kernel"], stub), \
            recorded(dense, ["tree_verify_dense_kernel"], stub), \
            recorded(store_all, ["store_all_verify_kernel"], stub), \
            recorded(gates_kernel, ["gdn_gating_kernel"], stub), recorded(stash, ["stash_window_kernel"], stub):
        yield


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=4, help="requests in the step (the last is a padding row)")
    p.add_argument("--T", type=int, default=4, help="tokens per request (root + drafts)")
    p.add_argument("--stub", action="store_true", help="record the Triton kernels without running them")
    p.add_argument("--vllm-src", default=None, help="folder holding vLLM 0.26's vllm/third_party/... sources")
    p.add_argument("--tree", default=None, help="widths such as 2,2,1: count the served tree's spec step in both "
                   "modes instead (the plugin's tree hooks; T is the tree's)")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    if args.B < 2 or args.T < 2:
        p.error("--B and --T must be at least 2 (a real row with a ragged window and a padding row)")
    parts = tree_parts(args) if args.tree is not None else chain_parts(args)
    text = "\n\n".join(parts)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return text


def counted_on(what: str, stub: bool) -> str:
    return (f"counted on CPU with the torch profiler (torch {torch.__version__}); {what}; "
            f"kernels {'stubbed' if stub else 'run under the Triton interpreter'}; per GDN layer per step")


def tree_parts(args) -> list[str]:
    """The served tree's spec step in both modes (``--tree``)."""
    from treewy.serve.launcher_command import parse_tree

    widths = parse_tree(args.tree)
    recon, sa = tree_fns(widths, args.B)
    with tree_kernels(args.stub):
        return [counted_on(f"tree {widths}, B = {args.B} (one a padding row)", args.stub),
                table("reconstruct tree spec step (tree_spec_update, the GPU's path)", *launches(recon)),
                table("store_all tree spec step (store_all_tree_update, the GPU's path)", *launches(sa))]


def chain_parts(args) -> list[str]:
    """The chain's spec step and flush (reconstruct) and vLLM's store-all kernel call."""
    step, flush = reconstruct_fns(args.B, args.T)
    with reconstruct_kernels(args.stub):
        parts = [counted_on(f"B = {args.B}, T = {args.T}", args.stub),
                 table("reconstruct spec step (vllm_spec_update)", *launches(step)),
                 table("reconstruct flush_slots (steps with prefill / plain-decode rows)", *launches(flush))]
    sa, mod = store_all_fn(args.B, args.T, args.vllm_src)
    if sa is None:
        parts.append("store_all: not counted (no --vllm-src and vLLM not importable)")
    else:
        with recorded(mod, ["fused_sigmoid_gating_delta_rule_update_kernel"], args.stub):
            parts.append(table("store_all spec step (vLLM 0.26 fused_sigmoid_gating_delta_rule_update)",
                               *launches(sa)))
    return parts


if __name__ == "__main__":
    main()
