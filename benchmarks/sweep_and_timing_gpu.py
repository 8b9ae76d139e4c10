"""One GPU run that explains the engine's per-step time: a profile, per-step times by phase, the full
acceptance sweep and the cross-checks, on the committed tiny checkpoint (no training).

    python -m benchmarks.sweep_and_timing_gpu --out DIR
    python -m benchmarks.sweep_and_timing_gpu --out /tmp/x --toy     # CPU end-to-end check

Writes into DIR (every table as .jsonl, and as .parquet where polars or pyarrow imports):
  summary.json  environment, stage times and errors, the backend cross-check (Triton vs torch tokens and
                accepted nodes, 4 prompts, store_all and both reconstruct launchers), bf16-vs-fp32 divergence
  profile.txt   torch.profiler (CPU + CUDA) of decoding at B = 1, bf16, Triton kernels, after a warm-up:
                plain, store_all (2,2,2), reconstruct (2,2,2) with each launcher; top 25 ops by self CPU
                time and by CUDA time, then the phase medians of a timing="phases" run
  timing.*      per-step time at B = 1 and B = 32, bf16 weights, fp32 GDN state, Triton kernels, eager:
                plain decoding and the 7 tree shapes x {store_all, reconstruct with each launcher}, MTP
                drafts. Each configuration is warmed up first (a short generate of three steps or more, so
                Triton compilation and autotuning, with and without a pending commit, stay out of the
                measured steps). step_ms_median (and _p90, _max, the Python garbage collections during
                the run) come from a run with two device syncs per step; {draft,verify,accept,commit,
                host}_ms_median and phases_step_ms_median from a second run with timing="phases" (a
                sync after every phase)
  sweep.*       acceptance sweep, fp32, 32 held-out prompts x 48 new tokens, Triton kernels: the plain row,
                MTP and n-gram drafters on the 7 shapes and chains k = 1..6, both modes (53 rows), run in the
                order plain, MTP (both modes), n-gram reconstruct, n-gram store_all: a sweep cut by its
                budget loses n-gram store_all rows first, whose acceptance equals the reconstruct rows'
                (both modes accept the same nodes)

Reconstruct launchers: "flush+verify" (treewy.models.backends.flush_then_verify: the pending commit by
the commit kernel, then the verify kernel) and "fused" (tree_verify_fwd with pending=: one launch).
Each stage has a wall-time budget (--budgets) inside a total deadline (--deadline); a stage out of time
stops starting configurations, and a failing stage is recorded in summary.json without stopping the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.common import backend_check, divergence, environment, log, write_rows

ROOT = Path(__file__).resolve().parents[1]

BUDGETS = dict(check=35, profile=40, timing=150, divergence=20, sweep=145)
PROFILE_TREE = (2, 2, 2)


class Run:
    """What the stages share: arguments, output folder, models by dtype, prompts, summary."""

    def __init__(self, args):
        self.args, self.t0 = args, time.time()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.toy = args.toy
        self.summary = environment(self.device) | dict(args=vars(args), stages={})
        self.models: dict = {}

    def model(self, dtype):
        from treewy.models import load
        if dtype not in self.models:
            self.models[dtype] = load("tiny", dtype=dtype, device=self.device)
        return self.models[dtype]

    def prompts(self, n: int) -> list[list[int]]:
        from treewy.models.corpus import heldout_prompts
        base = heldout_prompts(self.args.prompts, self.args.prompt_len, seed=0)
        return (base * (n // len(base) + 1))[:n]

    def stage(self, name: str, fn) -> None:
        """Run fn(run, deadline) within the stage's budget and the total deadline; record time and errors."""
        start = time.time()
        deadline = min(start + self.args.budgets[name], self.t0 + self.args.deadline)
        info = self.summary["stages"][name] = dict(budget_s=round(deadline - start, 1))
        if deadline <= start:
            info["skipped"] = "out of time"
            log(f"{name}: skipped, out of time")
            return
        log(f"{name}: up to {deadline - start:.0f} s")
        try:
            info.update(fn(self, deadline) or {})
        except Exception as e:  # noqa: BLE001 - a failed stage must not lose the others
            info["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        info["elapsed_s"] = round(time.time() - start, 1)
        log(f"{name}: done in {info['elapsed_s']} s{' (' + info['error'] + ')' if 'error' in info else ''}")
        self.save()

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.time() - self.t0, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))


