"""TreeWY inside real vLLM (0.26.x) on one GPU or more: correctness on the tiny checkpoint, memory, serving curves, a fault.

    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_serve_gpu tiny --out DIR        # points 3-5 on the tiny model
    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_serve_gpu sweep --mode store_all --out DIR   # 35B dummy
    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_serve_gpu sweep --tp 2 --gmu 0.4 --mode reconstruct --out DIR
    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_serve_gpu acceptance --mode reconstruct --out DIR
    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_serve_gpu tree-tiny --out DIR   # --tree served, both modes

``tiny``: exports treewy/models/tiny to vLLM's layout, then for each mode (store_all = stock vLLM,
reconstruct = the treewy plugin) starts ``vllm serve`` (MTP k = 3, temperature 0, CUDA graphs on) and
sends the same held-out prompts at concurrency 1 and then 32 (prompt token ids in, token ids out); a
third server per mode runs a pool of --preempt-blocks blocks (``--num-gpu-blocks-override``), small
enough that requests are preempted. Per phase it records every output, the spec-decode counters
(drafts, draft tokens, accepted, accepted per position) and preemptions from ``/metrics``, and vLLM's
own KV-cache capacity lines from the log. Then ``treewy.decode.generate`` (MTP chain (1, 1, 1), the
committed GPU kernels) writes the same prompts, and every output is compared. Writes tiny_<modes>.json and
the server logs. ``--dtype float32`` serves and generates in fp32: there two GDN kernels that round differently
agree to about 1e-6, far below the smallest gap between the top two logits, so any difference between the modes
is a logic error rather than a bf16 near-tie. vLLM 0.26's own GDN prefill refuses fp32, so both modes then prefill
through ``treewy.serve.fp32_prefill`` (TREEWY_FP32_PREFILL=1).

``sweep``: the 35B-A3B architecture with dummy weights (``treewy export-vllm --dummy``), one mode and one gmu per
call, ``treewy bench-serve`` over the given concurrencies and workloads (by default the grid the simulator's
committed predictions cover, ``treewy.sim.predict``: the three measured workloads, concurrency 1..256, closed loops
of one wave, max(16, concurrency) requests per point, each point after as many short unmeasured requests), the tidy table
and the server log; ``--stop-after S`` starts no point after S seconds, ``--resume-from DIR`` continues an
earlier run's checkpoint (its serve35b_<mode>.parquet and .points.jsonl, e.g. a committed results folder), and
``--pack`` leaves the per-point results and the server log as one results.tar.gz; ``--tree W1,W2,...`` serves that
draft tree (issue 30's measured width curve: k = its N drafts, the plugin's tree sampler at the paper's Table 2
length for the shape per depth, or with ``--acceptance tiny`` the tiny checkpoint's measured rates) into its own
table, serve35b_<mode>_tree<W1-W2-...>[_<acceptance>].parquet (a tree's acceptance named unless paper-35b);
the rows' device is the GPU nvidia-smi names; then capacity_<mode>_tp<N>.json: vLLM's
own KV capacity lines (pool tokens, attention block size, maximum concurrency at --max-model-len) beside
treewy.memory's figures for the same launch, and the simulator's knee for the sweep's workloads (SIMULATED).

``--tp N`` (tiny, sweep, acceptance) serves with vLLM's --tensor-parallel-size N; the script first checks that N GPUs
are visible. Every process it starts gets ENV_MULTI_GPU: NVLink multicast (NVLS) off for NCCL, torch's symmetric
memory and NVSHMEM, which these machines do not provide.

``acceptance``: the same 35B dummy server at the default acceptance (``--acceptance paper-35b``: vLLM's synthetic
sampler accepting the paper's 3.23 tokens per step) and CUDA graphs up to max_num_seqs x (1 + k) = 1024 tokens, a
short ``bench-serve`` sweep (``generation-short`` at concurrency 32 and 256, one wave each), then per point vLLM's
measured acceptance (its counters) beside the requested one with the noise check, and from the server log
(``--cudagraph-metrics``) the steps run per CUDA graph mode, the largest captured size, the capture's time and
memory and the KV pool. Writes acceptance_<mode>.json beside the sweep's table; exit 1 when a point failed or strayed.

``fault``: the tiny model through the same sweep; the engine is killed once after the first point, then
the sweep is resumed with retry_failed.

``compare`` (CPU): merges ``tiny`` reports written by separate processes (one mode each, e.g. one per GPU)
and writes the verdict.

``--compile decode`` starts vLLM without torch.compile and with full CUDA graphs for decode steps only
(``{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}``): the spec-decode steps still replay graphs, and the
server starts in a fraction of the time. ``--compile default`` keeps vLLM's default (compiled,
FULL_AND_PIECEWISE). The launcher captures steps of up to max_num_seqs x (1 + k) tokens (vLLM 0.26's default stops at
512, and larger steps ran without CUDA graphs on 2026-11-30); ``--graph-max-tokens N`` (sweep) sets another size,
e.g. 512 to repeat that run. Give each concurrent process its own GPU (CUDA_VISIBLE_DEVICES) and --port: never two
vLLM servers on one GPU, because a server's memory profile counts what another process allocates meanwhile as
its own (on 2026-11-30 a store-all server failed to start with "No available memory for the cache blocks"
when the fault run started on its GPU 15 s later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from treewy.serve.launcher import ServeOptions, VLLMServer, build_command
from treewy.serve.launcher_command import parse_tree
from treewy.serve.launcher_process import STACKS_ENV
from treewy.serve.metrics import parse_prometheus
from treewy.tree import DraftTree

ROOT = Path(__file__).resolve().parents[1]

VLLM_026_ARGS = ["--language-model-only", "--gdn-prefill-backend", "triton"]
#: NVLink SHARP / multicast off: NCCL, torch symmetric memory and NVSHMEM would otherwise try it at TP > 1
ENV_MULTI_GPU = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ENV_026 = {"VLLM_USE_FLASHINFER_SAMPLER": "0", **ENV_MULTI_GPU}
COMPILE = {"default": {}, "decode": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
           "piecewise": {"mode": 3, "cudagraph_mode": "PIECEWISE"},   # attention and GDN layers outside the graphs
           "eager": {"mode": 0, "cudagraph_mode": "NONE"}}


def compile_args(name: str) -> list[str]:
    """vLLM's ``--compilation-config`` for a COMPILE choice (the capture sizes come from the launcher)."""
    cfg = dict(COMPILE[name])
    return ["--compilation-config", json.dumps(cfg)] if cfg else []


KV_LINES = (re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
            re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
            re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
            re.compile(r"attention block size to (\d+) tokens"))
