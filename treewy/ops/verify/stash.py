"""The window's pending commit written into a serving pool's stash in one launch: u, k and g of request b into
slot ``slots[b]`` (kernel twin of ``naive_stash_window`` in ``naive.py``).

A served tree step (``treewy.serve.tree_plugin.tree_spec_update``) verifies its window with the previous one's
commit folded in, and then keeps this window's u, k and g in the request's slot for the next step's fold: three
scatters by slot in torch (plus their index casts), one launch here. It runs after the verify, which reads the
same slots' previous window, so the two never overlap. The chain step writes its stash inside its own kernel
(``chain_spec_step_kernel``).
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _copy_row(src, dst, n, BLOCK: tl.constexpr):
    """dst[:n] = src[:n], cast to dst's dtype."""
    for i in range(0, n, BLOCK):
        o = i + tl.arange(0, BLOCK)
        m = o < n
        tl.store(dst + o, tl.load(src + o, mask=m).to(dst.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T", "stride_pu", "stride_pk", "stride_pg"])
def stash_window_kernel(u, k, g, slots, pu, pk, pg, stride_pu, stride_pk, stride_pg, T,
                        NU: tl.constexpr, NK: tl.constexpr, NG: tl.constexpr, BLOCK: tl.constexpr):
    """Node i_t of request i_b: its u row (NU = HV V), key row (NK = H K) and decay row (NG = HV) into the stash
    of slot slots[i_b]; a slot <= 0 (a CUDA graph's padding row, vLLM's null block) is left alone."""
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s <= 0:
        return
    row = i_b.to(tl.int64) * T + i_t
    _copy_row(u + row * NU, pu + i_s * stride_pu + i_t * NU, NU, BLOCK)
    _copy_row(k + row * NK, pk + i_s * stride_pk + i_t * NK, NK, BLOCK)
    _copy_row(g + row * NG, pg + i_s * stride_pg + i_t * NG, NG, BLOCK)


def _slot_rows_contiguous(name: str, pool: torch.Tensor) -> None:
    want = [1]
    for n in reversed(pool.shape[2:]):
        want.insert(0, want[0] * n)
    if list(pool.stride()[1:]) != want:
        raise ValueError(f"{name} has strides {tuple(pool.stride())}: each slot's rows must be contiguous "
                         f"(strides {tuple(want)} after the slot's), as the reconstruct pools lay them out")


def stash_window_fwd(u: torch.Tensor, k: torch.Tensor, g: torch.Tensor, slots: torch.Tensor, pu: torch.Tensor,
                     pk: torch.Tensor, pg: torch.Tensor) -> None:
    """pu[slots[b], :T], pk[slots[b], :T], pg[slots[b], :T] = u[b], k[b], g[b] for every b with slots[b] > 0, cast to
    the pools' dtypes. u [B, T, HV, V], k [B, T, H, K], g [B, T, HV] (contiguous); slots int [B] on their device;
    pu [S, >= T, HV, V], pk [S, >= T, H, K], pg [S, >= T, HV]: any slot stride, each slot's rows contiguous."""
    B, T = u.shape[:2]
    for name, pool, x in (("pu", pu, u), ("pk", pk, k), ("pg", pg, g)):
        if tuple(pool.shape[2:]) != tuple(x.shape[2:]) or pool.shape[1] < T:
            raise ValueError(f"{name} has shape {tuple(pool.shape)}: expected [slots, >= {T}, "
                             f"{', '.join(map(str, x.shape[2:]))}] for a window of shape {tuple(x.shape)}")
        _slot_rows_contiguous(name, pool)
    u, k, g = u.contiguous(), k.contiguous(), g.contiguous()
    if B and T:
        stash_window_kernel[(T, B)](u, k, g, slots.contiguous(), pu, pk, pg, pu.stride(0), pk.stride(0), pg.stride(0),
                                    T, NU=u[0, 0].numel(), NK=k[0, 0].numel(), NG=g[0, 0].numel(), BLOCK=BLOCK)
