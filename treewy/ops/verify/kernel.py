"""TreeWY tree verify: every node's output and pseudo-value, no per-node state, with the previous step's
commit optionally folded in (``pending``): launcher (``tree_verify_fwd``) and public function (``tree_verify``).

Status: the kernel families' headers (``chain.py``, ``path.py``). Per step and head one state read and one
state write; at most two launches; no host sync and no host-side branching on device data, so a step
captures into a CUDA graph and replays what an eager call runs.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from treewy.ops._triton import is_capturing
from treewy.ops.checks import GDNDims, check_commit_inputs, check_gdn_kernel_inputs, check_scale, check_shape, contiguous
from treewy.ops.commit.kernel import tree_commit
from treewy.ops.common import MAX_KERNEL_NODES
from treewy.ops.verify.chain import chain_fwd, tree_verify_chain_kernel
from treewy.ops.verify.dense import dense_fwd, tree_verify_dense_kernel
from treewy.ops.verify.path import path_fwd, path_tables_kernel, tree_verify_path_kernel
from treewy.ops.verify.pending import PendingCommit, unpack
from treewy.ops.verify.select import KERNELS, select_kernel
from treewy.ops.verify.tuning import check_dot_precision
from treewy.tree import DraftTree, path_depth

#: The kernels behind each family name (launch order), for profilers and the offline compiler.
KERNEL_FNS = {"chain": (tree_verify_chain_kernel,), "dense": (tree_verify_dense_kernel,),
              "path": (tree_verify_path_kernel,), "path_split": (path_tables_kernel, tree_verify_path_kernel)}


def tree_verify_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, scale, use_qk_l2norm_in_kernel=False,
                    num_nodes=None, dot_precision=None, pending=None, kernel=None, config=None, chain=False,
                    state_indices=None, max_depth=None):
    """Launcher: inputs already validated; parents int32 on the inputs' device. Returns (o, u fp32).

    ``pending``: a PendingCommit whose parents and accepted are int32 device tensors (validated), or None;
    ``initial_state`` is then updated in place. ``chain``: the window is a chain (parents[t] = t - 1, not
    checked here); with ``kernel`` None the family is ``select_kernel(T, B, chain, state in bf16, precision
    "ieee")``. ``kernel``: one of KERNELS to force it. ``max_depth``: a bound on every request's tree depth
    (sizes the path kernel's tables; None: T - 1, always enough; a window deeper than the bound gets NaN outputs,
    never wrong ones).
    ``dot_precision``: None (the device default, see tuning.default_dot_precision), "tf32", "ieee" or
    "tf32_plain". ``config``: a ``triton.Config`` of the tuned kernel to launch instead of the autotuned one.
    ``state_indices``: None (request b's state is
    ``initial_state[b]``, its pending u / k / g row b) or int32 [B] on the device: ``initial_state`` and the
    pending u / k / g are pools of slots (any slot stride, each slot contiguous) and request b's live in
    slot ``state_indices[b]`` (a serving engine's state pool; distinct slots; any stride: vLLM's CUDA-graph buffer
    hands its column 0 of a [B, T] table, stride T, which the kernels, reading slot b at offset b, must not see).
    """
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel = {kernel!r}: expected None or one of {KERNELS}")
    B, T = q.shape[:2]
    dot_precision = check_dot_precision(dot_precision, v.device)
    kernel = kernel or select_kernel(T, B, chain, initial_state.dtype == torch.bfloat16, dot_precision == "ieee")
    o = torch.empty_like(v)
    u = torch.empty(v.shape, device=v.device, dtype=torch.float32)
    if state_indices is not None:
        state_indices = state_indices.contiguous()
    if pending is not None and not pending.accepted.is_contiguous():   # read at offset b too
        pending = replace(pending, accepted=pending.accepted.contiguous())
    if kernel == "chain":
        return chain_fwd(q, k, v, g, beta, initial_state, num_nodes, pending, scale, use_qk_l2norm_in_kernel, o, u,
                         config=config, state_indices=state_indices)
    if kernel == "dense":
        return dense_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, num_nodes, pending, scale,
                         use_qk_l2norm_in_kernel, o, u, dot_precision, config=config,
                         state_indices=state_indices)
    return path_fwd(q, k, v, g, beta, initial_state, parents, stride_pb, num_nodes, pending, scale,
                    use_qk_l2norm_in_kernel, o, u, dot_precision,
                    max_depth=T - 1 if chain else max_depth, config=config, state_indices=state_indices,
                    split=kernel == "path_split")


def check_pending(pending, state, dims: GDNDims, *, max_nodes: int, values: bool):
    """Validate a PendingCommit against the state [B, HV, V, K] it will be folded into (the checks of
    ``tree_commit``, accepted = -1 allowed); return it with int32 parents and accepted on the state's device."""
    if not isinstance(pending, PendingCommit):
        raise ValueError(f"pending must be a treewy.ops.PendingCommit, got {type(pending).__name__}")
    u, k, g, parents, accepted, _ = unpack(pending)
    par, _, acc = check_commit_inputs(state, u, k, g, parents, accepted, max_nodes=max_nodes, values=values,
                                      allow_none=True, prefix="pending.")
    check_shape("pending.k", k, (dims.B, u.shape[1], dims.H, dims.K),
           "[B, T_prev, H, K]: the previous window's keys")
    return replace(pending, parents=par, accepted=acc)


def _host(x, device_tensor: torch.Tensor | None, capturing: bool) -> torch.Tensor | None:
    """``x`` as a host tensor where it is host data (a DraftTree, a list, a CPU tensor), else the validated device
    tensor read back (one sync); None inside a capture, where device data cannot be read."""
    if isinstance(x, DraftTree):
        return x.parents
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        return None if capturing else device_tensor.cpu()
    return torch.as_tensor(x)