CAPTURE_LINE = re.compile(r"Graph capturing finished in ([\d.]+) secs, took ([\d.]+) GiB")
ENGINE_INIT_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
#: vLLM's --cudagraph-metrics table (vllm/compilation/cuda_graph.py, CUDAGraphLogging): its settings, then rows of
#: unpadded tokens | padded tokens | paddings | runtime mode | steps, per stats interval
GRAPH_SIZES_LINE = re.compile(r"- Capture sizes: \[([\d, ]*)\]")
GRAPH_ROW = re.compile(r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([A-Z_]+)\s*\|\s*(\d+)\s*\|")


def graph_report(text: str, past: int = 512) -> dict:
    """What a server log says about CUDA graphs: vLLM's capture (seconds, GiB), its largest captured size, and from
    --cudagraph-metrics the steps run per runtime mode (NONE: eager), the largest step of each, and the steps of
    more than ``past`` tokens replayed as full graphs (vLLM 0.26's default capture stops at 512)."""
    out: dict = {}
    if m := CAPTURE_LINE.search(text):
        out["capture_s"], out["capture_gib"] = float(m.group(1)), float(m.group(2))
    if m := ENGINE_INIT_LINE.search(text):
        out["engine_init_s"] = float(m.group(1))
    sizes = [int(x) for m in GRAPH_SIZES_LINE.finditer(text) for x in m.group(1).split(",") if x.strip()]
    out["largest_capture_size"] = max(sizes) if sizes else None
    steps: dict[str, dict] = {}
    for m in GRAPH_ROW.finditer(text):
        tokens, mode, n = int(m.group(1)), m.group(4), int(m.group(5))
        d = steps.setdefault(mode, {"steps": 0, "max_tokens": 0, f"steps_over_{past}": 0})
        d["steps"] += n
        d["max_tokens"] = max(d["max_tokens"], tokens)
        d[f"steps_over_{past}"] += n if tokens > past else 0
    out["steps_by_mode"] = steps
    return out


def acceptance_summary(row: dict) -> str:
    """One line per point: the requested acceptance, vLLM's measured one, and the verdict."""
    def rates(xs):
        return "(" + ", ".join(f"{x:.3f}" for x in xs) + ")" if xs else "(none)"

    head = f"{row['mode']} {row['workload']} c{row['concurrency']}:"
    if row.get("error"):
        return f"{head} FAILED: {row['error'][:300]}"
    want = row.get("expected_tokens_per_step")
    req = (f"requested {want:.3f} tokens/step {rates(row.get('acceptance_rates'))} ({row['acceptance_source']})"
           if want is not None else f"requested {row['acceptance_source']}")
    got = row.get("acceptance_length")
    se = f" +- {row['acceptance_stderr']:.3f}" if row.get("acceptance_stderr") is not None else ""
    meas = (f"vLLM measured {got:.3f}{se} {rates(row.get('measured_acceptance_rates'))}" if got is not None
            else "vLLM reported no drafts")
    verdict = f"WARNING {row['acceptance_warning']}" if row.get("acceptance_warning") else "within noise"
    return (f"{head} {req}; {meas}: {verdict}; mean TPOT {row.get('mean_tpot_ms') or float('nan'):.1f} ms, peak "
            f"running {row.get('peak_running')}, CUDA graphs up to {row.get('cudagraph_max_size')} tokens")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def counters(base_url: str) -> dict:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        s = parse_prometheus(r.read().decode())
    tot = lambda n: sum(v for _, v in s.get(n, []))  # noqa: E731
    per_pos = {}
    for lab, v in s.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        per_pos[lab.get("position")] = per_pos.get(lab.get("position"), 0) + v
    return {"drafts": tot("vllm:spec_decode_num_drafts_total"),
            "draft_tokens": tot("vllm:spec_decode_num_draft_tokens_total"),
            "accepted": tot("vllm:spec_decode_num_accepted_tokens_total"),
            "preemptions": tot("vllm:num_preemptions_total"),
            "accepted_per_pos": [per_pos[k] for k in sorted(per_pos, key=int)]}


def delta(a: dict, b: dict) -> dict:
    out = {k: b[k] - a[k] for k in ("drafts", "draft_tokens", "accepted", "preemptions")}
    out["accepted_per_pos"] = [y - x for x, y in zip(a["accepted_per_pos"] or [0] * len(b["accepted_per_pos"]),
                                                     b["accepted_per_pos"])]
    return out


def complete(base_url: str, model: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "return_token_ids": True}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["choices"][0]["token_ids"]


#: Seconds without one answer after which a phase counts as stalled (a served request of the tiny checkpoint takes
#: well under a second; run 4 of tree-tiny sat 100 s with 32 requests running and no token until its call's limit).
STALL_S = 120.0


class PhaseStalled(RuntimeError):
    """A phase's requests stopped getting answers (the server is alive but serves no token)."""


def run_requests(fn, items, concurrency: int, stall_s: float = STALL_S, on_stall=None) -> list:
    """[fn(x) for x in items] on ``concurrency`` threads, in order. When no request is answered for ``stall_s``
    seconds, ``on_stall()`` runs (say what the server is doing) and PhaseStalled is raised without waiting for the
    threads, which end once the server is stopped; a request's own exception propagates."""
    ex = ThreadPoolExecutor(concurrency)
    futures = [ex.submit(fn, x) for x in items]
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=stall_s, return_when=FIRST_COMPLETED)
            if not done:
                note = on_stall() if on_stall is not None else None
                raise PhaseStalled(f"{len(pending)} of {len(futures)} requests unanswered, none answered for "
                                   f"{stall_s:g} s" + (f"; {note}" if note else ""))
            for f in done:
                f.result()      # the first failure stops the phase
        return [f.result() for f in futures]
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def stall_report(srv: VLLMServer) -> str:
    """What a stalled server is doing: its processes' Python stacks go to its log (``dump_stacks``), and the GPU's
    utilization tells a kernel that never ends (busy) from a host that waits (idle)."""
    pids = srv.dump_stacks()
    try:
        util = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        util = "unknown"
    return f"stacks of pids {pids} in the server log; GPU utilization {util or 'unknown'}"


def kv_capacity(text: str) -> dict:
    out = {}
    if m := KV_LINES[0].search(text):
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    if m := KV_LINES[1].search(text):
        out["max_concurrency_at_len"] = int(m.group(1).replace(",", ""))
        out["max_concurrency"] = float(m.group(2))
    if m := KV_LINES[2].search(text):
        out["available_kv_gib"] = float(m.group(1))
    if m := KV_LINES[3].search(text):
        out["attention_block_size"] = int(m.group(1))
    return out


