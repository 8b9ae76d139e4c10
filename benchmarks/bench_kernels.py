"""The tree-verification targets (issue 14), measured in one run on one GPU.

    python -m benchmarks.bench_kernels --out DIR            # or: OUT=DIR python -m benchmarks.bench_kernels
    python -m benchmarks.bench_kernels --smoke --out DIR    # CPU, Triton interpreter, tiny shapes: runs end to end

One GDN layer of Qwen3.5-35B-A3B per step (H = 16, HV = 32, K = V = 128); bf16 q, k, v; fp32 g, beta; fp32
state unless said; the previous step's commit folded into the verify; medians of CUDA-graph replays. Printed
as measured and written to DIR/targets_<device>_<date>.txt and .json (rewritten after every section, so a run
cut short keeps what it measured):

- every target row with pass/fail, scored on the kernel the default choice runs (``select_kernel``); every
  other candidate family timed beside it, and a check that the choice is the fastest;
- launches per GDN layer per step (counted by the profiler), bytes moved against the roofline (the state read
  and written once plus the window's inputs and outputs, at the H200's 4.27 TB/s copy bandwidth);
- fla-core's fused_recurrent over the same 4 tokens (target 5; skipped with a note when fla is not importable);
- item 9: the times with exact fp32 products forced, as on GPUs without tf32 (before the exactness runs, which a
  --deadline cuts first);
- captured vs eager: a captured step launches the eager step's kernels and replays to its results; eager times;
- the autotuner's tunings (keyed by batch bucket, not batch size);
- exactness: 200 folded steps on every kernel a row uses, in each precision a row uses (tf32 split, and exact
  fp32 forced as on GPUs without tf32), committed state within 1e-5 of the fp64 recurrence; plain tf32 for
  the record; bf16 outputs within twice the error of rounding the inputs alone.

--smoke runs the same sections with tiny shapes under the Triton interpreter (no CUDA graphs, no profiler,
planned launch counts, times that are not timings) so the script is tested without a GPU, and the same way on a
machine with one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

# --smoke runs under the interpreter on any machine: its tensors live on the CPU, and a GPU machine leaves the
# interpreter off. Triton reads the switch when it is first imported (through treewy below), so it is set here.
SMOKE_FLAGS = ("--smoke", "--toy")
if __name__ == "__main__" and any(a in SMOKE_FLAGS for a in sys.argv[1:]):
    os.environ["TRITON_INTERPRET"] = "1"

from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

import treewy  # noqa: F401  (before triton: the interpreter switch where there is no GPU)
from treewy.bench.parity import folded_drift
from treewy.bench.registry import SMOKE_B, SMOKE_DIMS, get_op, measure
from treewy.bench.timing import COPY_BW, MODELS, make, target_result
from treewy.ops import PendingCommit, naive_tree_verify, tree_verify
from treewy.ops._triton import INTERPRET
from treewy.ops.verify import LAUNCHES, select_kernel
from treewy.ops.verify import kernel as verify
from treewy.ops.verify.tuning import PRECISION_ENV
from treewy.results import publish
from treewy.testing import rel_err
from treewy.tree import DraftTree

ROWS = [  # key, target, tree widths, B, state dtype, bar (us)
    ("333 B256", "1 (3,3,3), B=256", (3, 3, 3), 256, torch.float32, 600.0),
    ("222 B256", "2 (2,2,2), B=256", (2, 2, 2), 256, torch.float32, 450.0),
    ("chain3 B64", "3 chain k=3, B=64", (1, 1, 1), 64, torch.float32, 90.0),
    ("333 B64", "3 (3,3,3), B=64", (3, 3, 3), 64, torch.float32, 180.0),
    ("333 B1", "4 (3,3,3), B=1", (3, 3, 3), 1, torch.float32, 15.0),
    ("chain3 B1", "4 chain k=3, B=1", (1, 1, 1), 1, torch.float32, 5.5),
    ("chain3 B256", "5 chain k=3, B=256", (1, 1, 1), 256, torch.float32, 300.0),
    ("chain3 B256 bf16", "6 bf16 state, chain k=3, B=256", (1, 1, 1), 256, torch.bfloat16, 200.0),
]
DRIFT_BAR = 1e-5
VERIFY = get_op("verify")


def target(name, measured, bar, ok, unit=""):
    return {"target": name, "measured": float(measured), "bar": bar, "ok": bool(ok), "unit": unit}


def tree_of(widths):
    return DraftTree.from_widths(widths)


def is_chain(tree):
    return tree.max_depth == tree.num_nodes - 1


def candidates(tree, B, state_dtype=torch.float32):
    """The selected family first, then the others that can run the window (chains: chain, path and dense; trees:
    both path launches and dense)."""
    chosen = select_kernel(tree.num_nodes, B, is_chain(tree), state_dtype == torch.bfloat16)
    others = ("chain", "path", "dense") if is_chain(tree) else ("path", "path_split", "dense")
    return [chosen] + [k for k in others if k != chosen]


def pinned_configs():
    """Launch configs for the drift runs (no autotuning there: many window/pending shapes, few steps each);
    each compiles for sm_90 without spills (benchmarks/compile_offline.py)."""
    from treewy.ops.verify import dense
    from treewy.ops.verify.chain import fixed_config
    from treewy.ops.verify.path import config

    return {("chain", None): fixed_config(), ("path", "tf32"): config(32, 32, 4, 1, 32, True),
            ("dense", "tf32"): dense.config(32, 4, 1), ("dense", "ieee"): dense.config(16, 4, 1),
            ("path_split", "tf32"): config(32, 32, 4, 1, 32, True),
            ("path", "tf32_plain"): config(32, 32, 4, 1, 32, True), ("path", "ieee"): config(16, 32, 4, 1, 32, False)}


@contextmanager
def env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextmanager
def recording():
    """The kernel families the launcher runs, in order (the launcher's module names, wrapped)."""
    calls = []
    with mock.patch.object(verify, "chain_fwd", side_effect=lambda *a, _f=verify.chain_fwd, **k: (
            calls.append("chain"), _f(*a, **k))[1]), \
         mock.patch.object(verify, "path_fwd", side_effect=lambda *a, _f=verify.path_fwd, **k: (
            calls.append("path_split" if k.get("split") else "path"), _f(*a, **k))[1]), \
         mock.patch.object(verify, "dense_fwd", side_effect=lambda *a, _f=verify.dense_fwd, **k: (
            calls.append("dense"), _f(*a, **k))[1]):
        yield calls


class Bench:
    def __init__(self, args, log):
        self.args, self.log, self.smoke = args, log, args.smoke
        self.device = "cpu" if self.smoke else "cuda"
        self.dims = SMOKE_DIMS if self.smoke else MODELS["35B-A3B"]
        self.cases, self.targets, self.drift, self.notes, self.extra = {}, [], {}, [], {}
        self.t0 = time.time()

    def past_deadline(self, what):
        """True (and a note) once the run is past --deadline seconds: the remaining sections are skipped."""
        late = time.time() - self.t0 > self.args.deadline
        if late:
            self.notes.append(f"{what} skipped: past the --deadline of {self.args.deadline} s")
            self.log(self.notes[-1])
        return late

    def bar(self, bar):
        """A timing target's bar; under --smoke a report (the interpreter's times are not timings)."""
        return "report: --smoke" if self.smoke else bar

    def batch(self, B):
        return SMOKE_B[B] if self.smoke else B

    def time(self, fn):
        """Median us of CUDA-graph replays; under --smoke one interpreted call (not a timing)."""
        return measure(fn, self.smoke)

    def eager_time(self, fn):
        if self.smoke:
            return self.time(fn)
        import triton
        return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")

    def launches(self, fn, kernel):
        """(kernel launches of one call, how counted, {kernel name: us} of that eager call) by the profiler; the
        family's planned count (and no times) under --smoke."""
        if self.smoke:
            return LAUNCHES[kernel], "planned", {}
        try:
            from torch.profiler import ProfilerActivity, profile

            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            times = {}
            for e in events:
                times[e.name] = times.get(e.name, 0.0) + e.time_range.elapsed_us()
            return len(events), "profiled", times
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"launch count by profiler failed ({e!r}); planned counts reported")
            return LAUNCHES[kernel], "planned", {}

    def inputs(self, tree, B, state_dtype):
        return VERIFY.inputs(tree, B, self.dims, state_dtype, self.device,
                             torch.float32 if self.smoke else torch.bfloat16)

    def step(self, key, tree, B, state_dtype, kernel, dot_precision=None):
        """One folded TreeWY step: time, launches, bytes; the row is stored under ``key [kernel]``."""
        d = self.dims
        x = self.inputs(tree, B, state_dtype)
        fn = VERIFY.step("treewy", x, tree, kernel=kernel, dot_precision=dot_precision)
        us = self.time(fn)
        n, how, kernel_us = self.launches(fn, kernel)
        nbytes = VERIFY.min_bytes("treewy", tree, B, d, state_dtype)
        row = dict(key=key, kernel=kernel, T=tree.num_nodes, B=B, state_dtype=str(state_dtype).removeprefix("torch."),
                   dot_precision=dot_precision, us=us, launches=n, launches_how=how, kernel_us=kernel_us,
                   min_bytes=nbytes,
                   roofline_us=nbytes / COPY_BW * 1e6, roofline_fraction=nbytes / COPY_BW * 1e6 / us,
                   gbps=nbytes / (us * 1e-6) / 1e9)
        self.cases[f"{key} [{kernel}]" + (f" {dot_precision}" if dot_precision else "")] = row
        self.log(f"{key:18s} [{kernel:5s}]{' ' + dot_precision if dot_precision else '':6s} {us:10.1f} us  "
                 f"{n} launch(es)  roofline {row['roofline_us']:.1f} us ({row['roofline_fraction']:.2f})")
        del x, fn
        if not self.smoke:
            torch.cuda.empty_cache()
        return row

    def provider(self, key, provider, tree, B):
        """A non-TreeWY step (fla's fused_recurrent, our store-all kernel) for comparison."""
        d = self.dims
        if provider == "fla":
            try:
                import fla  # noqa: F401
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"fla rows skipped: fla-core not importable ({e!r})")
                self.log(self.notes[-1])
                return None
        x = self.inputs(tree, B, torch.float32)
        us = self.time(VERIFY.step(provider, x, tree))
        nbytes = VERIFY.min_bytes(provider, tree, B, d, torch.float32)
        self.cases[key] = dict(key=key, kernel=provider, T=tree.num_nodes, B=B, state_dtype="float32", us=us,
                               min_bytes=nbytes, roofline_us=nbytes / COPY_BW * 1e6,
                               roofline_fraction=nbytes / COPY_BW * 1e6 / us)
        self.log(f"{key:18s} [{provider}] {us:10.1f} us  roofline {nbytes / COPY_BW * 1e6:.1f} us")
        return us


