"""Where a decode step's time goes, TreeWY (reconstruct) vs store-all, at batches 1, 16, 32, 64, 128, 256 (one GPU).

    python -m benchmarks.profile_serving_step gdn --out $OUT                          # the GDN spec step alone
    python -m benchmarks.profile_serving_step engine --mode store_all --out $OUT      # inside vLLM 0.26, one mode
    python -m benchmarks.profile_serving_step engine --mode reconstruct --out $OUT    #   per process (the plugin
    python -m benchmarks.profile_serving_step table $OUT/engine_*.json --out $OUT     #   registers at vLLM start)
    python -m benchmarks.profile_serving_step gdn --smoke --out DIR                   # CPU (interpreter)

``gdn``: one GDN layer of Qwen3.5-35B-A3B (H = 16, HV = 32, K = V = 128, bf16 inputs, fp32 state), a chain of
k = 3 (T = 4) per request, each request with a pending window. reconstruct: the plugin's
``reconstruct.vllm_spec_update`` (one launch); store_all: vLLM 0.26's ``fused_sigmoid_gating_delta_rule_update``
called as its Qwen GDN layer calls it for the spec rows (k + 1 state blocks per request, written in place). Medians
of CUDA-graph replays (``treewy.ops.benchmark.bench``), the profiler's per-kernel device times of one eager call,
the chain kernel's configs timed at each batch (the pinned ``spec_step_config`` beside the fastest), and the flush
(nothing pending, as on most steps with prefill rows). Needs vLLM's sources importable (PYTHONPATH=/tmp/site) or
``--vllm-src``. Writes gdn_step_<device>_<date>.txt / .json.

``engine``: vLLM 0.26 on the 35B-A3B architecture with dummy weights (``treewy.serve.export.export_dummy``), MTP
k = 3 with synthetic acceptance (``--acceptance-rates``, the same in both modes), CUDA graphs and torch.compile as
vLLM defaults them, one ``LLM`` per process. Per batch: B requests of ``--prompt-len`` random tokens are added and
stepped past their prefill; then the torch profiler in the engine core (vLLM's ``profiler_config``) records
``--steps`` decode steps, each timed on the host. Every kernel of the trace is summed over the steps, per kernel and
per layer kind (``layer_kind``: GDN spec / conv / gating and norms, attention, MoE, dense GEMMs, sampling and
speculation, copies, other). Writes engine_<mode>_<device>_<date>.json (the raw traces stay in a temporary folder:
they do not fit what comes back). ``table`` puts both modes side by side: engine_<device>_<date>.txt.

``engine --timed-steps N``: after the profiled steps, N more decode steps of the same batch timed on the host without
the profiler (its own host work inflates the steps it records): the step's cadence, median and 10th / 90th
percentiles per mode in the table. With ``--compile decode`` that is the sweep server's decode step without the HTTP
front end. ``--timed-rounds R`` times N steps on R - 1 more batches of fresh requests too, each round's median in
the table: the served single-request steps kept one pace per request (12-15 or 20-22 ms, both modes), which
rounds of fresh requests in the engine alone either show or rule out.

``engine --mixed``: before each profiled step one new request of ``--prompt-len`` tokens arrives, so every step
carries a prefill chunk beside the B decodes, as the serving sweep's steps do when a request replaces a finished one.
With ``--compile decode`` (the sweep's server: no torch.compile, CUDA graphs for decode-only steps) those steps run
eagerly: the long steps that ``benchmarks/long_steps_vs_sim.py`` counts (150-275 ms at store-all's queued points of
2026-12-02). Files are named engine_<mode>_mixed_... and engine_mixed_...

Setup on the GPU machine: vLLM staged by benchmarks/vllm_pieces.sh (one piece per run, the last one joins), then
``export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import treewy  # noqa: F401  (before triton: the interpreter switch where there is no GPU)
from benchmarks.vllm_serve_gpu import COMPILE
from treewy.bench.registry import measure

BATCHES = (1, 16, 32, 64, 128, 256)
#: The GDN step alone also at 2, 4 and 8: where the spec step's value tile steps up (chain.SPEC_STEP_BV).
GDN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DIMS = dict(H=16, HV=32, K=128, V=128)
SMOKE = dict(batches=(1, 3), dims=dict(H=2, HV=4, K=16, V=16))
T = 4
#: Kernels listed per mode and batch in the engine table.
TOP_KERNELS = 25

#: (layer kind, kernel-name pattern), first match wins; kernels are matched case-insensitively.
LAYER_KINDS = (
    ("gdn spec step", r"chain_spec_step|fused_sigmoid_gating_delta_rule|fused_recurrent|tree_verify"),
    ("gdn prefill", r"chunk_|solve_tril|wy_fast|chunk_scaled_dot|fused_post_conv|recompute_w_u"),
    ("gdn conv", r"causal_conv1d"),
    ("gdn gating, norms, splits", r"gdn_gating|layer_norm_fwd|rms_norm_gated|qkvzba|l2norm|_layer_norm"),
    ("attention", r"flash|fmha|attn|attention|reshape_and_cache|paged"),
    ("moe", r"moe|expert|topk_softmax|grouped_topk|align_block"),
    ("gemm", r"gemm|xmma|cutlass|nvjet|cublas|matmul|sm90_|wgmma|splitk"),
    ("sampling and speculation", r"sampl|rejection|argmax|topk|top_p|softmax|prepare_inputs|spec|eagle|mtp"),
    ("copies and fills", r"copy|memcpy|memset|fill|cat_|index|gather|scatter"),
    ("norms and activations", r"rms_norm|rmsnorm|silu|act_and_mul|rotary|gelu"),
    ("compiled elementwise", r"triton_(poi|red|per)"),
)


def layer_kind(kernel: str) -> str:
    """The layer kind a kernel name belongs to (LAYER_KINDS), "other" if none."""
    for kind, pattern in LAYER_KINDS:
        if re.search(pattern, kernel, re.I):
            return kind
    return "other"


def kernel_table(events: list[tuple[str, float]], steps: int) -> dict:
    """{kernel: {kind, us_per_step, launches_per_step}} and {kind: us_per_step} from (name, device us) events."""
    kernels: dict[str, dict] = {}
    for name, us in events:
        row = kernels.setdefault(name, dict(kind=layer_kind(name), us=0.0, launches=0))
        row["us"] += us
        row["launches"] += 1
    per_kernel = {n: dict(kind=r["kind"], us_per_step=r["us"] / steps, launches_per_step=r["launches"] / steps)
                  for n, r in sorted(kernels.items(), key=lambda kv: -kv[1]["us"])}
    kinds: dict[str, float] = {}
    for r in per_kernel.values():
        kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["us_per_step"]
    return dict(kernels=per_kernel, kinds=dict(sorted(kinds.items(), key=lambda kv: -kv[1])))


def stamp() -> str:
    return datetime.date.today().isoformat()


def device_name(smoke: bool) -> str:
    return "cpu" if smoke else torch.cuda.get_device_name().split()[-1].lower()


# ---------------------------------------------------------------------------------------------------- gdn


def gdn_inputs(B, dims, device, gen):
    """A spec step of B requests of T tokens each in vLLM's layout, and the state indices of both modes."""
    H, HV, K, V = dims["H"], dims["HV"], dims["K"], dims["V"]
    N = B * T
    bf = torch.float32 if device == "cpu" else torch.bfloat16     # the interpreter reads bf16 wrongly
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    x = dict(A_log=r(HV) * 0.5, dt_bias=r(HV).to(bf), a=r(N, HV).to(bf), b=r(N, HV).to(bf), q=r(1, N, H, K).to(bf),
             k=r(1, N, H, K).to(bf), v=r(1, N, HV, V).to(bf),
             cu_seqlens=torch.arange(0, N + 1, T, dtype=torch.int32, device=device),
             num_accepted_tokens=torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32).to(device))
    own = torch.arange(1, B + 1, dtype=torch.int32, device=device)[:, None].repeat(1, T)    # one block, k + 1 views
    store_all = torch.arange(1, B * T + 1, dtype=torch.int32, device=device).reshape(B, T)  # k + 1 blocks
    return x, own, store_all


