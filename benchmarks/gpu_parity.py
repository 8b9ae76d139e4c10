"""GPU parity sweep of the Triton kernels at the real shapes of Qwen3.5-35B-A3B and 397B-A17B.

    python -m benchmarks.gpu_parity --out DIR [--batches 1 256]

Every paper tree shape and the chains k = 1..7, B up to 256: fp32 (tf32 off) within 1e-5
relative RMS of the fp64 reference, bf16 inputs within 2x the error of the reference run in bf16;
outputs poisoned with NaN before each run; commit of a random accepted node per request; the
store-all baseline where its snapshots fit; a CUDA-graph replay check of verify + commit on
(3, 3, 3); and what the dot precision ("ieee", "tf32" = the default, "tf32_plain") costs in error
and buys in time. Writes DIR/parity_log.txt
and DIR/parity.json; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


from treewy.ops import (
    naive_tree_commit, naive_tree_recurrent, naive_tree_verify, store_all_verify, tree_commit, tree_verify,
)
from treewy.ops.commit.kernel import tree_commit_fwd
from treewy.ops.verify.kernel import tree_verify_fwd
from treewy.tree import DraftTree

MODELS = {"35B-A3B": dict(H=16, HV=32, K=128, V=128), "397B-A17B": dict(H=16, HV=64, K=128, V=128)}
WIDTHS = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3)]
FP32_TOL = 1e-5


def trees():
    out = [(str(w), DraftTree.from_widths(w)) for w in WIDTHS]
    out += [(f"chain {k}", DraftTree.chain(k)) for k in (1, 2, 4, 5, 6, 7)]
    return out


def rel(x, ref):
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


@contextlib.contextmanager
def poisoned_empty():
    real_empty, real_like = torch.empty, torch.empty_like

    def poison(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x

    torch.empty = lambda *a, **kw: poison(real_empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(real_like(*a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_like


def inputs(B, T, H, HV, K, V, seed, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=torch.float64)  # noqa: E731
    q, k, v = rnd(B, T, H, K), F.normalize(rnd(B, T, H, K), dim=-1), rnd(B, T, HV, V)
    g = F.logsigmoid(rnd(B, T, HV) + 2.0) / 2  # decays mostly in 0.3..1, like trained GDN gates
    beta = torch.sigmoid(rnd(B, T, HV))
    h0 = rnd(B, HV, V, K) * 0.1
    return [q, k, v, g, beta, h0]


def check_case(model, name, tree, B, dims, seed, log):
    T = tree.num_nodes
    par = tree.parents.cuda()
    x64 = inputs(B, T, seed=seed, **dims)
    ro, ru = naive_tree_verify(*x64, par)
    acc = torch.randint(0, T, (B,), device="cuda")
    rs = naive_tree_commit(x64[5], ru, x64[1], x64[3], par, acc)
    rows = []
    for dt in (torch.float32, torch.bfloat16):
        x = [t.to(dt) for t in x64[:5]] + [x64[5].float()]
        with poisoned_empty():
            o, u = tree_verify(*x, par)
        st = x[5].clone()
        tree_commit(st, u, x[1], x[3], par, acc)
        e_o, e_u, e_s = rel(o, ro), rel(u, ru), rel(st, rs)
        if dt == torch.float32:
            tol_o = tol_u = tol_s = FP32_TOL
        else:
            xb = [t.to(dt) for t in x64]
            bo, bu = naive_tree_verify(*xb, par)
            bs = naive_tree_commit(xb[5], bu, xb[1], xb[3], par, acc)
            tol_o, tol_u, tol_s = 2 * rel(bo, ro), 2 * rel(bu, ru), 2 * rel(bs, rs)
        ok = e_o <= tol_o and e_u <= tol_u and e_s <= tol_s
        row = dict(model=model, tree=name, T=T, B=B, dtype=str(dt).removeprefix("torch."), o_err=e_o, u_err=e_u,
                   state_err=e_s, o_tol=tol_o, u_tol=tol_u, state_tol=tol_s, ok=ok)
        rows.append(row)
        log(f"{model:10s} {name:10s} T={T:3d} B={B:4d} {row['dtype']:8s} o {e_o:.2e} (tol {tol_o:.1e})  "
            f"u {e_u:.2e} (tol {tol_u:.1e})  state {e_s:.2e} (tol {tol_s:.1e})  {'ok' if ok else 'FAIL'}")
    return rows


def check_store_all(model, name, tree, B, dims, seed, log):
    T = tree.num_nodes
    x64 = inputs(B, T, seed=seed, **dims)
    ro, rstates = naive_tree_recurrent(*x64, tree)
    x = [t.float() for t in x64]
    with poisoned_empty():
        o, states = store_all_verify(*x, tree.parents.cuda())
    e = max(rel(o, ro), rel(states, rstates))
    log(f"{model:10s} {name:10s} T={T:3d} B={B:4d} store_all fp32 o/states {e:.2e}  {'ok' if e <= FP32_TOL else 'FAIL'}")
    return dict(model=model, tree=name, T=T, B=B, dtype="float32", op="store_all", err=e, tol=FP32_TOL,
                ok=e <= FP32_TOL)


def check_graph(log):
    tree = DraftTree.from_widths((3, 3, 3))
    B, T = 64, tree.num_nodes
    dims = MODELS["35B-A3B"]
    par = tree.parents.cuda()
    static = [t.to(torch.bfloat16) for t in inputs(B, T, seed=100, **dims)[:5]] + [None]
    static[5] = inputs(B, T, seed=100, **dims)[5].float()
    acc = torch.zeros(B, dtype=torch.int32, device="cuda")
    scale = dims["K"] ** -0.5
    o, u = tree_verify(*static, par)  # autotune before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # device parents inside a capture: chain and depth are given, not read
        o, u = tree_verify(*static, par, chain=tree.max_depth == T - 1, max_depth=tree.max_depth)
        tree_commit(static[5], u, static[1], static[3], par, acc)
    ok = True
    for seed in (101, 102, 103):
        new = inputs(B, T, seed=seed, **dims)
        a = torch.randint(0, T, (B,), dtype=torch.int32, device="cuda")
        for dst, src in zip(static[:5], new[:5]):
            dst.copy_(src)
        static[5].copy_(new[5])
        acc.copy_(a)
        graph.replay()
        torch.cuda.synchronize()
        eo, eu = tree_verify_fwd(*static[:5], new[5].float(), par, 0, scale)
        es = new[5].float()
        tree_commit_fwd(es, eu, static[1], static[3], par, 0, a)
        same = torch.equal(o, eo) and torch.equal(u, eu) and torch.equal(static[5], es)
        ok &= same
    log(f"CUDA graph: verify + commit of (3, 3, 3), B={B}, replayed with 3 new inputs and accepted nodes: "
        f"{'identical to the eager run' if ok else 'MISMATCH'}")
    return ok


def tf32_cost(log):
    import triton

    dims = MODELS["35B-A3B"]
    out = []
    for name, tree in (("(1, 1, 1)", DraftTree.chain(3)), ("(3, 3, 3)", DraftTree.from_widths((3, 3, 3)))):
        B, T = 256, tree.num_nodes
        x64 = inputs(B, T, seed=7, **dims)
        par = tree.parents.cuda()
        ro, ru = naive_tree_verify(*x64, par)
        x = [t.to(torch.bfloat16) for t in x64[:5]] + [x64[5].float()]
        for prec in ("ieee", "tf32", "tf32_plain"):
            o, u = tree_verify_fwd(*x, par, 0, dims["K"] ** -0.5, dot_precision=prec)
            us = 1e3 * triton.testing.do_bench(
                lambda: tree_verify_fwd(*x, par, 0, dims["K"] ** -0.5, dot_precision=prec), warmup=5, rep=25,
                return_mode="median")
            x32 = [t.float() for t in x64]
            o32, u32 = tree_verify_fwd(*x32, par, 0, dims["K"] ** -0.5, dot_precision=prec)
            row = dict(tree=name, B=B, precision=prec, verify_us=us, fp32_o_err=rel(o32, ro), fp32_u_err=rel(u32, ru))
            out.append(row)
            log(f"tf32 cost: {name} B={B} verify (bf16 inputs) {prec:7s} {us:8.1f} us; fp32 inputs: o err "
                f"{row['fp32_o_err']:.2e}, u err {row['fp32_u_err']:.2e}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    args = ap.parse_args(argv)
    from tqdm import tqdm

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []

    logf = open(args.out / "parity_log.txt", "w")

    def log(s):
        lines.append(s)
        logf.write(s + "\n")
        logf.flush()
        tqdm.write(s)

    dev = torch.cuda.get_device_name()
    log(f"treewy GPU parity sweep on {dev}, {datetime.date.today()}, torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}")
    t0 = time.time()
    rows, ok = [], True
    jobs = [(m, n, t, B) for m in MODELS for B in args.batches for n, t in trees()]
    for i, (model, name, tree, B) in enumerate(tqdm(jobs, desc="verify+commit")):
        for r in check_case(model, name, tree, B, MODELS[model], seed=i, log=log):
            rows.append(r)
            ok &= r["ok"]
    for model in MODELS:
        for name, tree in (("(1, 1, 1)", DraftTree.chain(3)), ("(3, 3, 3)", DraftTree.from_widths((3, 3, 3)))):
            r = check_store_all(model, name, tree, 8, MODELS[model], seed=1000, log=log)
            rows.append(r)
            ok &= r["ok"]
    graph_ok = check_graph(log)
    ok &= graph_ok
    tf32 = tf32_cost(log)
    worst = {}
    for r in rows:
        if "o_err" in r:
            key = r["dtype"]
            worst[key] = max(worst.get(key, 0.0), r["o_err"], r["u_err"], r["state_err"])
    log("worst relative RMS error over the sweep: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    log(f"{'PASS' if ok else 'FAIL'} ({len(rows)} rows) in {time.time() - t0:.0f} s")
    logf.close()
    (args.out / "parity.json").write_text(json.dumps(dict(device=dev, date=str(datetime.date.today()),
                                                          torch=torch.__version__, ok=ok, graph_ok=graph_ok,
                                                          rows=rows, tf32=tf32), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