def measure_rows(b: Bench, write):
    worst_launches = 0
    for key, name, widths, B, sdt, bar in ROWS:
        tree, B = tree_of(widths), b.batch(B)
        rows = [b.step(key, tree, B, sdt, k) for k in candidates(tree, B, sdt)]
        chosen, best = rows[0], min(rows, key=lambda r: r["us"])
        worst_launches = max(worst_launches, chosen["launches"])
        b.targets.append(target(f"{name} (us) [{chosen['kernel']}, {chosen['launches']} launch(es)]", chosen["us"],
                                b.bar(f"<= {bar:g}"), chosen["us"] <= bar, "us"))
        if len(rows) > 1:
            b.targets.append(target(f"  {key}: the chosen kernel is the fastest (us of the fastest, "
                                    f"{best['kernel']})", best["us"], b.bar("= chosen"), best is chosen, "us"))
        write(b)
    b.targets.append(target("7 launches per GDN layer per step (most over the rows, as chosen)", worst_launches,
                            "<= 3", worst_launches <= 3))
    chain256 = b.cases.get(f"chain3 B256 [{candidates(tree_of((1, 1, 1)), b.batch(256))[0]}]")
    tree = tree_of((1, 1, 1))
    fla = b.provider("fla chain3 B256", "fla", tree, b.batch(256)) if not b.smoke else None
    if b.smoke:
        b.notes.append("fla rows skipped: --smoke (fla's kernels are not run under the interpreter here)")
    if fla and chain256:
        b.targets.append(target("5 chain k=3, B=256 / fla fused_recurrent over the same 4 tokens",
                                chain256["us"] / fla, "<= 1.00", chain256["us"] <= fla, "x"))
    b.provider("store_all chain3 B256", "store_all", tree, b.batch(256))
    write(b)