def gdn_fns(B, dims, device, vllm_mod, config=None):
    """{name: zero-argument step} for one GDN layer at batch B: reconstruct's spec step and flush, store-all's."""
    from treewy.serve.reconstruct import ReconstructPools, flush_slots, vllm_spec_update

    gen = torch.Generator().manual_seed(B)
    x, own, sa_idx = gdn_inputs(B, dims, device, gen)
    pools = ReconstructPools.empty(B + 1, max_nodes=T, device=device, **dims)
    pools.state.normal_().mul_(0.1)
    pools.u.normal_().mul_(0.1)
    pools.k.normal_()
    pools.g.uniform_(-1, 0)
    pools.meta[1:, 0] = T
    empty = ReconstructPools.empty(B + 1, max_nodes=T, device=device, **dims)   # nothing pending
    sa_state = torch.randn(B * T + 1, dims["HV"], dims["V"], dims["K"], device=device) * 0.1
    # the same step with no accepted row to fold (num_accepted 0): what the fold costs; the stash is still read and
    # rewritten, so every replay sees the same pool (the inputs built here, outside the timed call)
    x_no_fold = {**x, "num_accepted_tokens": torch.zeros_like(x["num_accepted_tokens"])}
    fns = {"reconstruct spec step": lambda: vllm_spec_update(pools, **x, ssm_state_indices=own,
                                                             use_qk_l2norm_in_kernel=True, config=config),
           "reconstruct spec step, no row to fold": lambda: vllm_spec_update(
               pools, **x_no_fold, ssm_state_indices=own, use_qk_l2norm_in_kernel=True, config=config),
           "reconstruct flush, nothing pending": lambda: flush_slots(empty, own[:, 0])}
    if vllm_mod is not None:
        fns["store_all spec step"] = lambda: vllm_mod.fused_sigmoid_gating_delta_rule_update(
            **x, initial_state=sa_state, inplace_final_state=True, ssm_state_indices=sa_idx,
            use_qk_l2norm_in_kernel=True)
    return fns


