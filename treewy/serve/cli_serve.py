"""``treewy serve``: start vLLM with MTP speculation in store_all (stock) or reconstruct (TreeWY plugin) mode.

    treewy serve --preset qwen3.5-35b-a3b --mode reconstruct --dry-run
    treewy serve --model /ckpt/Qwen3.5-35B-A3B --mode store_all --port 8001 -- --max-model-len 32768
    treewy serve --model /tmp/q35b-dummy --acceptance length=2.5 -- --load-format dummy
    treewy serve --model /tmp/tiny-vllm --mode reconstruct --tree 2,2,1 --dry-run   # a fixed draft tree (N = 10)
"""

from __future__ import annotations

import argparse
import sys

from treewy.serve.launcher import (
    ServeError,
    ServeOptions,
    VLLMServer,
    acceptance_of,
    build_command,
    capture_plan,
    check_gpu,
    check_mtp_weights,
    check_port_free,
    check_tensor_parallel,
    check_vllm_installed,
    dummy_weights,
    format_command,
)
from treewy.serve.launcher_command import DRAFTERS, parse_tree
from treewy.serve.presets import PRESETS, ServePreset
from treewy.tree import STATE_MODES


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``serve`` and ``bench-serve``."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", help=f"named preset: {', '.join(sorted(PRESETS))}")
    src.add_argument("--model", help="a Hugging Face id or a local checkpoint directory (needs MTP weights)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (preset default, else 1)")
    p.add_argument("--gmu", type=float, help="gpu-memory-utilization (preset default, else 0.9)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, dest="k",
                   help="drafts per step: the chain length (default 3); with --tree, N = the tree's drafts")
    p.add_argument("--tree", metavar="W1,W2,...",
                   help="draft a fixed tree instead of a chain: the branching factor per level, e.g. 2,2,1 (N = 10 "
                        "drafts); served through the plugin in either mode (store_all: N + 1 state blocks per "
                        "request, reconstruct: one)")
    p.add_argument("--drafter", choices=DRAFTERS, default="mtp",
                   help="mtp: the checkpoint's MTP head (default); ngram: prompt lookup, no weights")
    p.add_argument("--max-num-seqs", type=int, help="vLLM --max-num-seqs (default 256)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--acceptance", metavar="FORM",
                   help="what the drafts accept, through vLLM's synthetic rejection sampler: paper-35b (the paper's "
                        "35B chain, 3.23 tokens per step at k = 3; a --tree: its Table 2 length), tiny (the tiny "
                        "checkpoint's measured rates for the shape), length=L (tokens per step), rates=A1,...,Ak "
                        "(unconditional per position or depth), or none (the drafts' real acceptance). Default: "
                        "paper-35b with --load-format dummy (random weights accept nothing), none otherwise")
    p.add_argument("--cudagraph-max-size", type=int, metavar="TOKENS",
                   help="largest step captured as a CUDA graph (default max_num_seqs x (1 + k): every decode step "
                        "the server can admit; larger steps run eagerly)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="vLLM prefix caching (store_all only; default off)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1 only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--vllm", default="vllm", help="the vllm executable (default: vllm on PATH)")
    p.add_argument("--health-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    p.add_argument("--no-gpu-check", action="store_true",
                   help="skip the GPU check (for a stand-in vllm executable, e.g. in tests)")
    p.add_argument("--log-file", help="also write the server log here")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_server_arguments(p)
    p.add_argument("--mode", choices=STATE_MODES, default="store_all",
                   help="store_all: stock vLLM (1 + k state blocks per request); reconstruct: the TreeWY plugin")
    p.add_argument("--dry-run", action="store_true", help="print the exact command and environment, run nothing")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more arguments passed to vllm serve")


def options_from_args(args, mode: str) -> tuple[ServeOptions, str]:
    """(options, name for the tables): preset defaults, then explicit flags."""
    extra = [a for a in (getattr(args, "extra", None) or []) if a != "--"]
    over = dict(tp=args.tp, gmu=args.gmu, num_speculative_tokens=args.k, max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len)
    tree = parse_tree(args.tree) if args.tree is not None else None
    if tree is not None:
        n = sum(_level_sizes(tree))
        if args.k is not None and args.k != n:
            raise ServeError(f"-k {args.k} and --tree {args.tree} disagree: the tree drafts N = {n} tokens per step "
                             f"and vLLM runs it as {n} drafts; drop -k (it follows the tree) or pass -k {n}")
        over["num_speculative_tokens"] = n
    common = dict(mode=mode, prefix_caching=args.prefix_caching, host=args.host, port=args.port,
                  vllm=args.vllm, extra_args=extra, acceptance=args.acceptance,
                  cudagraph_max_size=args.cudagraph_max_size, tree=tree, drafter=args.drafter)
    if args.preset:
        preset = ServePreset.from_name(args.preset)
        opts = ServeOptions.from_preset(preset, **over, **common)
        check_tensor_parallel(opts.tp, opts.model, preset.name)
        return opts, preset.name
    if not args.model:
        raise ServeError(f"pass --preset NAME ({', '.join(sorted(PRESETS))}) or --model PATH")
    opts = ServeOptions(model=args.model, **common)
    for k, v in over.items():
        if v is not None:
            setattr(opts, k, v)
    check_tensor_parallel(opts.tp, opts.model)
    return opts, args.model


def _level_sizes(widths):
    size = 1
    for w in widths:
        size *= w
        yield size


def describe(opts: ServeOptions) -> list[str]:
    """What the command asks of vLLM beyond its flags: the acceptance and the CUDA graphs."""
    plan = capture_plan(opts)
    graphs = (f"steps of up to {plan.max_size} tokens ({plan.why})" if plan.max_size else plan.why)
    eager = (f"; decode steps of up to {plan.needed} tokens are admitted, larger than {plan.max_size} run eagerly"
             if plan.eager_fallback_possible and plan.max_size else "")
    acc = acceptance_of(opts)
    lines = [f"acceptance: {acc.describe()}" + (" by depth (the plugin's tree sampler)" if opts.tree and acc.synthetic
                                                 else ""), f"CUDA graphs: {graphs}{eager}"]
    if opts.tree:
        lines.insert(0, f"tree: {tuple(opts.tree)}, N = {opts.num_speculative_tokens} drafts by {opts.drafter}, "
                        + ("N + 1 state blocks per request" if opts.mode == "store_all" else "one state block per "
                           "request"))
    return lines


def preflight(opts: ServeOptions, *, gpu_check: bool = True) -> str:
    """Every check that can fail before vLLM starts; returns the device name."""
    check_vllm_installed(opts.vllm)
    device = check_gpu(opts.tp) if gpu_check else "unchecked"
    if opts.drafter == "mtp":
        check_mtp_weights(opts.model, weights=not dummy_weights(opts))
    check_port_free(opts.host, opts.port)
    return device


def run(args) -> int:
    try:
        opts, _ = options_from_args(args, args.mode)
        argv, env = build_command(opts)
        if args.dry_run:
            print(format_command(argv, env))
            for k, v in sorted(env.items()):
                print(f"# env {k}={v}")
            for line in describe(opts):
                print(f"# {line}")
            return 0
        preflight(opts, gpu_check=not args.no_gpu_check)
        with VLLMServer(argv, env, opts.base_url, log_path=args.log_file) as srv:
            srv.wait_healthy(timeout=args.health_timeout)
            print(f"treewy serve: {opts.mode} server ready at {opts.base_url} (Ctrl-C stops it); "
                  + "; ".join(describe(opts)), flush=True)
            try:
                code = srv.proc.wait()
            except KeyboardInterrupt:
                print("treewy serve: stopping", file=sys.stderr)
                return 130
            print(f"treewy serve: vLLM exited with code {code}; last log lines:\n{srv.last_log()}", file=sys.stderr)
            return code or 1
    except (ServeError, ValueError) as e:
        print(f"treewy serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