def launchers(backend: str) -> dict:
    """Reconstruct step launchers by label (one entry, "torch", on the reference backend)."""
    if backend != "triton":
        return {"torch": None}
    from treewy.models.backends import flush_then_verify, fused_step
    return {"flush+verify": flush_then_verify, "fused": fused_step}


@contextlib.contextmanager
def step_launcher(fn):
    """Decode with ``fn`` as the reconstruct step launcher (None: leave the backend's default)."""
    from treewy.models import backends
    saved = backends.STEP_LAUNCHER
    backends.STEP_LAUNCHER = fn or saved
    try:
        yield
    finally:
        backends.STEP_LAUNCHER = saved


def configs(shapes, launch: dict) -> list[tuple]:
    """(drafter, widths, mode, launcher label) of the timed configurations: plain, then per shape
    store_all and reconstruct with each launcher."""
    out = [("none", (), "none", "-")]
    for widths in shapes:
        out.append(("mtp", widths, "store_all", "-"))
        out += [("mtp", widths, "reconstruct", name) for name in launch]
    return out


def decode_kwargs(drafter, widths, mode, backend) -> dict:
    return dict(drafter=None if drafter == "none" else drafter, tree=widths or (1,),
                commit=None if mode == "none" else mode, backend=backend)


def warm_tokens(widths) -> int:
    """New tokens that take at least three steps whatever is accepted (step 2 on carries a pending commit)."""
    return 2 + 3 * (len(widths) + 1)


# ------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------

def stage_check(run: Run, deadline: float) -> dict:
    """Triton kernels vs torch references on real decoding: tokens and accepted nodes, fp32."""
    from treewy.models.backends import get_ops
    if get_ops(torch.device(run.device), "auto").name != "triton" and not run.toy:
        return dict(check="kernels not importable on this device")
    n, tree, new = (1, (2, 1), 4) if run.toy else (4, (2, 2, 2), 24)
    m32, prompts = run.model(torch.float32), run.prompts(n)
    check = dict(store_all=backend_check(m32, prompts, tree, new, modes=("store_all",))["store_all"])
    for name, fn in launchers("triton").items():
        if time.time() > deadline:
            break
        with step_launcher(fn):
            check[f"reconstruct/{name}"] = backend_check(m32, prompts, tree, new, modes=("reconstruct",))["reconstruct"]
    run.summary["kernel_check"] = check
    return dict(check=check)


def stage_profile(run: Run, deadline: float) -> dict:
    """profile.txt: op tables of a few steps per configuration at B = 1, bf16."""
    from treewy.decode import generate
    from treewy.experiments.acceptance import device_name, summarize
    m16, prompts = run.model(torch.bfloat16), run.prompts(1)
    new = 8 if run.toy else 24
    activities = [torch.profiler.ProfilerActivity.CPU]
    if run.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sections, done = [], []
    for drafter, widths, mode, name in configs([PROFILE_TREE], launchers(run.args.backend)):
        if time.time() > deadline:
            sections.append(f"(out of time before {mode} {widths} {name})\n")
            break
        title = f"{mode} {widths or ''} launcher={name}"
        kw = decode_kwargs(drafter, widths, mode, run.args.backend)
        try:
            with step_launcher(launchers(run.args.backend).get(name)):
                generate(m16, prompts, max_new_tokens=warm_tokens(widths), **kw)
                phases = generate(m16, prompts, max_new_tokens=new, timing="phases", **kw)
                with torch.profiler.profile(activities=activities) as prof:
                    res = generate(m16, prompts, max_new_tokens=new, **kw)
            row = summarize(phases, drafter=drafter, kind="tree", widths=widths, mode=mode, model_name="tiny",
                            dtype="bfloat16", backend=run.args.backend, device=device_name(run.device))
            sections.append(profile_section(title, prof, res, row))
            done.append(title)
        except Exception as e:  # noqa: BLE001 - one failed profile must not lose the others
            traceback.print_exc()
            sections.append(f"## {title}: failed: {type(e).__name__}: {e}\n")
    (run.out / "profile.txt").write_text(profile_header(run) + "\n".join(sections))
    return dict(profiled=done)


def profile_header(run: Run) -> str:
    env = run.summary
    return (f"# torch.profiler, tiny checkpoint, bf16 weights, fp32 GDN state, B = 1, backend {run.args.backend}\n"
            f"# {env.get('gpu', env['device'])}, torch {env['torch']}, triton {env['triton']}, {env['started']}\n"
            "# Each profiled generate includes its prefill (see the treewy.prefill row); the treewy.* rows\n"
            "# are the decoding phases summed over the profiled steps.\n\n")