def capacity_report(text: str, *, model: str, tp: int, gmu: float, mode: str, max_model_len: int, max_num_seqs: int,
                    workloads: list[str]) -> dict:
    """vLLM's KV capacity lines from a server log beside treewy.memory's figures for that launch (per rank: the pool
    of one GPU), and the simulator's store-all knee over ``workloads`` (SIMULATED, concurrency 1..256; left out on
    a host without polars, which the simulator needs)."""
    from treewy.memory import GIB, ServerConfig, paging

    server = ServerConfig(max_num_seqs=max_num_seqs)
    layout = paging(model, "h200", tp=tp, gmu=gmu, mode=mode, server=server)
    report = {"vllm": kv_capacity(text),
              "treewy_memory": {"attention_block_size": layout.block_size, "num_blocks": layout.num_blocks,
                                "pool_gib": round(layout.pool_bytes / GIB, 3), "page_kib": layout.page_bytes / 1024,
                                "max_concurrency": round(layout.max_concurrency(max_model_len), 2),
                                "max_concurrency_at_len": max_model_len}}
    if importlib.util.find_spec("polars") is None:
        report["simulated_knee"] = {"SIMULATED": True, "skipped": "polars is not installed on this host"}
        return report
    from treewy.sim import knee, simulate

    sim = simulate(model, "h200", tp=tp, gmu=gmu, mode=["store_all", "reconstruct"], workload=workloads,
                   concurrency=[1, 8, 32, 64, 128, 256], num_prompts=256, server=server)
    report["simulated_knee"] = {"SIMULATED": True, "workloads": workloads, "store_all": knee(sim),
                                "reconstruct": knee(sim, "reconstruct")}
    return report


def check_gpus(tp: int) -> None:
    """At tp > 1, refuse before anything starts when fewer than ``tp`` GPUs are visible (the launcher's own check;
    a one-GPU run fails at once without its GPU anyway)."""
    from treewy.serve.launcher import check_gpu

    if tp > 1:
        check_gpu(tp)


def gpu_name() -> str:
    """The device column of a sweep's rows: the first visible GPU as nvidia-smi names it (an H100 session's rows say
    H100), or "unchecked" without one (the CPU tests, whose sweeps are stand-ins)."""
    from treewy.serve.launcher import ServeError, check_gpu

    try:
        return check_gpu(1)
    except ServeError:
        return "unchecked"


def serve_phases(model_dir: str, mode: str, prompts, new_tokens: int, out: Path, tag: str, extra: list[str],
                 concurrencies=(1, 32), max_num_seqs: int = 64, gmu: float = 0.3, port: int = 8011,
                 extra_env: dict | None = None, tp: int = 1) -> dict:
    opts = ServeOptions(model=model_dir, mode=mode, tp=tp, gmu=gmu, num_speculative_tokens=3, max_num_seqs=max_num_seqs,
                        port=port, max_model_len=2048, served_model_name="tiny", extra_args=VLLM_026_ARGS + extra)
    argv, env = build_command(opts)
    env = {**env, **ENV_026, **(extra_env or {}), STACKS_ENV: "1"}
    log_path = out / f"server_{tag}_{mode}.log"
    res = {"mode": mode, "tag": tag, "tp": tp, "argv": argv, "env": env, "phases": {}}
    t0 = time.time()
    with VLLMServer(argv, env, opts.base_url, log_path=str(log_path), echo=False) as srv:
        srv.wait_healthy(timeout=900)
        res["start_s"] = round(time.time() - t0, 1)
        log(f"{tag} {mode}: healthy after {res['start_s']} s")
        for c in concurrencies:
            before, t1 = counters(opts.base_url), time.time()
            outs = run_requests(lambda p: complete(opts.base_url, "tiny", p, new_tokens), prompts, c,
                                on_stall=lambda: stall_report(srv))
            res["phases"][f"c{c}"] = {"outputs": outs, "seconds": round(time.time() - t1, 2),
                                      "counters": delta(before, counters(opts.base_url))}
            log(f"{tag} {mode} c{c}: {res['phases'][f'c{c}']['seconds']} s, {res['phases'][f'c{c}']['counters']}")
    res.update(kv_capacity(log_path.read_text(errors="replace")))
    return res


def treewy_outputs(prompts, new_tokens: int, dtype: str = "bfloat16") -> list[list[int]]:
    import torch

    from treewy.decode import generate
    from treewy.models import load

    model = load("tiny", dtype=getattr(torch, dtype), device="cuda")
    res = generate(model, prompts, drafter="mtp", tree=(1, 1, 1), max_new_tokens=new_tokens)
    return [list(map(int, t)) for t in res.tokens]


def tiny_report_path(out: Path, modes, dtype: str = "bfloat16", tp: int = 1) -> Path:
    return out / f"tiny_{'-'.join(modes)}{'' if dtype == 'bfloat16' else '_' + dtype}{'' if tp == 1 else f'_tp{tp}'}.json"


def cmd_tiny(args) -> int:
    from treewy.models.corpus import heldout_prompts
    from treewy.serve.export import export_vllm

    check_gpus(args.tp)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_vllm(ROOT / "treewy/models/tiny", "/tmp/tiny-vllm", overwrite=True))
    prompts = heldout_prompts(args.prompts, args.prompt_len, seed=0)
    report = {"date": time.strftime("%Y-%m-%d"), "prompts": prompts, "new_tokens": args.new_tokens, "tp": args.tp,
              "runs": []}
    import torch
    report["device"] = torch.cuda.get_device_name(0)
    import vllm
    report["vllm"] = vllm.__version__
    # preempt: vLLM needs max_num_seqs <= the pool's blocks, and requests must outgrow their first attention
    # block (144-160 tokens for this model) while running, so that a full pool preempts
    report["compile"] = {"graphs": args.graphs_compile, "preempt": args.compile}
    report["dtype"] = args.dtype
    report["triton_f32"] = args.triton_f32
    dtype = ["--dtype", args.dtype]
    # vLLM's own GDN prefill refuses fp32: both modes get treewy's recurrent one (treewy.serve.fp32_prefill)
    extra_env = {"TREEWY_FP32_PREFILL": "1"} if args.dtype == "float32" else {}
    if args.triton_f32 != "tf32":  # the default precision of tl.dot on fp32 tiles (vLLM's Triton attention)
        extra_env["TRITON_F32_DEFAULT"] = args.triton_f32
    stages = (("graphs", dtype + compile_args(args.graphs_compile), (1, 32), 64, args.new_tokens),
              ("preempt", dtype + ["--num-gpu-blocks-override", str(args.preempt_blocks)] + compile_args(args.compile),
               (32,), args.preempt_seqs, args.preempt_tokens))
    path = tiny_report_path(out, args.modes, args.dtype, args.tp)
    for tag, extra, concs, seqs, tokens in stages:
        if tag not in args.stages:
            continue
        for mode in args.modes:
            try:
                report["runs"].append(serve_phases(model_dir, mode, prompts, tokens, out, tag, extra, concs, seqs,
                                                   port=args.port, extra_env=extra_env, tp=args.tp))
            except Exception as e:  # noqa: BLE001 - recorded, the other runs go on
                report["runs"].append({"mode": mode, "tag": tag, "error": f"{type(e).__name__}: {e}"})
                log(f"{tag} {mode} FAILED: {e}")
            path.write_text(json.dumps(report))
    t0 = time.time()
    report["treewy_generate"] = treewy_outputs(prompts, max(args.new_tokens, args.preempt_tokens), args.dtype)
    report["treewy_generate_s"] = round(time.time() - t0, 1)
    report["verdict"] = compare(report)
    path.write_text(json.dumps(report))
    print(json.dumps(report["verdict"], indent=1))
    return 0 if report["verdict"]["all_equal"] else 1


