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

``H200_VLLM026_GRAPHS1024_ACCEPTED``: the same server with graphs captured up to 1024 tokens and vLLM's synthetic
acceptance at the paper's 35B chain (3.23 tokens per step), refitted on 2026-12-02 to that sweep at gmu 0.6
(``benchmarks/results/sim_vs_measured_qwen3.5-35b-a3b_h200_gmu0.6_accepted_2026-12-02.txt``), its host costs on the
points whose TPOT measures decode steps alone (``decode_bound``: summarize-short's long prompts interleave prefill
chunks with decoding from 32 requests up, which the first fit's per-request term had absorbed). Its predictions for
the gmus not yet measured are committed before they run; gmu 0.75 then judged them (below).

``H200_VLLM026_GRAPHS1024_LONGSTEPS``: the same sweep (all 36 points), its eager step priced on what it measures
directly: the engine's long steps in vllm bench serve's records, whose mean per point the simulated eager steps'
mean matches (``benchmarks/sim_vs_measured.py --long-steps``; the steps counted agree, the price was half:
``benchmarks/results/long_steps_vs_sim_35b_h200_gmu0.6_2026-12-02.txt``). The eager step costs 119 ms beyond a
graph step, and the TTFT fit then needs no per-prefill-token cost. Its predictions for gmu 0.75 and 0.9 are
committed before those runs too.

``H200_VLLM026_GRAPHS1024_TWO_GMU``: the long-step fit made again over gmu 0.6 and 0.75 together (68 points,
2026-12-04), after the three fits above had predicted gmu 0.75 out of sample: the long-step fit erred least there
(RMS log error 0.166 in throughput, 0.191 in TPOT, 0.485 in p99 TTFT over 32 points; the first fit 0.241, 0.256,
0.617; ``benchmarks/results/recalibration_h200_gmu0.75_2026-12-04.md``), and refitted on both gmus no constant
moved by more than 10 %. ``H200_DEFAULT`` names it: the simulator's H200 server for runs whose drafts are accepted
(``treewy.sim.predict``, the serving panel's twins of such runs, the width chart).
"""

from __future__ import annotations

import json

from treewy.memory import ServerConfig
from treewy.results import table


def fit_record(name: str) -> dict:
    """The server fits table's entry ``name``: its ServerConfig fields, device, date, what it was fitted to and how."""
    fits = json.loads(table("server_fits").read_text())
    if name not in fits:
        raise ValueError(f"name = {name!r}: the server fits table has {', '.join(fits)}")
    return fits[name]


def fitted(name: str) -> ServerConfig:
    """The ServerConfig the server fits table holds under ``name``."""
    return ServerConfig(**fit_record(name)["server"])


H200_VLLM026_DECODE_GRAPHS = fitted("H200_VLLM026_DECODE_GRAPHS")
H200_VLLM026_GRAPHS1024_ACCEPTED = fitted("H200_VLLM026_GRAPHS1024_ACCEPTED")
H200_VLLM026_GRAPHS1024_LONGSTEPS = fitted("H200_VLLM026_GRAPHS1024_LONGSTEPS")
H200_VLLM026_GRAPHS1024_TWO_GMU = fitted("H200_VLLM026_GRAPHS1024_TWO_GMU")
#: The fit whose predictions erred least out of sample, refitted on every gmu measured since (see above).
H200_DEFAULT_FIT = "H200_VLLM026_GRAPHS1024_TWO_GMU"
H200_DEFAULT = H200_VLLM026_GRAPHS1024_TWO_GMU
