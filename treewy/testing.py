"""Random GDN inputs and error metrics shared by the tests, `treewy check` and the notebooks; the kernel tests'
windows, folded-step cases and references in fp64 and fp32; the output bound where the products took one tf32 pass,
and that pass emulated under the Triton interpreter so a CPU run meets the GPU's numerics."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from treewy.ops.verify import PendingCommit, naive_tree_step, naive_tree_verify, select_kernel, unpack
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


def random_parents(B: int, T: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """int32 [B, T]: a random_tree of T nodes per request, drawn request by request."""
    return torch.stack([random_tree(T, generator).parents for _ in range(B)]).to(torch.int32)


def bfs_tree() -> list[int]:
    """(2, 2) numbered in level order (root, its two children, then theirs): topological but not DFS pre-order."""
    return [-1, 0, 0, 1, 1, 2, 2]


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


def _device(device):
    return device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")


def window(B: int, T: int, H: int, HV: int, K: int, V: int, gen: torch.Generator, hard: bool = False,
           dtype=torch.float32, device=None) -> list[torch.Tensor]:
    """A kernel's window [q, k (unit keys), v, g, beta] on ``device`` (default: CUDA where present). Mild:
    g = logsigmoid(N(0, 1)) / 4, beta uniform in (0, 1); hard: half the nodes decay by g = -20, the others barely
    (g = -1e-4), and beta is 0.999 (writes that overwrite)."""
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    if hard:
        g = torch.where(torch.rand(B, T, HV, generator=gen) < 0.5, -20.0, -1e-4)
        beta = torch.full((B, T, HV), 0.999)
    else:
        g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 4
        beta = torch.rand(B, T, HV, generator=gen)
    return [x.to(_device(device), dtype) for x in (q, k, v, g, beta)]


def make_inputs(B: int, T: int, H: int, HV: int, K: int, V: int, seed: int = 0, state_dtype=torch.float32,
                dtype=torch.float32, device=None) -> list[torch.Tensor]:
    """A mild ``window`` from a generator seeded with ``seed``, then its initial state (standard normal x 0.3,
    in ``state_dtype``): the six tensors a verify op takes before the parents."""
    gen = torch.Generator().manual_seed(seed)
    w = window(B, T, H, HV, K, V, gen, dtype=dtype, device=device)
    return w + [(torch.randn(B, HV, V, K, generator=gen) * 0.3).to(_device(device), state_dtype)]


def normalized(x: torch.Tensor) -> torch.Tensor:
    """Keys or queries as the kernels normalize them in-kernel (use_qk_l2norm_in_kernel), in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def as64(ins) -> list[torch.Tensor]:
    """Each tensor in fp64."""
    return [x.double() for x in ins]


def refs(fn, ins, *rest):
    """fn (a reference) on a kernel's inputs in fp64 and in fp32: the error bound comes from the fp32 run."""
    return fn(*as64(ins), *rest), fn(*[x.float() for x in ins], *rest)


def pending_as(pending: PendingCommit, dtype) -> PendingCommit:
    """The same pending commit in a reference's dtype, its topology and accepted nodes copied to the host."""
    u, k, g, parents, accepted, l2norm = unpack(pending)
    parents = parents.cpu() if isinstance(parents, torch.Tensor) else parents
    return PendingCommit(u.to(dtype), k.to(dtype), g.to(dtype), parents, accepted.cpu(),
                         use_qk_l2norm_in_kernel=l2norm)


def step_refs(w, S: torch.Tensor, parents, pending: PendingCommit):
    """The folded step's reference (o, u, state) in fp64 and in fp32 on a kernel's inputs: window w, state S and
    the kernel's pending commit."""
    return tuple(naive_tree_step(*[x.to(dt) for x in w], S.to(dt), parents, pending=pending_as(pending, dt))
                 for dt in (torch.float64, torch.float32))


def case_step(B: int, H: int, HV: int, K: int, V: int, prev, new, gen: torch.Generator, hard: bool = False,
              state_dtype=torch.float32, device=None):
    """A folded step's case: a previous window (parents ``prev``, host) verified from S by the fp64 reference, a
    pending commit of it (random accepted nodes, the last request idle), the new window (parents ``new``) and the
    step's reference. Returns (S, pending, new window, (o, u, state) in fp64, the same in fp32)."""
    device = _device(device)
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(device, state_dtype)
    PT, T = prev.shape[-1], new.shape[-1]
    w0, w1 = window(B, PT, H, HV, K, V, gen, hard, device=device), window(B, T, H, HV, K, V, gen, hard, device=device)
    _, u0 = naive_tree_verify(*as64(w0), S.double(), prev)
    acc = torch.randint(0, PT, (B,), generator=gen, dtype=torch.int32)
    acc[-1] = -1
    pend = PendingCommit(u0.float(), w0[1], w0[3], prev.to(device), acc.to(device))
    return S, pend, w1, *step_refs(w1, S, new, pend)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error ||x - ref|| / ||ref||, computed in fp64 on ref's device (NaN anywhere gives NaN)."""
    x, ref = x.double().to(ref.device), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


