"""``treewy simulate``: a simulated serving sweep, printed as DESIGN §4's ratio table."""

from __future__ import annotations

import argparse
import time


def _ints(example: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            vals = tuple(int(x) for x in text.replace("(", "").replace(")", "").split(",") if x.strip())
        except ValueError:
            vals = ()
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers, e.g. {example}")
        return vals
    return parse


def _acceptance(text: str):
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected tokens per step (e.g. 3.23) or per-depth rates "
                                         "(e.g. 0.86,0.86,0.86)")
    return vals[0] if len(vals) == 1 and "," not in text else vals


def add_arguments(parser) -> None:
    from treewy.sim.sweep import CONCURRENCIES
    from treewy.sim.workloads import WORKLOADS
    from treewy.workloads import CATALOGUE
    parser.add_argument("--model", default="qwen3.5-35b-a3b", help="preset: qwen3.5-35b-a3b, qwen3.5-397b-a17b, "
                        "qwen3-next-80b-a3b, tiny")
    parser.add_argument("--gpu", default="b200", help="b200, h200 or h100")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--gmu", type=float, default=0.6, help="gpu-memory-utilization")
    parser.add_argument("--tree", type=_ints("1,1,1"), default=(1, 1, 1),
                        help="branching factors, e.g. 1,1,1 or 2,2,2")
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(CATALOGUE))
    parser.add_argument("--concurrency", type=_ints("1,8,32"), default=CONCURRENCIES,
                        help="e.g. 1,8,32,64,128,256 (at most 4096)")
    parser.add_argument("--acceptance", type=_acceptance, default=None,
                        help="tokens per step (e.g. 3.23) or comma-separated per-depth acceptance rates (e.g. "
                        "0.86,0.86,0.86); default: the paper's figure for the tree (its 35B chain: 3.23)")
    parser.add_argument("--state-dtype", default=None, help="GDN state dtype (default: the model's, fp32 for Qwen3.5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernels", default="auto", help="kernel table for measured state-cost ratios: a targets_*.json "
                        "or kernels_*.json, 'auto' (the current targets table) or 'none' (analytic)")
    parser.add_argument("--out", default=None, help="write the tidy frame to this .parquet file "
                        "(and the printed table next to it as .txt)")


def run(args) -> int:
    from treewy.cli import output_file
    from treewy.memory import paging
    from treewy.memory.specs import _bytes_of
    from treewy.sim.sweep import format_ratio_table, simulate

    # the flags simulate() would report under another name, and the output, are checked before any point runs
    if args.state_dtype is not None:
        _bytes_of(args.state_dtype, "--state-dtype")
    out = output_file(args.out) if args.out else None
    if out is not None and out.with_suffix(".txt").is_dir():
        raise ValueError(f"--out {args.out!r}: {out.with_suffix('.txt')}, where the table goes, is a folder")
    kernels = None if str(args.kernels).lower() == "none" else args.kernels
    t0 = time.perf_counter()
    c0 = time.process_time()
    df = simulate(args.model, args.gpu, args.tp, args.gmu, mode=["store_all", "reconstruct"], tree=args.tree,
                  workload=args.workload, concurrency=list(args.concurrency), seed=args.seed,
                  state_dtype=args.state_dtype, kernels=kernels, acceptance=args.acceptance)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines = [format_ratio_table(df, title=f"SIMULATED serving sweep: {args.model}, tp {args.tp}, {args.gpu}, "
                                          f"gmu {args.gmu}, tree {tuple(args.tree)}, workloads {', '.join(args.workload)}")]
    lines.append("")
    for mode in ("store_all", "reconstruct"):
        s = paging(args.model, args.gpu, tp=args.tp, gmu=args.gmu, mode=mode, tree=args.tree,
                   state_dtype=args.state_dtype).summary()
        lines.append(f"{mode:>11}: pool {s['pool_gib']:.1f} GiB = {s['num_blocks']} blocks of {s['block_size']} tokens "
                     f"x {s['group_size']} layers; state {s['state_blocks_per_request']} blocks/request; "
                     f"weights {s['weights_gib']:.1f} GiB, reserve {s['reserve_gib']:.1f} GiB, state {s['state_dtype']}")
    lines.append(f"GDN state cost: {', '.join(sorted(set(df['cost_source'].to_list())))}; "
                 f"{df.height} points in {wall:.1f} s wall, {cpu:.1f} s CPU")
    text = "\n".join(lines)
    print(text)
    if out is not None:
        df.write_parquet(out)
        out.with_suffix(".txt").write_text(text + "\n")
        print(f"wrote {out} and {out.with_suffix('.txt')}")
    return 0
