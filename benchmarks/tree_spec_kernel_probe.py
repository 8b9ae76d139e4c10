"""The served reconstruct tree step's kernel path (``tree_spec_update(kernels=True)``: gates, verify with the pending
fold and q, k normalized in the kernel, stash by slot) against its torch references on the same device, step after
step, with the tiny checkpoint's GDN shapes (H 2, HV 4, K = V = 64) and the accepted node off the leftmost path:
the largest relative error of the outputs, the state and the stash per (tree, batch, step). A GPU question the
stand-in engine cannot ask (it runs on the CPU): is a served tree's divergence the kernels' or vLLM's wiring's?

    [TREEWY_DOT_PRECISION=ieee] python -m benchmarks.tree_spec_kernel_probe [--steps 6] [--trees "2,2,1;3,3,3"]
        [--batches 1,3,8,32]

(the verify kernels' dots in the device default, tf32 on an H200, or exact fp32 under TREEWY_DOT_PRECISION=ieee)
"""

from __future__ import annotations

import argparse

import torch

from treewy.serve import tree_plugin as hooks
from treewy.serve.reconstruct import ReconstructPools
from treewy.testing import rel_err


def probe(widths, B: int, steps: int, device: str, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    H, HV, K, V = 2, 4, 64, 64
    n_slots = 2 * B + 2
    serving = hooks.TreeServing(widths, "reconstruct", n_slots, device)
    T = serving.layout.num_nodes
    slots = (1 + torch.randperm(n_slots - 1, generator=gen)[:B]).reshape(B, 1).to(device)
    pools = ReconstructPools.empty(n_slots, H=H, HV=HV, K=K, V=V, max_nodes=T, device=device)
    pools.state.copy_(torch.randn(pools.state.shape, generator=gen).to(device) * 0.3)
    runs = {True: pools, False: ReconstructPools(*(x.clone() for x in (pools.state, pools.u, pools.k, pools.g,
                                                                       pools.meta)))}
    rows, accepted = [], None
    for step in range(steps):
        kw = dict(A_log=torch.randn(HV, generator=gen), a=torch.randn(B * T, HV, generator=gen),
                  b=torch.randn(B * T, HV, generator=gen), dt_bias=torch.randn(HV, generator=gen),
                  q=torch.randn(1, B * T, H, K, generator=gen), k=torch.randn(1, B * T, H, K, generator=gen),
                  v=torch.randn(1, B * T, HV, V, generator=gen), cu_seqlens=torch.arange(B + 1) * T)
        kw = {n: x.to(device) for n, x in kw.items()}
        outs = {kern: hooks.tree_spec_update(runs[kern], serving, kernels=kern, ssm_state_indices=slots,
                                             accepted=accepted, **kw)[0] for kern in (True, False)}
        s = slots[:, 0].long()
        row = {"tree": ",".join(map(str, widths)), "B": B, "step": step,
               "pending": "none" if accepted is None else ",".join(map(str, accepted.tolist()[:4])),
               "o": rel_err(outs[True].float(), outs[False].float())}
        row.update({n: rel_err(getattr(runs[True], n)[s].float(), getattr(runs[False], n)[s].float())
                    for n in ("state", "u", "k", "g")})
        rows.append(row)
        accepted = torch.randint(0, T, (B,), generator=gen).to(device)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--trees", default="2,2,1;3,3,3")
    p.add_argument("--batches", default="1,3,8,32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    print(f"device {a.device} ({torch.cuda.get_device_name(0) if a.device == 'cuda' else 'cpu'}); rel. errors "
          "kernel path vs torch reference")
    print(f"{'tree':>6} {'B':>3} {'step':>4} {'pending':>12} {'o':>9} {'state':>9} {'u':>9} {'k':>9} {'g':>9}")
    for tree in a.trees.split(";"):
        for B in (int(x) for x in a.batches.split(",")):
            for r in probe(tuple(int(w) for w in tree.split(",")), B, a.steps, a.device):
                print(f"{r['tree']:>6} {r['B']:>3} {r['step']:>4} {r['pending']:>12} " +
                      " ".join(f"{r[n]:9.2e}" for n in ("o", "state", "u", "k", "g")), flush=True)


if __name__ == "__main__":
    main()
