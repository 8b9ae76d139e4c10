"""One GDN layer's verify step timed on a GPU. Shared by benchmarks/bench_kernels.py and the lab's timing panel.
``bench`` and ``run_case`` need CUDA; ``make``, ``previous_window`` and ``step_fn`` take a device (the
benchmark's --smoke mode runs them on CPU under the Triton interpreter).

Providers:
- ``treewy``: one launch, the previous step's commit folded into this verify (``pending``): what an
  engine runs every step. ``treewy_eager``: verify, then ``tree_commit`` (two launches).
- ``store_all``: verify writing a snapshot per node (commit is a slot-index update, free).
- ``fla``: fla-core's fused_recurrent over the window as a sequence (chains only; no rollback at all).

``min_bytes`` is the traffic a step must move: the state read once and written once, the window's
inputs read, o and u written, and for TreeWY the pending path's u and k read. ``gbps`` is that over
the measured time; ``roofline_us`` is that traffic at the copy bandwidth measured on an H200
(4.27 TB/s, read + write): every kernel family moves exactly that (the removed WY pair also wrote and read
back its prepare output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treewy.ops.verify.naive import naive_tree_verify
from treewy.ops.verify.pending import PendingCommit
from treewy.ops.store_all.kernel import store_all_verify_fwd
from treewy.ops.commit.kernel import tree_commit_fwd
from treewy.ops.verify.kernel import tree_verify_fwd
from treewy.paper import SHAPES
from treewy.tree import DraftTree

COPY_BW = 4.27e12  # bytes/s, device-to-device copy (read + write) measured on the H200
MODELS = {"35B-A3B": dict(H=16, HV=32, K=128, V=128, layers=30),
          "397B-A17B": dict(H=16, HV=64, K=128, V=128, layers=45)}


def trees():
    """(name, tree): T = 1, chains k = 1..7 and the paper's tree shapes beyond the depth-3 chain."""
    return ([((), DraftTree.chain(0))] + [((1,) * k, DraftTree.chain(k)) for k in range(1, 8)]
            + [(w, DraftTree.from_widths(w)) for w in SHAPES[1:]])