def profile_section(title: str, prof, res, row: dict) -> str:
    steps = len({s.step for s in res.steps})
    phases = ", ".join(f"{p} {row[f'{p}_ms_median']:.2f}" for p in ("draft", "verify", "accept", "commit", "host"))
    parts = [f"## {title}: {steps} profiled steps, acceptance {res.acceptance_length:.2f}",
             f"phase medians (ms, timing='phases' run): {phases}; step {row['step_ms_median']:.2f}", ""]
    averages = prof.key_averages()
    parts += ["### top 25 by self CPU time", averages.table(sort_by="self_cpu_time_total", row_limit=25)]
    for key in ("device_time_total", "cuda_time_total"):
        try:
            parts += [f"### top 25 by CUDA time ({key})", averages.table(sort_by=key, row_limit=25)]
            break
        except (AttributeError, KeyError):
            continue
    return "\n".join(parts) + "\n"


def stage_timing(run: Run, deadline: float) -> dict:
    """timing.*: per-step times per configuration and batch size, bf16 weights."""
    from treewy.experiments.acceptance import SHAPES
    m16 = run.model(torch.bfloat16)
    shapes = SHAPES[:2] if run.toy else SHAPES
    cfgs = configs(shapes, launchers(run.args.backend))
    rows = []
    for i, B in enumerate(run.args.batches):
        share = time.time() + (deadline - time.time()) / (len(run.args.batches) - i)  # equal time per batch size
        prompts = run.prompts(B)
        for cfg in cfgs:
            if time.time() > share:
                log(f"timing: B = {B} out of time after {len(rows)} rows")
                break
            rows.append(time_config(run, m16, prompts, *cfg))
            log(f"timing B={B} {cfg[2]} {cfg[1]} {cfg[3]}: step {rows[-1]['step_ms_median']:.2f} ms, "
                f"verify {rows[-1]['verify_ms_median']:.2f} ms")
            write_rows(rows, run.out / "timing")
    return dict(rows=len(rows), files=write_rows(rows, run.out / "timing"), step_ms_median=compare(rows))


def compare(rows: list[dict]) -> list[dict]:
    """Per batch size and shape: the median step time of each mode and launcher, and reconstruct / store_all."""
    table: dict = {}
    for r in rows:
        key = r["mode"] if r["launcher"] == "-" else f"{r['mode']}/{r['launcher']}"
        table.setdefault((r["batch"], r["shape"]), dict(batch=r["batch"], shape=r["shape"]))[key] = \
            round(r["step_ms_median"], 3)
    for entry in table.values():
        for key in [k for k in entry if k.startswith("reconstruct/")]:
            if entry.get("store_all"):
                entry[f"ratio {key} / store_all"] = round(entry[key] / entry["store_all"], 3)
    return list(table.values())


def time_config(run: Run, model, prompts, drafter, widths, mode, name) -> dict:
    """One timing row: warm-up, a measured run (two syncs per step), a phases run."""
    from treewy.decode import PHASES, generate
    from treewy.experiments.acceptance import device_name, summarize
    kw = decode_kwargs(drafter, widths, mode, run.args.backend)
    new = run.args.timing_tokens
    with step_launcher(launchers(run.args.backend).get(name)):
        t = time.time()
        generate(model, prompts, max_new_tokens=warm_tokens(widths), **kw)
        warm = time.time() - t
        collections = gc_collections()
        step = generate(model, prompts, max_new_tokens=new, **kw)
        collections = gc_collections() - collections
        phases = generate(model, prompts, max_new_tokens=new, timing="phases", **kw)
    meta = dict(drafter=drafter, kind="tree" if widths else "none", widths=widths, mode=mode, model_name="tiny",
                dtype="bfloat16", backend=run.args.backend, device=device_name(run.device))
    row = summarize(step, **meta)
    by_phase = summarize(phases, **meta)
    row.update({f"{p}_ms_median": by_phase[f"{p}_ms_median"] for p in PHASES})
    per_step = sorted({s.step: s.step_ms for s in step.steps if s.step > 0}.values()) or [float("nan")]
    row.update(phases_step_ms_median=by_phase["step_ms_median"], batch=len(prompts), launcher=name,
               warmup_s=round(warm, 2), state_dtype="float32", step_ms_p90=per_step[int(0.9 * (len(per_step) - 1))],
               step_ms_max=per_step[-1], gc_collections=collections)
    return row


def gc_collections() -> int:
    """Python garbage collections so far, all generations (a pause inside a step shows as an outlier)."""
    return sum(g["collections"] for g in gc.get_stats())


