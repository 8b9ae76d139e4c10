"""The serving sweep of the 35B architecture on one H200 as the simulator predicts it, before the GPU run.

The grid: gmu 0.6, 0.75, 0.9 x the three workloads of the measured sweep (``MEASURED_WORKLOADS``:
generation-short, summarize-short, balanced-short) x concurrency 1, 8, 32, 64, 128, 256 x both modes, at the
paper's synthetic acceptance (its 35B depth-3 MTP chain, 3.23 tokens per step: ``acceptance_rates``' default), on
the server ``treewy.sim.calibrated.H200_DEFAULT`` describes (max_num_seqs 256, decode-only CUDA graphs) with graphs
captured up to max_num_seqs x (1 + k) = 1024 tokens, as the launcher asks vLLM for (``capture_plan``), and with
``requests_per_point(c)`` requests per point, the number the GPU sweep sends (``--num-prompts 16``, one wave per
concurrency): one wave of c requests, and at least 16, so that at low concurrency TTFT and TPOT are means over 16
requests rather than one request's time.

A served tree's sweep (``vllm_serve_gpu.py sweep --tree W``, issue 30's width curve) is the same grid with
``tree=W``: graphs up to max_num_seqs x (1 + N) tokens (``server_for``) and the served sampler's per-depth rates
(``served_acceptance``: the paper's Table 2 length for the shape, or the tiny checkpoint's measured rates).
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from treewy.paper import CONCURRENCIES
from treewy.serve.acceptance import conditional_rates, parse_acceptance
from treewy.serve.launcher_command import ServeOptions, capture_plan
from treewy.sim.calibrated import H200_DEFAULT, H200_DEFAULT_FIT, fitted
from treewy.sim.sweep import simulate_many
from treewy.tree import DraftTree
from treewy.workloads import CATALOGUE, MEASURED_WORKLOADS, MIN_REQUESTS

GMUS = (0.6, 0.75, 0.9)
REQUESTS_PER_CONCURRENCY = 1
WORKLOADS = MEASURED_WORKLOADS
#: The server fit the predictions price steps with (``treewy.sim.calibrated``).
DEFAULT_FIT = H200_DEFAULT_FIT
CHAIN = (1, 1, 1)


def graph_max_tokens(tree=CHAIN) -> int:
    """The largest step the launcher has vLLM capture for the sweep's server of ``tree``: max_num_seqs x (1 + N)
    (1024 for the chain)."""
    opts = ServeOptions(model="qwen3.5-35b-a3b", num_speculative_tokens=DraftTree.from_widths(tree).num_drafts,
                        max_num_seqs=H200_DEFAULT.max_num_seqs, tree=None if tuple(tree) == CHAIN else tuple(tree))
    return capture_plan(opts).max_size


def server_from_fit(name: str, tree=CHAIN):
    """The server fit ``name`` (``treewy.sim.calibrated.fitted``) with graphs captured as the sweep's launcher asks
    for ``tree``."""
    return replace(fitted(name), graph_max_tokens=graph_max_tokens(tree))


def server_for(tree=CHAIN):
    """The default fit's server for the sweep of ``tree``."""
    return server_from_fit(DEFAULT_FIT, tree)


def served_acceptance(tree, form: str = "paper-35b") -> list[float]:
    """The simulator's per-depth conditional rates for a sweep of ``tree`` served at ``--acceptance form``
    (treewy.serve.acceptance): the served sampler's unconditional P(depth >= d) over P(depth >= d - 1)."""
    return conditional_rates(parse_acceptance(form, len(tuple(tree)), dummy=True, tree=tuple(tree)).rates)


def requests_per_point(concurrency: int) -> int:
    """Requests sent at one closed-loop point: max(concurrency, 16)."""
    return max(REQUESTS_PER_CONCURRENCY * int(concurrency), MIN_REQUESTS)


def _lengths(workload: str, n: int, rng: np.random.Generator):
    """vLLM's random dataset: uniform integers in [centre x (1 - r), centre x (1 + r)], as ``sample_lengths``."""
    w = CATALOGUE[workload]
    i, o, r = w.input_len, w.output_len, w.range_ratio
    draw = lambda c: rng.integers(int(c * (1 - r)), int(c * (1 + r)) + 1, size=n)  # noqa: E731
    return draw(i), draw(o)


def predict_calls(gmus=GMUS, workloads=WORKLOADS, concurrency=CONCURRENCIES, seed: int = 0, acceptance=None,
                  server=None, tree=CHAIN) -> list[dict]:
    """``simulate``'s arguments for every point of the grid (both modes each), in ``predict``'s order."""
    server = server_for(tree) if server is None else server
    calls = []
    for gmu in gmus:
        for wi, wl in enumerate(workloads):
            for ci, c in enumerate(concurrency):
                n = requests_per_point(c)
                calls.append(dict(model="qwen3.5-35b-a3b", gpu="h200", tp=1, gmu=gmu, mode=["store_all", "reconstruct"],
                                  workload=wl, concurrency=[c], seed=seed, num_prompts=n,
                                  lengths=_lengths(wl, n, np.random.default_rng([seed, wi, ci])),
                                  acceptance=acceptance, server=server, tree=tuple(tree)))
    return calls


def predict(gmus=GMUS, workloads=WORKLOADS, concurrency=CONCURRENCIES, seed: int = 0, acceptance=None,
            server=None, tree=CHAIN, on_point=None) -> pl.DataFrame:
    """SIMULATED rows (``treewy.schema``) for every point of the grid, H200, TP1, the 35B architecture, serving
    ``tree`` on ``server`` (default ``server_for(tree)``); all points in one batch across the simulator's workers.
    on_point(done, total): progress."""
    return pl.concat(simulate_many(predict_calls(gmus, workloads, concurrency, seed, acceptance, server, tree),
                                   on_point=on_point))


def sim_commit() -> str:
    """The checkout's HEAD, with '+dirty' when treewy/sim or treewy/memory differ from it."""
    root = Path(__file__).resolve().parents[2]
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--", "treewy/sim", "treewy/memory")
                                        else "")
