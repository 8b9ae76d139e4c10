"""Two checks of point 4 on real vLLM (0.26.x) in fp32, run in-process so that nothing depends on timing.

    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_fp32_checks probe --out DIR [--triton-f32 ieee]
    PYTHONPATH=/tmp/site:. python -m benchmarks.vllm_fp32_checks preempt --out DIR

``probe``: how far vLLM's fp32 prefill is from exact. vLLM (stock, no drafts, ``TREEWY_FP32_PREFILL=1``) scores the
held-out prompts of ``vllm_serve_gpu.py tiny`` with ``prompt_logprobs`` and ``logprobs`` of 5; the tiny model in
fp64 and in fp32 on the CPU scores the same tokens. Prints the largest and median |logprob difference| of vLLM and
of the fp32 model against fp64, and each engine's logprob gap between two given tokens of one prompt (``--tie``,
default: prompt 6, tokens 79 and 69, the one first token where vLLM and ``treewy.decode.generate`` parted in
fp32 on 2026-11-30). ``--triton-f32 ieee`` sets TRITON_F32_DEFAULT for vLLM's Triton kernels (its attention
multiplies fp32 tiles with ``tl.dot``, tf32 by default).

``preempt``: the preemption run of point 4 with the scheduling made equal. Each mode runs in its own process
through ``vllm.LLM`` with the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that every request is
queued before the first step and the schedule is a function of the inputs alone. Both modes get the same
``--block-size`` and the same blocks per request (``TREEWY_EQUAL_BLOCKS=1``: reconstruct keeps store-all's k
speculative blocks, unused), so a pool of ``--blocks`` blocks preempts the same requests at the same steps as
long as the two modes accept the same drafts. Writes the outputs, the spec-decode counters and the preemptions of
each mode, and compares them with each other and with ``treewy.decode.generate`` (fp32, CUDA).

``ties`` (CPU): for a ``preempt`` report, the fp64 model's logit gap wherever an output parts from treewy's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.vllm_serve_gpu import ENV_026, treewy_outputs

ROOT = Path(__file__).resolve().parents[1]

#: vLLM's engine settings both checks share: the tiny model in fp32, prefix caching off (reconstruct's
#: requirement), the GDN prefill through treewy's exact recurrence in both modes (vLLM 0.26's refuses fp32).
ENGINE = dict(dtype="float32", max_model_len=2048, enable_prefix_caching=False, gpu_memory_utilization=0.3,
              language_model_only=True, gdn_prefill_backend="triton", disable_log_stats=False)
ENV = {**ENV_026, "TREEWY_FP32_PREFILL": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompts(n: int, length: int) -> list[list[int]]:
    from treewy.models.corpus import heldout_prompts

    return heldout_prompts(n, length, seed=0)


def run_worker(job: dict, env: dict, out: Path, name: str) -> dict:
    """Run ``job`` in a fresh process (vLLM reads the plugin's environment at import) and return its result."""
    job_path, res_path = out / f"{name}.job.json", out / f"{name}.result.json"
    job_path.write_text(json.dumps({**job, "result": str(res_path)}))
    with open(out / f"{name}.log", "w") as f:
        rc = subprocess.run([sys.executable, "-m", "benchmarks.vllm_fp32_checks", "worker", str(job_path)],
                            cwd=ROOT, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not res_path.is_file():
        tail = (out / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
        return {"error": f"worker exited with {rc}", "log_tail": tail}
    return json.loads(res_path.read_text())


def counters(metrics) -> dict:
    """Spec-decode counters and preemptions from ``LLM.get_metrics()``."""
    by = {}
    for m in metrics:
        name = m.name.removesuffix("_total")
        if hasattr(m, "values"):
            by[name] = [int(x) for x in m.values]
        elif hasattr(m, "value"):
            by[name] = by.get(name, 0) + int(m.value)
    return {"drafts": by.get("vllm:spec_decode_num_drafts", 0),
            "draft_tokens": by.get("vllm:spec_decode_num_draft_tokens", 0),
            "accepted": by.get("vllm:spec_decode_num_accepted_tokens", 0),
            "accepted_per_pos": by.get("vllm:spec_decode_num_accepted_tokens_per_pos", []),
            "preemptions": by.get("vllm:num_preemptions", 0)}


def worker(job_path: str) -> int:
    """One engine in this process: ``job["kind"]`` "probe" (logprobs, no drafts) or "generate" (MTP k = 3)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(Path(job_path).read_text())
    t0 = time.time()
    llm = LLM(model=job["model"], **ENGINE, **job["engine"])
    start_s = round(time.time() - t0, 1)
    reqs = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    res = {"start_s": start_s, "num_gpu_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
           "block_size": llm.llm_engine.vllm_config.cache_config.block_size}
    if job["kind"] == "probe":
        sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, prompt_logprobs=5)
        outs = llm.generate(reqs, sp, use_tqdm=False)
        res["prompt_logprobs"] = [[None if d is None else {str(t): lp.logprob for t, lp in d.items()}
                                   for d in o.prompt_logprobs] for o in outs]
        res["next_logprobs"] = [{str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]
    else:
        sp = SamplingParams(max_tokens=job["new_tokens"], temperature=0.0, ignore_eos=True)
        t1 = time.time()
        outs = llm.generate(reqs, sp, use_tqdm=False)
        res["seconds"] = round(time.time() - t1, 2)
        res["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
        res["counters"] = counters(llm.get_metrics())
    Path(job["result"]).write_text(json.dumps(res))
    return 0


def reference_logprobs(model, prompt: list[int]):
    """log_softmax of the tiny model's logits at every position of ``prompt`` (its dtype, CPU), as float64."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
    return torch.log_softmax(logits, -1)


def probe_rows(probe: dict, plist, ref64, ref32) -> dict:
    """|logprob difference| against fp64 of vLLM and of the fp32 model, over every scored (position, token)."""
    import statistics

    d_vllm, d_fp32 = [], []
    for i, p in enumerate(plist):
        rows = [(pos - 1, d) for pos, d in enumerate(probe["prompt_logprobs"][i]) if d is not None]
        rows.append((len(p) - 1, probe["next_logprobs"][i]))
        for pos, d in rows:
            for t, lp in d.items():
                exact = float(ref64[i][pos, int(t)])
                d_vllm.append(abs(lp - exact))
                d_fp32.append(abs(float(ref32[i][pos, int(t)]) - exact))
    summary = lambda xs: {"max": max(xs), "median": statistics.median(xs), "n": len(xs)}  # noqa: E731
    return {"vllm_vs_fp64": summary(d_vllm), "fp32_model_vs_fp64": summary(d_fp32)}


def cmd_probe(args) -> int:
    import torch

    from treewy.models import load
    from treewy.serve.export import export_vllm

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_vllm(ROOT / "treewy/models/tiny", "/tmp/tiny-vllm-probe", overwrite=True))
    plist = prompts(args.prompts, args.prompt_len)
    env = {**ENV, "TREEWY_MODE": "store_all", "TRITON_F32_DEFAULT": args.triton_f32}
    log(f"probe: vLLM fp32, TRITON_F32_DEFAULT={args.triton_f32}")
    probe = run_worker({"kind": "probe", "model": model_dir, "prompts": plist, "engine": {"enforce_eager": True}},
                       env, out, f"probe_{args.triton_f32}")
    if "error" in probe:
        print(json.dumps(probe, indent=1))
        return 1
    log(f"probe: vLLM started in {probe['start_s']} s; scoring in fp64 and fp32 on the CPU")
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    refs = {}
    for dt in (torch.float64, torch.float32):
        model = load("tiny", dtype=dt)
        refs[dt] = [reference_logprobs(model, p) for p in plist]
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else "cpu", "triton_f32": args.triton_f32, **probe_rows(probe, plist, refs[torch.float64],
                                                                     refs[torch.float32])}
    i, (a, b) = args.tie_prompt, args.tie_tokens
    pos = len(plist[i]) - 1
    nxt = probe["next_logprobs"][i]
    report["tie"] = {"prompt": i, "tokens": [a, b],
                     "vllm": nxt[str(a)] - nxt[str(b)] if str(a) in nxt and str(b) in nxt else None,
                     "fp32_model": float(refs[torch.float32][i][pos, a] - refs[torch.float32][i][pos, b]),
                     "fp64_model": float(refs[torch.float64][i][pos, a] - refs[torch.float64][i][pos, b])}
    top = [max(d, key=d.get) for d in probe["next_logprobs"]]
    report["vllm_argmax_differs_from_fp64"] = [j for j in range(len(plist))
                                               if top[j] != str(int(refs[torch.float64][j][-1].argmax()))]
    path = out / f"probe_{args.triton_f32}.json"
    path.write_text(json.dumps({**report, "prompts": plist, "vllm": probe}))
    print(json.dumps(report, indent=1))
    return 0


def cmd_preempt(args) -> int:
    import torch

    from treewy.serve.export import export_vllm

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(export_vllm(ROOT / "treewy/models/tiny", "/tmp/tiny-vllm-preempt", overwrite=True))
    plist = prompts(args.prompts, args.prompt_len)
    engine = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 3}, "max_num_seqs": args.max_num_seqs,
              "num_gpu_blocks_override": args.blocks, "block_size": args.block_size,
              "compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "prompts": plist,
              "new_tokens": args.new_tokens, "engine": engine, "triton_f32": args.triton_f32, "runs": {}}
    for mode in ("store_all", "reconstruct"):
        env = {**ENV, "TREEWY_MODE": mode, "TREEWY_EQUAL_BLOCKS": "1", "TRITON_F32_DEFAULT": args.triton_f32}
        if mode == "reconstruct":
            env["VLLM_PLUGINS"] = "treewy"
        log(f"preempt: {mode}")
        report["runs"][mode] = run_worker({"kind": "generate", "model": model_dir, "prompts": plist,
                                           "engine": engine, "new_tokens": args.new_tokens}, env, out,
                                          f"preempt_{mode}")
        log(f"preempt: {mode}: { {k: v for k, v in report['runs'][mode].items() if k != 'outputs'} }")
    t0 = time.time()
    report["treewy_generate"] = treewy_outputs(plist, args.new_tokens, "float32")
    report["treewy_generate_s"] = round(time.time() - t0, 1)
    report["verdict"] = verdict(report)
    (out / "preempt_equal_blocks.json").write_text(json.dumps(report))
    print(json.dumps(report["verdict"], indent=1))
    return 0 if report["verdict"].get("all_equal") else 1