def chain_configs():
    import triton
    return [triton.Config({"BV": bv, "FOLD_ROWS": rows}, num_warps=w, num_stages=1)
            for bv in (8, 16, 32) for w in (1, 2, 4) for rows in (1, 4)]


def device_kernels(fn, smoke) -> list[tuple[str, float]]:
    """(kernel, device us) of one eager call, by the profiler (CUDA activity); under --smoke none."""
    if smoke:
        fn()
        return []
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cmd_gdn(args) -> int:
    from benchmarks.count_spec_step_ops import _vllm_module

    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    dims, batches = (SMOKE["dims"], SMOKE["batches"]) if smoke else (DIMS, GDN_BATCHES)
    vllm_mod = _vllm_module(args.vllm_src)
    rows, notes = [], []
    if vllm_mod is None:
        notes.append("store_all rows left out: vLLM's fused_sigmoid_gating not importable (PYTHONPATH=/tmp/site)")
    for B in batches:
        for name, fn in gdn_fns(B, dims, device, vllm_mod).items():
            us = measure(fn, smoke)
            rows.append(dict(B=B, step=name, us=us, kernels=device_kernels(fn, smoke), config="pinned"))
            print(f"B={B:4d} {name:36s} {us:9.1f} us", flush=True)
        for c in chain_configs()[:2] if smoke else chain_configs():
            tag = f"BV={c.kwargs['BV']} warps={c.num_warps} FOLD_ROWS={c.kwargs['FOLD_ROWS']}"
            try:
                us = measure(gdn_fns(B, dims, device, None, config=c)["reconstruct spec step"], smoke)
            except Exception as e:  # noqa: BLE001  (a config that does not compile is reported, not fatal)
                notes.append(f"B={B} {tag}: {type(e).__name__}: {e}")
                continue
            rows.append(dict(B=B, step="reconstruct spec step", us=us, kernels=[], config=tag))
        if not smoke:
            torch.cuda.empty_cache()
    dev = device_name(smoke)
    meta = dict(device=dev, date=stamp(), torch=torch.__version__, dims=dims, T=T, smoke=smoke,
                how="--smoke: one interpreted call, not a timing" if smoke else "median of CUDA-graph replays, us",
                notes=notes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gdn_step_{dev}_{stamp()}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (out / f"gdn_step_{dev}_{stamp()}.txt").write_text(gdn_text(meta, rows))
    print(gdn_text(meta, rows))
    return 0


def gdn_text(meta, rows) -> str:
    shapes = "tiny shapes" if meta["smoke"] else "Qwen3.5-35B-A3B shapes"
    lines = [f"One GDN layer's spec step, {shapes} {meta['dims']}, T = {meta['T']}; {meta['device']}, "
             f"{meta['date']}, torch {meta['torch']}; {meta['how']}", ""]
    from treewy.bench.timing import COPY_BW

    d = meta["dims"]
    state = d["HV"] * d["V"] * d["K"] * 4     # one fp32 state per request and layer
    lines.append("roofline: the state bytes alone at the H200's copy bandwidth (COPY_BW): reconstruct reads and writes "
                 f"one state, store_all reads one and writes T = {meta['T']}")
    lines.append(f"{'B':>4}  {'reconstruct':>12}  {'store_all':>10}  {'ratio':>6}  {'roofl. rc':>9}  {'roofl. sa':>9}  "
                 f"{'best config':>12}  best config of the chain kernel (reconstruct)")
    for B in sorted({r["B"] for r in rows}):
        at = {r["step"]: r["us"] for r in rows if r["B"] == B and r["config"] == "pinned"}
        tuned = [r for r in rows if r["B"] == B and r["config"] != "pinned"]
        best = min(tuned, key=lambda r: r["us"]) if tuned else None
        rc, sa = at.get("reconstruct spec step"), at.get("store_all spec step")
        lines.append(f"{B:4d}  {rc:12.1f}  {sa if sa is not None else float('nan'):10.1f}  "
                     f"{(rc / sa) if sa else float('nan'):6.3f}  {B * state * 2 / COPY_BW * 1e6:9.1f}  "
                     f"{B * state * (1 + meta['T']) / COPY_BW * 1e6:9.1f}  "
                     f"{best['us'] if best else float('nan'):12.1f}  "
                     f"{best['config'] if best else '-'}")
    lines.append("")
    lines.append("spec step with no accepted row to fold (us): " + ", ".join(
        f"B={r['B']} {r['us']:.1f}" for r in rows if r["step"].endswith("no row to fold")))
    lines.append("flush with nothing pending (us): " + ", ".join(
        f"B={r['B']} {r['us']:.1f}" for r in rows if r["step"].startswith("reconstruct flush")))
    lines.append("")
    lines.append("kernels of one eager call (device us):")
    for r in rows:
        if r["kernels"]:
            lines.append(f"  B={r['B']:4d} {r['step']:36s} " + "; ".join(f"{n} {us:.1f}" for n, us in r["kernels"]))
    lines += [f"note: {n}" for n in meta["notes"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- engine


def make_llm(args, trace_dir: Path):
    from vllm import LLM

    from treewy.serve.export import export_dummy
    from treewy.serve.launcher_command import capture_grid

    model = export_dummy("qwen3.5-35b-a3b", Path(trace_dir) / "model", max_len=args.max_model_len)
    rates = [float(r) for r in args.acceptance_rates.split(",")]
    spec = {"method": "mtp", "num_speculative_tokens": T - 1, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": rates}
    return LLM(model=str(model), load_format="dummy", language_model_only=True, gdn_prefill_backend="triton",
               skip_tokenizer_init=True, max_model_len=args.max_model_len, max_num_seqs=max_num_seqs(args),
               gpu_memory_utilization=args.gmu, enable_prefix_caching=False, speculative_config=spec,
               # every decode step profiled replays a full graph: the largest is max(batches) x (1 + k) tokens
               compilation_config={**COMPILE[args.compile],
                                   "cudagraph_capture_sizes": capture_grid(max(args.batches) * T)},
               profiler_config={"profiler": "torch", "torch_profiler_dir": str(trace_dir / "traces"),
                                "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False,
                                "torch_profiler_use_gzip": True})


def max_num_seqs(args) -> int:
    """The engine's max_num_seqs: the largest batch, and with --mixed the requests that arrive while it is profiled
    (so that none of them waits)."""
    return max(args.batches) + (args.steps if args.mixed else 0)


def trace_kernels(path: Path) -> list[tuple[str, float]]:
    """(kernel name, us) of every GPU kernel in a chrome trace written by the torch profiler."""
    import gzip
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return [(e["name"], float(e.get("dur", 0.0))) for e in trace.get("traceEvents", [])
            if e.get("cat") == "kernel" and e.get("ph") == "X"]


def cmd_engine(args) -> int:
    if os.environ.get("TREEWY_MODE", "store_all") != args.mode:
        os.environ["TREEWY_MODE"] = args.mode
    if args.mode == "reconstruct":
        os.environ.setdefault("VLLM_PLUGINS", "treewy")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import SamplingParams

    work = Path(tempfile.mkdtemp(prefix="treewy_profile_"))
    llm = make_llm(args, work)
    engine = llm.llm_engine
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=args.max_model_len - args.prompt_len - 1, temperature=0.0, ignore_eos=True)
    arrival = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)    # --mixed: a prefill, then done

    def add(rid, sampling):
        prompt = torch.randint(0, 248000, (args.prompt_len,), generator=gen).tolist()
        engine.add_request(rid, {"prompt_token_ids": prompt}, sampling)

    def start(ids):
        """Add the requests ``ids`` and step them past their prefill and one spec step."""
        for rid in ids:
            add(rid, params)
        produced = {}
        while len([r for r in ids if produced.get(r, 0) >= 2]) < len(ids):
            for out in engine.step():
                produced[out.request_id] = len(out.outputs[0].token_ids)

    def finish(ids):
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()

    results = {}
    for B in args.batches:
        ids = [f"B{B}-{i}" for i in range(B)]
        start(ids)
        before = set((work / "traces").glob("*")) if (work / "traces").exists() else set()
        llm.start_profile(profile_prefix=f"{args.mode}_B{B}")
        times = []
        for i in range(args.steps):
            if args.mixed:
                ids.append(f"B{B}-arrival{i}")
                add(ids[-1], arrival)
            times.append(timed_step(engine))
        llm.stop_profile()
        # the profiler's own host cost inflates the steps it records: the cadence is timed apart, unprofiled, on
        # these requests and then on --timed-rounds - 1 fresh batches (a served request keeps one pace for its life)
        rounds = [[timed_step(engine) for _ in range(args.timed_steps)]]
        finish(ids)
        for r in range(1, args.timed_rounds if args.timed_steps else 1):
            ids = [f"B{B}-round{r}-{i}" for i in range(B)]
            start(ids)
            rounds.append([timed_step(engine) for _ in range(args.timed_steps)])
            finish(ids)
        new = wait_for_traces(work / "traces", before)
        events = [ev for p in new for ev in trace_kernels(p)]
        results[B] = dict(step_ms_median=statistics.median(times), step_ms=times, traces=[p.name for p in new],
                          **kernel_table(events, args.steps), **step_spread([t for r in rounds for t in r]),
                          **({"plain_round_medians": [statistics.median(r) for r in rounds]} if len(rounds) > 1 else {}))
        print(f"{args.mode}{' mixed' if args.mixed else ''} B={B}: step {statistics.median(times):.2f} ms (host); "
              + ", ".join(f"{k} {v:.0f} us" for k, v in list(results[B]["kinds"].items())[:6]), flush=True)
    dev = device_name(False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(mode=args.mode, device=dev, date=stamp(), torch=torch.__version__, steps=args.steps,
                timed_steps=args.timed_steps, timed_rounds=args.timed_rounds,
                prompt_len=args.prompt_len, acceptance_rates=args.acceptance_rates, gmu=args.gmu,
                cudagraph_max_size=max(args.batches) * T, compile=args.compile, mixed=args.mixed,
                how="torch profiler in vLLM's engine core; kernel device time summed over the steps / steps")
    path = out / f"engine_{args.mode}{'_mixed' if args.mixed else ''}_{dev}_{stamp()}.json"
    path.write_text(json.dumps(dict(meta=meta, batches=results), indent=1))
    print(f"wrote {path}")
    return 0


def timed_step(engine) -> float:
    """One engine step's wall time on the host, ms."""
    t0 = time.perf_counter()
    engine.step()
    return (time.perf_counter() - t0) * 1e3


def step_spread(times: list[float]) -> dict:
    """The unprofiled steps' median and 10th / 90th percentiles (ms); {} when none were timed."""
    if not times:
        return {}
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
    return dict(plain_step_ms=times, plain_step_ms_median=statistics.median(times), plain_step_ms_p10=q[0],
                plain_step_ms_p90=q[-1])


def wait_for_traces(folder: Path, before: set, timeout: float = 120.0) -> list[Path]:
    """The trace files the engine core wrote since ``before`` (it writes them after stop_profile returns)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        new = [p for p in folder.glob("*.json*") if p not in before]
        if new and all(time.time() - p.stat().st_mtime > 2 for p in new):
            return sorted(new)
        time.sleep(1)
    raise RuntimeError(f"no profiler trace appeared in {folder} within {timeout:.0f} s of stop_profile")


def engine_text(reports: list[dict]) -> str:
    """Both modes side by side per batch: the host step time, us per step per layer kind, the top kernels."""
    by_mode = {r["meta"]["mode"]: r for r in reports}
    modes = [m for m in ("store_all", "reconstruct") if m in by_mode]
    meta = reports[0]["meta"]
    steps = ("Steps with one new request's prefill chunk beside the decodes" if meta.get("mixed")
             else "Decode steps")
    lines = [f"{steps} inside vLLM 0.26, Qwen3.5-35B-A3B dummy weights, MTP k = {T - 1}, synthetic acceptance "
             f"{meta['acceptance_rates']}, compile {meta.get('compile', 'default')}; {meta['device']}, "
             f"{meta['date']}; {meta['how']}", ""]
    batches = sorted({int(b) for r in reports for b in r["batches"]})
    for B in batches:
        rows = {m: by_mode[m]["batches"].get(str(B)) or by_mode[m]["batches"].get(B) for m in modes}
        if not all(rows.values()):
            continue
        lines.append(f"B = {B}: host step (ms) " + ", ".join(f"{m} {rows[m]['step_ms_median']:.2f}" for m in modes))
        if all("plain_step_ms_median" in rows[m] for m in modes):
            n = min(len(rows[m]["plain_step_ms"]) for m in modes)
            lines.append(f"  unprofiled, {n} steps: median [p10, p90] ms " + ", ".join(
                f"{m} {rows[m]['plain_step_ms_median']:.2f} [{rows[m]['plain_step_ms_p10']:.2f}, "
                f"{rows[m]['plain_step_ms_p90']:.2f}]" for m in modes))
        if all("plain_round_medians" in rows[m] for m in modes):
            lines.append("  median per round of fresh requests (ms): " + "; ".join(
                f"{m} " + ", ".join(f"{x:.2f}" for x in rows[m]["plain_round_medians"]) for m in modes))
        kinds = sorted({k for m in modes for k in rows[m]["kinds"]}, key=lambda k: -max(rows[m]["kinds"].get(k, 0)
                                                                                        for m in modes))
        lines.append(f"  {'layer kind (us per step)':34s}" + "".join(f"{m:>14s}" for m in modes))
        for k in kinds:
            lines.append(f"  {k:34s}" + "".join(f"{rows[m]['kinds'].get(k, 0.0):14.1f}" for m in modes))
        lines.append(f"  {'all kernels':34s}" + "".join(f"{sum(rows[m]['kinds'].values()):14.1f}" for m in modes))
        for m in modes:
            lines.append(f"  {m}: top kernels (us per step, launches per step)")
            for name, r in list(rows[m]["kernels"].items())[:TOP_KERNELS]:
                lines.append(f"    {r['us_per_step']:10.1f} {r['launches_per_step']:7.1f}  [{r['kind']}] {name[:110]}")
        lines.append("")
    return "\n".join(lines)


def cmd_table(args) -> int:
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    kinds = {(bool(r["meta"].get("mixed")), r["meta"].get("compile", "default")) for r in reports}
    if len(kinds) > 1:
        raise SystemExit(f"reports: {len(kinds)} kinds of step (--mixed, --compile) among them; put one kind in a "
                         "table")
    text = engine_text(reports)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = reports[0]["meta"]
    (out / f"engine_{'mixed_' if meta.get('mixed') else ''}{meta['device']}_{meta['date']}.txt").write_text(text)
    print(text)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gdn", help="the GDN spec step alone, both modes, CUDA-graph medians")
    g.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    g.add_argument("--vllm-src", default=None, help="folder holding vLLM 0.26's vllm/third_party/... (else import)")
    e = sub.add_parser("engine", help="decode steps inside vLLM 0.26 under the engine core's torch profiler")
    e.add_argument("--mode", choices=("store_all", "reconstruct"), required=True)
    e.add_argument("--batches", default=",".join(map(str, BATCHES)))
    e.add_argument("--steps", type=int, default=8, help="decode steps profiled per batch")
    e.add_argument("--timed-steps", type=int, default=0,
                   help="decode steps timed on the host after the profiled ones, without the profiler")
    e.add_argument("--timed-rounds", type=int, default=1,
                   help="batches of fresh requests timed so per batch size (the first is the profiled one)")
    e.add_argument("--prompt-len", type=int, default=128)
    e.add_argument("--max-model-len", type=int, default=2048)
    e.add_argument("--gmu", type=float, default=0.9)
    e.add_argument("--acceptance-rates", default="0.8,0.6,0.45",
                   help="vLLM's synthetic_acceptance_rates per draft position (the same in both modes)")
    e.add_argument("--mixed", action="store_true",
                   help="one new request arrives before each profiled step: its prefill chunk beside the decodes")
    e.add_argument("--compile", default="default", choices=tuple(COMPILE),
                   help="vLLM's compilation as benchmarks/vllm_serve_gpu.py's --compile (decode: the sweep's server)")
    t = sub.add_parser("table", help="both modes' engine reports side by side")
    t.add_argument("reports", nargs="+")
    for q in (g, e, t):
        q.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default $OUT)")
    args = p.parse_args(argv)
    if not args.out:
        p.error("--out (or $OUT) is required")
    if args.cmd == "engine":
        try:
            args.batches = [int(b) for b in args.batches.split(",")]
        except ValueError:
            p.error(f"--batches {args.batches!r}: expected comma-separated integers, e.g. 1,16,256")
        if min(args.batches) < 1 or args.steps < 1 or args.prompt_len < 1:
            p.error("--batches, --steps and --prompt-len must be positive")
        if args.timed_steps < 0:
            p.error(f"--timed-steps {args.timed_steps}: expected 0 (none) or more")
        if args.timed_rounds < 1:
            p.error(f"--timed-rounds {args.timed_rounds}: expected 1 or more")
    if (args.cmd == "engine" or (args.cmd == "gdn" and not args.smoke)) and not torch.cuda.is_available():
        p.error(f"{args.cmd} needs a CUDA GPU (gdn --smoke runs on the CPU)")
    return {"gdn": cmd_gdn, "engine": cmd_engine, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
