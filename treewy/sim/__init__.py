"""Serving simulator: a vLLM-style scheduler over treewy.memory's paging and a roofline step cost.

    from treewy.sim import simulate
    df = simulate(model="qwen3.5-35b-a3b", gpu="b200", gmu=0.6, mode="reconstruct",
                  workload="generation-heavy", concurrency=[1, 8, 32, 64, 128, 256])

Modules: ``workloads`` (length distributions, arrivals), ``cost`` (per-step roofline),
``scheduler`` (continuous batching, chunked prefill, admission, preemption) and ``fast_path`` (its
pure-decode steps in vectorized blocks), ``sweep`` (the driver and the ratio table), ``pool`` (its points across
processes), ``cli`` (``treewy simulate``). Every row it returns is labelled
``simulated=True, device="simulated"``. See README.md in this folder for the choices made.
"""

from treewy.sim.sweep import (CONCURRENCIES, acceptance_rates, format_ratio_table, knee,
                              ratio_table, simulate, simulate_many, sweep)
from treewy.sim.workloads import WORKLOADS

__all__ = ["CONCURRENCIES", "WORKLOADS", "acceptance_rates", "format_ratio_table", "knee", "ratio_table",
           "simulate", "simulate_many", "sweep"]