def verdict(report: dict) -> dict:
    """Outputs and counters of the two modes against each other, and outputs against treewy.decode.generate."""
    runs, ref = report["runs"], report["treewy_generate"]
    if any("error" in r for r in runs.values()):
        return {"all_equal": False, "errors": {m: r["error"] for m, r in runs.items() if "error" in r}}
    a, b = runs["store_all"], runs["reconstruct"]
    v = {"outputs_equal": sum(x == y for x, y in zip(a["outputs"], b["outputs"])), "of": len(ref),
         "counters": {"store_all": a["counters"], "reconstruct": b["counters"]},
         "counters_equal": a["counters"] == b["counters"],
         "blocks": {m: (r["num_gpu_blocks"], r["block_size"]) for m, r in runs.items()},
         "equal_to_treewy": {m: sum(x == y[:len(x)] for x, y in zip(r["outputs"], ref)) for m, r in runs.items()}}
    v["all_equal"] = (v["outputs_equal"] == len(ref) and v["counters_equal"]
                      and all(n == len(ref) for n in v["equal_to_treewy"].values()))
    return v


def ties(report: dict) -> list[dict]:
    """Every output of a ``preempt`` report that parts from ``treewy.decode.generate``: where, both tokens, and the
    fp64 and fp32 tiny model's logit gap between them there (CPU). A gap far below the engines' measured fp32
    deviation (``probe``) is a tie that either side may break."""
    import torch

    from benchmarks.common import first_difference, next_logits
    from treewy.models import load

    rows, models = [], {dt: load("tiny", dtype=dt) for dt in (torch.float64, torch.float32)}
    for mode, run in report["runs"].items():
        for i, (out, ref) in enumerate(zip(run["outputs"], report["treewy_generate"])):
            j = first_difference(out, ref)
            if j is None:
                continue
            row = {"mode": mode, "prompt": i, "position": j, "vllm": out[j], "treewy": ref[j]}
            for dt, m in models.items():
                lg = next_logits(m, report["prompts"][i] + ref[:j])
                row[f"gap_{str(dt)[6:]}"] = float(lg[ref[j]] - lg[out[j]])
            rows.append(row)
    return rows