def stage_divergence(run: Run, deadline: float) -> dict:
    """bf16 vs fp32 tokens: plain greedy, and (3,3,3) speculation (reconstruct)."""
    from treewy.decode import generate
    prompts, new, b = run.prompts(run.args.prompts), run.args.new_tokens, run.args.backend
    m32, m16 = run.model(torch.float32), run.model(torch.bfloat16)
    tree = (2, 1) if run.toy else (3, 3, 3)
    g32, g16 = (generate(m, prompts, max_new_tokens=new, backend=b) for m in (m32, m16))
    s16, s32 = (generate(m, prompts, drafter="mtp", tree=tree, commit="reconstruct", max_new_tokens=new, backend=b)
                for m in (m16, m32))
    run.summary["divergence"] = dict(
        tree=str(tree),
        greedy_bf16_vs_fp32=divergence(g32.tokens, g16.tokens),
        spec_bf16_vs_greedy_fp32=divergence(g32.tokens, s16.tokens),
        spec_bf16_vs_greedy_bf16=divergence(g16.tokens, s16.tokens),
        spec_fp32_equals_greedy_fp32=s32.tokens == g32.tokens,
        acceptance_fp32=s32.acceptance_length, acceptance_bf16=s16.acceptance_length,
    )
    return {}


def stage_sweep(run: Run, deadline: float) -> dict:
    """sweep.*: the acceptance sweep in fp32, n-gram store_all rows last."""
    from treewy.experiments.acceptance import CHAINS, SHAPES, sweep_rows
    shapes, chains = (SHAPES[:2], CHAINS[:2]) if run.toy else (SHAPES, CHAINS)
    m32, prompts = run.model(torch.float32), run.prompts(run.args.prompts)
    common = dict(shapes=shapes, chains=chains, max_new_tokens=run.args.new_tokens, model_name="tiny",
                  backend=run.args.backend, deadline=deadline)
    rows = []
    for drafters, modes, baseline in ((("mtp",), ("reconstruct", "store_all"), True),
                                      (("ngram",), ("reconstruct",), False), (("ngram",), ("store_all",), False)):
        rows += sweep_rows(m32, prompts, drafters=drafters, modes=modes, baseline=baseline, **common)
        write_rows(rows, run.out / "sweep")
    expected = 1 + 2 * 2 * (len(shapes) + len(chains))
    return dict(rows=len(rows), expected_rows=expected, files=write_rows(rows, run.out / "sweep"))


STAGES = dict(check=stage_check, profile=stage_profile, timing=stage_timing, divergence=stage_divergence,
              sweep=stage_sweep)


def parse_budgets(text: str) -> dict:
    budgets = dict(BUDGETS)
    for part in filter(None, text.split(",")):
        name, _, seconds = part.partition("=")
        if name not in budgets:
            raise SystemExit(f"--budgets: unknown stage {name!r}; stages: {', '.join(BUDGETS)}")
        budgets[name] = float(seconds)
    return budgets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--toy", action="store_true", help="small sizes, torch backend: a CPU end-to-end check")
    ap.add_argument("--deadline", type=float, default=390.0, help="seconds from start for all stages")
    ap.add_argument("--budgets", type=parse_budgets, default=dict(BUDGETS),
                    help="per-stage seconds, e.g. 'timing=150,sweep=140' (defaults: "
                         + ", ".join(f"{k}={v}" for k, v in BUDGETS.items()) + ")")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in this order")
    ap.add_argument("--backend", default=None, help="GDN ops: triton (default on a GPU) or torch (default with --toy)")
    ap.add_argument("--batches", default=None, help="timing batch sizes (default 1,32; toy 1,4)")
    args = ap.parse_args(argv)
    args.backend = args.backend or ("torch" if args.toy else "triton")
    args.batches = [int(b) for b in (args.batches or ("1,4" if args.toy else "1,32")).split(",")]
    sizes = (4, 48, 8, 8) if args.toy else (32, 128, 48, 32)
    args.prompts, args.prompt_len, args.new_tokens, args.timing_tokens = sizes
    if args.toy:
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    run = Run(args)
    log(f"{run.summary.get('gpu', run.device)}: torch {run.summary['torch']}, triton {run.summary['triton']}, "
        f"backend {args.backend}")
    for name in args.stages.split(","):
        run.stage(name, STAGES[name])
    run.save()
    log(f"all stages done in {time.time() - run.t0:.0f} s; wrote {sorted(p.name for p in run.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
