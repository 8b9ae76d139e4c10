"""One GDN layer's verify step timed on a GPU: TreeWY (verify + commit), store-all (verify; select is an
index update) and fla-core's fused_recurrent (chains only). Shared by benchmarks/bench_kernels.py and
the lab's timing panel. GPU only: every function here allocates on "cuda".

``gbps`` is the step's minimal traffic (state read once and written once, inputs read, outputs
written) over the measured time; ``roofline_us`` is that traffic at the copy bandwidth measured on
an H200 (4.27 TB/s, read + write).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treewy.ops.store_all import store_all_verify_fwd
from treewy.ops.tree_commit import tree_commit_fwd
from treewy.ops.tree_verify import DEFAULT_DOT_PRECISION, tree_verify_fwd
from treewy.paper import SHAPES
from treewy.tree import DraftTree

COPY_BW = 4.27e12  # bytes/s, device-to-device copy (read + write) measured on the H200
MODELS = {"35B-A3B": dict(H=16, HV=32, K=128, V=128, layers=30),
          "397B-A17B": dict(H=16, HV=64, K=128, V=128, layers=45)}


def trees():
    """(name, tree): T = 1, chains k = 1..7 and the paper's tree shapes beyond the depth-3 chain."""
    return [((), DraftTree.chain(0))] + [((1,) * k, DraftTree.chain(k)) for k in range(1, 8)] + [(w, DraftTree.from_widths(w)) for w in SHAPES[1:]]


def make(B, T, H, HV, K, V, state_dtype):
    gen = torch.Generator(device="cuda").manual_seed(B * 1000 + T)
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q = r(B, T, H, K).bfloat16()
    k = F.normalize(r(B, T, H, K), dim=-1).bfloat16()
    v = r(B, T, HV, V).bfloat16()
    g = F.logsigmoid(r(B, T, HV) + 2.0) / 2
    beta = torch.sigmoid(r(B, T, HV))
    h0 = (r(B, HV, V, K) * 0.1).to(state_dtype)
    return q, k, v, g, beta, h0


def min_bytes(B, T, H, HV, K, V, sb):
    state = B * HV * V * K * sb * 2
    ins = B * T * (2 * H * K * 2 + HV * V * 2 + 2 * HV * 4)
    out = B * T * HV * V * 2
    return state + ins + out


def bench(fn):
    import triton

    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def run_case(provider, model, dims, tree_name, tree, B, state_dtype, total_mem):
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    T = tree.num_nodes
    sb = torch.tensor([], dtype=state_dtype).element_size()
    block = HV * V * K * sb
    held = block * (T if provider == "store_all" else 1)
    row = dict(provider=provider, model=model, tree=str(tree_name) if tree_name else "chain 0 (T = 1)", num_nodes=T, B=B, H=H, HV=HV, K=K, V=V,
               state_dtype=str(state_dtype).removeprefix("torch."), state_bytes_per_request=held,
               fits=bool(held * B * dims["layers"] <= total_mem), us=None, gbps=None)
    nbytes = min_bytes(B, T, H, HV, K, V, sb)
    row["roofline_us"] = nbytes / COPY_BW * 1e6
    x = make(B, T, H, HV, K, V, state_dtype)
    par = tree.parents.cuda()
    scale = K ** -0.5
    acc = torch.randint(0, T, (B,), device="cuda", dtype=torch.int32)
    if provider == "treewy":
        state = x[5]
        row["precision"] = DEFAULT_DOT_PRECISION

        def fn():
            o, u = tree_verify_fwd(*x[:5], state, par, 0, scale)
            tree_commit_fwd(state, u, x[1], x[3], par, 0, acc)
    elif provider == "store_all":
        free = torch.cuda.mem_get_info()[0]
        if B * T * block * 1.1 > free:
            row["note"] = "snapshots do not fit on the device for one layer"
            return row
        states = torch.empty(B, T, HV, V, K, device="cuda", dtype=state_dtype)
        state = x[5]
        row["note"] = "select = an index update (no copy), as engines do"

        def fn():
            store_all_verify_fwd(*x[:5], state, par, 0, scale, states=states)
    else:
        try:
            from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd
        except Exception as e:  # noqa: BLE001
            row["note"] = f"fla-core not importable: {e!r}"
            return row

        def fn():
            fused_recurrent_gated_delta_rule_fwd(q=x[0], k=x[1], v=x[2], g=x[3], beta=x[4], scale=scale,
                                                 initial_state=x[5], output_final_state=True,
                                                 state_v_first=True)
    us = bench(fn)
    row["us"] = us
    row["gbps"] = nbytes / (us * 1e-6) / 1e9
    return row
