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

from treewy.ops.benchmark import COPY_BW, MODELS, run_case, state_bytes, target_result, trees
from treewy.tree import DraftTree

CHAIN3 = ((1, 1, 1), DraftTree.chain(3))
TREE333 = ((3, 3, 3), DraftTree.from_widths((3, 3, 3)))
DECODE = ((), DraftTree.chain(0))
CHAIN_KERNELS = ("fma", "chain")   # candidates timed on every chain target row; the fastest is scored
TREE_KERNELS = ("dot", "dot_head")


def target(name, measured, bar, ok, unit=""):
    return {"target": name, "measured": measured, "bar": bar, "ok": bool(ok), "unit": unit}


class Bench:
    """Rows by key, timed once each, and the targets computed from whatever rows exist."""

    def __init__(self, log):
        self.log, self.rows, self.best, self.drift = log, {}, {}, {}
        self.total = torch.cuda.get_device_properties(0).total_memory
        m35 = MODELS["35B-A3B"]
        snap = state_bytes("store_all", TREE333[1], m35["HV"], m35["K"], m35["V"], torch.float32)
        self.b_fit = max(1, int(self.total // (snap * m35["layers"])))  # store-all (3,3,3), all 30 layers

    def case(self, key, provider, model, tree, B, state_dtype=torch.float32, **kw):
        name, t = tree
        r = self.rows[key] = run_case(provider, model, MODELS[model], name, t, B, state_dtype, self.total, **kw)
        torch.cuda.empty_cache()
        self.log(f"{key:38s} " + (f"{r['us']:9.1f} us  {r['gbps']:6.0f} GB/s  roofline {r['roofline_us']:.1f} us"
                                  if r["us"] is not None else r.get("note", "")))
        return r["us"]

    def best_of(self, key, model, tree, B, kernels, state_dtype=torch.float32):
        """The TreeWY step with each candidate kernel (rows "key [kernel]"); returns the faster (us, kernel)."""
        best = None
        for kernel in kernels:
            us = self.case(f"{key} [{kernel}]", "treewy", model, tree, B, state_dtype, kernel=kernel)
            if us is not None and (best is None or us < best[0]):
                best = (us, kernel)
        return best


def targets_of(b: Bench):
    """The targets table from the rows measured so far (targets whose rows are missing are skipped)."""
    r = {k: v["us"] for k, v in b.rows.items()}
    m35 = MODELS["35B-A3B"]
    out = []
    tw = b.best.get("chain3 B256")
    if tw:
        us, kern = tw
        frac = b.rows[f"treewy chain3 B256 [{kern}]"]["roofline_fraction"]
        out += [target(f"1 chain k=3, B=256: TreeWY step (us) [{kern}]", us, "<= 300", us <= 300, "us"),
                target("1 ... its roofline fraction", frac, ">= 0.84", frac >= 0.84)]
        if r.get("fla chain3 B256"):
            out.append(target("2 fla fused_recurrent T=4 / TreeWY", r["fla chain3 B256"] / us, ">= 1.6",
                              r["fla chain3 B256"] / us >= 1.6, "x"))
        if r.get("store_all chain3 B256"):
            out.append(target("2 store-all T=4 / TreeWY", r["store_all chain3 B256"] / us, ">= 2.5",
                              r["store_all chain3 B256"] / us >= 2.5, "x"))
        if b.best.get("333 B256"):
            tt, tk = b.best["333 B256"]
            out.append(target(f"3 (3,3,3) B=256 / chain k=3 B=256 [{tk}]", tt / us, "<= 1.6", tt / us <= 1.6, "x"))
    if r.get("store_all T1 B256") and r.get("fla T1 B256"):
        ratio = r["store_all T1 B256"] / r["fla T1 B256"]
        out.append(target("2 store-all T=1 / fla T=1", ratio, "<= 1.10", ratio <= 1.10, "x"))
    snap = state_bytes("store_all", TREE333[1], m35["HV"], m35["K"], m35["V"], torch.float32)
    out.append(target("3 store-all (3,3,3) snapshots at B=256, all layers (GiB)", snap * 256 * m35["layers"] / 2**30,
                      f"device {b.total / 2**30:.0f}", True, "GiB"))
    sa, tf = r.get(f"store_all 333 B{b.b_fit}"), (b.best.get(f"333 B{b.b_fit}") or (None,))[0]
    if sa and tf:
        out.append(target(f"3 store-all (3,3,3) at B={b.b_fit} (largest that fits) / TreeWY", sa / tf, "report",
                          True, "x"))
    if b.best.get("chain3 B1"):
        us, kern = b.best["chain3 B1"]
        out.append(target(f"4 B=1 chain k=3 (us) [{kern}]", us, "<= 10", us <= 10, "us"))
    if b.best.get("333 B1"):
        us, kern = b.best["333 B1"]
        out.append(target(f"4 B=1 (3,3,3) (us) [{kern}]", us, "<= 15", us <= 15, "us"))
    if b.best.get("chain3 B256 bf16"):
        us, kern = b.best["chain3 B256 bf16"]
        out.append(target(f"5 bf16 state chain k=3 B=256 (us) [{kern}]", us, "<= 160", us <= 160, "us"))
    if tw and b.best.get("chain3 B256 397B"):
        us, kern = b.best["chain3 B256 397B"]
        f397 = b.rows[f"treewy chain3 B256 397B [{kern}]"]["roofline_fraction"]
        f35 = b.rows[f"treewy chain3 B256 [{tw[1]}]"]["roofline_fraction"]
        out.append(target("5 397B roofline fraction / 35B", f397 / f35, ">= 0.90", f397 / f35 >= 0.90, "x"))
    for key, d in b.drift.items():
        ok = d["state_err"] <= 1e-5
        out.append(target(f"6 state error, {d['steps']} folded steps, {key}", d["state_err"],
                          "<= 1e-5" if key != "tf32" else "report", ok or key == "tf32"))
    return out


def measure(args, log, write):
    """Time the rows the targets need (writing the table as soon as they exist), then drift, then extras."""
    b = Bench(log)
    m35 = MODELS["35B-A3B"]
    b.best["chain3 B256"] = b.best_of("treewy chain3 B256", "35B-A3B", CHAIN3, 256, CHAIN_KERNELS)
    b.case("fla chain3 B256", "fla", "35B-A3B", CHAIN3, 256)
    b.case("store_all chain3 B256", "store_all", "35B-A3B", CHAIN3, 256)
    b.case("store_all T1 B256", "store_all", "35B-A3B", DECODE, 256)
    b.case("fla T1 B256", "fla", "35B-A3B", DECODE, 256)
    b.best["333 B256"] = b.best_of("treewy 333 B256", "35B-A3B", TREE333, 256, TREE_KERNELS)
    b.best["chain3 B1"] = b.best_of("treewy chain3 B1", "35B-A3B", CHAIN3, 1, CHAIN_KERNELS)
    b.best["333 B1"] = b.best_of("treewy 333 B1", "35B-A3B", TREE333, 1, TREE_KERNELS)
    b.best["chain3 B256 bf16"] = b.best_of("treewy chain3 B256 bf16", "35B-A3B", CHAIN3, 256, CHAIN_KERNELS,
                                           torch.bfloat16)
    b.best["chain3 B256 397B"] = b.best_of("treewy chain3 B256 397B", "397B-A17B", CHAIN3, 256, CHAIN_KERNELS)
    b.case(f"store_all 333 B{b.b_fit}", "store_all", "35B-A3B", TREE333, b.b_fit)
    b.best[f"333 B{b.b_fit}"] = b.best_of(f"treewy 333 B{b.b_fit}", "35B-A3B", TREE333, b.b_fit, TREE_KERNELS)
    write(b)

    from treewy.ops.parity import folded_drift

    # chains take the FMA kernel (exact fp32), (3,3,3) the dot kernel (tf32x3); plain tf32 for the record
    for key, steps, shapes, kw in (
            ("fma + dot kernels", args.drift_steps, [CHAIN3[1], TREE333[1]], {}),
            ("chain kernel", args.drift_steps, [DraftTree.chain(1), CHAIN3[1]], {"kernel": "chain"}),
            ("dot_head kernel", args.drift_steps, [TREE333[1]], {"kernel": "dot_head"}),
            ("tf32", args.drift_steps // 4, [TREE333[1]], {"dot_precision": "tf32"})):
        b.drift[key] = folded_drift(steps, B=4, H=m35["H"], HV=m35["HV"], K=128, V=128, trees=shapes,
                                    device="cuda", input_dtype=torch.bfloat16, **kw)
        log(f"drift {key}: {b.drift[key]}")
        write(b)

    b.case("treewy_eager chain3 B256", "treewy_eager", "35B-A3B", CHAIN3, 256)
    b.case("treewy T1 B256 [fma]", "treewy", "35B-A3B", DECODE, 256)
    b.case("treewy T1 B256 [chain]", "treewy", "35B-A3B", DECODE, 256, kernel="chain")
    b.case("treewy (2,2,2) B256", "treewy", "35B-A3B", ((2, 2, 2), DraftTree.from_widths((2, 2, 2))), 256)
    b.case("treewy 333 B256 tf32 [dot]", "treewy", "35B-A3B", TREE333, 256, dot_precision="tf32")
    write(b)
    return b


def fmt(targets, rows):
    lines = [f"{'target':62s} {'measured':>11s}  {'bar':>10s}  result", "-" * 96]
    for t in targets:
        m = t["measured"]
        ms = f"{m:11.3g}" if (abs(m) < 1e-2 or abs(m) >= 1e4) else f"{m:11.2f}"
        lines.append(f"{t['target']:62s} {ms}  {t['bar']:>10s}  {target_result(t)}")
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
    dev, date = torch.cuda.get_device_name(), str(datetime.date.today())
    tag = dev.split()[-1].lower()
    head = (f"{dev}, {date}, torch {torch.__version__}, triton {triton.__version__}; one GDN layer per step, "
            f"bf16 inputs, fp32 state unless said, medians of CUDA-graph replays; copy bandwidth "
            f"{COPY_BW / 1e12:.2f} TB/s")

    def write(b: Bench, table=None):
        """(Re)write the targets table and the rows so far: a run cut short keeps what it measured."""
        targets = targets_of(b)
        text = head + "\n\n" + fmt(targets, b.rows) + "\n"
        (args.out / f"targets_{tag}_{date}.txt").write_text(text)
        (args.out / f"targets_{tag}_{date}.json").write_text(json.dumps(
            dict(device=dev, date=date, torch=torch.__version__, triton=triton.__version__,
                 seconds=round(time.time() - t0), targets=targets, rows=b.rows, drift=b.drift,
                 store_all_fit_batch=b.b_fit, table=table), indent=1, default=str))
        return text

    b = measure(args, log, write)
    print(write(b, full_table(log) if args.table else None))


if __name__ == "__main__":
    main()
