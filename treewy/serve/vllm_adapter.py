"""Everything that depends on which vLLM is installed: the supported versions and the names the plugin hooks.

vLLM 0.26.x is the version the plugin runs on (tested on an H200: the ``vllm``-marked tests and
benchmarks/vllm_serve_gpu.py); 0.33.x is checked against its source only (``vllm_names.check_source``).
Nothing here imports vLLM at import time.
"""

from __future__ import annotations

#: Supported vLLM release lines, and how far each is verified.
SUPPORTED = {"0.26": "served and tested on an H200", "0.33": "names checked against its source only"}

#: The ``[serve]`` extra's requirement: the supported release lines and nothing between them.
SERVE_REQUIREMENT = "vllm>=0.26,<0.34," + ",".join(f"!=0.{m}.*" for m in range(27, 33))

#: The module of vLLM's Qwen GDN layer, and the function its ``_forward_core`` calls for the spec rows
#: (vLLM's store-all kernel; called with ``num_accepted_tokens=`` there and nowhere else).
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_LAYER = "QwenGatedDeltaNetAttention"
SPEC_UPDATE = "fused_sigmoid_gating_delta_rule_update"
#: The layer module's prefill op; its ``forward_native`` (the Triton backend) is what ``fp32_prefill`` replaces.
PREFILL_OP = "ChunkGatedDeltaRule"

#: Fused decode paths of the layer that bypass ``SPEC_UPDATE`` (switched off in reconstruct mode).
FUSED_PATH_FLAGS = ("enable_packed_recurrent_decode", "enable_fused_gdn_spec_decode")

#: Model classes whose ``get_mamba_state_{shape,dtype}_from_config`` plan vLLM's page padding.
MODEL_CLASSES = {
    "0.26": (("vllm.model_executor.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
             ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM")),
    "0.33": (("vllm.model_executor.models.qwen3_5", "Qwen3_5ForCausalLMBase"),
             ("vllm.model_executor.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
             ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM")),
}


def release_line(version: str) -> str | None:
    """"0.26" for "0.26.0", "0.26.1rc2+cu130", ...; None for an unsupported version."""
    parts = version.split(".")
    line = ".".join(parts[:2]) if len(parts) >= 2 else version
    return line if line in SUPPORTED else None


def unsupported_message(version: str) -> str:
    lines = ", ".join(f"{k}.x ({v})" for k, v in SUPPORTED.items())
    return (f"vLLM {version} is not supported by treewy's plugin and launcher; supported: {lines}. "
            f"Install one with: pip install 'treewy[serve]' ({SERVE_REQUIREMENT})")


def check_version(version: str) -> str:
    """The release line of ``version``; ValueError naming the supported ones otherwise."""
    line = release_line(version)
    if line is None:
        raise ValueError(unsupported_message(version))
    return line


def installed_version() -> str | None:
    """The installed vLLM's version from its package metadata (no import of vLLM), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None
