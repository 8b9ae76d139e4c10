"""Input checks shared by the references and the kernels: validate once, at the door, in words."""

from __future__ import annotations

from dataclasses import dataclass

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


def _shape(name: str, x: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(expected)} ({what})")


def check_finite(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if x is not None and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"{name} holds {bad} NaN or infinite values; fix the producer of {name} "
                             "(a NaN gate usually means an overflowed projection)")


def check_tensor(name: str, x, device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} is on {x.device} but q is on {device}; move all inputs to one device")
    return x


def check_gdn_inputs(q, k, v, g, beta, initial_state, parents, *, finite: bool = True):
    """Validate the verify inputs (layouts of DESIGN.md section 3) and return (dims, parents [B, T] int64).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, V, K];
    parents a DraftTree, [T] or [B, T].
    """
    q = check_tensor("q", q)
    dev = q.device
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        check_tensor(name, x, dev)
    if q.ndim != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected 4 dims [B, T, H, K]")
    B, T, H, K = q.shape
    _shape("k", k, (B, T, H, K), "[B, T, H, K] like q")
    if v.ndim != 4 or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected [B, T, HV, V] with B = {B}, T = {T}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of the H = {H} key heads of q/k "
                         "(GVA needs HV = H * r)")
    _shape("g", g, (B, T, HV), "[B, T, HV] log decay per node and value head")
    _shape("beta", beta, (B, T, HV), "[B, T, HV] write strength per node and value head")
    _shape("initial_state", initial_state, (B, HV, V, K), "[B, HV, V, K], value dim first")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if not x.is_floating_point():
            raise ValueError(f"{name} has dtype {x.dtype}; expected a floating dtype (bf16, fp32 or fp64)")
    par = validate_parents(parents)
    if par.ndim == 1:
        par = par.expand(B, -1)
    if par.shape != (B, T):
        raise ValueError(f"parents describe {par.shape[-1]} nodes"
                         + ("" if par.shape[0] == B else f" for {par.shape[0]} requests")
                         + f", but the inputs have B = {B} requests of T = {T} nodes")
    if finite:
        check_finite(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
        if bool((g > 0).any()):
            raise ValueError(f"g has {int((g > 0).sum())} positive entries; g is a log decay and must be "
                             "<= 0 (e.g. -exp(A_log) * softplus(a + dt_bias))")
        if bool(((beta < 0) | (beta > 1)).any()):
            raise ValueError("beta must lie in [0, 1] (a sigmoid output); got values from "
                             f"{float(beta.min()):.3g} to {float(beta.max()):.3g}")
    return GDNDims(B, T, H, HV, K, V), par.to(dev)


def check_accepted(accepted, B: int, T: int, device) -> torch.Tensor:
    a = torch.as_tensor(accepted, device=device)
    if a.dtype.is_floating_point or a.dtype == torch.bool:
        raise ValueError(f"accepted must hold integer node indices, got dtype {a.dtype}")
    if a.ndim == 0:
        a = a.expand(B)
    if tuple(a.shape) != (B,):
        raise ValueError(f"accepted has shape {tuple(a.shape)}, expected [B] = [{B}] (one node per request)")
    if bool(((a < 0) | (a >= T)).any()):
        raise ValueError(f"accepted holds {a.tolist()}; every entry must be a node index in 0..{T - 1}")
    return a.long()


def parents_of(parents) -> torch.Tensor:
    """The parent tensor of a DraftTree or a parent array, validated."""
    return parents.parents.long() if isinstance(parents, DraftTree) else validate_parents(parents)
