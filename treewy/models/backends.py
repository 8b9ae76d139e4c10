"""GDN op backends for the engine: the Triton kernels where importable and on a GPU, else the torch references.

The engine validates its draft tree once per ``generate`` and hands every op a contiguous int32
parent tensor on the device ([T]: one topology for the batch), so the kernel backend calls the
launchers (``*_fwd``) directly: no per-layer value checks, no host syncs. The torch backend is the
references, unchanged (they validate every call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ops:
    name: str
    tree_step: object         # (q, k, v, g, beta, state, parents, pending, max_depth) -> (o, u); pending applied
    flush: object             # (state, pending) -> state, the pending commit applied in place
    store_all_verify: object  # (q, k, v, g, beta, S0, parents) -> (o, states [B, T, HV, V, K])
    tree_conv1d: object       # (x, weight, conv_state, parents, bias, activation) -> y
    tree_conv1d_commit: object  # (x, conv_state, parents, accepted) -> conv_state


def _torch_ops() -> Ops:
    from treewy.ops import (
        naive_flush, naive_tree_conv1d, naive_tree_conv1d_commit, naive_tree_recurrent, naive_tree_verify,
    )

    def flush(state, pending):
        return state.copy_(naive_flush(state, pending))

    def tree_step(q, k, v, g, beta, state, parents, pending, max_depth=None):
        if pending is not None:
            flush(state, pending)
        return naive_tree_verify(q, k, v, g, beta, state, parents)

    return Ops("torch", tree_step, flush, naive_tree_recurrent, naive_tree_conv1d, naive_tree_conv1d_commit)


def _stride(parents: torch.Tensor) -> int:
    """Batch stride of a kernel parent tensor: 0 for one shared topology [T]."""
    return 0 if parents.ndim == 1 else parents.shape[-1]


def _kernel_flush(state, pending):
    """The pending commit applied in place by the commit kernel (accepted = -1 leaves a row unchanged)."""
    from treewy.ops.commit.kernel import tree_commit_fwd
    from treewy.ops.verify.pending import unpack

    u, k, g, parents, accepted, use_qk_l2norm_in_kernel = unpack(pending)
    return tree_commit_fwd(state, u, k, g, parents, _stride(parents), accepted, use_qk_l2norm_in_kernel)


def flush_then_verify(q, k, v, g, beta, initial_state, parents, stride_pb, scale, pending=None, max_depth=None):
    """``tree_verify_fwd(..., pending=pending)`` in two launches: the pending commit in place, then the verify."""
    from treewy.ops.verify.kernel import tree_verify_fwd
    if pending is not None:
        _kernel_flush(initial_state, pending)
    return tree_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale,
                           chain=max_depth == q.shape[1] - 1, max_depth=max_depth)


def fused_step(q, k, v, g, beta, initial_state, parents, stride_pb, scale, pending=None, max_depth=None):
    """One launch: the pending commit folded into the verify (``tree_verify_fwd(..., pending=pending)``);
    ``max_depth``: the window's depth (a chain of T nodes is T - 1 deep and runs the chain kernel; None: T - 1,
    any tree, through the tree kernel)."""
    from treewy.ops.verify.kernel import tree_verify_fwd
    return tree_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale, pending=pending,
                           chain=max_depth == q.shape[1] - 1, max_depth=max_depth)


#: The launcher of one reconstruct step (deferred commit + verify): ``fused_step`` (one launch) or
#: ``flush_then_verify`` (two launches, kept for comparison in benchmarks/sweep_and_timing_gpu.py).
STEP_LAUNCHER = fused_step


def _kernel_ops() -> Ops:
    """The Triton launchers behind the engine's calling convention (inputs contiguous, parents int32 on device)."""
    from treewy.ops.store_all.kernel import store_all_verify_fwd
    from treewy.ops.conv.kernel import tree_conv1d_commit_fwd, tree_conv1d_fwd

    def tree_step(q, k, v, g, beta, state, parents, pending, max_depth=None):
        return STEP_LAUNCHER(q, k, v, g, beta, state, parents, _stride(parents), q.shape[-1] ** -0.5,
                             pending=pending, max_depth=max_depth)

    def store_all_verify(q, k, v, g, beta, S0, parents):
        return store_all_verify_fwd(q, k, v, g, beta, S0, parents, _stride(parents), q.shape[-1] ** -0.5)

    def tree_conv1d(x, weight, conv_state, parents, bias=None, activation="silu"):
        # the kernel reads conv_state as contiguous [B, C, W - 1]; a view of a serving pool is not (vLLM 0.26's
        # conv pool is [slots, W - 1 + N, C] seen as [slots, C, W - 1 + N]: its columns are C apart)
        return tree_conv1d_fwd(x, weight, conv_state.contiguous(), parents, _stride(parents), bias, activation)

    def tree_conv1d_commit(x, conv_state, parents, accepted):
        return tree_conv1d_commit_fwd(x, conv_state, parents, _stride(parents), accepted.to(torch.int32))

    return Ops("triton", tree_step, _kernel_flush, store_all_verify, tree_conv1d, tree_conv1d_commit)


def get_ops(device, backend: str = "auto") -> Ops:
    """``backend``: "auto" (kernels on CUDA when ``treewy.ops`` has them, else torch), "torch" or "triton"."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend = {backend!r}: expected 'auto', 'torch' or 'triton'")
    if backend == "torch" or (backend == "auto" and torch.device(device).type != "cuda"):
        return _torch_ops()
    try:
        return _kernel_ops()
    except ImportError as e:
        if backend == "triton":
            raise ValueError(f"backend='triton' but the Triton kernels cannot be imported ({e}); "
                             "use backend='torch'") from e
        return _torch_ops()
