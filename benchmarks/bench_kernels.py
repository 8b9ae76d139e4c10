"""The kernel performance targets, measured in one run: TreeWY (commit folded into verify) vs store-all vs fla.

    python benchmarks/bench_kernels.py --out DIR [--table] [--drift-steps 200]

One GDN layer per step; bf16 q, k, v; fp32 g, beta; fp32 state unless said; Qwen3.5-35B-A3B shapes
(H = 16, HV = 32, K = V = 128) unless said; medians of CUDA-graph replays. ``roofline`` is the
step's minimal traffic (treewy.ops.benchmark.min_bytes) at the H200's 4.27 TB/s copy bandwidth;
``frac`` is roofline time over measured time. The six targets:

1. chain k = 3 (T = 4), B = 256: TreeWY step <= 300 us.
2. same run: >= 1.6x faster than fla-core's fused_recurrent over the same 4 tokens, >= 2.5x faster
   than store-all at T = 4; store-all within 10 % of fla at T = 1.
3. (3,3,3) (T = 40), B = 256: <= 1.6x the chain step, one launch; store-all's snapshot memory at
   B = 256 and its time at the largest batch whose snapshots fit (all GDN layers, device memory).
4. B = 1: chain k = 3 <= 10 us, (3,3,3) <= 15 us.
5. bf16 state, chain k = 3, B = 256 <= 160 us; 397B-A17B shapes (HV = 64) within 10 % of the 35B
   roofline fraction.
6. after 200 folded steps at the model's shapes (B = 4; chain k = 3 and (3,3,3) at random, random
   accepted nodes), the committed state within 1e-5 relative of the fp64 recurrence; the same
   over 50 steps of (3,3,3) with plain tf32 dot products, for the record.

Writes DIR/targets_<device>_<date>.txt and .json (and, with --table, the full chain/tree table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

from treewy.ops.benchmark import COPY_BW, MODELS, run_case, state_bytes, trees
from treewy.tree import DraftTree

CHAIN3 = ((1, 1, 1), DraftTree.chain(3))
TREE333 = ((3, 3, 3), DraftTree.from_widths((3, 3, 3)))
DECODE = ((), DraftTree.chain(0))


def target(name, measured, bar, ok, unit=""):
    return {"target": name, "measured": measured, "bar": bar, "ok": bool(ok), "unit": unit}


def measure(args, log):
    total = torch.cuda.get_device_properties(0).total_memory
    m35, m397 = MODELS["35B-A3B"], MODELS["397B-A17B"]
    fp32, bf16 = torch.float32, torch.bfloat16
    rows = {}

    def case(key, provider, model, tree, B, state_dtype=fp32, **kw):
        name, t = tree
        r = rows[key] = run_case(provider, model, MODELS[model], name, t, B, state_dtype, total, **kw)
        torch.cuda.empty_cache()
        log(f"{key:34s} " + (f"{r['us']:9.1f} us  {r['gbps']:6.0f} GB/s  roofline {r['roofline_us']:.1f} us"
                             if r["us"] is not None else r.get("note", "")))
        return r["us"]

    tw = case("treewy chain3 B256", "treewy", "35B-A3B", CHAIN3, 256)
    fla4 = case("fla chain3 B256", "fla", "35B-A3B", CHAIN3, 256)
    sa4 = case("store_all chain3 B256", "store_all", "35B-A3B", CHAIN3, 256)
    sa1 = case("store_all T1 B256", "store_all", "35B-A3B", DECODE, 256)
    fla1 = case("fla T1 B256", "fla", "35B-A3B", DECODE, 256)
    tt = case("treewy 333 B256", "treewy", "35B-A3B", TREE333, 256)
    t1c = case("treewy chain3 B1", "treewy", "35B-A3B", CHAIN3, 1)
    t1t = case("treewy 333 B1", "treewy", "35B-A3B", TREE333, 1)
    tb = case("treewy chain3 B256 bf16 state", "treewy", "35B-A3B", CHAIN3, 256, bf16)
    t397 = case("treewy chain3 B256 397B", "treewy", "397B-A17B", CHAIN3, 256)
    snap = state_bytes("store_all", TREE333[1], m35["HV"], m35["K"], m35["V"], fp32)
    b_fit = max(1, int(total // (snap * m35["layers"])))
    sa333 = case(f"store_all 333 B{b_fit}", "store_all", "35B-A3B", TREE333, b_fit)
    tw_fit = case(f"treewy 333 B{b_fit}", "treewy", "35B-A3B", TREE333, b_fit)
    case("treewy_eager chain3 B256", "treewy_eager", "35B-A3B", CHAIN3, 256)
    case("treewy T1 B256", "treewy", "35B-A3B", DECODE, 256)
    case("treewy (2,2,2) B256", "treewy", "35B-A3B", ((2, 2, 2), DraftTree.from_widths((2, 2, 2))), 256)
    case("treewy 333 B256 tf32", "treewy", "35B-A3B", TREE333, 256, dot_precision="tf32")

    log("drift: 200 folded steps")
    from treewy.ops.parity import folded_drift

    # chains take the FMA kernel (exact fp32), (3,3,3) the dot kernel: tf32x3, and plain tf32 for the record
    drift = {}
    for p, steps, shapes in (("tf32x3", args.drift_steps, [CHAIN3[1], TREE333[1]]),
                             ("tf32", args.drift_steps // 4, [TREE333[1]])):
        drift[p] = folded_drift(steps, B=4, H=m35["H"], HV=m35["HV"], K=128, V=128, trees=shapes,
                                device="cuda", input_dtype=bf16, dot_precision=p)
        log(f"drift {p}: {drift[p]}")

    r = rows
    f35 = r["treewy chain3 B256"]["roofline_fraction"]
    f397 = r["treewy chain3 B256 397B"]["roofline_fraction"]
    targets = [
        target("1 chain k=3, B=256: TreeWY step (us)", tw, "<= 300", tw <= 300, "us"),
        target("1 ... its roofline fraction", f35, ">= 0.84", f35 >= 0.84),
        target("2 fla fused_recurrent T=4 / TreeWY", fla4 / tw, ">= 1.6", fla4 / tw >= 1.6, "x"),
        target("2 store-all T=4 / TreeWY", sa4 / tw, ">= 2.5", sa4 / tw >= 2.5, "x"),
        target("2 store-all T=1 / fla T=1", sa1 / fla1, "<= 1.10", sa1 / fla1 <= 1.10, "x"),
        target("3 (3,3,3) B=256 / chain k=3 B=256", tt / tw, "<= 1.6", tt / tw <= 1.6, "x"),
        target("3 store-all (3,3,3) snapshots at B=256, all layers (GiB)",
               snap * 256 * m35["layers"] / 2**30, f"device {total / 2**30:.0f}", True, "GiB"),
        target(f"3 store-all (3,3,3) at B={b_fit} (largest that fits) / TreeWY", sa333 / tw_fit, "report",
               True, "x"),
        target("4 B=1 chain k=3 (us)", t1c, "<= 10", t1c <= 10, "us"),
        target("4 B=1 (3,3,3) (us)", t1t, "<= 15", t1t <= 15, "us"),
        target("5 bf16 state chain k=3 B=256 (us)", tb, "<= 160", tb <= 160, "us"),
        target("5 397B roofline fraction / 35B", f397 / f35, ">= 0.90", f397 / f35 >= 0.90, "x"),
        target("6 state error after 200 folded steps (tf32x3)", drift["tf32x3"]["state_err"], "<= 1e-5",
               drift["tf32x3"]["state_err"] <= 1e-5),
        target("6 ... (3,3,3) with plain tf32 dot products, 50 steps", drift["tf32"]["state_err"], "report",
               True),
    ]
    return targets, rows, drift, b_fit


def fmt(targets, rows):
    lines = [f"{'target':62s} {'measured':>11s}  {'bar':>10s}  result", "-" * 96]
    for t in targets:
        m = t["measured"]
        ms = f"{m:11.3g}" if (abs(m) < 1e-2 or abs(m) >= 1e4) else f"{m:11.2f}"
        res = "report" if t["bar"].startswith(("report", "device")) else ("PASS" if t["ok"] else "FAIL")
        lines.append(f"{t['target']:62s} {ms}  {t['bar']:>10s}  {res}")
    lines += ["", f"{'case':34s} {'us':>9s} {'GB/s':>7s} {'roof us':>8s} {'frac':>5s}  MiB/req", "-" * 80]
    for key, r in rows.items():
        us = f"{r['us']:9.1f}" if r["us"] is not None else f"{'-':>9s}"
        gb = f"{r['gbps']:7.0f}" if r["gbps"] is not None else f"{'-':>7s}"
        fr = f"{r['roofline_fraction']:5.2f}" if r.get("roofline_fraction") else f"{'-':>5s}"
        lines.append(f"{key:34s} {us} {gb} {r['roofline_us']:8.1f} {fr}  {r['state_bytes_per_request'] / 2**20:7.1f}"
                     + (f"  ({r['note']})" if r.get("note") else ""))
    return "\n".join(lines)


def full_table(log):
    """Every chain and tree shape at B = 1, 8, 64, 256 for the three providers (35B shapes)."""
    total = torch.cuda.get_device_properties(0).total_memory
    out = []
    for B in (1, 8, 64, 256):
        for name, t in trees():
            for p in ("treewy", "store_all", "fla"):
                if p == "fla" and not set(name) <= {1}:
                    continue
                log(f"table {p} {name} B={B}")
                out.append(run_case(p, "35B-A3B", MODELS["35B-A3B"], name, t, B, torch.float32, total))
                torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--drift-steps", type=int, default=200)
    ap.add_argument("--table", action="store_true", help="also time every chain and tree shape at B = 1..256")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU (timings of the Triton kernels)")
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)  # noqa: E731
    targets, rows, drift, b_fit = measure(args, log)
    table = full_table(log) if args.table else None
    dev, date = torch.cuda.get_device_name(), str(datetime.date.today())
    tag = dev.split()[-1].lower()
    head = (f"{dev}, {date}, torch {torch.__version__}, triton {triton.__version__}; one GDN layer per step, "
            f"bf16 inputs, fp32 state unless said, medians of CUDA-graph replays; copy bandwidth "
            f"{COPY_BW / 1e12:.2f} TB/s")
    text = head + "\n\n" + fmt(targets, rows) + "\n"
    print(text)
    (args.out / f"targets_{tag}_{date}.txt").write_text(text)
    (args.out / f"targets_{tag}_{date}.json").write_text(json.dumps(
        dict(device=dev, date=date, torch=torch.__version__, triton=triton.__version__, seconds=round(time.time() - t0),
             targets=targets, rows=rows, drift=drift, store_all_fit_batch=b_fit, table=table), indent=1, default=str))


if __name__ == "__main__":
    main()