def _window_shape(parents, par: torch.Tensor, num_nodes, nn: torch.Tensor | None,
                  capturing: bool) -> tuple[int | None, bool | None]:
    """(the deepest node's depth over every request's window, whether every request's window is a chain), each
    None where it cannot be read (inside a capture with device tensors). Request b's window is a chain when each
    of its first ``num_nodes[b]`` nodes has the node before it as parent; one tree in the batch makes it not a
    chain. Inside a capture with device num_nodes, every node counts (a bound: a chain stays a chain)."""
    host = _host(parents, par, capturing)
    if host is None:
        return None, None
    host = host.reshape(-1, host.shape[-1]).long()
    T = host.shape[-1]
    depth = int(path_depth(host).max()) if host.numel() else 0
    n = None if nn is None else _host(num_nodes, nn, capturing)
    t = torch.arange(T)
    links = host == t - 1
    if n is not None:
        links = links | (t[None, :] >= n.long().reshape(-1, 1))
    return depth, bool(links.all())


def tree_verify(q, k, v, g, beta, initial_state, parents, scale=None, use_qk_l2norm_in_kernel=False,
                num_nodes=None, pending=None, kernel=None, chain=None, dot_precision=None, max_depth=None):
    """Outputs and pseudo-values of every tree node (kernel twin of ``naive_tree_verify``).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (bf16 or fp32); initial_state [B, HV, V, K]
    (fp32 or bf16; any batch stride); parents a DraftTree, [T] or [B, T]; num_nodes optional int [B]:
    request b uses nodes 0..num_nodes[b] - 1 (0 = inactive slot), the rest of its o and u is written as
    zeros. Returns o [B, T, HV, V] in v's dtype and u [B, T, HV, V] fp32.

    pending: a ``PendingCommit`` of the previous window (kernel twin of ``naive_tree_step``): the state is
    first overwritten in place with each request's pending accepted state (rows with accepted = -1 are
    left as they are), then the window is verified from it. The next step's pending commit is
    ``PendingCommit(u, k, g, parents, accepted)`` of this window.

    kernel: None (``select_kernel``), "chain" (chains only), "dense" (up to 64 nodes), "path" or "path_split" (any
    tree). chain: None finds it from ``parents`` (host data, or the device tensor outside capture); inside a
    CUDA-graph capture pass it (True / False) so the capture picks the kernel an eager call picks. max_depth: None
    finds the windows' depth the same way; inside such a capture pass it too (a bound that does not hold gives NaN
    outputs, never wrong ones). dot_precision: see ``tree_verify_fwd``.

    While a CUDA graph is being captured only metadata is checked: pass int32 device tensors validated
    beforehand.
    """
    capturing = is_capturing()
    values = not capturing
    q, k, v, g, beta = contiguous(q, k, v, g, beta)
    if isinstance(pending, PendingCommit):
        pending = replace(pending, **dict(zip("ukg", contiguous(*unpack(pending)[:3]))))
    dims, par, stride_pb, nn = check_gdn_kernel_inputs(q, k, v, g, beta, initial_state, parents, num_nodes,
                                                       max_nodes=MAX_KERNEL_NODES, values=values)
    if pending is not None:
        pending = check_pending(pending, initial_state, dims, max_nodes=MAX_KERNEL_NODES, values=values)
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel = {kernel!r}: expected None or one of {KERNELS}")
    dot_precision = check_dot_precision(dot_precision, q.device)
    depth, all_chains = _window_shape(parents, par, num_nodes, nn, capturing)
    if chain is None:
        chain = all_chains
        if chain is None and kernel is None:
            raise ValueError("chain = None inside a CUDA-graph capture with device-tensor parents: the kernel "
                             "choice cannot read them there; pass chain=True or chain=False (as the eager call "
                             "finds it), or kernel=")
        chain = chain if chain is not None else kernel == "chain"
    elif chain and all_chains is False:
        raise ValueError("chain = True but some request's window is not a chain (parents[b, t] = t - 1 for every "
                         "node t below num_nodes[b]); pass chain=None to detect it")
    if max_depth is None:
        max_depth = depth
    elif values and depth is not None and depth > max_depth:
        raise ValueError(f"max_depth = {max_depth} but the window is {depth} deep; pass max_depth=None to "
                         "detect it")
    if max_depth is None and capturing and not chain and kernel in (None, "path", "path_split"):
        raise ValueError("max_depth = None inside a CUDA-graph capture with device-tensor parents: pass the "
                         "windows' depth bound (DraftTree.max_depth) so the capture compiles the path kernel "
                         "an eager call compiles")
    if kernel == "chain" and not chain:
        raise ValueError("kernel='chain' needs every request's window to be a chain (parents[t] = t - 1); "
                         "leave kernel=None for trees")
    scale = check_scale(scale, dims.K)
    return tree_verify_fwd(q, k, v, g, beta, initial_state, par, stride_pb, scale, use_qk_l2norm_in_kernel, nn,
                           dot_precision=dot_precision, pending=pending, kernel=kernel, chain=bool(chain),
                           max_depth=max_depth)


def flush_pending(state, pending: PendingCommit):
    """Apply a pending commit now, in place (kernel twin of ``naive_flush``); returns ``state``.

    Rows whose accepted node is -1 are left unchanged. Use it when the state must be materialized:
    the request finishes or is preempted, or someone else reads the state.
    """
    u, k, g, parents, accepted, use_qk_l2norm_in_kernel = unpack(pending)
    return tree_commit(state, u, k, g, parents, accepted, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                       allow_none=True)
