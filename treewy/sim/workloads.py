"""Request streams for the simulator: the catalogue's length distributions (``treewy.workloads``) and arrivals.

Every draw is clipped to at least 4 tokens (vLLM's ShareGPT filter) and is an integer. Workloads of real prompts
shipped as files (``mt-bench``) send every prompt of the file once in a random order and then repeats drawn at
random, as vLLM's loader does, with the file's prompt lengths in Qwen3.5 tokens approximated as bytes / 4
(``treewy.workloads.qwen_token_lengths``).

Arrivals: a closed loop keeps ``concurrency`` requests in flight (``--max-concurrency`` with an
infinite request rate: a new request is sent when one finishes); an open loop sends requests at
Poisson times of a given ``rate`` (req/s).
"""

from __future__ import annotations

import numpy as np

from treewy.workloads import CATALOGUE, SWEEP_WORKLOADS, prompt_rows, qwen_token_lengths

WORKLOADS = SWEEP_WORKLOADS

_SPEC_BENCH_MEDIANS = np.array([80, 50, 700, 40, 80, 600])


_FILE_LENGTHS: dict[str, np.ndarray] = {}


def file_prompt_lengths(workload: str) -> np.ndarray:
    """The prompt lengths (approximate Qwen3.5 tokens) of a workload shipped as a file, read once."""
    if workload not in _FILE_LENGTHS:
        prompts = [r["prompt"] for r in prompt_rows(workload)]
        _FILE_LENGTHS[workload] = np.array(qwen_token_lengths(prompts), dtype=np.int64)
    return _FILE_LENGTHS[workload]


def _uniform(rng, center, n, ratio):
    return rng.integers(int(center * (1 - ratio)), int(center * (1 + ratio)) + 1, size=n)


def sample_lengths(workload: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens), int64 [n] each, for ``n`` requests of a workload."""
    if workload not in CATALOGUE:
        raise ValueError(f"workload = {workload!r}: unknown workload; known workloads are {list(CATALOGUE)}")
    w = CATALOGUE[workload]
    if workload == "sharegpt-chat":
        prompt = np.clip(rng.lognormal(np.log(150), 1.0, n), 4, 1024)
        out = np.clip(rng.lognormal(np.log(150), 0.9, n), 4, None)
        out = np.minimum(out, 2048 - prompt)
    elif workload == "spec-bench":
        cat = rng.integers(0, len(_SPEC_BENCH_MEDIANS), size=n)
        prompt = rng.lognormal(np.log(_SPEC_BENCH_MEDIANS[cat]), 0.4)
        out = np.full(n, w.output_len)
    elif w.dataset == "custom":
        lens = file_prompt_lengths(workload)  # each prompt once (shuffled), then repeats drawn at random
        prompt = np.concatenate([rng.permutation(lens)[:n], rng.choice(lens, size=max(0, n - len(lens)))])
        out = np.full(n, w.output_len)
    else:
        prompt, out = _uniform(rng, w.input_len, n, w.range_ratio), _uniform(rng, w.output_len, n, w.range_ratio)
    prompt = np.maximum(np.round(prompt), 4).astype(np.int64)
    out = np.maximum(np.round(out), 4).astype(np.int64)
    return prompt, out


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Send times (s) of ``n`` requests at a Poisson rate (req/s), the first at 0."""
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
