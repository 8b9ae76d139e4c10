"""A stand-in ``vllm`` executable for the serving tests (standard library only, 127.0.0.1 only).

    fake_vllm.py serve MODEL --host 127.0.0.1 --port P ...   an OpenAI-compatible server:
        /health, /v1/models, /v1/completions (streamed, SSE like vLLM), /metrics (Prometheus text
        with vLLM's metric names: KV usage, running requests, preemptions, spec-decode counters)
    fake_vllm.py bench serve --base-url URL --save-result --result-dir D --result-filename F ...
        sends --num-prompts streamed requests (closed loop --max-concurrency, or open loop
        --request-rate) and writes a result JSON with vllm bench serve's keys.

Speculation: without a synthetic sampler each step accepts REAL_RATES' worth of drafts (3.2 tokens per step at
k = 3, deterministic). With vLLM 0.26's --speculative-config keys "rejection_sample_method": "synthetic" and
"synthetic_acceptance_rates" (validated as vLLM does) each step draws its drafts as vLLM's sampler does: draft i is
accepted when a uniform draw is below a_i / a_(i-1), stopping at the first rejection; the draws of a request are
seeded by its prompt (and its ``seed`` sampling parameter, when sent), so a run's counters are reproducible.
A /v1/completions body with ``return_token_ids`` and no ``stream`` gets one JSON reply with ``token_ids`` (0..n - 1).

Knobs (environment): FAKE_VLLM_DIE_AFTER=N (the server exits after its N-th completion request),
FAKE_VLLM_FAIL_START=1 (the server exits at once), FAKE_VLLM_CALL_LOG=path (one line per bench run),
FAKE_VLLM_REQUEST_LOG=path (one line per completion request: its prompt length, max_tokens, stream flag, temperature
and seed),
FAKE_VLLM_ACCEPT_SCALE=x (a faulty synthetic sampler: every conditional rate times x).
TREEWY_MODE=reconstruct makes the fake KV pool 2.4x roomier per request, like the plugin.
A served tree (TREEWY_TREE=W1,W2,..., k = its N drafts) accepts at most its depth D drafts per step, at
TREEWY_TREE_RATES (D unconditional per-depth rates, the plugin's tree sampler) when set; vLLM's counters then count
position d - 1 for depth d, and positions D..N - 1 stay 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_DELAY_S = 0.006
REAL_RATES = (1.0, 0.7, 0.5)  # per-position acceptance of the fake's own drafts: 3.2 tokens per step at k = 3


class State:
    def __init__(self, mode: str):
        self.lock = threading.Lock()
        self.running = 0
        self.completions = 0
        self.preemptions = 0
        self.drafts = 0.0
        self.draft_tokens = 0.0
        self.accepted = 0.0
        self.per_pos = [0.0] * 3
        self.k = 3
        self.conditional: list[float] | None = None  # synthetic sampler: conditional acceptance per position
        self.depth: int | None = None  # a served tree's depth: the most drafts a step accepts
        self.per_req = 0.05 if mode == "reconstruct" else 0.12  # KV fraction one running request holds


def serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speculative-config", default='{"num_speculative_tokens": 3}')
    p.add_argument("--served-model-name")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    args, _ = p.parse_known_args(argv)
    if os.environ.get("FAKE_VLLM_FAIL_START"):
        print("ERROR fake vllm: CUDA out of memory while loading weights", flush=True)
        return 1
    assert args.host == "127.0.0.1", "the fake server binds to 127.0.0.1 only"
    die_after = int(os.environ.get("FAKE_VLLM_DIE_AFTER", "0"))
    st = State(os.environ.get("TREEWY_MODE", "store_all"))
    spec = json.loads(args.speculative_config)
    st.k = spec.get("num_speculative_tokens", 3)
    st.per_pos = [0.0] * st.k
    if spec.get("rejection_sample_method") == "synthetic":
        rates = spec.get("synthetic_acceptance_rates")
        if (not isinstance(rates, list) or len(rates) != st.k or not all(0 <= r <= 1 for r in rates)
                or any(b > a for a, b in zip(rates, rates[1:]))):
            print(f"ValueError: synthetic_acceptance_rates must be {st.k} non-increasing rates in [0, 1], got {rates}",
                  flush=True)
            return 1
        scale = float(os.environ.get("FAKE_VLLM_ACCEPT_SCALE", "1"))
        st.conditional = [scale * (p / q if q > 0 else 0.0) for p, q in zip(rates, [1.0, *rates[:-1]])]
    elif "synthetic_acceptance_rates" in spec:
        print("ValueError: synthetic_acceptance_rates are only valid with rejection_sample_method='synthetic'.")
        return 1
    if os.environ.get("TREEWY_TREE"):
        st.depth = len(os.environ["TREEWY_TREE"].split(","))
        if os.environ.get("TREEWY_TREE_RATES"):
            rates = [float(x) for x in os.environ["TREEWY_TREE_RATES"].split(",")]
            st.conditional = [p / q if q > 0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])]
    print(f"INFO TREEWY_TREE={os.environ.get('TREEWY_TREE')}", flush=True)
    print(f"INFO speculative_config={json.dumps(spec)}, tensor_parallel_size={args.tensor_parallel_size}", flush=True)
    name = args.served_model_name or args.model

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body: bytes, ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode())
            elif self.path == "/metrics":
                with st.lock:
                    lab = f'engine="0",model_name="{name}"'
                    text = "\n".join([
                        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                        "# TYPE vllm:kv_cache_usage_perc gauge",
                        f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, st.running * st.per_req)}",
                        "# TYPE vllm:num_requests_running gauge",
                        f"vllm:num_requests_running{{{lab}}} {float(st.running)}",
                        "# TYPE vllm:num_preemptions_total counter",
                        f"vllm:num_preemptions_total{{{lab}}} {float(st.preemptions)}",
                        f"vllm:spec_decode_num_drafts_total{{{lab}}} {st.drafts}",
                        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {st.draft_tokens}",
                        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {st.accepted}",
                        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {a}'
                          for i, a in enumerate(st.per_pos)),
                        "",
                    ])
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self):
            if self.path != "/v1/completions":
                self._send(404, b'{"error": "not found"}')
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if os.environ.get("FAKE_VLLM_REQUEST_LOG"):
                prompt = body.get("prompt")
                with st.lock, open(os.environ["FAKE_VLLM_REQUEST_LOG"], "a") as f:
                    f.write(json.dumps({"prompt_len": len(prompt) if isinstance(prompt, list) else None,
                                        "max_tokens": body.get("max_tokens"), "stream": body.get("stream"),
                                        "temperature": body.get("temperature"), "seed": body.get("seed")}) + "\n")
            with st.lock:
                st.completions += 1
                if die_after and st.completions >= die_after:
                    print("fake vllm: engine core died (FAKE_VLLM_DIE_AFTER)", flush=True)
                    os._exit(3)
                st.running += 1
                if st.running * st.per_req > 1.0:
                    st.preemptions += 1
            try:
                n = int(body.get("max_tokens", 16))
                draws = str(body.get("prompt")) + ("" if body.get("seed") is None else f"|{body['seed']}")
                if body.get("return_token_ids") and not body.get("stream"):
                    # one JSON reply with the token ids, at once (nothing streamed to pace), counted before it is
                    # sent so that a scrape after the reply sees this request's steps
                    with st.lock:
                        speculate(st, n, draws)
                    choice = {"index": 0, "text": " tok" * n, "token_ids": list(range(n)), "finish_reason": "length"}
                    self._send(200, json.dumps({"id": "cmpl-fake", "object": "text_completion", "model": name,
                                                "choices": [choice]}).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(obj):
                    data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                for i in range(n):
                    time.sleep(TOKEN_DELAY_S)
                    chunk({"id": "cmpl-fake", "object": "text_completion", "model": name,
                           "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}]})
                chunk({"id": "cmpl-fake", "object": "text_completion", "model": name, "choices": [],
                       "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}})
                chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                with st.lock:
                    speculate(st, n, draws)
            finally:
                with st.lock:
                    st.running -= 1

    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    print(f"INFO fake vllm {args.model} serving on http://{args.host}:{args.port}", flush=True)
    print(f"INFO TREEWY_MODE={os.environ.get('TREEWY_MODE')} VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        print("INFO fake vllm: shutting down", flush=True)
    return 0


def speculate(st: State, n: int, prompt: str) -> None:
    """Count the speculative steps that emit a request's n tokens after its first (the prefill's)."""
    most = st.k if st.depth is None else min(st.k, st.depth)
    if st.conditional is None:
        rates = [REAL_RATES[i] if i < min(len(REAL_RATES), most) else 0.0 for i in range(st.k)]
        steps = (n - 1) / (1 + sum(rates))
        st.drafts += steps
        st.draft_tokens += steps * st.k
        st.accepted += steps * sum(rates)
        st.per_pos = [a + steps * r for a, r in zip(st.per_pos, rates)]
        return
    rng, emitted = random.Random(prompt), 1
    while emitted < n:
        accepted = 0
        while accepted < min(most, len(st.conditional)) and rng.random() < st.conditional[accepted]:
            st.per_pos[accepted] += 1
            accepted += 1
        st.drafts += 1
        st.draft_tokens += st.k
        st.accepted += accepted
        emitted += 1 + accepted


def _scrape(base: str) -> dict[str, float]:
    out = {}
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name = line.split("{")[0].split(" ")[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def bench(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", required=True)
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--random-output-len", type=int, default=16)
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", required=True)
    args, _ = p.parse_known_args(argv)
    if os.environ.get("FAKE_VLLM_CALL_LOG"):
        with open(os.environ["FAKE_VLLM_CALL_LOG"], "a") as f:
            f.write(json.dumps({"max_concurrency": args.max_concurrency, "request_rate": args.request_rate}) + "\n")
    base = args.base_url.rstrip("/")
    before = _scrape(base)

    def one(i):
        t0 = time.perf_counter()
        req = urllib.request.Request(base + args.endpoint, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": args.model, "prompt": f"prompt {i}", "stream": True,
                                                      "max_tokens": args.random_output_len}).encode())
        times = []
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        if json.loads(line[6:]).get("choices"):
                            times.append(time.perf_counter())
        except Exception as e:  # noqa: BLE001 (a failed request is counted, like vllm bench serve does)
            return {"ok": False, "error": str(e)}
        return {"ok": bool(times), "ttft": times[0] - t0 if times else None, "e2el": time.perf_counter() - t0,
                "n": len(times), "itl": [b - a for a, b in zip(times, times[1:])]}

    t_start = time.perf_counter()
    workers = args.max_concurrency or args.num_prompts
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = []
        for i in range(args.num_prompts):
            futures.append(pool.submit(one, i))
            if args.request_rate != float("inf"):
                time.sleep(1.0 / args.request_rate)
        results = [f.result() for f in futures]
    duration = time.perf_counter() - t_start
    ok = [r for r in results if r["ok"]]
    try:
        after = _scrape(base)
    except Exception:  # noqa: BLE001
        after = before

    def stats(name, values):
        v = values or [0.0]
        s = sorted(v)
        return {f"mean_{name}_ms": statistics.mean(v) * 1000, f"median_{name}_ms": statistics.median(v) * 1000,
                f"std_{name}_ms": statistics.pstdev(v) * 1000,
                f"p99_{name}_ms": s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))] * 1000}

    out_tokens = sum(r["n"] for r in ok)
    result = {"date": time.strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": args.model,
              "tokenizer_id": args.model, "num_prompts": args.num_prompts, "request_rate": args.request_rate,
              "burstiness": 1.0, "max_concurrency": args.max_concurrency, "duration": duration,
              "completed": len(ok), "failed": len(results) - len(ok), "total_input_tokens": 8 * len(ok),
              "total_output_tokens": out_tokens, "request_throughput": len(ok) / duration,
              "output_throughput": out_tokens / duration, "total_token_throughput": (out_tokens + 8 * len(ok)) / duration,
              "max_concurrent_requests": workers}
    result.update(stats("ttft", [r["ttft"] for r in ok]))
    result.update(stats("tpot", [(r["e2el"] - r["ttft"]) / max(1, r["n"] - 1) for r in ok]))
    result.update(stats("itl", [x for r in ok for x in r["itl"]]))
    result.update(stats("e2el", [r["e2el"] for r in ok]))
    drafts = after.get("vllm:spec_decode_num_drafts_total", 0) - before.get("vllm:spec_decode_num_drafts_total", 0)
    acc = after.get("vllm:spec_decode_num_accepted_tokens_total", 0) - before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0)
    if drafts > 0:
        result["spec_decode_acceptance_length"] = 1 + acc / drafts
    print(f"============ Serving Benchmark Result ============\nSuccessful requests: {len(ok)}\n"
          f"Failed requests: {len(results) - len(ok)}", flush=True)
    if args.save_result:
        os.makedirs(args.result_dir, exist_ok=True)
        with open(os.path.join(args.result_dir, args.result_filename), "w") as f:
            json.dump(result, f)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(os.environ.get("FAKE_VLLM_VERSION", "0.26.0"))
        return 0
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if argv[:2] == ["bench", "serve"]:
        return bench(argv[2:])
    print(f"fake vllm: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