def cmd_compare(args) -> int:
    """Merge tiny reports of separate processes (same prompts and reference) and write the joint verdict."""
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    merged = dict(reports[0])
    for r in reports[1:]:
        if r["prompts"] != merged["prompts"] or r["treewy_generate"] != merged["treewy_generate"]:
            raise SystemExit(f"{args.out}: the reports were made from different prompts or references")
        merged["runs"] = merged["runs"] + r["runs"]
    merged["verdict"] = compare(merged)
    Path(args.out).write_text(json.dumps(merged))
    print(json.dumps(merged["verdict"], indent=1))
    return 0 if merged["verdict"]["all_equal"] else 1


def compare(report: dict) -> dict:
    ref = report["treewy_generate"]
    v = {"all_equal": True, "phases": []}
    by = {}
    for r in report["runs"]:
        if "error" in r:
            v["all_equal"] = False
            v["phases"].append({"run": f"{r['tag']}/{r['mode']}", "error": r["error"]})
            continue
        for ph, d in r["phases"].items():
            same = [a == b[:len(a)] for a, b in zip(d["outputs"], ref)]   # greedy: a shorter run is a prefix
            row = {"run": f"{r['tag']}/{r['mode']}/{ph}", "equal_to_treewy": sum(same), "of": len(ref),
                   "counters": d["counters"], "kv": {k: r.get(k) for k in ("kv_cache_tokens", "max_concurrency")}}
            v["phases"].append(row)
            v["all_equal"] &= all(same)
            by.setdefault((r["tag"], ph), {})[r["mode"]] = d
    for (tag, ph), modes in by.items():
        if len(modes) == 2:
            a, b = modes["store_all"], modes["reconstruct"]
            v["phases"].append({"run": f"{tag}/{ph} store_all vs reconstruct",
                                "outputs_equal": sum(x == y for x, y in zip(a["outputs"], b["outputs"])),
                                "counters_equal": a["counters"] == b["counters"]})
    return v


def kill_engine(server_pid: int) -> list[int]:
    """SIGKILL the engine-core process(es) of the vLLM server whose pid is ``server_pid``, and nothing else: the
    server's descendants, found from its pid through /proc, whose command line says EngineCore (all of them if
    none does). Another server's engine on the same host is not among them. Returns the pids killed."""
    import signal

    from treewy.serve.launcher import cmdline, descendants

    tree = descendants(server_pid)
    engines = [p for p in tree if "EngineCore" in cmdline(p)] or tree
    for p in engines:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return engines


def kill_engine_after(cfg, points: int, out: Path) -> None:
    """Kill the engine core of the sweep's own server once, as soon as ``points`` points are in its checkpoint (the
    server's pid is in the record the sweep keeps beside its table)."""
    import threading

    def watch():
        while not (cfg.checkpoint.is_file() and len(cfg.checkpoint.read_text().splitlines()) >= points):
            time.sleep(0.5)
        time.sleep(3)                                  # inside the next point's requests
        server_pid = json.loads(cfg.server_pid_file.read_text())["pid"]
        killed = kill_engine(server_pid)
        (out / "fault.txt").write_text(f"{time.strftime('%H:%M:%S')} SIGKILL to the engine core of server pid "
                                       f"{server_pid} after {points} finished point(s): pids {killed}\n")
        log(f"FAULT: killed the engine core (pids {killed}) after {points} point(s)")

    threading.Thread(target=watch, daemon=True).start()


def run_sweep(cfg, out: Path, kill_at: int = 0) -> tuple[int, int]:
    from treewy.serve.sweep import Sweep

    os.environ.update(ENV_026)
    if kill_at:
        kill_engine_after(cfg, kill_at, out)
    ran, bad = Sweep(cfg, log=log).run(progress=False)
    log(f"sweep {cfg.modes}: {ran} points run, {bad} failed")
    return ran, bad


def cmd_fault(args) -> int:
    """The tiny model through ``treewy bench-serve``'s sweep; the engine is killed once after the first point,
    then the same sweep is resumed with retry_failed."""
    from treewy.serve.export import export_vllm
    from treewy.serve.sweep import SweepConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_vllm(ROOT / "treewy/models/tiny", "/tmp/tiny-vllm-fault", overwrite=True))
    server = ServeOptions(model=model_dir, gmu=0.3, num_speculative_tokens=3, max_num_seqs=64, port=args.port,
                          max_model_len=2048, extra_args=VLLM_026_ARGS + compile_args(args.compile))
    cfg = SweepConfig(server=server, model_name="tiny", workloads=["smoke"], modes=[args.mode],
                      concurrencies=[1, 4, 8, 16], num_prompts=16, out=out / "fault_sweep.parquet",
                      result_dir=out / "fault_results", device=gpu_name(), health_timeout=900, point_timeout=300)
    run_sweep(cfg, out, kill_at=1)
    first = [json.loads(x) for x in cfg.checkpoint.read_text().splitlines()]
    ran, bad = run_sweep(replace(cfg, retry_failed=True), out)
    final = [json.loads(x) for x in cfg.checkpoint.read_text().splitlines()]
    summary = {"first_pass": [(r["point"], r["row"].get("error")) for r in first],
               "resume": [(r["point"], r["row"].get("error")) for r in final[len(first):]]}
    (out / "fault.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if bad == 0 else 1


def dummy_35b_server(args, extra=(), **options):
    """(the output folder, made; the server options) for the 35B architecture on dummy weights in one mode, after
    the GPU-count check: max_num_seqs 256, MTP k = 3, the config exported to /tmp."""
    from treewy.serve.export import export_dummy

    check_gpus(args.tp)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_dummy("qwen3.5-35b-a3b", f"/tmp/q35b-dummy-{args.mode}", max_len=args.max_model_len,
                                 overwrite=True))
    k = options.pop("num_speculative_tokens", 3)
    return out, ServeOptions(model=model_dir, tp=args.tp, gmu=args.gmu, num_speculative_tokens=k, max_num_seqs=256,
                             port=args.port, max_model_len=args.max_model_len, acceptance=args.acceptance,
                             extra_args=VLLM_026_ARGS + ["--load-format", "dummy", *extra] + compile_args(args.compile),
                             **options)


