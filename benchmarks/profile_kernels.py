"""Where the verify kernels spend their time: every launch config of every kernel timed on the target
cases, with its registers, spills and static SASS instruction mix; then, under Nsight Compute, the
fastest config of each kernel (and fla, store-all) profiled once.

    python -m benchmarks.profile_kernels --out DIR [--deadline 240]
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m benchmarks.profile_kernels --out DIR --ncu

The first form writes DIR/profile_<device>_<date>.json and prints one line per config as measured;
the second reads that file and launches each fastest config once between cudaProfilerStart/Stop
(the pending commits are built, and anything autotuned, before profiling starts). ``--stalls CSV`` (CPU)
summarizes the warp-stall samples of ``ncu -i REP --page source --print-source sass --csv`` by opcode and by
runs of instructions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import time
from collections import Counter
from pathlib import Path

import torch

from treewy.bench.timing import COPY_BW, MODELS, bench, make, min_bytes, step_fn
from treewy.ops.verify.kernel import KERNEL_FNS
from treewy.tree import DraftTree

CHAIN3 = DraftTree.chain(3)
TREE333 = DraftTree.from_widths((3, 3, 3))
CASES = {  # name: (tree, B, kernel families); path_split: its streaming kernel's configs (tables kernel pinned)
    "chain3 B256": (CHAIN3, 256, ("chain", "path", "dense")),
    "333 B256": (TREE333, 256, ("path", "path_split", "dense")),
    "222 B256": (DraftTree.from_widths((2, 2, 2)), 256, ("path_split", "dense")),
    "333 B64": (TREE333, 64, ("path_split", "dense")),
    "chain3 B1": (CHAIN3, 1, ("chain", "path", "dense")),
    "333 B1": (TREE333, 1, ("path", "dense")),
}
OPS = ("FFMA", "FMUL", "FADD", "SHFL", "LDS", "STS", "LDSM", "BAR", "HMMA", "LDG", "STG", "LDL", "STL", "MUFU")


def compiled(jit_fn):
    """Every CompiledKernel of a JITFunction so far (Triton keeps them per device)."""
    out = []
    for cache in jit_fn.device_caches.values():
        out += list(cache[0].values())
    return out


def sass_mix(ck):
    """Static count of selected SASS opcodes in a compiled kernel (None where nvdisasm is unavailable)."""
    try:
        sass = ck.asm["sass"]
    except Exception:  # noqa: BLE001
        return None
    ops = Counter()
    for m in re.finditer(r"^\s+(?:/\*[0-9a-f]+\*/\s+)?(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[\s.]", sass, re.M):
        ops[m.group(1)] += 1
    mix = {op: ops.get(op, 0) for op in OPS}
    mix["total"] = sum(ops.values())
    return mix


def time_configs(args, log):
    import triton

    dims = MODELS["35B-A3B"]
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    rows, t0 = [], time.time()
    for case, (tree, B, names) in CASES.items():
        BT = max(2, tree.num_nodes)
        for name in names:
            if args.kernels and name not in args.kernels:
                continue
            kern = KERNEL_FNS[name][-1]  # the autotuned kernel of the family
            bt = triton.next_power_of_2(BT)
            bt = max(16, bt) if name != "chain" else bt
            cfgs = kern.early_config_prune(kern.configs, {"BT": bt, "K": K, "V": V, "DOT_PRECISION": "tf32",
                                                          "HAS_TABLES": name == "path_split"})
            for cfg in cfgs:
                if time.time() - t0 > args.deadline:
                    log(f"deadline {args.deadline} s reached: {case} {name} {cfg} and later configs not timed")
                    return rows
                before = {id(c) for c in compiled(kern.fn)}
                x = make(B, tree.num_nodes, H, HV, K, V, torch.float32)
                us = bench(step_fn("treewy", x, tree, kernel=name, config=cfg))
                new = [c for c in compiled(kern.fn) if id(c) not in before]
                ck = new[-1] if new else None
                nbytes = min_bytes("treewy", tree, B, H, HV, K, V, 4)
                row = dict(case=case, kernel=name, config=str(cfg), kwargs=cfg.all_kwargs(), us=us,
                           roofline_us=nbytes / COPY_BW * 1e6,
                           n_regs=getattr(ck, "n_regs", None), n_spills=getattr(ck, "n_spills", None),
                           shared=getattr(getattr(ck, "metadata", None), "shared", None),
                           sass=sass_mix(ck) if ck is not None else None)
                rows.append(row)
                log(f"{case:12s} {name:9s} {str(cfg):60s} {us:9.1f} us  regs {row['n_regs']} spills {row['n_spills']}"
                    f"  smem {row['shared']}  sass {row['sass']}")
                del x
                torch.cuda.empty_cache()
    return rows


def fastest(rows):
    best = {}
    for r in rows:
        key = (r["case"], r["kernel"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best


def ncu_pass(args, log, path):
    """Launch the fastest config of each kernel on the B = 256 cases, fla and store-all once each, profiled."""
    import triton

    rows = json.loads(path.read_text())["rows"]
    dims = MODELS["35B-A3B"]
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    steps = []
    for (case, name), r in sorted(fastest(rows).items()):
        tree, B, _ = CASES[case]
        if B != 256:
            continue
        cfg = triton.Config({k: v for k, v in r["kwargs"].items() if k.isupper()},
                            **{k: v for k, v in r["kwargs"].items() if k in ("num_warps", "num_stages")})
        x = make(B, tree.num_nodes, H, HV, K, V, torch.float32)
        steps.append((f"treewy {case} [{name}] {cfg}", step_fn("treewy", x, tree, kernel=name, config=cfg)))
    peers = () if args.kernels else (("fla", CHAIN3), ("store_all", CHAIN3), ("fla", DraftTree.chain(0)))
    for prov, tree in peers:  # with --kernels, only those kernels
        x = make(256, tree.num_nodes, H, HV, K, V, torch.float32)
        steps.append((f"{prov} T={tree.num_nodes} B256", step_fn(prov, x, tree)))
    for _, fn in steps:  # compile (and autotune fla) before profiling starts
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for i, (label, fn) in enumerate(steps):
        log(f"ncu launch {i}: {label}")
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def stall_summary(csv_path: Path, window: int = 40) -> str:
    """Nsight Compute's per-SASS-instruction warp-stall samples (``ncu -i REP --page source --print-source sass
    --csv``, gzipped or not) summed by opcode and by runs of ``window`` instructions, with each run's busiest
    opcodes and its largest execution count (a loop body shows as a count that is a multiple of the grid's warps)."""
    import csv
    import gzip

    opener = gzip.open if csv_path.suffix == ".gz" else open
    with opener(csv_path, "rt") as f:
        rows = list(csv.reader(f))
    hdr = rows[1]
    i_s, i_e = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    data = [r for r in rows[2:] if len(r) > i_e and r[i_s].isdigit()]
    op = lambda r: r[1].split()[1 if r[1].strip().startswith("@") else 0].split(".")[0]  # noqa: E731
    total, executed = sum(int(r[i_s]) for r in data), sum(int(r[i_e]) for r in data)
    by_op, ex_op = Counter(), Counter()
    for r in data:
        by_op[op(r)] += int(r[i_s])
        ex_op[op(r)] += int(r[i_e])
    out = [f"{csv_path.name}: {total} stall samples, {executed} warp instructions executed, {len(data)} SASS lines",
           "", "opcode      stall %  executed %"]
    out += [f"{o:10s} {100 * s / total:7.1f} {100 * ex_op[o] / executed:10.1f}" for o, s in by_op.most_common(15)]
    out += ["", f"runs of {window} instructions: first, stall %, largest execution count, busiest opcodes"]
    for s in range(0, len(data), window):
        seg = data[s:s + window]
        ops = Counter(op(r) for r in seg)
        out.append(f"{s:5d} {100 * sum(int(r[i_s]) for r in seg) / total:6.1f} {max(int(r[i_e]) for r in seg):10d}  "
                   + ", ".join(f"{o} x{c}" for o, c in ops.most_common(6)))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds of config timing before stopping")
    ap.add_argument("--kernels", nargs="*", help="only these kernels (default: every kernel of each case)")
    ap.add_argument("--ncu", action="store_true", help="launch the fastest configs once each for Nsight Compute")
    ap.add_argument("--stalls", type=Path, help="(CPU) summarize an ncu SASS source-page csv and exit")
    args = ap.parse_args(argv)
    if args.stalls:
        print(stall_summary(args.stalls))
        return
    if not torch.cuda.is_available():
        raise SystemExit("profile_kernels.py needs a CUDA GPU")
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)  # noqa: E731
    dev, date = torch.cuda.get_device_name(), str(datetime.date.today())
    path = args.out / f"profile_{dev.split()[-1].lower()}_{date}.json"
    if args.ncu:
        return ncu_pass(args, log, path)
    rows = time_configs(args, log)
    path.write_text(json.dumps(dict(device=dev, date=date, torch=torch.__version__, triton=triton.__version__,
                                    rows=rows), indent=1, default=str))
    for (case, name), r in sorted(fastest(rows).items()):
        log(f"fastest {case:12s} {name:9s} {r['us']:9.1f} us ({r['roofline_us']:.1f} us roofline)  {r['config']}")


if __name__ == "__main__":
    main()
