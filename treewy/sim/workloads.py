"""Request streams for the simulator: length distributions and arrival processes.

Five length distributions, each a stand-in for a benchmark people run against vLLM. Lengths are in
tokens; every draw is clipped to at least 4 tokens (vLLM's ShareGPT filter) and is an integer.

=================  ========================================  ======================================
workload           input (prompt) length                      output length
=================  ========================================  ======================================
sharegpt-chat      lognormal, median 150, sigma 1.0,          lognormal, median 150, sigma 0.9
                   at most 1024                               (prompt + output at most 2048)
spec-bench         six equal categories (MT-bench 80,         256, fixed (``--spec-bench-output-len``
                   translation 50, summarization 700,         default of ``vllm bench serve``)
                   QA 40, math 80, RAG 600), lognormal
                   sigma 0.4 around each median
balanced-chat      uniform 1024 +- 20 %                       uniform 1024 +- 20 %
generation-heavy   uniform 1024 +- 20 %                       uniform 8192 +- 20 %
summarize-heavy    uniform 8192 +- 20 %                       uniform 1024 +- 20 %
=================  ========================================  ======================================

Why these: ShareGPT as ``vllm bench serve --dataset-name sharegpt`` samples it (replies as output
lengths, mean ~230 / ~200 tokens, filtered to prompt <= 1024 and total <= 2048); Spec-Bench's
question mix (480 questions, 80 per category; summarization and RAG carry long documents) with
vLLM's fixed 256-token outputs; and the three input/output pairs the public InferenceMAX serving
benchmarks use for chat (1k/1k), reasoning (1k/8k) and summarization (8k/1k), with vLLM's random
dataset at ``--random-range-ratio 0.2``. The paper does not publish its exact traffic, so none of
these were tuned to its table. All outputs run to their length (``--ignore-eos``).

Arrivals: a closed loop keeps ``concurrency`` requests in flight (``--max-concurrency`` with an
infinite request rate: a new request is sent when one finishes); an open loop sends requests at
Poisson times of a given ``rate`` (req/s).
"""

from __future__ import annotations

import numpy as np

WORKLOADS = ("sharegpt-chat", "spec-bench", "balanced-chat", "generation-heavy", "summarize-heavy")

_SPEC_BENCH_MEDIANS = np.array([80, 50, 700, 40, 80, 600])


def _uniform(rng, center, n, ratio=0.2):
    return rng.integers(int(center * (1 - ratio)), int(center * (1 + ratio)) + 1, size=n)


def sample_lengths(workload: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens), int64 [n] each, for ``n`` requests of a workload."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload = {workload!r}: unknown workload; known workloads are {list(WORKLOADS)}")
    if workload == "sharegpt-chat":
        prompt = np.clip(rng.lognormal(np.log(150), 1.0, n), 4, 1024)
        out = np.clip(rng.lognormal(np.log(150), 0.9, n), 4, None)
        out = np.minimum(out, 2048 - prompt)
    elif workload == "spec-bench":
        cat = rng.integers(0, len(_SPEC_BENCH_MEDIANS), size=n)
        prompt = rng.lognormal(np.log(_SPEC_BENCH_MEDIANS[cat]), 0.4)
        out = np.full(n, 256)
    elif workload == "balanced-chat":
        prompt, out = _uniform(rng, 1024, n), _uniform(rng, 1024, n)
    elif workload == "generation-heavy":
        prompt, out = _uniform(rng, 1024, n), _uniform(rng, 8192, n)
    else:
        prompt, out = _uniform(rng, 8192, n), _uniform(rng, 1024, n)
    prompt = np.maximum(np.round(prompt), 4).astype(np.int64)
    out = np.maximum(np.round(out), 4).astype(np.int64)
    return prompt, out


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Send times (s) of ``n`` requests at a Poisson rate (req/s), the first at 0."""
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
