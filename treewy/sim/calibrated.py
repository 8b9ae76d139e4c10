"""Server configs whose fixed step costs were fitted to a measured serving sweep (``ServerConfig``'s defaults
are assumptions). Each names the sweep, the server settings it holds for, and the fit.

``H200_VLLM026_DECODE_GRAPHS``: vLLM 0.26.0 on one H200, served as ``benchmarks/vllm_serve_gpu.py sweep``
serves it (``--compile decode``: no torch.compile, full CUDA graphs for decode-only steps of up to 512 tokens,
vLLM's max_cudagraph_capture_size there; max_num_seqs 256). Fitted on 2026-11-30 to Qwen3.5-35B-A3B with
dummy weights at gmu 0.6, workloads generation-short and summarize-short, both modes, concurrency 1-256 (24
points, ``treewy/data/serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-11-30.parquet``; ``benchmarks/sim_vs_measured.py``
writes the comparison to ``benchmarks/results/sim_vs_measured_qwen3.5-35b-a3b_h200_2026-11-30.txt``):

- on the 16 points whose wave ran at once (decode steps under CUDA graphs), measured minus assumed TPOT by least
  squares as a per-step constant plus a per-running-request term: host_overhead_s 0.5 ms -> 6.32 ms,
  host_per_request_s 0 -> 0.113 ms (this server runs the model without torch.compile);
- then on the 8 points that queued: a step with a prefill chunk, or with more than 512 tokens (TreeWY at 256
  concurrent requests runs 137-147 of them, 4 tokens each), runs without CUDA graphs and costs 86.1 ms on top.
  That is why TreeWY's TPOT more than doubled past 128 requests (46 -> 117 ms), which the simulator with
  graphs everywhere did not: a server that admits more requests needs a larger max_cudagraph_capture_size.

The memory side needed no change: the pool matched vLLM's, and the admitted requests to within one request at
every point once max_num_seqs matched (store-all 47-48 running against the simulator's 46-48; TreeWY 128 of 128,
then 147 and 137 of 256 against 147 and 138). Not captured: summarize-short's TPOT at 16-32 requests (measured
20.0-28.1 ms, simulated 25.8-32.5) and the TTFT of a wave sent at once (README.md, "Time to first token").
The fit holds with and without asynchronous scheduling (the fitted points are single waves, which it does not move).
"""

from __future__ import annotations

from treewy.memory import ServerConfig

H200_VLLM026_DECODE_GRAPHS = ServerConfig(max_num_seqs=256, host_overhead_s=6.32e-3, host_per_request_s=1.13e-4,
                                          graph_max_tokens=512, graphs_decode_only=True, eager_step_s=8.61e-2)