def cmd_sweep(args) -> int:
    from treewy.serve.sweep import SweepConfig
    # the predicted grid's defaults, from modules that need no polars (a GPU host may lack it)
    from treewy.paper import CONCURRENCIES
    from treewy.workloads import MEASURED_WORKLOADS, MIN_REQUESTS

    args.workloads = args.workloads or ",".join(MEASURED_WORKLOADS)
    args.concurrency = args.concurrency or ",".join(map(str, CONCURRENCIES))
    args.num_prompts = MIN_REQUESTS if args.num_prompts is None else args.num_prompts

    tree = {} if args.tree is None else {"tree": parse_tree(args.tree), "drafter": args.drafter}
    if tree:
        tree["num_speculative_tokens"] = DraftTree.from_widths(tree["tree"]).num_drafts
    # --cudagraph-metrics: the steps run per graph mode (a decode step run eagerly shows as a NONE row of 1 + k tokens)
    out, server = dummy_35b_server(args, extra=["--cudagraph-metrics"], cudagraph_max_size=args.graph_max_tokens, **tree)
    # a tree's table per acceptance too: the width sweep runs each tree at paper-35b (the default) and at tiny
    acceptance = ("" if not tree or args.acceptance in (None, "paper-35b")
                  else "_" + re.sub(r"[^A-Za-z0-9.]+", "-", args.acceptance).strip("-"))
    name = (f"serve35b_{args.mode}{'' if args.tp == 1 else f'_tp{args.tp}'}"
            + ("" if not tree else "_tree" + "-".join(map(str, tree["tree"]))) + acceptance)
    cfg = SweepConfig(server=server, model_name="qwen3.5-35b-a3b", workloads=args.workloads.split(","),
                      modes=[args.mode], concurrencies=[int(c) for c in args.concurrency.split(",")],
                      num_prompts=args.num_prompts, prompts_per_concurrency=1, out=out / f"{name}.parquet",
                      result_dir=out / "results", device=gpu_name(), health_timeout=900, point_timeout=300,
                      retry_failed=args.retry_failed, stop_after_s=args.stop_after)
    if args.resume_from:
        resume_into(Path(args.resume_from), cfg)
    _, bad = run_sweep(cfg, out)
    server_log = cfg.result_dir / f"server-{args.mode}.log"
    text = server_log.read_text(errors="replace") if server_log.is_file() else ""
    report = capacity_report(text, model="qwen3.5-35b-a3b", tp=args.tp, gmu=args.gmu, mode=args.mode,
                             max_model_len=args.max_model_len, max_num_seqs=256, workloads=cfg.workloads)
    report["graphs"] = graph_report(text)
    (out / f"capacity_{args.mode}_tp{args.tp}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    if args.pack:
        pack_folder(cfg.result_dir)
    return 0 if bad == 0 else 1


def resume_into(src: Path, cfg) -> None:
    """Copy an earlier run's table and checkpoint (``src``/<table>.parquet and .points.jsonl, e.g. a committed
    results folder carried to the GPU machine) into this run's --out, so the sweep resumes where that run stopped."""
    import shutil

    pairs = [(src / cfg.out.name, cfg.out), (src / cfg.checkpoint.name, cfg.checkpoint)]
    if not pairs[1][0].is_file():
        raise SystemExit(f"--resume-from {src}: no {cfg.checkpoint.name} there (the checkpoint of this mode's sweep)")
    for a, b in pairs:
        if b.exists():
            raise SystemExit(f"--resume-from {src}: {b} exists already; pass a fresh --out")
        if a.is_file():
            shutil.copyfile(a, b)
    log(f"resuming {len(cfg.checkpoint.read_text().splitlines())} recorded point(s) from {src}")


def pack_folder(folder: Path) -> None:
    """Replace ``folder`` by ``folder``.tar.gz beside it (one file for the per-point results and server logs)."""
    import shutil

    if folder.is_dir():
        shutil.make_archive(str(folder), "gztar", root_dir=folder)
        shutil.rmtree(folder)


def cmd_acceptance(args) -> int:
    """The 35B architecture on dummy weights at the default acceptance, through bench-serve's driver (one mode)."""
    from treewy.serve.sweep import SweepConfig, load_checkpoint

    out, server = dummy_35b_server(args, extra=["--cudagraph-metrics"])
    cfg = SweepConfig(server=server, model_name="qwen3.5-35b-a3b", workloads=[args.workload], modes=[args.mode],
                      concurrencies=[int(c) for c in args.concurrency.split(",")], num_prompts=args.num_prompts,
                      prompts_per_concurrency=1, out=out / f"acceptance_{args.mode}.parquet",
                      result_dir=out / f"acceptance_{args.mode}_results", device=gpu_name(), health_timeout=900,
                      point_timeout=300)
    t0 = time.time()
    run_sweep(cfg, out)
    rows = [r["row"] for r in load_checkpoint(cfg.checkpoint).values()]
    server_log = cfg.result_dir / f"server-{args.mode}.log"
    text = server_log.read_text(errors="replace") if server_log.is_file() else ""
    argv, env = build_command(replace(server, mode=args.mode))
    report = {"date": time.strftime("%Y-%m-%d"), "mode": args.mode, "argv": argv, "env": env,
              "wall_s": round(time.time() - t0, 1), "graphs": graph_report(text), **kv_capacity(text), "rows": rows}
    (out / f"acceptance_{args.mode}.json").write_text(json.dumps(report, indent=1))
    for row in rows:
        print(acceptance_summary(row))
    print(json.dumps({k: report[k] for k in ("graphs", "wall_s")} | kv_capacity(text)))
    return 1 if any(r.get("error") or r.get("acceptance_warning") for r in rows) or not rows else 0


#: every per-depth |z| below this: the served tree's accepted depths match the engine's (a depth crosses it by chance
#: about once in 370 when steps are independent draws)
DEPTH_Z_MAX = 3.0


def served_depth_counts(counters: dict, depth: int) -> tuple[int, list[int]]:
    """(steps, [steps that accepted depth >= d for d = 1..depth]) from a phase's spec-decode counter deltas. A served
    tree emits depth(a) + 1 tokens per step, which vLLM counts as accepted positions 0..depth(a) - 1, so position
    d - 1 counts depth >= d and positions ``depth``.. stay 0 (tests/serve_fakes/fake_vllm.py, treewy/serve/metrics.py).
    """
    per = [int(round(x)) for x in counters["accepted_per_pos"]]
    if any(per[depth:]):
        raise ValueError(f"vLLM counted accepted drafts at positions {depth}.. ({per[depth:]}): a tree of depth "
                         f"{depth} accepts at most that many per step, so the tree's sampler was not the one serving")
    return int(round(counters["drafts"])), (per + [0] * depth)[:depth]


def engine_depth_counts(steps, depth: int) -> tuple[int, list[int]]:
    """The same counts from ``treewy.decode.generate``'s per-step records (StepStat.length = accepted depth + 1)."""
    got = [s.length - 1 for s in steps]
    return len(got), [sum(x >= d for x in got) for d in range(1, depth + 1)]


def _depth_sample(name: str, counts) -> dict:
    n, at_least = counts
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{name}: {n!r} steps; comparing accepted depths needs at least one speculative step")
    if any(not isinstance(c, int) or not 0 <= c <= n for c in at_least) or any(
            b > a for a, b in zip(at_least, at_least[1:])):
        raise ValueError(f"{name}: steps at depth >= d must be non-increasing counts within 0..{n} steps, got "
                         f"{list(at_least)}")
    rates = [c / n for c in at_least]
    mean = sum(rates)
    # E[depth^2] = sum_d (2d - 1) P(depth >= d): the variance comes from the same counts
    var = max(0.0, sum((2 * d - 1) * r for d, r in enumerate(rates, 1)) - mean ** 2)
    return {"steps": n, "at_least": list(at_least), "rates": rates,
            "rate_se": [(r * (1 - r) / n) ** 0.5 for r in rates], "mean_depth": mean, "mean_se": (var / n) ** 0.5}


def compare_depths(served, engine, z_max: float = DEPTH_Z_MAX) -> dict:
    """Accepted depth per step, served against the engine. ``served`` and ``engine``: (steps, [steps at depth >= d
    for d = 1..D]). Per side the mean depth and P(depth >= d) with standard errors; per depth the two-sample z of the
    rates (pooled variance; 0 where both sides sit at 0 or 1). Steps are taken as independent draws, which a
    request's steps, sharing its context, only roughly are: the verdict ``matches`` needs every |z| < z_max."""
    s, e = _depth_sample("served", served), _depth_sample("engine", engine)
    if len(s["rates"]) != len(e["rates"]):
        raise ValueError(f"served has {len(s['rates'])} depths and engine {len(e['rates'])}: count the same tree")
    z = []
    for cs, ce in zip(s["at_least"], e["at_least"]):
        pool = (cs + ce) / (s["steps"] + e["steps"])
        se = (pool * (1 - pool) * (1 / s["steps"] + 1 / e["steps"])) ** 0.5
        z.append((cs / s["steps"] - ce / e["steps"]) / se if se > 0 else 0.0)
    return {"served": s, "engine": e, "z": z, "z_max": z_max, "matches": all(abs(x) < z_max for x in z)}


def depth_counts_line(served, generate) -> str:
    """At temperature 0 the served steps accept what generate's steps accept: (steps, [steps at depth >= d]) of both,
    and whether they are the same."""
    same = served[0] == generate[0] and list(served[1]) == list(generate[1])
    return (f"steps accepting depth >= 1..{len(served[1])}: {list(served[1])} of {served[0]} served, "
            f"{list(generate[1])} of {generate[0]} in generate ({'the same' if same else 'NOT the same'})")


def depth_line(cmp: dict) -> str:
    """One report line: mean accepted depth of both, per depth the counts, rates +- SE and z, then the verdict."""
    s, e = cmp["served"], cmp["engine"]

    def rate(side, i):
        return f"{side['at_least'][i]}/{side['steps']} = {side['rates'][i]:.3f} +- {side['rate_se'][i]:.3f}"

    per = ", ".join(f"P(depth >= {i + 1}) {rate(s, i)} vs {rate(e, i)} (z {z:+.2f})" for i, z in enumerate(cmp["z"]))
    far = [d for d, z in enumerate(cmp["z"], 1) if abs(z) >= cmp["z_max"]]
    verdict = (f"matches (|z| < {cmp['z_max']:g} at every depth)" if cmp["matches"] else
               f"does NOT match (|z| >= {cmp['z_max']:g} at depth {', '.join(map(str, far))})")
    return (f"accepted depth {s['mean_depth']:.3f} +- {s['mean_se']:.3f} served vs {e['mean_depth']:.3f} +- "
            f"{e['mean_se']:.3f} treewy.decode.generate; {per}: {verdict}; {s['steps']} served steps, {e['steps']} "
            "generate steps")


def complete_seeded(base_url: str, model: str, prompt: list[int], max_tokens: int, temperature: float,
                    seed: int) -> list[int]:
    """``complete`` sampled at ``temperature`` with vLLM's per-request ``seed``."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                       "seed": seed, "ignore_eos": True, "return_token_ids": True}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["choices"][0]["token_ids"]


def _temperature(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = float("nan")
    if not 0 <= t < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0 (0: greedy, e.g. 1)")
    return t


def _seed(text: str) -> int:
    if not text.isdigit() or int(text) >= 2 ** 62:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer in 0..2**62 - 1 (request i gets seed + i)")
    return int(text)


def cmd_tree_tiny(args) -> int:
    """``tree-tiny``: the tiny checkpoint served with a fixed draft tree (``--tree``) per mode and tree, prompts at each
    concurrency, fp32 with exact Triton dots, against ``treewy.decode.generate`` with the same tree, drafter
    (``--drafter``: mtp or ngram) and mode. At temperature 0 every output must equal generate's (one "N/N equal" line
    per run). At ``--temperature`` T > 0 request i carries seed ``--seed`` + i and generate runs the batch with seed
    ``--seed``: two random streams, so per run the accepted depth per step is compared instead, vLLM's counters against
    generate's records (``compare_depths``, one line per concurrency). Writes tree_tiny.json and tree_tiny.txt."""
    import torch

    from treewy.decode import generate
    from treewy.models import load
    from treewy.models.corpus import heldout_prompts
    from treewy.ops.verify.tuning import PRECISION_ENV, pin_first_configs
    from treewy.serve.export import export_vllm
    from treewy.serve.tree_trace import TRACE_ENV, TRACE_STEPS_ENV

    if args.trace and args.compile != "eager":
        raise SystemExit("--trace reads values back every traced step: serve with --compile eager")
    check_gpus(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_vllm(ROOT / "treewy/models/tiny", "/tmp/tiny-vllm", overwrite=True))
    prompts = heldout_prompts(args.prompts, args.prompt_len, seed=0)
    trees = [tuple(int(w) for w in t.split(",")) for t in args.trees]
    sampled = args.temperature > 0
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "prompts": prompts,
              "new_tokens": args.new_tokens, "drafter": args.drafter, "temperature": args.temperature,
              "seed": args.seed if sampled else None, "compile": args.compile, "runs": [], "lines": []}
    # fp32, equal up to real near-ties: vLLM's Triton dots (TRITON_F32_DEFAULT) and treewy's verify kernels, whose
    # dots pass their precision explicitly (PRECISION_ENV; tf32 on an H200 by default), exact in the servers and in
    # generate here. Run 8 (2026-12-05) had treewy's in tf32: reconstruct trees parted from generate (4-40 of 40
    # equal), the store-all kernel (no tf32 dots) 40/40
    env_extra = {"TREEWY_FP32_PREFILL": "1", "TRITON_F32_DEFAULT": "ieee", PRECISION_ENV: "ieee"}
    os.environ[PRECISION_ENV] = "ieee"
    sampling = {"temperature": args.temperature, "seed": args.seed} if sampled else {}
    model = load("tiny", dtype=torch.float32, device="cuda")
    for tree in trees:
        for mode in args.modes:
            # generate's verify kernels run their first config, as the served ones do (tree_vllm.install pins them),
            # and none is timed: on a fresh machine 7 minutes went by before the first server started (2026-12-04,
            # the first reference compiling its kernels; the timing line says how much the reference takes)
            t0 = time.time()
            pin_first_configs(True)
            try:
                ref = generate(model, prompts, drafter=args.drafter, tree=tree, commit=mode,
                               max_new_tokens=args.new_tokens, **sampling)
            finally:
                pin_first_configs(False)
            log(f"{mode} tree {tree}: generate's reference took {time.time() - t0:.1f} s")
            ref_tokens = [list(map(int, t)) for t in ref.tokens]
            opts = ServeOptions(model=model_dir, mode=mode, gmu=0.3, max_num_seqs=max(args.concurrency),
                                port=args.port, max_model_len=2048, served_model_name="tiny", tree=tree,
                                drafter=args.drafter,
                                num_speculative_tokens=DraftTree.from_widths(tree).num_drafts,
                                extra_args=VLLM_026_ARGS + ["--dtype", "float32"] + compile_args(args.compile))
            run = {"tree": list(tree), "mode": mode, "phases": {}}
            head = f"{mode} tree {tree} {args.drafter}"
            try:
                argv, env = build_command(opts)
                tag = f"{mode}_{'-'.join(map(str, tree))}"
                trace = {TRACE_ENV: str((out / f"trace_{tag}.jsonl").resolve()),
                         TRACE_STEPS_ENV: str(args.trace)} if args.trace else {}
                with VLLMServer(argv, {**env, **ENV_026, **env_extra, **trace, STACKS_ENV: "1"}, opts.base_url,
                                log_path=str(out / f"server_tree_{tag}.log"), echo=False) as srv:
                    srv.wait_healthy(timeout=900)
                    for c in args.concurrency:
                        before = counters(opts.base_url)
                        if sampled:
                            def ask(i):
                                return complete_seeded(opts.base_url, "tiny", prompts[i], args.new_tokens,
                                                       args.temperature, args.seed + i)
                        else:
                            def ask(i):
                                return complete(opts.base_url, "tiny", prompts[i], args.new_tokens)
                        outs = run_requests(ask, range(len(prompts)), c, args.stall_s,
                                            on_stall=lambda: stall_report(srv))
                        phase = {"outputs": outs, "counters": delta(before, counters(opts.base_url))}
                        if sampled:
                            phase["depths"] = compare_depths(served_depth_counts(phase["counters"], len(tree)),
                                                             engine_depth_counts(ref.steps, len(tree)))
                            line = f"{head} c{c} temperature {args.temperature:g}: {depth_line(phase['depths'])}"
                        else:
                            phase["equal"] = sum(a == b[:len(a)] for a, b in zip(outs, ref_tokens))
                            phase["depth_counts"] = {"served": served_depth_counts(phase["counters"], len(tree)),
                                                     "generate": engine_depth_counts(ref.steps, len(tree))}
                            line = (f"{head} c{c}: {phase['equal']}/{len(ref_tokens)} equal to treewy.decode.generate; "
                                    f"{depth_counts_line(**phase['depth_counts'])}")
                        run["phases"][f"c{c}"] = phase
                        report["lines"].append(line)
            except Exception as e:  # noqa: BLE001 - recorded, the other runs go on
                run["error"] = f"{type(e).__name__}: {e}"
                report["lines"].append(f"{head}: FAILED ({run['error']})")
            log(report["lines"][-1])
            report["runs"].append(run)
            (out / "tree_tiny.json").write_text(json.dumps(report))
    how = (f"temperature {args.temperature:g}, request i seeded {args.seed} + i, generate seeded {args.seed}"
           if sampled else "temperature 0")
    (out / "tree_tiny.txt").write_text("\n".join([f"tree-tiny {report['date']} on {report['device']}, "
                                                   f"{len(prompts)} prompts x {args.new_tokens} new tokens, fp32, "
                                                   f"{how}, compile {args.compile}", *report["lines"]]) + "\n")
    print("\n".join(report["lines"]))
    ok = all("error" not in r and all(p["depths"]["matches"] if sampled else p["equal"] == len(prompts)
                                      for p in r["phases"].values()) for r in report["runs"])
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny")
    t.add_argument("--out", required=True)
    t.add_argument("--prompts", type=int, default=40)
    t.add_argument("--prompt-len", type=int, default=64)
    t.add_argument("--new-tokens", type=int, default=48)
    t.add_argument("--preempt-blocks", type=int, default=40)
    t.add_argument("--preempt-seqs", type=int, default=16, help="max_num_seqs of the preemption run (<= blocks)")
    t.add_argument("--preempt-tokens", type=int, default=160, help="new tokens per request in the preemption run")
    t.add_argument("--modes", default="store_all,reconstruct", type=lambda s: s.split(","))
    t.add_argument("--stages", default="graphs,preempt", type=lambda s: s.split(","))
    t.add_argument("--port", type=int, default=8011)
    t.add_argument("--compile", default="decode", choices=tuple(COMPILE), help="for the preemption stage")
    t.add_argument("--graphs-compile", default="default", choices=tuple(COMPILE), help="for the graphs stage")
    t.add_argument("--triton-f32", default="tf32", choices=("tf32", "ieee"),
                   help="TRITON_F32_DEFAULT for the servers: vLLM's Triton attention multiplies fp32 tiles with "
                        "tl.dot, tf32 unless this says ieee (the 2026-11-30 fp32 run used tf32)")
    t.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="the model's dtype in vLLM and in treewy.decode.generate (float32: kernels that round "
                        "differently agree far below the smallest gap between the top two logits)")
    s = sub.add_parser("sweep")
    s.add_argument("--out", required=True)
    s.add_argument("--mode", required=True, choices=("store_all", "reconstruct"))
    s.add_argument("--gmu", type=float, default=0.6)
    s.add_argument("--workloads", default=None, help="default: the predictions' three (treewy.sim.predict)")
    s.add_argument("--concurrency", default=None, help="default: the predictions' grid (treewy.sim.predict)")
    s.add_argument("--num-prompts", type=int, default=None,
                   help="at least this many requests per point (default: the predictions', 16)")
    s.add_argument("--max-model-len", type=int, default=2048)
    s.add_argument("--port", type=int, default=8021)
    s.add_argument("--compile", default="decode", choices=tuple(COMPILE))
    s.add_argument("--graph-max-tokens", type=int, default=None,
                   help="the largest step captured as a CUDA graph (default: max_num_seqs x (1 + k) = 1024; vLLM "
                        "0.26's own default is 512)")
    s.add_argument("--acceptance", default=None,
                   help="treewy's --acceptance (default paper-35b on these dummy weights; none: the drafts' own, "
                        "which accept nothing here, as on 2026-11-30)")
    s.add_argument("--tree", default=None, metavar="W1,W2,...",
                   help="serve this draft tree (k = its N drafts; acceptance per depth: the paper's Table 2 length, "
                        "or with --acceptance tiny the tiny checkpoint's measured rates)")
    s.add_argument("--drafter", default="mtp", choices=("mtp", "ngram"), help="the tree's drafter")
    s.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                   help="start no point after this many seconds (the rest: the same command again, --resume-from)")
    s.add_argument("--resume-from", default=None, metavar="DIR",
                   help="a folder holding an earlier run's serve35b_<mode>.parquet and .points.jsonl to continue")
    s.add_argument("--pack", action="store_true",
                   help="pack results/ (per-point results, server log) into results.tar.gz at the end")
    s.add_argument("--retry-failed", action="store_true",
                   help="rerun the points the checkpoint in --out records as failed (finished ones are kept)")
    a = sub.add_parser("acceptance")
    a.add_argument("--out", required=True)
    a.add_argument("--mode", required=True, choices=("store_all", "reconstruct"))
    a.add_argument("--acceptance", default=None, help="treewy's --acceptance (default paper-35b)")
    a.add_argument("--gmu", type=float, default=0.6)
    a.add_argument("--workload", default="generation-short")
    a.add_argument("--concurrency", default="32,256")
    a.add_argument("--num-prompts", type=int, default=4, help="at least this many requests per point")
    a.add_argument("--max-model-len", type=int, default=2048)
    a.add_argument("--port", type=int, default=8041)
    a.add_argument("--compile", default="decode", choices=tuple(COMPILE))
    f = sub.add_parser("fault")
    f.add_argument("--out", required=True)
    f.add_argument("--mode", default="reconstruct", choices=("store_all", "reconstruct"))
    f.add_argument("--port", type=int, default=8031)
    f.add_argument("--compile", default="decode", choices=tuple(COMPILE))
    tt = sub.add_parser("tree-tiny")
    tt.add_argument("--out", required=True)
    tt.add_argument("--prompts", type=int, default=40)
    tt.add_argument("--prompt-len", type=int, default=64)
    tt.add_argument("--new-tokens", type=int, default=48)
    tt.add_argument("--trees", default="2,2,1;2,2,2;3,3,3", type=lambda s: s.split(";"),
                    help="semicolon-separated trees, each its widths")
    tt.add_argument("--modes", default="store_all,reconstruct", type=lambda s: s.split(","))
    tt.add_argument("--concurrency", default="1,32", type=lambda s: [int(x) for x in s.split(",")])
    tt.add_argument("--port", type=int, default=8051)
    tt.add_argument("--drafter", default="mtp", choices=("mtp", "ngram"),
                    help="the served drafter (vLLM's mtp or ngram method) and the reference's")
    tt.add_argument("--compile", default="decode", choices=tuple(COMPILE),
                    help="decode: every decode step (the tree's verify) replayed from a full CUDA graph, no "
                         "torch.compile (servers start in seconds); default: vLLM's own compile and graphs")
    tt.add_argument("--temperature", type=_temperature, default=0.0,
                    help="0: outputs equal to generate's; above 0: sampled, accepted depths compared statistically")
    tt.add_argument("--stall-s", type=float, default=STALL_S, metavar="SECONDS",
                    help="a phase with no answer for this long is stalled: the server's stacks go to its log, the "
                         "run is recorded as failed and the next (tree, mode) starts")
    tt.add_argument("--trace", type=int, default=0, metavar="STEPS",
                    help="trace the first STEPS tree steps of each server against vLLM's own ops "
                         "(treewy.serve.tree_trace; needs --compile eager): trace_<mode>_<tree>.jsonl")
    tt.add_argument("--seed", type=_seed, default=0,
                    help="at --temperature > 0: request i's vLLM seed is this + i, generate's seed is this")
    c = sub.add_parser("compare")
    c.add_argument("--out", required=True, help="the merged report (json)")
    c.add_argument("reports", nargs="+")
    for sp in (t, s, a):
        sp.add_argument("--tp", type=int, default=1, help="vLLM's --tensor-parallel-size (that many visible GPUs)")
    args = p.parse_args(argv)
    return {"tiny": cmd_tiny, "sweep": cmd_sweep, "acceptance": cmd_acceptance, "fault": cmd_fault,
            "compare": cmd_compare, "tree-tiny": cmd_tree_tiny}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
