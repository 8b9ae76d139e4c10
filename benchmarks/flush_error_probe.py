"""The flush test's one failure (slot 5 after a flush at node 2, H200): the same pools flushed by the GPU kernel and
by the Triton interpreter in a second process, each against fp64, slot by slot and head by head.

    PYTHONPATH=$PWD python3 benchmarks/flush_error_probe.py OUT gpu
"""
import os, sys, subprocess
sys.path.insert(0, "tests")
import torch
import test_serve_spec_step as T
from treewy.serve.reconstruct import ReconstructPools
from treewy.testing import rel_err
out = sys.argv[1]
if sys.argv[2] == "gpu":
    gen = torch.Generator().manual_seed(3)
    pools = T.page_pools()
    x, cu, slots = T.batch(gen, [3, 4, 3], [2, 4, 5])
    T.spec_step_gated(pools, slots, torch.ones(3, device=T.DEVICE), x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], cu)
    torch.save([t.cpu().clone() for t in (pools.state, pools.u, pools.k, pools.g, pools.meta)], out + "/pools.pt")
    flush = torch.tensor([4, 0, 2, -1, 6, 5], dtype=torch.int32, device=T.DEVICE)
    T.flush_slots(pools, flush, 2)
    torch.save(pools.state.cpu(), out + "/gpu_state.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, __file__, out, "cpu"], env=env, check=True)
else:
    p = ReconstructPools(*torch.load(out + "/pools.pt"))
    r64 = ReconstructPools(*(t.double() if t.is_floating_point() else t.clone() for t in torch.load(out + "/pools.pt")))
    flush = torch.tensor([4, 0, 2, -1, 6, 5], dtype=torch.int32)
    T.naive_flush_slots(r64, flush, 2, dtype=torch.float64)
    T.flush_slots(p, flush, 2)
    g = torch.load(out + "/gpu_state.pt")
    for s in (2, 4, 5):
        print(f"slot {s}: gpu vs fp64 {rel_err(g[s], r64.state[s]):.3g}, interpreter vs fp64 {rel_err(p.state[s], r64.state[s]):.3g}, gpu vs interpreter {rel_err(g[s], p.state[s].double()):.3g}")
        d = (g[s].double() - r64.state[s]).norm(dim=(1, 2)) / r64.state[s].norm(dim=(1, 2))
        print("   per head gpu vs fp64:", [f"{v:.2g}" for v in d.tolist()])
