"""Input checks shared by the references and the kernels: validate once, at the door, in words."""

from __future__ import annotations

import numbers
from dataclasses import astuple, dataclass

import torch

from treewy.tree import DraftTree, validate_parents


@dataclass(frozen=True)
class GDNDims:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int


def check_shape(name: str, x: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(expected)} ({what})")


def check_finite(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if x is not None and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{name} holds {bad} NaN or infinite values; fix the producer of {name} "
                             "(a NaN gate usually means an overflowed projection)")


def check_tensor(name: str, x, device: torch.device | None = None, ref: str = "q") -> torch.Tensor:
    """x must be a tensor (on ``device``, the device of the input named ``ref``, when given)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} is on {x.device} but {ref} is on {device}; move all inputs to one device")
    return x


def check_scale(scale, K: int) -> float:
    """The query scale as a float: None gives K ** -0.5; otherwise a finite positive real number."""
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) and not (
            isinstance(scale, torch.Tensor) and scale.numel() == 1 and scale.is_floating_point()):
        raise ValueError(f"scale = {scale!r}: expected a positive real number (None gives K ** -0.5 = "
                         f"{K ** -0.5:.4g})")
    value = float(scale)
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"scale = {value}: expected a finite positive number (None gives K ** -0.5 = "
                         f"{K ** -0.5:.4g})")
    return value


def gdn_dims(q, k, v, g, beta, initial_state) -> GDNDims:
    """Check the tensors, their device and the layouts of DESIGN.md section 3; return the dims.

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, V, K].
    """
    q = check_tensor("q", q)
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        check_tensor(name, x, q.device)
    if q.ndim != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected 4 dims [B, T, H, K]")
    B, T, H, K = q.shape
    check_shape("k", k, (B, T, H, K), "[B, T, H, K] like q")
    if v.ndim != 4 or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected [B, T, HV, V] with B = {B}, T = {T}")
    HV, V = v.shape[2], v.shape[3]
    for letter, size, name in (("H", H, "q"), ("K", K, "q"), ("HV", HV, "v"), ("V", V, "v")):
        if size == 0:
            raise ValueError(f"{name} has {letter} = 0 (shape {tuple(q.shape if name == 'q' else v.shape)}): every "
                             "head count and head dim must be at least 1")
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of the H = {H} key heads of q/k "
                         "(GVA needs HV = H * r)")
    check_shape("g", g, (B, T, HV), "[B, T, HV] log decay per node and value head")
    check_shape("beta", beta, (B, T, HV), "[B, T, HV] write strength per node and value head")
    check_shape("initial_state", initial_state, (B, HV, V, K), "[B, HV, V, K], value dim first")
    return GDNDims(B, T, H, HV, K, V)


def check_gdn_values(q, k, v, g, beta, initial_state) -> None:
    """No NaN or infinity anywhere; g a log decay (<= 0); beta in [0, 1]. Syncs with the host."""
    check_finite(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    if bool((g > 0).any()):
        raise ValueError(f"g has {int((g > 0).sum())} positive entries; g is a log decay and must be "
                         "<= 0 (e.g. -exp(A_log) * softplus(a + dt_bias))")
    if bool(((beta < 0) | (beta > 1)).any()):
        raise ValueError("beta must lie in [0, 1] (a sigmoid output); got values from "
                         f"{float(beta.min()):.3g} to {float(beta.max()):.3g}")


def check_gdn_inputs(q, k, v, g, beta, initial_state, parents, *, finite: bool = True):
    """Validate the verify inputs of the references and return (dims, parents [B, T] int64).

    parents: a DraftTree, [T] or [B, T]. ``finite`` also checks the values (check_gdn_values).
    """
    dims = gdn_dims(q, k, v, g, beta, initial_state)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if not x.is_floating_point():
            raise ValueError(f"{name} has dtype {x.dtype}; expected a floating dtype (bf16, fp32 or fp64)")
    par = validate_parents(parents)
    if par.ndim == 1:
        par = par.expand(dims.B, -1)
    if par.shape != (dims.B, dims.T):
        raise ValueError(f"parents describe {par.shape[-1]} nodes"
                         + ("" if par.shape[0] == dims.B else f" for {par.shape[0]} requests")
                         + f", but the inputs have B = {dims.B} requests of T = {dims.T} nodes")
    if finite:
        check_gdn_values(q, k, v, g, beta, initial_state)
    return dims, par.to(q.device)


def conv_dims(x, conv_state, weight=None) -> tuple[int, int, int, int]:
    """(B, T, C, W) of a tree conv: x [B, T, C], conv_state [B, C, W - 1], weight [C, W] (if given)."""
    x = check_tensor("x", x)
    check_tensor("conv_state", conv_state, x.device, ref="x")
    if x.ndim != 3 or conv_state.ndim != 3:
        raise ValueError(f"x has shape {tuple(x.shape)} and conv_state {tuple(conv_state.shape)}; expected "
                         "[B, T, C] and [B, C, W - 1]")
    B, T, C = x.shape
    W = conv_state.shape[-1] + 1
    if weight is not None:
        check_tensor("weight", weight, x.device, ref="x")
        if weight.ndim != 2 or weight.shape[0] != C:
            raise ValueError(f"weight has shape {tuple(weight.shape)}, expected [C, W] = [{C}, W] "
                             "(a depthwise nn.Conv1d weight [C, 1, W] squeezed on dim 1)")
        W = weight.shape[1]
    if tuple(conv_state.shape) != (B, C, W - 1):
        raise ValueError(f"conv_state has shape {tuple(conv_state.shape)}, expected [B, C, W - 1] = "
                         f"[{B}, {C}, {W - 1}]")
    return B, T, C, W


def check_accepted(accepted, B: int, T: int, device, *, allow_none: bool = False,
                   name: str = "accepted") -> torch.Tensor:
    """Accepted node per request [B] as int64; ``allow_none`` also admits -1 (nothing to commit)."""
    a = torch.as_tensor(accepted, device=device)
    if a.dtype.is_floating_point or a.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer node indices, got dtype {a.dtype}")
    if a.ndim == 0:
        a = a.expand(B)
    if tuple(a.shape) != (B,):
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected [B] = [{B}] (one node per request)")
    lo = -1 if allow_none else 0
    if bool(((a < lo) | (a >= T)).any()):
        raise ValueError(f"{name} holds {a.tolist()}; every entry must be a node index in {lo}..{T - 1}"
                         + (" (-1 = nothing pending)" if allow_none else ""))
    return a.long()


def check_commit_inputs(state, u, k, g, parents, accepted, *, max_nodes: int, values: bool, allow_none: bool = False,
                        prefix: str = ""):
    """Validate the inputs of a commit kernel (``tree_commit``, or a pending commit when ``prefix`` is
    "pending."); return (parents int32, its batch stride, accepted int32 [B]). ``values`` also checks
    topology, finiteness, g <= 0 and the accepted range (host syncs); pass False inside CUDA-graph capture."""
    nu, nk, ng, na = (prefix + n for n in ("u", "k", "g", "accepted"))
    state = check_tensor("state", state)
    for name, x in ((nu, u), (nk, k), (ng, g)):
        check_tensor(name, x, state.device, ref="state")
    check_kernel_device(("state", state), (nu, u), (nk, k), (ng, g))
    if state.ndim != 4 or u.ndim != 4 or k.ndim != 4:
        raise ValueError(f"state {tuple(state.shape)}, {nu} {tuple(u.shape)}, {nk} {tuple(k.shape)}: expected "
                         "[B, HV, V, K], [B, T, HV, V] and [B, T, H, K]")
    B, T, HV, V = u.shape
    H, K = k.shape[2], k.shape[3]
    if state.shape[0] != B:
        raise ValueError(f"{nu} holds a window of {B} requests but the state {state.shape[0]}: a commit belongs to "
                         "the batch it was verified with (PendingCommit of the previous step of this batch)")
    if tuple(state.shape) != (B, HV, V, K) or tuple(k.shape[:2]) != (B, T) or HV % H != 0:
        raise ValueError(f"state {tuple(state.shape)}, {nu} {tuple(u.shape)} and {nk} {tuple(k.shape)} disagree: "
                         "expected state [B, HV, V, K], u [B, T, HV, V], k [B, T, H, K] with HV a multiple of H")
    if tuple(g.shape) != (B, T, HV):
        raise ValueError(f"{ng} has shape {tuple(g.shape)}, expected [B, T, HV] = [{B}, {T}, {HV}]")
    check_kernel_dtype("state", state, STATE_DTYPES)
    check_kernel_dtype(nu, u, (torch.float32,))
    check_kernel_dtype(nk, k, KERNEL_FLOAT_DTYPES)
    check_kernel_dtype(ng, g, KERNEL_FLOAT_DTYPES)
    check_contiguous("state", state, inner=3)   # written in place; u, k and g arrive contiguous (``contiguous``)
    check_kernel_nodes(T, max_nodes)
    par, stride_pb = kernel_parents(parents, B, T, state.device, values=values)
    if values:
        check_finite(**{nu: u, nk: k, ng: g})
        if bool((g > 0).any()):
            raise ValueError(f"{ng} has positive entries; g is a log decay and must be <= 0")
        acc = check_accepted(accepted, B, T, state.device, allow_none=allow_none, name=na).to(torch.int32)
    else:
        acc = accepted
        if not (isinstance(acc, torch.Tensor) and acc.dtype == torch.int32 and acc.device == state.device
                and tuple(acc.shape) == (B,)):
            raise ValueError(f"{na} must be an int32 [B] tensor on the state's device inside CUDA-graph capture")
    return par, stride_pb, acc.contiguous()


# Checks for the Triton kernels: metadata only, so they never sync the host.

KERNEL_FLOAT_DTYPES = (torch.bfloat16, torch.float32)
STATE_DTYPES = (torch.float32, torch.bfloat16)


def contiguous(*xs):
    """The inputs a public op only reads, contiguous (copied where they are not): the kernels index them densely.
    Tensors an op writes in place (the states) are checked instead (``check_contiguous``)."""
    return [x.contiguous() if isinstance(x, torch.Tensor) else x for x in xs]


def check_kernel_device(*named: tuple[str, torch.Tensor]) -> None:
    """The kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter."""
    from treewy.ops._triton import INTERPRET

    for name, x in named:
        if x is None:
            continue
        if x.device.type == "cpu" and not INTERPRET:
            if torch.cuda.is_available():
                raise ValueError(f"{name} is a CPU tensor; the Triton kernels run on the GPU: move the inputs "
                                 "with .cuda(), or use the naive_* references on CPU")
            raise RuntimeError(f"{name} is a CPU tensor, there is no CUDA GPU, and TRITON_INTERPRET is "
                               "disabled; unset TRITON_INTERPRET (or set it to 1) before importing treewy.ops "
                               "to run the kernels on the CPU, or use the naive_* references")
        if x.device.type == "cuda" and INTERPRET:
            raise ValueError(f"{name} is on {x.device} but TRITON_INTERPRET=1 runs kernels on the CPU; "
                             "unset TRITON_INTERPRET to use the GPU, or pass CPU tensors")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {x.device}; the kernels run on CUDA (or CPU under the interpreter)")


def check_kernel_dtype(name: str, x: torch.Tensor, allowed: tuple) -> None:
    if x.dtype not in allowed:
        names = " or ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name} has dtype {x.dtype}; the kernels take {names} (cast with .to(...); "
                         "use the naive_* references for fp64)")


def check_contiguous(name: str, x: torch.Tensor, inner: int | None = None) -> None:
    """x must be contiguous, or, with ``inner``, contiguous in its last ``inner`` dims (any batch stride)."""
    if inner is None:
        ok = x.is_contiguous()
    else:
        expect = 1
        ok = True
        for size, stride in zip(reversed(x.shape[-inner:]), reversed(x.stride()[-inner:])):
            if size != 1 and stride != expect:
                ok = False
            expect *= size
    if not ok:
        what = "contiguous" if inner is None else f"contiguous in its last {inner} dims"
        raise ValueError(f"{name} with shape {tuple(x.shape)} and strides {x.stride()} is not {what}; "
                         "pass x.contiguous()")


def check_kernel_nodes(T: int, limit: int) -> None:
    if T > limit:
        raise ValueError(f"the trees have T = {T} nodes, more than the kernel limit of {limit}; "
                         f"prune the tree to at most {limit - 1} drafts or use the naive_* references")


def kernel_parents(parents, B: int, T: int, device, *, values: bool) -> tuple[torch.Tensor, int]:
    """(int32 parents on ``device``, batch stride) for a kernel: [T] shares one topology (stride 0).

    ``values`` validates the topology (a host sync); pass False inside CUDA-graph capture, where
    ``parents`` must already be a validated int32 device tensor.
    """
    if isinstance(parents, DraftTree):
        parents = parents.parents
    if not isinstance(parents, torch.Tensor):
        parents = torch.as_tensor(parents)
    if parents.ndim not in (1, 2) or parents.shape[-1] != T or (parents.ndim == 2 and parents.shape[0] != B):
        raise ValueError(f"parents has shape {tuple(parents.shape)}, expected [T] = [{T}] or [B, T] = [{B}, {T}]")
    if values:
        validate_parents(parents)
    if parents.dtype != torch.int32 or parents.device != device or not parents.is_contiguous():
        if not values:
            raise ValueError("parents must be a contiguous int32 tensor on the inputs' device inside "
                             "CUDA-graph capture; convert it before capturing")
        parents = parents.to(device=device, dtype=torch.int32).contiguous()
    return parents, (0 if parents.ndim == 1 else T)


def check_num_nodes(num_nodes, B: int, T: int, device, *, values: bool) -> torch.Tensor | None:
    """Optional per-request node counts [B] (0..T; nodes at or past the count are ignored) as int32."""
    if num_nodes is None:
        return None
    n = num_nodes if isinstance(num_nodes, torch.Tensor) else torch.as_tensor(num_nodes)
    if n.dtype.is_floating_point or n.dtype == torch.bool:
        raise ValueError(f"num_nodes must hold integers, got dtype {n.dtype}")
    if tuple(n.shape) != (B,):
        raise ValueError(f"num_nodes has shape {tuple(n.shape)}, expected [B] = [{B}] (nodes per request)")
    if values and bool(((n < 0) | (n > T)).any()):
        raise ValueError(f"num_nodes holds {n.tolist()}; every count must lie in 0..{T}")
    if n.dtype != torch.int32 or n.device != device:
        if not values:
            raise ValueError("num_nodes must be an int32 tensor on the inputs' device inside CUDA-graph capture")
        n = n.to(device=device, dtype=torch.int32)
    return n.contiguous()


def check_gdn_kernel_inputs(q, k, v, g, beta, initial_state, parents, num_nodes=None, *, max_nodes: int,
                            values: bool = True):
    """Validate the inputs of a GDN tree kernel; return (dims, parents int32, parents batch stride, num_nodes).

    Metadata (shapes, dtypes, devices, the state's layout, the node limit) is always checked. ``values``
    also checks the topology, finiteness and the ranges of g and beta (host syncs): the kernels
    pass ``values=False`` while a CUDA graph is being captured.
    """
    B, T, H, HV, K, V = astuple(gdn_dims(q, k, v, g, beta, initial_state))
    named = (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state))
    check_kernel_device(*named)
    for name, x in named[:5]:
        check_kernel_dtype(name, x, KERNEL_FLOAT_DTYPES)
    check_kernel_dtype("initial_state", initial_state, STATE_DTYPES)
    # written in place; q, k, v, g and beta arrive contiguous (``contiguous``)
    check_contiguous("initial_state", initial_state, inner=3)
    check_kernel_nodes(T, max_nodes)
    if values:
        check_gdn_values(q, k, v, g, beta, initial_state)
    par, stride_pb = kernel_parents(parents, B, T, q.device, values=values)
    nn = check_num_nodes(num_nodes, B, T, q.device, values=values)
    return GDNDims(B, T, H, HV, K, V), par, stride_pb, nn
