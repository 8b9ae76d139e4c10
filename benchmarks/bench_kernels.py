"""Benchmark of one GDN layer's verify step: TreeWY (verify + commit) vs store-all (verify + select) vs fla.

    python benchmarks/bench_kernels.py --out DIR [--models 35B-A3B 397B-A17B] [--batches 1 8 64 256]

Shapes of Qwen3.5-35B-A3B (H = 16, HV = 32, K = V = 128) and 397B-A17B (HV = 64); bf16 q, k, v,
fp32 g, beta and state; chains k = 1..7 and the paper's tree shapes. fla-core's
fused_recurrent_gated_delta_rule runs the chains only (it keeps no rollback copies: the floor
among existing kernels). Times are medians of CUDA-graph replays (triton.testing.do_bench_cudagraph).
``gbps`` is the step's minimal traffic (state read once and written once, inputs read, outputs
written) over the measured time; ``roofline_us`` is that traffic at the 4.27 TB/s copy bandwidth
measured on the H200. ``state_bytes_per_request`` is the GDN state a request holds per layer
(store-all: one snapshot per node; TreeWY and fla: one state); store-all's select is taken to
be free (engines update a slot index), so its row times the verify kernel alone; ``fits`` says whether that state
for all GDN layers of the model (30 or 45) at this batch fits in the GPU's memory (weights and KV
cache ignored). Store-all is timed only where its snapshots fit on the device for one layer.
Prints a table and writes DIR/kernels_<device>_<date>.json and .txt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treewy.ops.store_all import store_all_verify_fwd  # noqa: E402
from treewy.ops.tree_commit import tree_commit_fwd  # noqa: E402
from treewy.ops.tree_verify import DEFAULT_DOT_PRECISION, tree_verify_fwd  # noqa: E402
from treewy.tree import DraftTree  # noqa: E402

COPY_BW = 4.27e12  # bytes/s, device-to-device copy (read + write) measured on the H200
MODELS = {"35B-A3B": dict(H=16, HV=32, K=128, V=128, layers=30),
          "397B-A17B": dict(H=16, HV=64, K=128, V=128, layers=45)}
WIDTHS = [(2, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3)]


def trees():
    return [((), DraftTree.chain(0))] + [((1,) * k, DraftTree.chain(k)) for k in range(1, 8)] + [(w, DraftTree.from_widths(w)) for w in WIDTHS]


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


def fmt_table(rows):
    head = f"{'model':10s} {'tree':12s} {'T':>3s} {'B':>4s} {'provider':9s} {'us':>9s} {'GB/s':>7s} " \
           f"{'roof us':>8s} {'MiB/req':>8s} fits"
    out = [head, "-" * len(head)]
    for r in rows:
        us = f"{r['us']:9.1f}" if r["us"] is not None else f"{'-':>9s}"
        gb = f"{r['gbps']:7.0f}" if r["gbps"] is not None else f"{'-':>7s}"
        out.append(f"{r['model']:10s} {r['tree']:12s} {r['num_nodes']:3d} {r['B']:4d} {r['provider']:9s} {us} {gb} "
                   f"{r['roofline_us']:8.1f} {r['state_bytes_per_request'] / 2**20:8.1f} {r['fits']}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--providers", nargs="+", default=["treewy", "store_all", "fla"])
    ap.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    import triton
    from tqdm import tqdm

    args.out.mkdir(parents=True, exist_ok=True)
    state_dtype = getattr(torch, args.state_dtype)
    total_mem = torch.cuda.get_device_properties(0).total_memory
    dev = torch.cuda.get_device_name()
    jobs = [(p, m, n, t, B) for m in args.models for B in args.batches for n, t in trees()
            for p in args.providers if not (p == "fla" and not set(n) <= {1})]
    rows = []
    t0 = time.time()
    for p, m, n, t, B in tqdm(jobs, desc="bench"):
        rows.append(run_case(p, m, MODELS[m], n, t, B, state_dtype, total_mem))
        torch.cuda.empty_cache()
    date = str(datetime.date.today())
    tag = dev.split()[-1].lower() if dev else "gpu"
    meta = dict(device=dev, date=date, torch=torch.__version__, triton=triton.__version__,
                copy_bandwidth_tbps=COPY_BW / 1e12, seconds=round(time.time() - t0), rows=rows)
    table = fmt_table(rows)
    (args.out / f"kernels_{tag}_{date}.json").write_text(json.dumps(meta, indent=1))
    (args.out / f"kernels_{tag}_{date}.txt").write_text(
        f"{dev}, {date}, torch {torch.__version__}, triton {triton.__version__}; one GDN layer, bf16 inputs, "
        f"{args.state_dtype} state; median of CUDA-graph replays\n" + table + "\n")
    print(table)


if __name__ == "__main__":
    main()
