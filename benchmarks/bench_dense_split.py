"""The dense split launch's two kernels timed apart (autotuned) at the target rows; one GDN layer, H200."""
import sys, time, torch, triton
from treewy.ops.benchmark import MODELS, bench, make, step_fn
from treewy.ops.tree_verify import dense
from treewy.ops.tree_verify.dense import dense_tables_kernel, table_floats
from treewy.tree import DraftTree

d = MODELS["35B-A3B"]; H, HV, K, V = d["H"], d["HV"], d["K"], d["V"]
rows = [((3, 3, 3), 256), ((2, 2, 2), 256), ((3, 3, 3), 64), ("chain", 256)]
for widths, B in rows:
    tree = DraftTree.chain(3) if widths == "chain" else DraftTree.from_widths(widths)
    T = tree.num_nodes
    for sd in ([torch.float32, torch.bfloat16] if widths == "chain" else [torch.float32]):
        x = make(B, T, H, HV, K, V, sd)
        q, k, v, g, beta, h0 = x
        t0 = time.time()
        res = {}
        for fam in ("dense", "dense_split"):
            res[fam] = bench(step_fn("treewy", x, tree, kernel=fam))
        par = tree.parents.to("cuda", torch.int32)
        tab = torch.empty(B * HV * table_floats(T), device="cuda")
        BT = max(16, triton.next_power_of_2(T))
        tfn = lambda: dense_tables_kernel[(B * HV,)](q, k, g, beta, par, par, tab, 0, K ** -0.5, T, B, H=H, HV=HV, K=K,
                                                    BT=BT, BK=128, USE_QK_L2NORM_IN_KERNEL=False, HAS_NUM_NODES=False,
                                                    DOT_PRECISION="tf32", SPLIT=True, INPUT_BF16=True)
        res["tables only"] = bench(tfn)
        best = {k: str(getattr(fn, "best_config", None)) for k, fn in (("tables", dense_tables_kernel), ("stream", dense.tree_verify_dense_kernel))}
        print(widths, B, sd, {k: round(v, 1) for k, v in res.items()}, best, f"{time.time()-t0:.0f}s", flush=True)
        ck = [c for cache in dense_tables_kernel.fn.device_caches.values() for c in cache[0].values()]
        print("  tables kernels compiled:", [(c.n_regs, c.n_spills) for c in ck], flush=True)
        cs = [c for cache in dense.tree_verify_dense_kernel.fn.device_caches.values() for c in cache[0].values()]
        print("  stream/dense kernels compiled:", [(c.n_regs, c.n_spills) for c in cs], flush=True)