#: The least error a bound assumes of an fp32 computation: four units of roundoff (2^-24), as two summation orders
#: of the same sums differ by a few. One unit failed a kernel that was right: window 1 of the pending-fold property
#: test (T = 1, V = 7, H200, 2026-12-04) reached 2.27e-7 where the fp32 reference happened to reach 7.4e-8.
FP32_FLOOR = 4 * 2.0 ** -24

#: How many times the fp32 reference's own error against fp64 a kernel's fp32 error may be. Over random batches
#: the kernels reach about 1.8 (tests/test_properties.py); 3 leaves room and still fails a ten-fold regression.
FP32_FACTOR = 3.0


#: FP32_FACTOR's counterpart for the tree kernels' tf32 mode (dot precision "tf32", the default on GPUs): their
#: products that feed u and the state are split into tf32 hi + lo parts, and the dropped lo x lo term costs a few
#: times fp32's error (dense, at the model's shapes on the H200: ``pytest -m gpu``; benchmarks/README.md names its log).
TF32_SPLIT_FACTOR = 8.0


def fp32_factor(tf32: bool) -> float:
    """The factor of fp32_bound for a kernel run with tf32 products split into parts (True) or exact fp32."""
    return TF32_SPLIT_FACTOR if tf32 else FP32_FACTOR


def fp32_bound(ref32: torch.Tensor, ref64: torch.Tensor, factor: float = FP32_FACTOR) -> float:
    """An fp32 op's error bound from what fp32 achieves on the same inputs: ``factor`` times the error of the
    reference run in fp32 against the reference in fp64 (at least ``FP32_FLOOR``)."""
    return factor * max(rel_err(ref32, ref64), FP32_FLOOR)


def assert_close_fp32(name: str, out: torch.Tensor, ref64: torch.Tensor, ref32: torch.Tensor,
                      factor: float = FP32_FACTOR) -> float:
    """Assert that an fp32 op's ``out`` lies within ``fp32_bound(ref32, ref64, factor)`` of ``ref64``, where
    ref64 and ref32 are its reference run in fp64 and in fp32 on the inputs the op was given. Returns the error."""
    err, bound = rel_err(out, ref64), fp32_bound(ref32, ref64, factor)
    assert err <= bound, (f"{name}: error {err:.3g} against fp64 above the bound {bound:.3g} "
                          f"({factor:g} x the fp32 reference's {rel_err(ref32, ref64):.3g})")
    return err


# ---- the outputs where the verify kernels' output-only products take one tf32 pass ----

#: tf32's unit roundoff: 10 explicit mantissa bits, so rounding to nearest errs by at most 2^-11 relative.
TF32_EPS = 2.0 ** -11

#: The bound on the outputs o of a verify kernel whose output-only products (S q, P U, Q K^T) took one tf32 pass
#: (dot precision "tf32", the GPUs' default; u and the state keep fp32 accuracy: TF32_SPLIT_FACTOR). The tensor cores
#: read each fp32 operand with its low 13 mantissa bits dropped (Triton's tf32 mma code converts nothing first): up
#: to 2 TF32_EPS, always toward zero, so a product errs by up to 4 TF32_EPS and o, a sum of them, by about as much.
#: Set against the outputs of the H200 run that held them to the fp32 bound
#: (benchmarks/results/gpu_tests_h200_2026-12-01_head9e8922b.log): tests/test_verify.py checks that every one lies
#: within it and that ten times the worst does not.
O_TF32_TOL = 6 * TF32_EPS


def picked_kernel(T: int, B: int, chain: bool, state_dtype=torch.float32, device=None, dot_precision=None) -> str:
    """The kernel family ``tree_verify(kernel=None)`` runs for a window of T nodes over B requests (``chain``:
    every request's window is a chain) on ``device`` at ``dot_precision`` (None: the device default)."""
    from treewy.ops.verify.tuning import check_dot_precision

    prec = check_dot_precision(dot_precision, _device(device))
    return select_kernel(T, B, chain, state_dtype == torch.bfloat16, prec == "ieee")