def capture_vs_eager(b: Bench, write):
    """Item 8: the kernel a captured step launches is the eager one; replays equal eager; eager vs graph time."""
    for widths in ((1, 1, 1), (3, 3, 3)):
        tree, B = tree_of(widths), b.batch(256)
        T = tree.num_nodes
        x = b.inputs(tree, B, torch.float32)
        q, k, v, g, beta, S = x
        par = tree.parents.to(b.device, torch.int32)
        _, u0 = naive_tree_verify(q.double(), k.double(), v.double(), g.double(), beta.double(), S.double(), par)
        acc = torch.randint(0, T, (B,), device=b.device, dtype=torch.int32)
        pend = PendingCommit(u0.float(), k, g, par, acc)
        with recording() as calls:
            state = S.clone()
            eo, eu = tree_verify(q, k, v, g, beta, state, tree, pending=pend)
            eager_calls = list(calls)
            calls.clear()
            if b.smoke:
                with mock.patch.object(verify, "is_capturing", lambda: True):
                    tree_verify(q, k, v, g, beta, S.clone(), par, pending=pend, chain=is_chain(tree),
                                max_depth=tree.max_depth)
                same_results = None
            else:
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                cstate = S.clone()
                with torch.cuda.graph(graph):  # device parents and the chain flag: no host reads in a capture
                    co, cu = tree_verify(q, k, v, g, beta, cstate, par, pending=pend, chain=is_chain(tree),
                                         max_depth=tree.max_depth)
                cstate.copy_(S)
                graph.replay()
                torch.cuda.synchronize()
                same_results = bool(torch.equal(co, eo) and torch.equal(cu, eu) and torch.equal(cstate, state))
            captured_calls = list(calls)
        key = f"{'chain k=3' if is_chain(tree) else '(3,3,3)'}, B={B}"
        b.log(f"capture {key}: eager {eager_calls}, captured {captured_calls}, same results {same_results}")
        b.targets.append(target(f"8 captured step runs the eager kernels, {key} ({'+'.join(eager_calls)})",
                                captured_calls == eager_calls, "= eager", captured_calls == eager_calls))
        if same_results is not None:
            b.targets.append(target(f"8 captured replay equals the eager step bit for bit, {key}", same_results,
                                    "= eager", same_results))
        kernel = eager_calls[0]
        fn = VERIFY.step("treewy", x, tree, kernel=kernel)
        eager_us = b.eager_time(fn)
        graph_us = b.cases.get(f"{'chain3' if is_chain(tree) else '333'} B256 [{kernel}]", {}).get("us")
        b.extra[f"eager {key}"] = dict(eager_us=eager_us, graph_us=graph_us)
        b.targets.append(target(f"8 eager (no graph) step, {key} [{kernel}] (us)", eager_us,
                                "report" + (f": graph {graph_us:.1f}" if graph_us else ""), True, "us"))
        del x
    # per autotuned kernel (the families share the path kernel: "path_split" is it with HAS_TABLES in the key)
    kernels = {f.fn.__name__: f for fns in verify.KERNEL_FNS.values() for f in fns}
    tunings = {n: len(getattr(f, "cache", {})) for n, f in kernels.items()}
    b.extra["autotune tunings"] = tunings
    b.extra["autotune picks"] = {n: {str(key): str(cfg) for key, cfg in getattr(f, "cache", {}).items()}
                                 for n, f in kernels.items()}
    for n, picks in b.extra["autotune picks"].items():
        for key, cfg in picks.items():
            b.log(f"autotune {n}: {cfg} for {key}")
    batches = sorted({b.batch(B) for *_, B, _s, _b in ROWS})
    b.targets.append(target(f"8 autotune tunings ({', '.join(tunings)}) over batch sizes {batches}",
                            sum(tunings.values()), f"report: {tunings}", True))
    write(b)