def make(B, T, H, HV, K, V, state_dtype, seed=0, device="cuda", input_dtype=torch.bfloat16):
    """q, k (unit keys), v in ``input_dtype``; fp32 g, beta; the state [B, HV, V, K] in ``state_dtype``."""
    gen = torch.Generator(device=device).manual_seed(B * 1000 + T + seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    q = r(B, T, H, K).to(input_dtype)
    k = F.normalize(r(B, T, H, K), dim=-1).to(input_dtype)
    v = r(B, T, HV, V).to(input_dtype)
    g = F.logsigmoid(r(B, T, HV) + 2.0) / 2
    beta = torch.sigmoid(r(B, T, HV))
    h0 = (r(B, HV, V, K) * 0.1).to(state_dtype)
    return q, k, v, g, beta, h0


def previous_window(x, tree, seed=1):
    """A pending commit from a previous window of the same tree: its u, k, g and a random accepted node."""
    q, k, v, g, beta, h0 = x
    B, T = q.shape[:2]
    par = tree.parents.to(q.device, torch.int32)
    _, u = naive_tree_verify(*(t.double() for t in x), par)  # the reference: nothing compiled or tuned for it
    u = u.float()
    gen = torch.Generator(device=q.device).manual_seed(seed)
    acc = torch.randint(0, T, (B,), generator=gen, device=q.device, dtype=torch.int32)
    return PendingCommit(u, k, g, par, acc)


def target_result(target: dict) -> str:
    """A bench_kernels.py target's verdict: "PASS" / "FAIL", or "report" for a figure measured for the record."""
    if target["bar"].startswith(("report", "device")):
        return "report"
    return "PASS" if target["ok"] else "FAIL"


def min_bytes(provider, tree, B, H, HV, K, V, sb):
    T = tree.num_nodes
    state = B * HV * V * K * sb * 2
    ins = B * T * (2 * H * K * 2 + HV * V * 2 + 2 * HV * 4)
    out = B * T * HV * V * 2
    if provider in ("treewy", "treewy_eager"):
        path = tree.max_depth + 1
        out += B * T * HV * V * 4                          # u, fp32
        ins += B * path * (HV * V * 4 + H * K * 2 + HV * 4)  # the pending path's u, k, g
    return state + ins + out


def bench(fn):
    import triton

    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def state_bytes(provider, tree, HV, K, V, state_dtype):
    """GDN state a request holds per layer: one block, or one snapshot per node for store-all."""
    sb = torch.tensor([], dtype=state_dtype).element_size()
    return HV * V * K * sb * (tree.num_nodes if provider == "store_all" else 1)


def step_fn(provider, x, tree, *, kernel=None, dot_precision=None, config=None):
    """A zero-argument callable running one step of ``provider`` on the inputs ``x`` (see make);
    ``config`` pins the TreeWY kernel's launch config (see tree_verify_fwd)."""
    q, k, v, g, beta, state = x
    B, T = q.shape[:2]
    dev = q.device
    par = tree.parents.to(dev, torch.int32)
    scale = q.shape[-1] ** -0.5
    chain = tree.max_depth == T - 1
    if provider == "treewy":
        pend = previous_window(x, tree)
        return lambda: tree_verify_fwd(q, k, v, g, beta, state, par, 0, scale, pending=pend, kernel=kernel,
                                       dot_precision=dot_precision, config=config, chain=chain,
                                       max_depth=tree.max_depth)
    if provider == "treewy_eager":
        acc = torch.randint(0, T, (B,), device=dev, dtype=torch.int32)

        def eager():
            _, u = tree_verify_fwd(q, k, v, g, beta, state, par, 0, scale, kernel=kernel, dot_precision=dot_precision,
                                   chain=chain, max_depth=tree.max_depth)
            tree_commit_fwd(state, u, k, g, par, 0, acc)
        return eager
    if provider == "store_all":
        states = torch.empty(B, T, *state.shape[1:], device=dev, dtype=state.dtype)
        return lambda: store_all_verify_fwd(q, k, v, g, beta, state, par, 0, scale, states=states)
    if provider == "fla":
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

        return lambda: fused_recurrent_gated_delta_rule_fwd(q=q, k=k, v=v, g=g, beta=beta, scale=scale,
                                                            initial_state=state, output_final_state=True,
                                                            state_v_first=True)
    raise ValueError(f"provider = {provider!r}: expected treewy, treewy_eager, store_all or fla")


def run_case(provider, model, dims, tree_name, tree, B, state_dtype, total_mem, **kw):
    """One timed row (dict). Store-all is skipped where one layer's snapshots do not fit on the device."""
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    T = tree.num_nodes
    sb = torch.tensor([], dtype=state_dtype).element_size()
    held = state_bytes(provider, tree, HV, K, V, state_dtype)
    row = dict(provider=provider, model=model, tree=str(tree_name) if tree_name else "chain 0 (T = 1)", num_nodes=T,
               B=B, H=H, HV=HV, K=K, V=V, state_dtype=str(state_dtype).removeprefix("torch."),
               state_bytes_per_request=held, fits=bool(held * B * dims["layers"] <= total_mem), us=None, gbps=None,
               **{k: v for k, v in kw.items() if v is not None})
    nbytes = min_bytes(provider, tree, B, H, HV, K, V, sb)
    row["roofline_us"] = nbytes / COPY_BW * 1e6
    if provider == "store_all" and B * held * 1.1 > torch.cuda.mem_get_info()[0]:
        row["note"] = "snapshots do not fit on the device for one layer"
        return row
    if provider == "fla":
        try:
            import fla  # noqa: F401
        except Exception as e:  # noqa: BLE001
            row["note"] = f"fla-core not importable: {e!r}"
            return row
    fn = step_fn(provider, make(B, T, H, HV, K, V, state_dtype), tree, **kw)
    us = bench(fn)
    row["us"] = us
    row["gbps"] = nbytes / (us * 1e-6) / 1e9
    row["roofline_fraction"] = row["roofline_us"] / us
    return row
