"""The server a model runs on: vLLM's knobs that shape the pool, and the fixed costs of an engine step.

``paging`` reads the scheduling limits and the memory-profile terms; the simulator (``treewy.sim``) reads the
limits, the fixed step costs and the scheduling mode. The fixed costs are defined here and nowhere else:
``treewy.sim.cost.StepCost`` takes them from the ``ServerConfig`` it is given. Their defaults are assumed, not
calibrated; ``treewy.sim.calibrated`` holds configs fitted to measured serving sweeps, each saying which.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    """A vLLM server as memory and the simulator see it; the limits are ``vllm serve``'s on a >= 70 GiB GPU."""

    max_num_seqs: int = 1024                # vLLM's default on large GPUs (treewy serve launches 256)
    max_num_batched_tokens: int = 8192
    kernel_block_alignment: int = 16
    # the memory profile's terms (``activation_reserve_bytes``), against vLLM 0.26's profile of the 35B on the H200
    # (the capacity logs ``benchmarks/vllm_serve_gpu.py sweep`` writes; benchmarks/README.md names them)
    cudagraph_gib: float = 1.0              # a guess (CUDA graphs on); the tiny model measured 0.14-0.17 GiB
    non_torch_gib: float = 0.22             # that profile's non-torch memory
    sampler_bytes_per_logit: float = 33.0   # fitted to that profile's peak activation
    mtp_in_pool: bool = True                # the MTP layer's KV shares the pool with the target's
    language_model_only: bool = True        # served text-only: the vision tower is not loaded
    # the step's fixed costs (treewy.sim.cost); assumed, unless a calibrated config says otherwise
    host_overhead_s: float = 0.5e-3         # per engine step
    host_per_request_s: float = 0.0         # per running request per step (scheduling, sampling, bookkeeping)
    layer_floor_s: float = 20e-6            # per layer per forward pass
    graph_max_tokens: int | None = None     # vLLM's max_cudagraph_capture_size (512 by default there): steps of
    graphs_decode_only: bool = False        # more tokens, or with a prefill chunk under FULL_DECODE_ONLY graphs,
    eager_step_s: float = 0.0               # run eagerly and cost this on top
    prefill_request_s: float = 0.0          # per request with a prefill chunk in a step (its host-side setup)
    prefill_token_s: float = 0.0            # per prefill token, beyond the roofline's price for it
    # vLLM 0.26 schedules step K + 1 before it reads step K's outputs (v1/engine/core.py step_with_batch_queue,
    # a batch queue of 2; "Asynchronous scheduling is enabled" in its log): what a step frees or sends is seen late
    async_scheduling: bool = True