def cmd_ties(args) -> int:
    rows = ties(json.loads(Path(args.report).read_text()))
    Path(args.report).with_suffix(".ties.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(f"{r['mode']:12s} prompt {r['prompt']:2d} token {r['position']:3d}: vLLM {r['vllm']}, "
              f"treewy {r['treewy']}; logit[treewy] - logit[vLLM] = {r['gap_float64']:+.3g} (fp64), "
              f"{r['gap_float32']:+.3g} (fp32)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("probe", "preempt"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--prompts", type=int, default=40)
        s.add_argument("--prompt-len", type=int, default=64)
        s.add_argument("--triton-f32", default="tf32", choices=("tf32", "ieee"),
                       help="TRITON_F32_DEFAULT for vLLM's Triton kernels (tl.dot on fp32 tiles)")
    pr = sub.choices["probe"]
    pr.add_argument("--tie-prompt", type=int, default=6)
    pr.add_argument("--tie-tokens", type=int, nargs=2, default=(79, 69))
    pe = sub.choices["preempt"]
    pe.add_argument("--blocks", type=int, default=40, help="the pool (num_gpu_blocks_override), both modes")
    pe.add_argument("--block-size", type=int, default=96,
                    help="tokens per attention block, both modes (at least what reconstruct's page needs: 96 for "
                         "the tiny model in fp32)")
    pe.add_argument("--max-num-seqs", type=int, default=16)
    pe.add_argument("--new-tokens", type=int, default=160)
    t = sub.add_parser("ties", help="(CPU) the fp64 logit gap where a preempt report parts from treewy")
    t.add_argument("report")
    w = sub.add_parser("worker")
    w.add_argument("job")
    args = p.parse_args(argv)
    if args.cmd == "worker":
        return worker(args.job)
    return {"probe": cmd_probe, "preempt": cmd_preempt, "ties": cmd_ties}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
