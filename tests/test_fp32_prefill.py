"""treewy.serve.fp32_prefill: the fp32 stand-in for vLLM's GDN prefill against the readable recurrence."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from treewy.ops import naive_tree_recurrent
from treewy.serve import fp32_prefill, vllm_adapter
from treewy.testing import normalized


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_varlen_batch_equals_the_recurrence_per_sequence(dtype):
    torch.manual_seed(0)
    lens, H, HV, K, V = [5, 1, 9, 3], 2, 4, 12, 7
    N = sum(lens)
    q, k = torch.randn(1, N, H, K, dtype=dtype), torch.randn(1, N, H, K, dtype=dtype)
    v = torch.randn(1, N, HV, V, dtype=dtype)
    g = -torch.rand(1, N, HV, dtype=dtype) * 3
    beta = torch.rand(1, N, HV, dtype=dtype)
    h0 = torch.randn(len(lens), HV, V, K, dtype=dtype)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    core = torch.full((1, N + 3, HV, V), float("nan"), dtype=dtype)
    o, ht = fp32_prefill.recurrent_prefill(q, k, v, g, beta, h0, True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                           core_attn_out=core)
    assert o.shape == v.shape and o.dtype == dtype and ht.shape == h0.shape and ht.dtype == torch.float32
    for b, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        L = e - s
        ref_o, states = naive_tree_recurrent(normalized(q[:, s:e]), normalized(k[:, s:e]), v[:, s:e], g[:, s:e],
                                             beta[:, s:e], h0[b:b + 1], torch.arange(-1, L - 1))
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        torch.testing.assert_close(o[:, s:e], ref_o, rtol=tol, atol=tol)
        torch.testing.assert_close(ht[b], states[0, -1].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(core.reshape(-1)[: o.numel()], o.reshape(-1))
    assert core.reshape(-1)[o.numel():].isnan().all()  # past the tokens: untouched


def test_dense_batch_without_cu_seqlens_and_no_final_state():
    torch.manual_seed(1)
    B, L, H, K, V = 2, 4, 1, 8, 8
    q, k = normalized(torch.randn(B, L, H, K)), normalized(torch.randn(B, L, H, K))
    v, g, beta = torch.randn(B, L, H, V), -torch.rand(B, L, H), torch.rand(B, L, H)
    h0 = torch.randn(B, H, V, K)
    o, ht = fp32_prefill.recurrent_prefill(q, k, v, g, beta, h0, False, use_qk_l2norm_in_kernel=False)
    ref_o, _ = naive_tree_recurrent(q, k, v, g, beta, h0, torch.arange(-1, L - 1))
    assert ht is None and o.shape == (B, L, H, V)
    torch.testing.assert_close(o, ref_o, rtol=2e-5, atol=2e-5)


def test_install_replaces_the_triton_prefill_once(monkeypatch):
    class ChunkGatedDeltaRule:
        def forward_native(self, *a, **k):
            raise AssertionError("ChunkGatedDeltaRuleFunction does not support float32. Please use bfloat16.")

    mod = types.ModuleType(vllm_adapter.GDN_MODULE)
    setattr(mod, vllm_adapter.PREFILL_OP, ChunkGatedDeltaRule)
    monkeypatch.setitem(sys.modules, vllm_adapter.GDN_MODULE, mod)
    fp32_prefill.install()
    patched = ChunkGatedDeltaRule.forward_native
    fp32_prefill.install()
    assert ChunkGatedDeltaRule.forward_native is patched
    x = torch.randn(1, 3, 1, 4)
    o, ht = ChunkGatedDeltaRule().forward_native(q=x, k=x, v=x, g=-torch.ones(1, 3, 1), beta=torch.ones(1, 3, 1),
                                                 initial_state=torch.zeros(1, 1, 4, 4), output_final_state=True,
                                                 cu_seqlens=torch.tensor([0, 3]))
    assert o.shape == x.shape and torch.isfinite(o).all() and ht.shape == (1, 1, 4, 4)


def test_requested_reads_the_environment(monkeypatch):
    monkeypatch.delenv(fp32_prefill.ENV, raising=False)
    assert not fp32_prefill.requested()
    monkeypatch.setenv(fp32_prefill.ENV, "1")
    assert fp32_prefill.requested()
