"""GDN op backends: the Triton kernels where importable and on a GPU, else the torch references."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ops:
    name: str
    tree_verify: object       # (q, k, v, g, beta, S0, parents) -> (o, u)
    tree_commit: object       # (S0, u, k, g, parents, accepted) -> S_a
    store_all_verify: object  # (q, k, v, g, beta, S0, parents) -> (o, states [B, T, HV, V, K])
    tree_conv1d: object       # (x, weight, conv_state, parents, bias, activation) -> y
    tree_conv1d_commit: object  # (x, conv_state, parents, accepted) -> conv_state


def _torch_ops() -> Ops:
    from treewy.ops.naive import (
        naive_tree_commit,
        naive_tree_recurrent,
        naive_tree_verify,
    )
    from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit
    return Ops("torch", naive_tree_verify, naive_tree_commit, naive_tree_recurrent, naive_tree_conv1d,
               naive_tree_conv1d_commit)


def get_ops(device, backend: str = "auto") -> Ops:
    """``backend``: "auto" (kernels on CUDA when ``treewy.ops`` has them, else torch), "torch" or "triton"."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend = {backend!r}: expected 'auto', 'torch' or 'triton'")
    ref = _torch_ops()
    if backend == "torch" or (backend == "auto" and torch.device(device).type != "cuda"):
        return ref
    try:
        from treewy.ops import store_all_verify, tree_commit, tree_conv1d, tree_verify
    except ImportError as e:
        if backend == "triton":
            raise ValueError("backend='triton' but treewy.ops has no tree_verify / tree_commit / "
                             f"store_all_verify / tree_conv1d kernels ({e}); use backend='torch'") from e
        return ref
    try:
        from treewy.ops import tree_conv1d_commit
    except ImportError:
        tree_conv1d_commit = ref.tree_conv1d_commit
    return Ops("triton", tree_verify, tree_commit, store_all_verify, tree_conv1d, tree_conv1d_commit)
