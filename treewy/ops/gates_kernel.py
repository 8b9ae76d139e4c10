"""The GDN layer's gating in one launch: (g, beta) from the raw gates, the kernel twin of
``treewy.ops.gates.gdn_gating`` (its torch reference, beside it).

The served tree steps (``treewy.serve.tree_plugin``) compute the window's gates before the verify kernel reads them;
in torch that is about ten element-wise launches per GDN layer and step, here one. The chain step reads the raw
gates inside its own kernel (``chain_spec_step_kernel``, RAW_GATES) and needs none of this.
"""

from __future__ import annotations

from treewy.ops import _triton  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

import torch
import triton
import triton.language as tl

from treewy.ops.common import _gates

BLOCK = 1024


@triton.jit
def gdn_gating_kernel(a, b, A_log, dt_bias, g, beta, n_el, softplus_threshold, HV: tl.constexpr, BLOCK: tl.constexpr):
    """Entries [pid * BLOCK, (pid + 1) * BLOCK) of the flat [N, HV] gates: g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b), in fp32."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n_el
    b_g, b_beta = _gates(a, b, A_log, dt_bias, o, o % HV, m, softplus_threshold, True)
    tl.store(g + o, b_g, mask=m)
    tl.store(beta + o, b_beta, mask=m)


def gdn_gating_fwd(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                   softplus_threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) fp32 [N, HV] from a, b [N, HV] (any float dtype) and A_log, dt_bias [HV]: ``gdn_gating``'s numbers
    in one launch. Inputs already on one device with those shapes (the serving hooks' callers check them)."""
    a, b = a.contiguous(), b.contiguous()
    N, HV = a.shape
    g = torch.empty(N, HV, device=a.device, dtype=torch.float32)
    beta = torch.empty_like(g)
    if N:
        gdn_gating_kernel[(triton.cdiv(N * HV, BLOCK),)](a, b, A_log, dt_bias, g, beta, N * HV, softplus_threshold,
                                                        HV=HV, BLOCK=BLOCK)
    return g, beta
