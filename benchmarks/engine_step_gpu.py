"""The engine's decode step, eager against captured (issue 28), on the tiny checkpoint, and notebook 04's sweep.

    python -m benchmarks.engine_step_gpu --out $OUT            # an H200: about 4-5 minutes, compilation included
    python -m benchmarks.engine_step_gpu --out /tmp/x --smoke  # the CPU: a toy model, the static step uncaptured
    python -m benchmarks.engine_step_gpu --out /tmp/x --device cpu --deadline 1500   # the tiny checkpoint on a CPU

1. Per-step wall and GPU time at B = 1 and B = 32 for plain decoding, the paper's chain (1, 1, 1) and the tree
   (3, 3, 3) (MTP drafts, reconstruct), each through the eager loop (``graphs=False``) and the captured step
   (``graphs=True``): wall = the median of StepStat.step_ms over a decode after a warm-up decode; GPU = the CUDA
   kernels' time in a torch.profiler trace of a third decode, per step; for a captured engine also the median
   of back-to-back graph replays timed by CUDA events. Both decodes must emit the same tokens (checked).
   On the CPU (``--device cpu``, ``--smoke``) the static step runs uncaptured and there is no GPU time.
2. Notebook 04's acceptance sweep end to end (``treewy.experiments.acceptance.sweep``, as SweepPanel calls it:
   16 held-out prompts, 48 new tokens, the paper's shapes and chains k = 1..6, both modes, per drafter): cold
   (a fresh process with an empty Triton cache: compiling, autotuning, capturing), warm from disk (a second fresh
   process on that cache) and warm in process (the same sweep again, the engines kept).

Writes engine_step.json and engine_step.txt (device and date in both) under --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import treewy  # noqa: F401  (before triton: the interpreter on a machine without a GPU)
from benchmarks.common import log

CASES = [("plain", None, None), ("chain (1, 1, 1)", "mtp", (1, 1, 1)), ("tree (3, 3, 3)", "mtp", (3, 3, 3))]


def _model(smoke: bool, device: str, dtype):
    from treewy.models import build, load, tiny_config
    from treewy.models.train_tiny import SIZES
    if smoke:
        return build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=3).to(device)
    return load("tiny", dtype=dtype, device=device)


def _prompts(n: int, smoke: bool):
    from treewy.models.corpus import heldout_prompts
    return [[256] + list(range(100, 100 + 6 + b)) for b in range(n)] if smoke else heldout_prompts(n, 96, seed=0)


def _kernel_ms(prof) -> float | None:
    """The CUDA kernels' (and copies') time in a profile, ms; None without CUDA events."""
    from torch.autograd import DeviceType
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith("treewy.")]
    return sum(e.device_time for e in evs) / 1e3 if evs else None


def _replay_ms(model, reps: int = 50) -> float | None:
    """The median over back-to-back replays of the engine just used, ms per replay (CUDA events)."""
    from treewy.decode_graph import engines
    graphs = [e.graph for e in engines(model).values() if e.graph is not None]
    if not graphs:
        return None
    g = graphs[-1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def step_rows(model, smoke: bool, batches, new: int, deadline: float) -> list[dict]:
    from tqdm import tqdm

    from treewy.decode import generate
    from treewy.decode_graph import drop_engines
    cuda = next(model.parameters()).is_cuda
    paths = [("eager", False), ("captured", True)] if cuda else [("eager", False), ("static", "static")]
    rows = []
    jobs = [(c, B, p) for c in CASES for B in batches for p in paths]
    for (name, drafter, tree), B, (path, graphs) in tqdm(jobs, desc="step times"):
        if time.time() > deadline:
            log(f"deadline: skipped {name} B = {B} {path}")
            continue
        prompts = _prompts(B, smoke)
        kw = dict(drafter=drafter, tree=tree, max_new_tokens=new, graphs=graphs)
        drop_engines(model)
        t0 = time.perf_counter()
        generate(model, prompts, **kw)                                   # compiles, tunes, captures
        first_s = time.perf_counter() - t0
        res = generate(model, prompts, **kw)
        per_step = {}
        for s in res.steps:
            per_step.setdefault(s.step, s.step_ms)
        gpu = None
        if cuda:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                again = generate(model, prompts, **kw)
            gpu = _kernel_ms(prof)
        else:   # no device time to trace on the CPU
            again = generate(model, prompts, **kw)
        steps = len(per_step)
        rows.append(dict(case=name, B=B, path=path, steps=steps, acceptance=round(res.acceptance_length, 3),
                         step_ms=statistics.median(per_step.values()),
                         gpu_ms=None if gpu is None else gpu / steps,
                         replay_ms=_replay_ms(model) if graphs is True else None,
                         first_decode_s=first_s, same_tokens=again.tokens == res.tokens))
        r = rows[-1]
        gpu_text = "-" if gpu is None else f"{r['gpu_ms']:.3f}"
        tqdm.write(f"{name:16s} B = {B:2d} {path:8s} step {r['step_ms']:8.2f} ms  gpu {gpu_text} ms  "
                   f"first decode {first_s:.1f} s")
    return rows


def _sweep_times(model, smoke: bool, repeats: int) -> list[float]:
    """Seconds per run of notebook 04's sweep (both drafters), ``repeats`` runs in this process."""
    from treewy.experiments.acceptance import CHAINS, SHAPES, sweep
    prompts = _prompts(2 if smoke else 16, smoke)
    shapes, chains = (SHAPES[:1], CHAINS[:1]) if smoke else (SHAPES, CHAINS)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for d in ("mtp", "ngram"):
            sweep(model, prompts, drafters=[d], shapes=shapes, chains=chains, modes=("reconstruct", "store_all"),
                  max_new_tokens=8 if smoke else 48, baseline=False, progress=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def sweep_runs(args, deadline: float) -> list[dict]:
    """Cold, warm from disk and warm in process (on the CPU: two runs in this process)."""
    if args.smoke or args.device == "cpu":
        model = _model(args.smoke, "cpu", getattr(torch, args.dtype))
        cold, warm = _sweep_times(model, args.smoke, 2)
        return [dict(run="first in process", seconds=cold), dict(run="again in process", seconds=warm)]
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for label, repeats in (("cold (empty Triton cache)", 2), ("warm from disk (a new process)", 1)):
            left = deadline - time.time()
            if left < 20:
                log(f"deadline: skipped the sweep {label}")
                break
            log(f"sweep: {label}")
            cmd = [sys.executable, "-m", "benchmarks.engine_step_gpu", "--sweep-child", str(repeats),
                   "--dtype", args.dtype, "--out", args.out]
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                log(f"the sweep {label} passed the deadline")
                break
            times = [float(x) for x in p.stdout.split("SWEEP_SECONDS")[-1].split()] if p.returncode == 0 else []
            if not times:
                log(f"the sweep {label} failed: {p.stderr[-2000:]}")
                break
            runs.append(dict(run=label, seconds=times[0]))
            if repeats > 1:
                runs.append(dict(run="warm in process (the engines kept)", seconds=times[1]))
    return runs


def table(data: dict) -> str:
    lines = [f"# engine step, eager vs captured: {data['model']} ({data['dtype']}), {data['device']}, {data['date']}",
             f"# torch {data['torch']}, {data['new_tokens']} new tokens, MTP drafts, reconstruct; "
             "step_ms: median wall per step; gpu_ms: kernels per step (profiler); replay_ms: one graph replay",
             f"{'case':16s} {'B':>3s} {'path':9s} {'steps':>5s} {'accept':>6s} {'step_ms':>9s} {'gpu_ms':>8s} "
             f"{'replay_ms':>9s} {'wall/gpu':>8s} {'first_s':>7s} same"]
    for r in data["rows"]:
        def f(x, w, p):
            return f"{'-':>{w}s}" if x is None else f"{x:{w}.{p}f}"
        ratio = None if not r["gpu_ms"] else r["step_ms"] / r["gpu_ms"]
        lines.append(f"{r['case']:16s} {r['B']:3d} {r['path']:9s} {r['steps']:5d} {r['acceptance']:6.2f} "
                     f"{f(r['step_ms'], 9, 3)} {f(r['gpu_ms'], 8, 3)} {f(r['replay_ms'], 9, 3)} {f(ratio, 8, 2)} "
                     f"{f(r['first_decode_s'], 7, 2)} {r['same_tokens']}")
    lines.append("")
    lines.append(f"# notebook 04's acceptance sweep end to end ({data['sweep']['what']})")
    lines += [f"{r['run']:40s} {r['seconds']:8.1f} s" for r in data["sweep"]["runs"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="the CPU: a toy model, small sizes, no capture")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the tiny checkpoint's eager and static (uncaptured) steps on this CPU")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights (notebooks: fp32)")
    ap.add_argument("--deadline", type=float, default=330.0, help="seconds; stages past it are skipped")
    ap.add_argument("--sweep-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.sweep_child is not None:   # a fresh process of sweep_runs
        times = _sweep_times(_model(False, "cuda", dtype), False, args.sweep_child)
        print("SWEEP_SECONDS", *times, flush=True)
        return 0
    device = "cpu" if args.smoke else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("engine_step_gpu: error: no CUDA device; pass --device cpu (the tiny checkpoint) or --smoke",
              file=sys.stderr)
        return 2
    deadline = time.time() + args.deadline
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = _model(args.smoke, device, dtype)
    new = 4 if args.smoke else 48
    rows = step_rows(model, args.smoke, (2,) if args.smoke else (1, 32), new,
                     deadline - 150 * (device == "cuda"))   # on a GPU, leave the sweep's subprocesses their time
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    from treewy.experiments.acceptance import device_name
    data = dict(model="toy (random weights)" if args.smoke else "tiny", dtype=args.dtype,
                device=device_name(device), date=str(datetime.date.today()), torch=torch.__version__,
                new_tokens=new, rows=rows,
                sweep=dict(what="2 prompts, 8 tokens, one shape and one chain (smoke)" if args.smoke else
                           "16 prompts, 48 tokens, 7 shapes + 6 chains, both modes, both drafters",
                           runs=sweep_runs(args, deadline)))
    (out / "engine_step.json").write_text(json.dumps(data, indent=1))
    text = table(data)
    (out / "engine_step.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
