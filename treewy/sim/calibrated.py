"""Server configs whose fixed step costs were fitted to a measured serving sweep (``ServerConfig``'s defaults
are assumptions). The fits live in the server fits table (kind "server_fits" of treewy/data/index.json): per
config, the fitted ``ServerConfig`` fields, the device, engine and date, how the server was launched, the measured
table it was fitted to (kind "serving") and how each field was fitted, with what the fit left uncaptured;
``benchmarks/sim_vs_measured.py`` writes the point-by-point comparison.

``H200_VLLM026_DECODE_GRAPHS``: vLLM 0.26.0 on one H200, served as ``benchmarks/vllm_serve_gpu.py sweep`` serves
it (decode-only CUDA graphs, no torch.compile), fitted to Qwen3.5-35B-A3B with dummy weights at gmu 0.6. Its host
overheads come from the points whose wave ran at once; its eager-step cost from the points that queued, where a
step with a prefill chunk or more tokens than the largest captured graph runs without graphs: why TreeWY's TPOT
jumps once it admits more requests than a graph holds tokens for (a server that admits more requests needs a
larger max_cudagraph_capture_size). Its prefill costs (per request with a prefill chunk in a step, per prefill token)
come from the time to first token of the points that paid no one-time cost and did not queue
(``benchmarks/results/ttft_explained_2026-12-01.md``): a wave sent at once waits for the prefill step that holds it,
which costs a few ms per request more than the roofline and the decode-step fit priced; with them the eager-step cost
was fitted again, and moved down. The memory side needed no change.
"""

from __future__ import annotations

import json

from treewy.memory import ServerConfig
from treewy.results import table


def fitted(name: str) -> ServerConfig:
    """The ServerConfig the server fits table holds under ``name``."""
    fits = json.loads(table("server_fits").read_text())
    if name not in fits:
        raise ValueError(f"name = {name!r}: the server fits table has {', '.join(fits)}")
    return ServerConfig(**fits[name]["server"])


H200_VLLM026_DECODE_GRAPHS = fitted("H200_VLLM026_DECODE_GRAPHS")
