"""The two small launches of a served tree step beside their torch references: the gates from the raw gates
(``gdn_gating_fwd`` / ``treewy.ops.gates.gdn_gating``) and the window's stash written by slot (``stash_window_fwd``
/ ``naive_stash_window``). CPU: Triton interpreter, awkward sizes."""

from __future__ import annotations

import pytest
import torch

from treewy.ops.gates import gdn_gating
from treewy.ops.verify import naive_stash_window

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("N,HV,dtype", [(1, 1, torch.float32), (37, 6, torch.bfloat16), (700, 3, torch.float32)])
def test_the_gating_kernel_gives_the_references_gates(N, HV, dtype):
    from treewy.ops.gates_kernel import gdn_gating_fwd

    gen = torch.Generator().manual_seed(N)
    a = (torch.randn(N, HV, generator=gen) * 8).to(dtype)       # some past softplus's threshold (20) with dt_bias
    b = (torch.randn(N, HV, generator=gen) * 3).to(dtype)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen) * 10
    g, beta = (x.cpu() for x in gdn_gating_fwd(*(x.to(DEVICE) for x in (A_log, a, b, dt_bias))))
    rg, rbeta = gdn_gating(A_log, a, b, dt_bias)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == (N, HV)
    torch.testing.assert_close(g, rg, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(beta, rbeta, rtol=2e-6, atol=1e-7)


def test_the_gating_kernel_takes_an_empty_window():
    from treewy.ops.gates_kernel import gdn_gating_fwd

    g, beta = gdn_gating_fwd(*(torch.zeros(s, device=DEVICE) for s in ((2,), (0, 2), (0, 2), (2,))))
    assert g.shape == beta.shape == (0, 2)


def _pools(S, T, H, HV, K, V, key_dtype, gen):
    """A stash as the reconstruct pools lay it out: keys and decays in two halves (the tree uses half 0)."""
    u = torch.randn(S, T, HV, V, generator=gen)
    k = torch.randn(S, 2, T, H, K, generator=gen).to(key_dtype)
    g = torch.randn(S, 2, T, HV, generator=gen)
    return u, k, g


@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16])
def test_the_stash_kernel_writes_each_window_into_its_slot(key_dtype):
    from treewy.ops.verify.stash import stash_window_fwd

    gen = torch.Generator().manual_seed(7)
    S, T, H, HV, K, V, Tw = 6, 5, 2, 4, 12, 20, 3                      # a window shorter than the stash
    slots = torch.tensor([4, 0, 1], dtype=torch.int32)                 # the second: a padding row
    u, k, g = (torch.randn(3, Tw, *s, generator=gen) for s in ((HV, V), (H, K), (HV,)))
    k = k.to(key_dtype)                     # served keys arrive in the stash's dtype (bf16 activations)
    runs = []
    for fn in (stash_window_fwd, naive_stash_window):
        pu, pk, pg = (x.to(DEVICE) for x in _pools(S, T, H, HV, K, V, key_dtype, torch.Generator().manual_seed(1)))
        fn(*(x.to(DEVICE) for x in (u, k, g, slots)), pu, pk[:, 0], pg[:, 0])
        runs.append((pu.cpu(), pk.cpu(), pg.cpu()))
    for got, want in zip(*runs):
        assert torch.equal(got, want)
    pu, pk, pg = runs[0]
    assert torch.equal(pu[4, :Tw], u[0]) and torch.equal(pk[1, 0, :Tw], k[2])
    fresh = _pools(S, T, H, HV, K, V, key_dtype, torch.Generator().manual_seed(1))
    assert torch.equal(pu[0], fresh[0][0]) and torch.equal(pk[:, 1], fresh[1][:, 1]), "slot 0 and half 1 untouched"


def test_the_stash_kernel_refuses_pools_it_would_misread():
    from treewy.ops.verify.stash import stash_window_fwd

    u, k, g = torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 2)
    slots = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"pk has shape \(3, 2, 1, 4\)"):
        stash_window_fwd(u, k, g, slots, torch.zeros(3, 2, 2, 4), torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 2))
    with pytest.raises(ValueError, match="pu has strides .* each slot's rows must be contiguous"):
        stash_window_fwd(u, k, g, slots, torch.zeros(3, 2, 4, 2).transpose(2, 3), torch.zeros(3, 2, 1, 8),
                         torch.zeros(3, 2, 2))