def exactness(b: Bench, write):
    """200 folded steps on every kernel a row uses, per precision; outputs with bf16 inputs."""
    d = b.dims
    steps = 4 if b.smoke else b.args.drift_steps
    pins = {} if b.smoke else pinned_configs()
    chain3, t222, t333, chain1 = tree_of((1, 1, 1)), tree_of((2, 2, 2)), tree_of((3, 3, 3)), DraftTree.chain(1)
    runs = [("chain", None, [chain3, chain1], steps), ("dense", "tf32", [t333, t222, chain3], steps),
            ("dense", "ieee", [t333, chain3], steps), ("path", "tf32", [t333, t222, chain3], steps),
            ("path_split", "tf32", [t333, t222], steps), ("path", "ieee", [t333, chain3], steps),
            ("path", "tf32_plain", [t333], max(2, steps // 4))]
    for kernel, prec, trees, n in runs:
        label = f"{kernel}" + (f" {prec}" if prec else "")
        if b.past_deadline(f"drift {label}"):
            continue
        r = folded_drift(n, B=2 if b.smoke else 4, H=d["H"], HV=d["HV"], K=d["K"], V=d["V"], trees=trees,
                         device=b.device, input_dtype=torch.float32 if b.smoke else torch.bfloat16, kernel=kernel,
                         dot_precision=prec, config=pins.get((kernel, prec)), check_every=max(1, n // 10))
        b.drift[label] = {k: v for k, v in r.items() if k != "history"}
        b.log(f"drift {label}, {n} steps: state {r['state_err']:.2e}, outputs {r['out_err']:.2e}")
        plain = prec == "tf32_plain"
        b.targets.append(target(f"exact: state error after {n} folded steps, {label} "
                                f"({', '.join(str(t.num_nodes) for t in trees)}-node windows)", r["state_err"],
                                "report" if plain else f"<= {DRIFT_BAR:g}", plain or r["state_err"] <= DRIFT_BAR))
        write(b)
    if b.smoke:
        b.notes.append("bf16 output bound skipped: --smoke (the Triton interpreter mishandles bf16)")
    elif not b.past_deadline("bf16 output bound"):
        bf16_outputs(b)
    write(b)


def exact_fp32_rows(b: Bench, write):
    """Item 9: the rows timed with exact fp32 products forced, as on a GPU without tf32 (the tree's own choice
    under that precision; the chain on the path kernel)."""
    for key, widths, kernel in (("333 B256", (3, 3, 3), None), ("chain3 B256", (1, 1, 1), "path")):
        if b.past_deadline(f"exact fp32 forced, {key}"):
            continue
        tree = tree_of(widths)
        kernel = kernel or select_kernel(tree.num_nodes, b.batch(256), is_chain(tree), exact=True)   # its choice
        with env(PRECISION_ENV, "ieee"):  # the default precision becomes exact fp32, as on a GPU without tf32
            r = b.step(f"{key} {PRECISION_ENV}=ieee", tree, b.batch(256), torch.float32, kernel)
        b.targets.append(target(f"9 exact fp32 forced ({PRECISION_ENV}=ieee), {key} [{kernel}] (us)", r["us"],
                                "report", True, "us"))
        write(b)


def bf16_outputs(b: Bench):
    """bf16 q, k, v: the error against the fp64 reference on the unrounded inputs, against twice the error of
    rounding the inputs alone (the fp64 reference on the rounded inputs); the precisions' output errors."""
    d = b.dims
    for widths, kernel in (((1, 1, 1), "chain"), ((1, 1, 1), "path"), ((3, 3, 3), "path"), ((3, 3, 3), "path_split"),
                           ((1, 1, 1), "dense"), ((2, 2, 2), "dense"), ((3, 3, 3), "dense")):
        tree = tree_of(widths)
        x = make(4, tree.num_nodes, d["H"], d["HV"], d["K"], d["V"], torch.float32, device="cuda",
                 input_dtype=torch.float32)
        ro, ru = naive_tree_verify(*[t.double() for t in x], tree)
        bf = [t.bfloat16() for t in x[:3]] + list(x[3:5])
        rounded_o, rounded_u = naive_tree_verify(*[t.double() for t in bf], x[5].double(), tree)
        o, u = tree_verify(*bf, x[5].clone(), tree, kernel=kernel)
        bound_o, bound_u = 2 * rel_err(rounded_o, ro), 2 * rel_err(rounded_u, ru)
        err_o, err_u = rel_err(o, ro), rel_err(u, ru)
        b.log(f"bf16 {widths} [{kernel}]: o {err_o:.2e} (bound {bound_o:.2e}), u {err_u:.2e} (bound {bound_u:.2e})")
        b.targets.append(target(f"bf16 inputs, {widths} [{kernel}]: output error", err_o, f"<= {bound_o:.2e}",
                                err_o <= bound_o))
        b.targets.append(target(f"bf16 inputs, {widths} [{kernel}]: u error", err_u, f"<= {bound_u:.2e}",
                                err_u <= bound_u))
        if widths == (3, 3, 3):
            for prec in ("tf32", "ieee", "tf32_plain"):
                po, pu = tree_verify(*x[:5], x[5].clone(), tree, kernel=kernel, dot_precision=prec)
                b.targets.append(target(f"fp32 inputs, {widths} [{kernel} {prec}]: output / u error",
                                        max(rel_err(po, ro), rel_err(pu, ru)), "report", True))


def fmt(head, b: Bench):
    lines = [head, "", f"{'target':84s} {'measured':>10s}  {'bar':>14s}  result", "-" * 120]
    for t in b.targets:
        m = t["measured"]
        ms = f"{m:10.3g}" if (m and (abs(m) < 1e-2 or abs(m) >= 1e4)) else f"{m:10.2f}"
        lines.append(f"{t['target']:84s} {ms}  {t['bar']:>14s}  {target_result(t)}")
    lines += ["", f"{'case':34s} {'us':>9s} {'launch':>6s} {'roof us':>8s} {'frac':>5s} {'GB/s':>6s}",
              "-" * 76]
    for key, r in b.cases.items():
        lines.append(f"{key:34s} {r['us']:9.1f} {r.get('launches', '-')!s:>6s} {r['roofline_us']:8.1f} "
                     f"{r['roofline_fraction']:5.2f} {r.get('gbps', float('nan')):6.0f}")
    split = [(key, r) for key, r in b.cases.items() if len(r.get("kernel_us") or {}) > 1]
    if split:   # where a step takes more than one launch: each kernel's share (profiler, one eager call)
        lines += ["", "per kernel (profiler, one eager call, us):"]
        lines += [f"  {key}: " + ", ".join(f"{name} {t:.1f}" for name, t in r["kernel_us"].items()) for key, r in split]
    lines += [""] + [f"note: {n}" for n in b.notes]
    return "\n".join(lines) + "\n"


def main(argv=None):
    # no abbreviations: the interpreter switch above recognizes --smoke and --toy spelled out
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="output directory (default: $OUT)")
    ap.add_argument("--drift-steps", type=int, default=200)
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="seconds after which the remaining exactness sections are skipped (noted in the table)")
    ap.add_argument(*SMOKE_FLAGS, action="store_true",
                    help="tiny shapes on the CPU under the Triton interpreter: checks the script, measures nothing")
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("give --out DIR or set $OUT")
    if args.smoke and not INTERPRET:   # main() called from Python after triton was imported without the interpreter
        ap.error("--smoke runs under the Triton interpreter: run the script itself, or set TRITON_INTERPRET=1 "
                 "before anything imports triton")
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU; --smoke runs it on the CPU under the Triton interpreter")
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)  # noqa: E731
    dev = "CPU (Triton interpreter, --smoke: not timings)" if args.smoke else torch.cuda.get_device_name()
    date = str(datetime.date.today())
    tag = "smoke" if args.smoke else dev.split()[-1].lower()
    head = (f"{dev}, {date}, torch {torch.__version__}, triton {triton.__version__}; one GDN layer per step, "
            f"{'fp32 inputs, tiny shapes' if args.smoke else 'bf16 inputs, Qwen3.5-35B-A3B shapes'}, fp32 state "
            f"unless said, {'one interpreted call' if args.smoke else 'medians of CUDA-graph replays'}; roofline at "
            f"{COPY_BW / 1e12:.2f} TB/s")
    b = Bench(args, log)

    def write(bench):
        text = fmt(head, bench)
        (args.out / f"targets_{tag}_{date}.txt").write_text(text)
        (args.out / f"targets_{tag}_{date}.json").write_text(json.dumps(
            dict(device=dev, date=date, torch=torch.__version__, triton=triton.__version__,
                 seconds=round(time.time() - t0), smoke=args.smoke, targets=bench.targets, rows=bench.cases,
                 drift=bench.drift, extra=bench.extra, notes=bench.notes), indent=1, default=str))
        return text

    measure_rows(b, write)
    exact_fp32_rows(b, write)   # before the drift runs, which the --deadline cuts first
    if not b.past_deadline("captured vs eager"):
        capture_vs_eager(b, write)
    exactness(b, write)
    print(write(b))
    log(f"done; wrote {args.out}/targets_{tag}_{date}.txt and .json")
    if not args.smoke:   # the table the package reads from now on (treewy/data/index.json, "kernel_targets")
        log(f"published {publish('kernel_targets', args.out / f'targets_{tag}_{date}.json')}")


if __name__ == "__main__":
    main()
