"""Server configs whose fixed step costs were fitted to a measured serving sweep (``ServerConfig``'s defaults
are assumptions). Each names the sweep, the server settings it holds for, and the fit.

``H200_VLLM026_DECODE_GRAPHS``: vLLM 0.26.0 on one H200, served as ``benchmarks/vllm_serve_gpu.py sweep``
serves it (``--compile decode``: no torch.compile, full CUDA graphs for decode steps only; max_num_seqs 256).
Fitted on 2026-11-30 to Qwen3.5-35B-A3B with dummy weights at gmu 0.6, workload generation-short, both modes,
concurrency 1-128 (10 points, ``treewy/data/serving_qwen3.5-35b-a3b_h200_gmu0.6_2026-11-30.parquet``): the
measured mean TPOT minus the simulator's with the assumed constants was fitted by least squares as a per-step
constant plus a per-running-request term (``benchmarks/sim_vs_measured.py``; the comparison is in
``benchmarks/results/sim_vs_measured_qwen3.5-35b-a3b_h200_2026-11-30.txt``). The memory side needed no
change: the simulator's pool and admitted requests matched vLLM's at every point once max_num_seqs matched.
Not captured: this configuration's prefill (mean TTFT 0.5-4.5 s below the knee, the simulator's 24-108 ms).
"""

from __future__ import annotations

from treewy.memory import ServerConfig

H200_VLLM026_DECODE_GRAPHS = ServerConfig(max_num_seqs=256, host_overhead_s=7.93e-3, host_per_request_s=8.8e-5)
