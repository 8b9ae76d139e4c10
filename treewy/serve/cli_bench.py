"""``treewy bench-serve``: the serving sweep against real vLLM, written as the simulator's tidy table.

    treewy bench-serve --preset qwen3.5-35b-a3b --workloads balanced-chat,generation-heavy \\
        --concurrency 1,8,32,64,128,256 --modes store_all,reconstruct --out results/serve35b.parquet
    treewy bench-serve --model /tmp/q35b-dummy --workloads generation-short --concurrency 32,256 \
        --out results/dummy.parquet -- --load-format dummy        # synthetic acceptance: the paper's 35B chain

Every row records the acceptance asked of vLLM (--acceptance; on dummy weights the paper's 35B chain by default)
beside the one its counters show, and the CUDA graph capture sizes; a point whose measured acceptance strays from the
request by more than 3 standard errors gets a warning (printed, and in the acceptance_warning column).
Rerunning the same command resumes: finished points (in OUT.points.jsonl) are skipped. An existing OUT
whose rows that checkpoint does not hold (another run's or another tool's table) is refused, not replaced.
Exit code 0 when every point succeeded, 1 when some failed (they are rows with ``error`` set).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from treewy.serve.cli_serve import add_server_arguments, options_from_args, preflight
from treewy.serve.launcher import ServeError, acceptance_of, build_command
from treewy.serve.sweep import WORKLOADS, Sweep, SweepConfig
from treewy.tree import STATE_MODES


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def add_arguments(p) -> None:
    add_server_arguments(p)
    p.add_argument("--workloads", default="balanced-chat", help=f"comma-separated: {', '.join(WORKLOADS)}")
    p.add_argument("--modes", default=",".join(STATE_MODES), help="comma-separated: store_all,reconstruct")
    p.add_argument("--concurrency", type=_csv(int), default=[], help="closed-loop points, e.g. 1,8,32")
    p.add_argument("--request-rate", type=_csv(float), default=[], help="open-loop points (req/s), e.g. 2,8")
    p.add_argument("--num-prompts", type=int, default=200, help="requests per load point (at least)")
    p.add_argument("--prompts-per-concurrency", type=int, default=0,
                   help="closed loops send max(--num-prompts, this x concurrency) requests, e.g. 1 for one wave")
    p.add_argument("--dataset-dir", help="folder with ShareGPT / Spec-Bench files for the workloads read from disk")
    p.add_argument("--out", default="results/serving.parquet", help="the tidy table (parquet)")
    p.add_argument("--result-dir", help="vllm bench serve result JSONs and server logs (default: next to --out)")
    p.add_argument("--device", help="the device column (default: the GPU name nvidia-smi reports)")
    p.add_argument("--point-timeout", type=float, default=3600.0)
    p.add_argument("--metrics-interval", type=float, default=0.5, help="seconds between /metrics scrapes")
    p.add_argument("--retry-failed", action="store_true", help="rerun points recorded as failed")
    p.add_argument("--max-restarts", type=int, default=1, help="restarts of a server that dies mid-sweep, per mode")
    p.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                   help="start no point after this many seconds; rerun the same command to resume")
    p.add_argument("--show-server-log", action="store_true", help="stream the server log to the terminal")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: more arguments passed to vllm serve, e.g. -- --load-format dummy")


def run(args) -> int:
    try:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in STATE_MODES]
        if bad or not modes:
            raise ServeError(f"--modes {args.modes!r}: expected a comma-separated subset of {', '.join(STATE_MODES)}")
        opts, name = options_from_args(args, modes[0])
        for m in modes:  # every mode's command must be valid before anything starts
            build_command(replace(opts, mode=m))
        out = Path(args.out)
        cfg = SweepConfig(server=opts, model_name=name, workloads=[w.strip() for w in args.workloads.split(",") if w.strip()],
                          modes=modes, concurrencies=args.concurrency, request_rates=args.request_rate,
                          num_prompts=args.num_prompts, prompts_per_concurrency=args.prompts_per_concurrency, out=out,
                          result_dir=Path(args.result_dir) if args.result_dir else None,
                          dataset_dir=args.dataset_dir, device=args.device or "unchecked",
                          health_timeout=args.health_timeout, point_timeout=args.point_timeout,
                          metrics_interval=args.metrics_interval, retry_failed=args.retry_failed,
                          max_restarts=args.max_restarts, echo_server_log=args.show_server_log,
                          stop_after_s=args.stop_after)
        cfg.points()  # load points and workloads are checked before anything starts
        for w in cfg.workloads:
            WORKLOADS[w].bench_args(cfg.dataset_dir)  # missing dataset files fail now, not mid-sweep
        sweep = Sweep(cfg, log=lambda m: print(f"treewy bench-serve: {m}", file=sys.stderr, flush=True))
        sweep.stop_leftover_server()  # before the preflight finds its port in use
        device = preflight(opts, gpu_check=not args.no_gpu_check)
        cfg.device = args.device or device
        ran, failed = sweep.run(progress=not args.no_progress)
        frame = sweep.write_table()
        n_err = int(frame["error"].is_not_null().sum())
        n_warn = int(frame["acceptance_warning"].is_not_null().sum())
        print(f"treewy bench-serve: {ran} point(s) run now, {failed} failed; {frame.height} row(s) in {out}"
              + (f" ({n_err} failed: see the error column; rerun with --retry-failed)" if n_err else "")
              + (f"; at {n_warn} point(s) vLLM's acceptance strayed beyond noise from the requested "
                 f"{acceptance_of(opts).describe()}: see the acceptance_warning column" if n_warn else ""))
        return 1 if n_err else 0
    except (ServeError, ValueError) as e:
        print(f"treewy bench-serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("treewy bench-serve: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
