"""Build, start, watch and stop ``vllm serve`` with MTP speculation, in store_all or reconstruct mode.

Three parts, each its own module, every public name importable from here:

- ``launcher_command``: ``ServeOptions`` and ``build_command`` (pure; the dry run prints it), the acceptance asked
  for and ``capture_plan`` (the CUDA graph sizes);
- ``launcher_checks``: preflight checks (the port, vLLM on PATH, the visible GPUs, MTP weights, ``--tp``);
- ``launcher_process``: ``VLLMServer`` (its own process group, log streaming, ``/health``, a clean stop) and the
  ``/proc`` readers a sweep uses to find a server an earlier run left behind.
"""

from __future__ import annotations

from treewy.serve.launcher_checks import (
    check_gpu,
    check_mtp_weights,
    check_port_free,
    check_tensor_parallel,
    check_vllm_installed,
    visible_gpus,
)
from treewy.serve.launcher_command import (
    CAPTURE_KEYS,
    COMPILATION_FLAGS,
    PLUGIN_NAME,
    CapturePlan,
    ServeError,
    ServeOptions,
    acceptance_of,
    build_command,
    capture_grid,
    capture_plan,
    dummy_weights,
    extra_value,
    format_command,
)
from treewy.serve.launcher_process import (
    PR_SET_PDEATHSIG,
    VLLMServer,
    cmdline,
    descendants,
    group_members,
    has_proc,
    process_alive,
    process_start_time,
)

__all__ = [
    "CAPTURE_KEYS", "COMPILATION_FLAGS", "PLUGIN_NAME", "PR_SET_PDEATHSIG", "CapturePlan", "ServeError", "ServeOptions",
    "VLLMServer", "acceptance_of", "build_command", "capture_grid", "capture_plan", "check_gpu", "check_mtp_weights",
    "check_port_free", "check_tensor_parallel", "check_vllm_installed", "cmdline", "descendants", "dummy_weights",
    "extra_value", "format_command", "group_members", "has_proc", "process_alive", "process_start_time",
    "visible_gpus",
]
