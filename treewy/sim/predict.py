"""The serving sweep of the 35B architecture on one H200 as the simulator predicts it, before the GPU run.

The grid: gmu 0.6, 0.75, 0.9 x three workloads x concurrency 1, 8, 32, 64, 128, 256 x both modes, at the paper's
synthetic acceptance (its 35B depth-3 MTP chain, 3.23 tokens per step: ``acceptance_rates``' default), on the server
``H200_VLLM026_DECODE_GRAPHS`` describes (max_num_seqs 256, decode-only CUDA graphs of up to 512 tokens), with
``requests_per_point(c)`` requests per point, the number the GPU sweep sends (``--prompts-per-concurrency 4
--num-prompts 64``): at least 64, so that a p99 is not one request's time.

Workloads: ``generation-short`` and ``summarize-short`` (the catalogue's), and ``balanced-short``, balanced-chat
(1024 -> 1024) at 1/8 of its lengths, the scale of ``summarize-short``: random 128 -> 128 tokens, +- 20 %
(``vllm bench serve --dataset-name random --random-input-len 128 --random-output-len 128 --random-range-ratio 0.2``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import polars as pl

from treewy.paper import CONCURRENCIES
from treewy.sim.calibrated import H200_VLLM026_DECODE_GRAPHS
from treewy.sim.sweep import simulate
from treewy.workloads import CATALOGUE

GMUS = (0.6, 0.75, 0.9)
MIN_REQUESTS = 64
REQUESTS_PER_CONCURRENCY = 4
#: (input, output) centre lengths and spread of the workload that is not in the catalogue
BALANCED_SHORT = (128, 128, 0.2)
WORKLOADS = ("generation-short", "summarize-short", "balanced-short")


def requests_per_point(concurrency: int) -> int:
    """Requests sent at one closed-loop point: max(4 x concurrency, 64)."""
    return max(REQUESTS_PER_CONCURRENCY * int(concurrency), MIN_REQUESTS)


def _lengths(workload: str, n: int, rng: np.random.Generator):
    """vLLM's random dataset: uniform integers in [centre x (1 - r), centre x (1 + r)], as ``sample_lengths``."""
    i, o, r = BALANCED_SHORT if workload == "balanced-short" else (
        CATALOGUE[workload].input_len, CATALOGUE[workload].output_len, CATALOGUE[workload].range_ratio)
    draw = lambda c: rng.integers(int(c * (1 - r)), int(c * (1 + r)) + 1, size=n)  # noqa: E731
    return draw(i), draw(o)


def predict(gmus=GMUS, workloads=WORKLOADS, concurrency=CONCURRENCIES, seed: int = 0, acceptance=None,
            server=H200_VLLM026_DECODE_GRAPHS) -> pl.DataFrame:
    """SIMULATED rows (``treewy.schema``) for every point of the grid, H200, TP1, the 35B architecture."""
    frames = []
    for gi, gmu in enumerate(gmus):
        for wi, wl in enumerate(workloads):
            for ci, c in enumerate(concurrency):
                n = requests_per_point(c)
                lengths = _lengths(wl, n, np.random.default_rng([seed, wi, ci]))
                frames.append(simulate("qwen3.5-35b-a3b", "h200", 1, gmu, mode=["store_all", "reconstruct"],
                                       workload=wl, concurrency=[c], seed=seed, num_prompts=n, lengths=lengths,
                                       acceptance=acceptance, server=server))
    return pl.concat(frames)


def sim_commit() -> str:
    """The checkout's HEAD, with '+dirty' when treewy/sim or treewy/memory differ from it."""
    root = Path(__file__).resolve().parents[2]
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--", "treewy/sim", "treewy/memory")
                                        else "")