def output_tf32(kernel: str, device=None, dot_precision=None) -> bool:
    """Whether verify family ``kernel`` takes its output-only products in one tf32 pass on ``device`` at
    ``dot_precision`` (None: the device default): every family with dot products ("chain" has none) unless the
    products are exact fp32 ("ieee")."""
    from treewy.ops.verify.tuning import check_dot_precision

    return kernel != "chain" and check_dot_precision(dot_precision, _device(device)) != "ieee"


def output_bound(tf32: bool, exact_bound: float) -> float:
    """The bound on a verify kernel's outputs: ``exact_bound`` (what exact fp32 products are held to) unless its
    output-only products took one tf32 pass (``tf32``, see ``output_tf32``), then O_TF32_TOL."""
    return O_TF32_TOL if tf32 else exact_bound


def assert_close_output(name: str, o: torch.Tensor, ref64: torch.Tensor, ref32: torch.Tensor, tf32: bool,
                        factor: float = FP32_FACTOR) -> float:
    """Assert that a verify kernel's outputs ``o`` lie within ``output_bound`` of ``ref64``: the fp32 bound from
    ``ref32`` (``assert_close_fp32``), or O_TF32_TOL where its output-only products took one tf32 pass. Returns
    the error."""
    if not tf32:
        return assert_close_fp32(name, o, ref64, ref32, factor)
    err = rel_err(o, ref64)
    assert err <= O_TF32_TOL, (f"{name}: error {err:.3g} against fp64 above the bound {O_TF32_TOL:.3g} of outputs "
                               f"whose products took one tf32 pass ({O_TF32_TOL / TF32_EPS:g} x 2^-11)")
    return err


#: Environment variable: "1" has the kernel tests (tests/test_verify.py, test_commit.py) run every test under
#: ``tf32_on_the_interpreter``.
TF32_EMULATION_ENV = "TREEWY_TF32_EMULATION"


def _tf32_operand(x):
    """fp32 values as the tensor cores read them in a tf32 product: the low 13 mantissa bits dropped."""
    import numpy as np

    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@contextmanager
def untimed_autotune():
    """Every autotuned verify kernel runs the first config its pruning keeps for each shape, untimed and compiled
    alone: for GPU tests, whose results are the same under every config (timing every config of every new shape
    compiles each of them first). It was not what made the tree plugin's engine tests slow on the H200: with it,
    one still took 422 s beside 11 other test processes and 30 s alone (benchmarks/gpu_tests.sh runs them in one
    process)."""
    from triton.runtime.autotuner import Autotuner

    from treewy.ops.verify.kernel import KERNEL_FNS

    tuners = {fn for fns in KERNEL_FNS.values() for fn in fns if isinstance(fn, Autotuner)}
    saved = {t: t.early_config_prune for t in tuners}
    for t, prune in saved.items():
        t.early_config_prune = lambda configs, nargs, _p=prune, **kw: (_p(configs, nargs, **kw) if _p else configs)[:1]
    try:
        yield
    finally:
        for t, prune in saved.items():
            t.early_config_prune = prune


@contextmanager
def tf32_on_the_interpreter():
    """The GPU's tf32 numerics under the Triton interpreter: tf32 the default dot precision (TREEWY_DOT_PRECISION)
    and every ``tl.dot(..., input_precision="tf32")`` over fp32 operands reading them as the tensor cores do
    (``_tf32_operand``; the interpreter otherwise multiplies exact fp32), so a CPU run errs as a GPU run does. Only
    under the interpreter (TRITON_INTERPRET=1): a GPU has the real thing."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from treewy.ops._triton import INTERPRET
    from treewy.ops.verify.tuning import PRECISION_ENV

    if not INTERPRET:
        raise RuntimeError("tf32_on_the_interpreter emulates the tensor cores under the Triton interpreter; on a "
                           "GPU the kernels run tf32 themselves (TRITON_INTERPRET is off here)")
    builder, real = interpreter.InterpreterBuilder, interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == b.data.dtype == "float32":
            a, b = (interpreter.TensorHandle(_tf32_operand(x.data), x.dtype) for x in (a, b))
        return real(self, a, b, d, input_precision, max_num_imprecise_acc)

    old = os.environ.get(PRECISION_ENV)
    os.environ[PRECISION_ENV] = "tf32"
    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = real
        if old is None:
            os.environ.pop(PRECISION_ENV, None)
        else:
            os.environ[PRECISION_ENV] = old
