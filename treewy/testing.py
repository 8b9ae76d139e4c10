"""Random GDN inputs and error metrics shared by the tests, `treewy check` and the notebooks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treewy.tree import DraftTree, validate_parents


@dataclass
class GDNInputs:
    q: torch.Tensor              # [B, T, H, K]
    k: torch.Tensor              # [B, T, H, K], unit norm
    v: torch.Tensor              # [B, T, HV, V]
    g: torch.Tensor              # [B, T, HV], log decay <= 0
    beta: torch.Tensor           # [B, T, HV] in (0, 1)
    initial_state: torch.Tensor  # [B, HV, V, K]
    parents: torch.Tensor        # int32 [T] or [B, T]

    def args(self):
        """Positional arguments of the verify ops, in their order."""
        return self.q, self.k, self.v, self.g, self.beta, self.initial_state, self.parents

    def to(self, dtype=None, device=None) -> GDNInputs:
        f = lambda x: x.to(device=device, dtype=dtype)  # noqa: E731
        return GDNInputs(f(self.q), f(self.k), f(self.v), f(self.g), f(self.beta), f(self.initial_state),
                         self.parents.to(device) if device is not None else self.parents)


def random_tree(T: int, generator: torch.Generator | None = None) -> DraftTree:
    """A uniformly random recursive tree of T nodes (each node's parent drawn from the nodes before it)."""
    parents = [-1] + [int(torch.randint(0, t, (1,), generator=generator)) for t in range(1, T)]
    return DraftTree(parents)


def random_gdn_inputs(parents, B: int = 2, H: int = 2, HV: int = 4, K: int = 16, V: int = 16, *,
                      dtype=torch.float64, device="cpu", seed: int = 0, g_min: float = -2.0,
                      beta_range: tuple[float, float] = (0.0, 1.0), normalize_keys: bool = True) -> GDNInputs:
    """Inputs of a verify window for the given tree (DraftTree, [T] or [B, T])."""
    par = validate_parents(parents.parents if isinstance(parents, DraftTree) else parents)
    T = par.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    uni = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    k = rnd(B, T, H, K)
    if normalize_keys:
        k = torch.nn.functional.normalize(k, dim=-1)
    lo, hi = beta_range
    x = GDNInputs(
        q=rnd(B, T, H, K), k=k, v=rnd(B, T, HV, V),
        g=uni(B, T, HV) * g_min, beta=lo + (hi - lo) * uni(B, T, HV),
        initial_state=rnd(B, HV, V, K), parents=par.to(torch.int32),
    )
    return x.to(dtype=dtype, device=device)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error ||x - ref|| / ||ref||, computed in fp64 on ref's device (NaN anywhere gives NaN)."""
    x, ref = x.double().to(ref.device), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


#: fp32's unit roundoff: the least error a bound assumes of an fp32 computation.
FP32_EPS = 2.0 ** -24

#: How many times the fp32 reference's own error against fp64 a kernel's fp32 error may be. Over random batches
#: the kernels reach about 1.8 (tests/test_properties.py); 3 leaves room and still fails a ten-fold regression.
FP32_FACTOR = 3.0


#: FP32_FACTOR's counterpart for the tree kernels' tf32 mode (dot precision "tf32", the default on GPUs): their
#: products that feed u and the state are split into tf32 hi + lo parts, and the dropped lo x lo term costs a few
#: times fp32's error (dense, at the model's shapes on the H200: benchmarks/results/gpu_tests_h200_2026-12-01.log).
TF32_SPLIT_FACTOR = 8.0


def fp32_factor(tf32: bool) -> float:
    """The factor of fp32_bound for a kernel run with tf32 products split into parts (True) or exact fp32."""
    return TF32_SPLIT_FACTOR if tf32 else FP32_FACTOR


def fp32_bound(ref32: torch.Tensor, ref64: torch.Tensor, factor: float = FP32_FACTOR) -> float:
    """An fp32 op's error bound from what fp32 achieves on the same inputs: ``factor`` times the error of the
    reference run in fp32 against the reference in fp64 (at least the unit roundoff)."""
    return factor * max(rel_err(ref32, ref64), FP32_EPS)


def assert_close_fp32(name: str, out: torch.Tensor, ref64: torch.Tensor, ref32: torch.Tensor,
                      factor: float = FP32_FACTOR) -> float:
    """Assert that an fp32 op's ``out`` lies within ``fp32_bound(ref32, ref64, factor)`` of ``ref64``, where
    ref64 and ref32 are its reference run in fp64 and in fp32 on the inputs the op was given. Returns the error."""
    err, bound = rel_err(out, ref64), fp32_bound(ref32, ref64, factor)
    assert err <= bound, (f"{name}: error {err:.3g} against fp64 above the bound {bound:.3g} "
                          f"({factor:g} x the fp32 reference's {rel_err(ref32, ref64):.3g})")
    return err
