"""Launch plumbing shared by the kernel families: autotune keys bucketed by batch size, the dot-product
precision (and the environment variable that forces exact fp32), and the pending commit's launch arguments."""

from __future__ import annotations

import inspect
import os

import torch
import triton

from treewy.ops._triton import INTERPRET, is_capturing
from treewy.ops.verify.pending import unpack

#: Environment variable that forces the dot-product precision of the tensor-core kernels: "ieee" runs the
#: exact fp32 path of GPUs without tf32 (sm_75, the T4) on any GPU; "tf32" the default of sm_80 and later.
PRECISION_ENV = "TREEWY_DOT_PRECISION"

#: "tf32": tensor cores, products that feed the committed state (S k, (I + M)^-1 R, K K^T) split into
#: hi + lo tf32 parts (fp32-level error), output-only products (S q, P U, Q K^T) in one tf32 pass.
#: "ieee": exact fp32 products everywhere (no tf32). "tf32_plain": one tf32 pass everywhere, for the record
#: (the committed state drifts: the "drift" section of the kernel targets table, treewy/data/index.json).
DOT_PRECISIONS = ("tf32", "ieee", "tf32_plain")

#: Autotune key: shapes, flags and the batch bucket (not B itself: one tuning per bucket, not per batch size).
KEY = ["B_BUCKET", "BT", "BPT", "H", "HV", "K", "V", "USE_QK_L2NORM_IN_KERNEL", "HAS_NUM_NODES", "HAS_PENDING",
       "HAS_STATE_INDICES"]
#: The same for kernels with dot products: their precision flags too.
KEY_DOTS = KEY + ["DOT_PRECISION", "SPLIT", "K_TF32"]


def _quick_bench(fn, quantiles=None):
    if is_capturing():   # a Triton release that times even a lone config: no launch and no sync in a capture
        return [0.0] * len(quantiles) if quantiles else 0.0
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_AUTOTUNE_PARAMS = inspect.signature(triton.autotune).parameters
# quick timing per config; best configs cached on disk across processes where Triton can
AUTOTUNE_EXTRA = {**({"do_bench": _quick_bench} if "do_bench" in _AUTOTUNE_PARAMS else {}),
                  **({"cache_results": True} if "cache_results" in _AUTOTUNE_PARAMS else {})}


_PINNED = False


def pin_first_configs(pinned: bool = True) -> None:
    """For a serving engine: every autotuned verify kernel runs the first config its pruning keeps, untimed, at every
    shape, as inside a capture. There the state pool is the engine's whole cache: timing a config restores it
    (``restore_value``) and every new batch bucket compiles every config while requests wait; a served chain already
    runs a pinned config. (A served tree's reconstruct server stalled at 32 requests on the H200 with its tree
    kernels autotuning, and again with them pinned: ``benchmarks/results/tree_tiny_h200_2026-12-02/``.)"""
    global _PINNED
    _PINNED = pinned


def capture_safe_pruning(prune=None) -> dict:
    """``prune_configs_by`` for an autotuned kernel: ``prune`` (None: every config), and while a CUDA graph is being
    captured (or configs are pinned, ``pin_first_configs``) only the first config it keeps. Timing configs
    synchronizes, which a capture forbids: a shape first seen inside one (vLLM captures its spec-decode graphs without
    running the spec path eagerly first) runs that config, untimed, from then on in this process; shapes tuned before
    the capture keep their tuned config."""
    def early_config_prune(configs, named_args, **kwargs):
        kept = prune(configs, named_args, **kwargs) if prune else configs
        return kept[:1] if _PINNED or is_capturing() else kept
    return {"early_config_prune": early_config_prune}


def batch_bucket(B: int) -> int:
    """The autotune bucket of a batch size: the next power of 4 (1, 4, 16, 64, 256, 1024), at most 1024."""
    bucket = 1
    while bucket < B and bucket < 1024:
        bucket *= 4
    return bucket


def fit_v(configs, named_args, **kwargs):
    """Configs whose value tile is no wider than V (rounded up to a power of two, at least 16)."""
    V = {**named_args, **kwargs}["V"]
    return [c for c in configs if c.kwargs["BV"] <= max(16, triton.next_power_of_2(V))] or configs[:1]


def default_dot_precision(device) -> str:
    """The dot-product precision for kernels on ``device``: $TREEWY_DOT_PRECISION when set, else "tf32" on
    GPUs with tf32 (compute capability 8.0 and later), "ieee" before (sm_75) and under the interpreter."""
    env = os.environ.get(PRECISION_ENV, "").strip().lower()
    if env:
        if env not in DOT_PRECISIONS:
            raise ValueError(f"{PRECISION_ENV} = {env!r}: expected one of {DOT_PRECISIONS} (unset it for the "
                             "device's default)")
        return env
    device = torch.device(device)
    if INTERPRET or device.type != "cuda":
        return "ieee"
    return "tf32" if torch.cuda.get_device_capability(device)[0] >= 8 else "ieee"


def check_dot_precision(dot_precision: str | None, device) -> str:
    """``dot_precision`` as given, or the device default; a ValueError names the choices."""
    if dot_precision is None:
        return default_dot_precision(device)
    if dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"dot_precision = {dot_precision!r}: expected None (the device default) or one of "
                         f"{DOT_PRECISIONS}")
    return dot_precision


def pending_args(pending, placeholder):
    """(u, k, g, parents, accepted, PT, parents batch stride, keys normalized in kernel, (u, k, g) batch
    strides) of a validated PendingCommit, or placeholders (never read) when there is none."""
    if pending is None:
        return placeholder, placeholder, placeholder, placeholder, placeholder, 1, 0, False, (0, 0, 0)
    pu, pk, pg, ppar, pacc, pl2 = unpack(pending)
    PT = pu.shape[1]
    if ppar.shape[-1] > 1 and ppar.stride(-1) != 1:
        raise ValueError(f"pending.parents with strides {ppar.stride()} is not contiguous in its last dim: pass "
                         "parents [T] or a view of rows with unit stride, e.g. parents.contiguous()")
    # the parents' own batch stride: 0 for [T] and for [T] expanded to [B, T] (a served tree's one topology), whose
    # rows past the first are no memory of their own. Read as rows PT apart, they were read past the tensor, and a
    # pending fold walking such "parents" can loop forever (it did under the interpreter, 2026-12-04): the likely
    # cause of a reconstruct tree server's stall at 32 requests on the H200 that day, not rerun yet
    return pu, pk, pg, ppar, pacc, PT, 0 if ppar.ndim == 1 else ppar.stride(0), pl2, (
        pu.stride(0), pk.stride(0), pg.stride(0))
