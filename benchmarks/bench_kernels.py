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
import time
from pathlib import Path

import torch

from treewy.ops.benchmark import COPY_BW, MODELS, run_case, trees


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
