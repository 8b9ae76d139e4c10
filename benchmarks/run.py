"""One command over the registry of ops (treewy/bench/registry.py): each op at named shapes, ours beside its baselines.

    python -m benchmarks.run --list                                          # ops, providers, shapes
    python -m benchmarks.run --op verify --shapes 333_B256 chain3_B256 --json $OUT/ops.json
    python -m benchmarks.run --op all --base store_all --json $OUT/ops.json  # ours and store-all only
    python -m benchmarks.run --op verify commit --smoke --json /tmp/ops.json  # CPU, interpreter: not timings

On a GPU each row is the median of CUDA-graph replays of one step (one GDN layer), with the bytes the step must move,
the roofline at the H200's copy bandwidth and GB/s. The JSON holds the rows under "rows" and the device, date,
torch and triton versions under "meta". A provider that cannot run a shape (fla on a tree, or fla not installed) gets
a row with "note" and no time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from treewy.bench.registry import OPS, SHAPES, get_op, get_shape, run

PROG = "benchmarks.run"


def fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def meta(smoke: bool) -> dict:
    import triton

    device = "CPU (Triton interpreter, --smoke: not timings)" if smoke else torch.cuda.get_device_name()
    return dict(device=device, date=str(datetime.date.today()), torch=torch.__version__, triton=triton.__version__,
                smoke=smoke, timing="one interpreted call" if smoke else "median of CUDA-graph replays (us)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", nargs="+", help=f"op names or 'all' ({', '.join(OPS)})")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="shape names (default: all; see --list)")
    ap.add_argument("--base", nargs="+", help="the baselines beside ours (default: every provider of the op)")
    ap.add_argument("--json", type=Path, help="where the rows are written")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny dimensions: checks the command")
    ap.add_argument("--list", action="store_true", help="the registered ops, their providers and the shapes")
    args = ap.parse_args(argv)
    if args.list:
        for op in OPS.values():
            print(f"{op.name:8s} {', '.join(op.providers):36s} {op.doc}")
        for s in SHAPES.values():
            print(f"{s.name:18s} tree {s.widths}, B = {s.B}, {s.model}, {str(s.state_dtype).removeprefix('torch.')}")
        return 0
    if not args.op:
        return fail("give --op NAME [NAME ...] (or --op all); --list shows the ops")
    if not args.smoke and not torch.cuda.is_available():
        return fail("no CUDA GPU here: --smoke runs the ops on the CPU under the Triton interpreter")
    try:
        ops = list(OPS.values()) if args.op == ["all"] else [get_op(n) for n in args.op]
        shapes = [get_shape(n) for n in args.shapes]
    except ValueError as e:
        return fail(f"{e} (see --list)")
    rows = []
    for op in ops:
        providers = [op.providers[0]] + [p for p in op.providers[1:] if args.base is None or p in args.base]
        for shape in shapes:
            for provider in providers:
                row = run(op.name, shape, provider, smoke=args.smoke)
                rows.append(row)
                us = f"{row['us']:10.2f} us  roofline {row['roofline_us']:8.2f} us ({row['roofline_fraction']:.2f})" \
                    if row["us"] is not None else f"{'-':>13s}  {row['note']}"
                print(f"{op.name:7s} {shape.name:18s} {provider:13s} {us}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(meta=meta(args.smoke), rows=rows), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
