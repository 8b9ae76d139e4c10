"""Everything that depends on which vLLM is installed: the supported versions and the names the plugin hooks.

vLLM 0.26.x is the version the plugin runs on (tested on an H200: the ``vllm``-marked tests and
benchmarks/vllm_serve_gpu.py); 0.33.x is checked against its source only (``vllm_names.check_source``).
Every vLLM module, class, function, attribute and keyword the plugin (``plugin``, ``fp32_prefill``,
``reconstruct.vllm_spec_update``) touches is named here once, as a constant, and read through the functions below;
``vllm_names`` checks each name against an install or a release's source. Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import dataclasses
import importlib

#: Supported vLLM release lines, and how far each is verified.
SUPPORTED = {"0.26": "served and tested on an H200", "0.33": "names checked against its source only"}

#: The ``[serve]`` extra's requirement: the supported release lines and nothing between them.
SERVE_REQUIREMENT = "vllm>=0.26,<0.34," + ",".join(f"!=0.{m}.*" for m in range(27, 33))

#: The module of vLLM's Qwen GDN layer, and the function its ``_forward_core`` calls for the spec rows
#: (vLLM's store-all kernel; called with ``num_accepted_tokens=`` there and nowhere else).
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_LAYER = "QwenGatedDeltaNetAttention"
SPEC_UPDATE = "fused_sigmoid_gating_delta_rule_update"
#: SPEC_UPDATE's keyword arguments (``reconstruct.vllm_spec_update`` takes them by these names), and the one the
#: plugin's wrapper reads to tell a spec-row call from any other.
SPEC_UPDATE_PARAMS = ("A_log", "a", "b", "dt_bias", "q", "k", "v", "initial_state", "cu_seqlens", "ssm_state_indices",
                      "num_accepted_tokens", "use_qk_l2norm_in_kernel")
NUM_ACCEPTED = "num_accepted_tokens"
#: The layer module's prefill op; its ``forward_native`` (the Triton backend) is what ``fp32_prefill`` replaces,
#: called with PREFILL_PARAMS by keyword.
PREFILL_OP = "ChunkGatedDeltaRule"
PREFILL_METHOD = "forward_native"
PREFILL_PARAMS = ("self", "q", "k", "v", "g", "beta", "initial_state", "output_final_state", "cu_seqlens",
                  "chunk_indices", "chunk_offsets", "use_qk_l2norm_in_kernel", "core_attn_out")

#: vLLM's out-of-tree layer registry (``PluggableLayer.register_oot`` fills it).
CUSTOM_OP_MODULE = "vllm.model_executor.custom_op"
OOT_REGISTRY = "op_registry_oot"
REGISTER_OOT = "register_oot"   # a classmethod of the layer (PluggableLayer's), called with name=
#: The per-step context: ``get_forward_context().attn_metadata`` maps a layer's prefix to its metadata.
FORWARD_CONTEXT_MODULE = "vllm.forward_context"
GET_FORWARD_CONTEXT = "get_forward_context"
ATTN_METADATA = "attn_metadata"
#: The KV-cache spec a Mamba-like layer returns (its page: ``shapes`` and ``dtypes``; its spare blocks per request).
KV_CACHE_MODULE = "vllm.v1.kv_cache_interface"
MAMBA_SPEC = "MambaSpec"
SPEC_SHAPES, SPEC_DTYPES, SPEC_SPARE_BLOCKS = "shapes", "dtypes", "num_speculative_blocks"

#: Attributes of vLLM's GDN layer the plugin reads: its shape on this rank's view (heads are the model's, all
#: ranks), its cache config, its name in the forward context and its bound KV cache.
LAYER_DIMS = {"tp": "tp_size", "num_k_heads": "num_k_heads", "num_v_heads": "num_v_heads",
              "head_k_dim": "head_k_dim", "head_v_dim": "head_v_dim", "num_spec": "num_spec"}
LAYER_CACHE_CONFIG, LAYER_PREFIX, LAYER_KV_CACHE = "cache_config", "prefix", "kv_cache"
#: ``CacheConfig.mamba_cache_mode``, and its value without prefix caching (the one mode reconstruct supports).
MAMBA_CACHE_MODE, NO_MAMBA_CACHE = "mamba_cache_mode", "none"
#: The HF text config's GDN fields (what the layer's ``__init__`` reads them as), and the path from a VllmConfig to
#: the text config, the tensor-parallel size and the speculative config.
CONFIG_HEADS = {"num_k_heads": "linear_num_key_heads", "num_v_heads": "linear_num_value_heads",
                "head_k_dim": "linear_key_head_dim", "head_v_dim": "linear_value_head_dim"}
MODEL_CONFIG, HF_TEXT_CONFIG = "model_config", "hf_text_config"
PARALLEL_CONFIG, TP_SIZE = "parallel_config", "tensor_parallel_size"
SPECULATIVE_CONFIG, NUM_SPECULATIVE_TOKENS = "speculative_config", "num_speculative_tokens"
#: GDNAttentionMetadata fields the layer's forward reads: row counts, the state slots of the non-spec and spec rows.
MD_NUM_PREFILLS, MD_NUM_DECODES = "num_prefills", "num_decodes"
MD_NON_SPEC_SLOTS, MD_SPEC_SLOTS = "non_spec_state_indices_tensor", "spec_state_indices_tensor"
#: per non-spec row (decodes, then prefills), whether it continues a state (context > 0); None without prefills
MD_HAS_INITIAL_STATE = "has_initial_state"

#: Fused decode paths of the layer that bypass ``SPEC_UPDATE`` (switched off in reconstruct mode), per release line.
FUSED_PATH_FLAGS = {"0.26": ("enable_packed_recurrent_decode",),
                    "0.33": ("enable_packed_recurrent_decode", "enable_fused_gdn_spec_decode")}

#: Model classes whose ``get_mamba_state_{shape,dtype}_from_config`` plan vLLM's page padding.
MODEL_CLASSES = {
    "0.26": (("vllm.model_executor.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
             ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM")),
    "0.33": (("vllm.model_executor.models.qwen3_5", "Qwen3_5ForCausalLMBase"),
             ("vllm.model_executor.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
             ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM")),
}
PAGE_METHODS = ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config")


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


def gdn_module():
    """vLLM's Qwen GDN layer module (imports vLLM)."""
    return importlib.import_module(GDN_MODULE)


def gdn_layer(gdn):
    return getattr(gdn, GDN_LAYER)


def register_layer(gdn, cls) -> None:
    """Make vLLM build ``cls`` wherever it builds its Qwen GDN layer (once per process)."""
    if GDN_LAYER not in getattr(importlib.import_module(CUSTOM_OP_MODULE), OOT_REGISTRY):
        getattr(gdn_layer(gdn), REGISTER_OOT)(cls, name=GDN_LAYER)


def spec_update(gdn):
    return getattr(gdn, SPEC_UPDATE)


def set_spec_update(gdn, fn) -> None:
    setattr(gdn, SPEC_UPDATE, fn)


def prefill_op():
    return getattr(gdn_module(), PREFILL_OP)


def set_prefill(op, fn) -> None:
    setattr(op, PREFILL_METHOD, fn)


def model_class(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def page_methods(cls) -> tuple:
    """The model class's (shape, dtype) page-planning classmethods, bound."""
    return tuple(getattr(cls, m) for m in PAGE_METHODS)


def set_page_methods(cls, methods) -> None:
    for m, fn in zip(PAGE_METHODS, methods):
        setattr(cls, m, fn)


def config_dims(vllm_config) -> dict:
    """The GDN shape a VllmConfig gives (``page_layout``'s keywords): tp, the model's heads and head dims, num_spec."""
    hf = getattr(getattr(vllm_config, MODEL_CONFIG), HF_TEXT_CONFIG)
    spec = getattr(vllm_config, SPECULATIVE_CONFIG)
    return {"tp": getattr(getattr(vllm_config, PARALLEL_CONFIG), TP_SIZE),
            **{k: getattr(hf, a) for k, a in CONFIG_HEADS.items()},
            "num_spec": getattr(spec, NUM_SPECULATIVE_TOKENS) if spec else 0}


def layer_dims(layer) -> dict:
    """The same shape as the built layer holds it."""
    return {k: getattr(layer, a) for k, a in LAYER_DIMS.items()}


def mamba_cache_mode(layer) -> str:
    return getattr(getattr(layer, LAYER_CACHE_CONFIG), MAMBA_CACHE_MODE)


def disable_fused_paths(layer, line: str) -> None:
    for flag in FUSED_PATH_FLAGS[line]:
        setattr(layer, flag, False)


def is_mamba_spec(spec) -> bool:
    return isinstance(spec, getattr(importlib.import_module(KV_CACHE_MODULE), MAMBA_SPEC))


def spec_page(spec) -> tuple:
    """(shapes, dtypes) of a MambaSpec's page."""
    return getattr(spec, SPEC_SHAPES), getattr(spec, SPEC_DTYPES)


def with_page(spec, shapes, dtypes, num_speculative_blocks: int):
    """The MambaSpec with this page and this many spare blocks per request."""
    page = {SPEC_SHAPES: shapes, SPEC_DTYPES: dtypes, SPEC_SPARE_BLOCKS: num_speculative_blocks}
    return dataclasses.replace(spec, **page)


def layer_kv_cache(layer) -> tuple:
    return getattr(layer, LAYER_KV_CACHE)


def layer_metadata(layer):
    """The layer's GDNAttentionMetadata in this step (None when the step has none for it, e.g. a profile run)."""
    ctx = getattr(importlib.import_module(FORWARD_CONTEXT_MODULE), GET_FORWARD_CONTEXT)()
    raw = getattr(ctx, ATTN_METADATA)
    return raw.get(getattr(layer, LAYER_PREFIX)) if isinstance(raw, dict) else None


def non_spec_slots(md):
    """The state slots of the step's prefill and plain-decode rows; None when it has none."""
    if md is None or (getattr(md, MD_NUM_PREFILLS) == 0 and getattr(md, MD_NUM_DECODES) == 0):
        return None
    return getattr(md, MD_NON_SPEC_SLOTS)


def fresh_non_spec_rows(md):
    """bool [non-spec rows]: the rows that start a request's state from nothing (a prefill's first chunk), whose slot
    holds whatever the block held before; None when the step has no prefill (every plain decode continues a state)."""
    has = getattr(md, MD_HAS_INITIAL_STATE, None) if md is not None else None
    return None if has is None else ~has


def spec_slots(md):
    """The spec rows' state slots [B, k + 1] (None: no spec rows)."""
    return getattr(md, MD_SPEC_SLOTS, None)


def set_spec_slots(md, slots) -> None:
    setattr(md, MD_SPEC_SLOTS, slots)


# ------------------------------------------------------------------------------------------------------------------
# Served trees (issue 30; ``tree_vllm``): the functions and methods a tree replaces, and what it reads off them.
# ------------------------------------------------------------------------------------------------------------------

#: The release lines a tree is wired for (``vllm_names`` checks the names below for these only).
TREE_LINES = ("0.26",)
#: The layer module's conv kernel; its spec-row call (``_forward_core``, the only one with ``num_accepted_tokens=``)
#: passes x, conv_state, weight, bias, activation positionally and the rest by keyword.
CONV_UPDATE = "causal_conv1d_update"
CONV_UPDATE_MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
CONV_UPDATE_PARAMS = ("x", "conv_state", "weight", "bias", "activation", "conv_state_indices", "num_accepted_tokens",
                      "query_start_loc")
CONV_SLOTS = "conv_state_indices"
#: SPEC_UPDATE's state pool keyword (store-all: N + 1 blocks per request, ``ssm_state_indices`` [B, N + 1]).
SPEC_INITIAL_STATE = "initial_state"
#: vLLM's rejection sampler, what its forward is given and returns.
SAMPLER_MODULE = "vllm.v1.sample.rejection_sampler"
REJECTION_SAMPLER, SAMPLER_FORWARD = "RejectionSampler", "forward"
SAMPLER_FORWARD_PARAMS = ("self", "metadata", "draft_probs", "logits", "sampling_metadata")
SPEC_METADATA_MODULE, SPEC_METADATA = "vllm.v1.spec_decode.metadata", "SpecDecodeMetadata"
MD_DRAFT_TOKENS, MD_NUM_DRAFT_TOKENS = "draft_token_ids", "num_draft_tokens"
SAMPLING_METADATA_MODULE, SAMPLING_METADATA = "vllm.v1.sample.metadata", "SamplingMetadata"
SAMPLING_ALL_GREEDY, SAMPLING_TEMPERATURE, SAMPLING_GENERATORS = "all_greedy", "temperature", "generators"
OUTPUTS_MODULE, SAMPLER_OUTPUT = "vllm.v1.outputs", "SamplerOutput"
SAMPLED_TOKEN_IDS, LOGPROBS_TENSORS = "sampled_token_ids", "logprobs_tensors"
#: The model runner: the inputs step (positions, then the slot mapping built from them) and the step after the
#: sampler (where vLLM counts each request's accepted tokens for the GDN layers' next step).
RUNNER_MODULE, RUNNER = "vllm.v1.worker.gpu_model_runner", "GPUModelRunner"
PREPARE_INPUTS, PREPARE_INPUTS_PARAMS = "_prepare_inputs", ("self", "scheduler_output", "num_scheduled_tokens")
AFTER_SAMPLE, AFTER_SAMPLE_PARAMS = ("_update_states_after_model_execute",
                                     ("self", "output_token_ids", "scheduler_output"))
#: The memory profile's sampler warm-up: vLLM's rejection sampler given one draft per request, random logits.
DUMMY_SAMPLER_RUN, DUMMY_SAMPLER_RUN_PARAMS = "_dummy_sampler_run", ("self", "hidden_states")
#: Runner attributes: the positions buffer (int64 [max_num_tokens]), M-RoPE's ([3, max_num_tokens] in a CpuGpuBuffer),
#: the packed windows' starts and the accepted counts (CpuGpuBuffers), the input batch's CPU copy of those counts and
#: the event the next step waits on before reading it, and whether async scheduling corrects the counts instead.
RUNNER_POSITIONS, RUNNER_USES_MROPE, RUNNER_MROPE_POSITIONS = "positions", "uses_mrope", "mrope_positions"
RUNNER_QUERY_START, RUNNER_NUM_ACCEPTED, RUNNER_ACCEPTED_EVENT = ("query_start_loc", "num_accepted_tokens",
                                                                 "num_accepted_tokens_event")
RUNNER_INPUT_BATCH, BATCH_ACCEPTED_CPU, RUNNER_ASYNC_SPEC = ("input_batch", "num_accepted_tokens_cpu_tensor",
                                                             "use_async_spec_decode")
INPUT_BATCH_MODULE, INPUT_BATCH = "vllm.v1.worker.gpu_input_batch", "InputBatch"
BUFFER_MODULE, BUFFER, BUFFER_GPU, BUFFER_NP = "vllm.v1.utils", "CpuGpuBuffer", "gpu", "np"


def conv_update(gdn):
    return getattr(gdn, CONV_UPDATE)


def set_conv_update(gdn, fn) -> None:
    setattr(gdn, CONV_UPDATE, fn)


def sampler_class():
    return getattr(importlib.import_module(SAMPLER_MODULE), REJECTION_SAMPLER)


def runner_class():
    return getattr(importlib.import_module(RUNNER_MODULE), RUNNER)


def sampler_output(token_ids):
    """vLLM's SamplerOutput holding ``token_ids`` [B, D + 1] (-1 padded) and no logprobs."""
    cls = getattr(importlib.import_module(OUTPUTS_MODULE), SAMPLER_OUTPUT)
    return cls(**{SAMPLED_TOKEN_IDS: token_ids, LOGPROBS_TENSORS: None})


def spec_drafts(md) -> tuple:
    """(draft_token_ids [B * N] on the device, num_draft_tokens: list[int]) of a SpecDecodeMetadata."""
    return getattr(md, MD_DRAFT_TOKENS), getattr(md, MD_NUM_DRAFT_TOKENS)


def temperature(sampling_metadata):
    """0.0 when every request is greedy, else the per-request temperatures [B] (a device tensor)."""
    return 0.0 if getattr(sampling_metadata, SAMPLING_ALL_GREEDY) else getattr(sampling_metadata, SAMPLING_TEMPERATURE)


def generators(sampling_metadata) -> dict:
    """{request row: torch.Generator} for the requests that asked for a ``seed`` (vLLM seeds one per such request;
    the others draw from the device's global generator)."""
    return getattr(sampling_metadata, SAMPLING_GENERATORS)


def runner_positions(runner) -> list:
    """The positions buffers the model reads: [positions] or M-RoPE's three rows (text tokens: all three equal)."""
    if getattr(runner, RUNNER_USES_MROPE):
        return list(getattr(getattr(runner, RUNNER_MROPE_POSITIONS), BUFFER_GPU))
    return [getattr(runner, RUNNER_POSITIONS)]


def runner_starts(runner, num_reqs: int):
    """The host copy (numpy) of each request's first packed token, this step."""
    return getattr(getattr(runner, RUNNER_QUERY_START), BUFFER_NP)[:num_reqs]


def uses_async_spec_decode(runner) -> bool:
    return bool(getattr(runner, RUNNER_ASYNC_SPEC, False))


def set_num_accepted(runner, counts) -> None:
    """What the GDN layers read next step as ``num_accepted_tokens`` (per request, moved with its row): the device
    buffer, its copy in the input batch, and the event the next step's read waits on."""
    n = counts.shape[0]
    getattr(getattr(runner, RUNNER_NUM_ACCEPTED), BUFFER_GPU)[:n] = counts
    getattr(getattr(runner, RUNNER_INPUT_BATCH), BATCH_ACCEPTED_CPU)[:n].copy_(counts, non_blocking=True)
    event = getattr(runner, RUNNER_ACCEPTED_EVENT)
    if event is not None:
        event.record()

#: The softmax layers' attention backends a served tree runs on, each (module, impl class, metadata class, backend
#: class, its ``get_name()``): vLLM picks FlashAttention where it can (bf16 / fp16; FA3 on an H200) and Triton where
#: FlashAttention cannot (fp32; the tiny checkpoint's H200 runs). ``tree_vllm`` replaces each impl's forward (the
#: tree attention on the windows, ``draft_pass_attention`` on an MTP tree pass) and compacts each one's layers. In
#: 0.26 the two keep one cache layout, K and V packed as [num_blocks, Hkv, block_size, 2 * D] (``split_kv_cache``;
#: ``vllm_names.TREE_FLAGS`` checks both), and both metadata classes carry the five fields ``attention_windows``
#: reads (all device tensors but the two counts); what else each backend's own forward reads is never asked of the
#: tree pass's metadata, which reaches no backend's own forward.
FLASH_MODULE, FLASH_IMPL, FLASH_BACKEND_NAME = ("vllm.v1.attention.backends.flash_attn", "FlashAttentionImpl",
                                                "FLASH_ATTN")
TRITON_MODULE, TRITON_IMPL, TRITON_BACKEND_NAME = ("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl",
                                                   "TRITON_ATTN")
TREE_ATTN_BACKENDS = ((FLASH_MODULE, FLASH_IMPL, "FlashAttentionMetadata", "FlashAttentionBackend",
                       FLASH_BACKEND_NAME),
                      (TRITON_MODULE, TRITON_IMPL, "TritonAttentionMetadata", "TritonAttentionBackend",
                       TRITON_BACKEND_NAME))
ATTN_FORWARD, ATTN_FORWARD_PARAMS = "forward", ("self", "layer", "query", "key", "value", "kv_cache",
                                                "attn_metadata", "output")
IMPL_HEAD_SIZE, IMPL_SCALE, IMPL_ATTN_TYPE = "head_size", "scale", "attn_type"
FA_NUM_TOKENS, FA_MAX_QUERY_LEN, FA_QUERY_START, FA_SEQ_LENS, FA_BLOCK_TABLE = (
    "num_actual_tokens", "max_query_len", "query_start_loc", "seq_lens", "block_table")
DECODER_ATTN = "decoder"   # AttentionType.DECODER's value (vllm/v1/attention/backend.py)
#: The runner's attention groups (backend, layer names, KV-cache group), the layers by name in the forward context
#: (each holding its bound KV cache), and the input batch's block tables per KV-cache group.
RUNNER_ATTN_GROUPS, RUNNER_COMPILATION_CONFIG, STATIC_FORWARD_CONTEXT = ("attn_groups", "compilation_config",
                                                                        "static_forward_context")
GROUP_BACKEND, GROUP_LAYER_NAMES, GROUP_KV_CACHE_GROUP = "backend", "layer_names", "kv_cache_group_id"
GROUP_KV_CACHE_SPEC = "kv_cache_spec"
BATCH_BLOCK_TABLE, BLOCK_TABLES, BLOCK_TABLE_DEVICE = "block_table", "block_tables", "get_device_tensor"
LAYER_KV_CACHE_ATTR, LAYER_HEAD_SIZE = "kv_cache", "head_size"
#: The runner's token-id buffer (CpuGpuBuffer, int32 [max_num_tokens]) that the model embeds.
RUNNER_INPUT_IDS = "input_ids"
#: vLLM's n-gram drafter (host code): its propose, called by the runner with these arguments.
NGRAM_MODULE, NGRAM_PROPOSER, NGRAM_PROPOSE = "vllm.v1.spec_decode.ngram_proposer", "NgramProposer", "propose"
NGRAM_PROPOSE_PARAMS = ("self", "num_speculative_tokens", "sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu")
NGRAM_MAX_N, NGRAM_MAX_MODEL_LEN = "max_n", "max_model_len"


def attention_impl_classes() -> list:
    """The impl classes of ``TREE_ATTN_BACKENDS`` (imports their modules), FlashAttention's first."""
    return [getattr(importlib.import_module(module), impl) for module, impl, *_ in TREE_ATTN_BACKENDS]


def tree_backend_names() -> tuple:
    """The ``get_name()`` of every backend in ``TREE_ATTN_BACKENDS``."""
    return tuple(b[-1] for b in TREE_ATTN_BACKENDS)


def ngram_proposer_class():
    return getattr(importlib.import_module(NGRAM_MODULE), NGRAM_PROPOSER)


def ngram_limits(proposer) -> tuple:
    """(longest n-gram it matches, max_model_len) of vLLM's n-gram drafter."""
    return getattr(proposer, NGRAM_MAX_N), getattr(proposer, NGRAM_MAX_MODEL_LEN)


def attention_windows(md) -> tuple:
    """(num_actual_tokens, max_query_len, query_start_loc, seq_lens, block_table) of a FlashAttentionMetadata or a
    TritonAttentionMetadata (the same five fields in both)."""
    return tuple(getattr(md, f) for f in (FA_NUM_TOKENS, FA_MAX_QUERY_LEN, FA_QUERY_START, FA_SEQ_LENS,
                                          FA_BLOCK_TABLE))


def impl_dims(impl) -> tuple:
    """(head_size, scale, is a decoder self-attention) of an attention impl."""
    kind = getattr(impl, IMPL_ATTN_TYPE)
    return getattr(impl, IMPL_HEAD_SIZE), getattr(impl, IMPL_SCALE), getattr(kind, "value", kind) == DECODER_ATTN


def split_kv_cache(kv_cache, head_size: int) -> tuple:
    """FlashAttention's and Triton's packed cache [num_blocks, Hkv, block_size, 2 * D] as its key and value views,
    each [num_blocks, block_size, Hkv, D] (what both forwards do: ``kv_cache.transpose(1, 2).split(head_size, -1)``)."""
    return tuple(kv_cache.transpose(1, 2).split(head_size, dim=-1))


def tree_kv_caches(runner, num_reqs: int) -> list:
    """(kv_cache, block_table [num_reqs, blocks], head_size) of every softmax layer the runner holds, with its
    KV-cache group's block table. A softmax layer on a backend outside ``TREE_ATTN_BACKENDS`` is a ValueError: its
    windows would have had causal attention instead of the tree's (the hooks replace those backends' forwards only)."""
    layers = getattr(getattr(runner, RUNNER_COMPILATION_CONFIG), STATIC_FORWARD_CONTEXT)
    tables = getattr(getattr(getattr(runner, RUNNER_INPUT_BATCH), BATCH_BLOCK_TABLE), BLOCK_TABLES)
    names = tree_backend_names()
    out = []
    for groups in getattr(runner, RUNNER_ATTN_GROUPS):
        for group in groups:
            if is_mamba_spec(getattr(group, GROUP_KV_CACHE_SPEC)):
                continue
            backend = getattr(group, GROUP_BACKEND).get_name()
            if backend not in names:
                raise ValueError(f"a served tree's softmax layers run on {backend}, whose attention the tree hooks do "
                                 f"not replace (their windows got causal attention): serve with --attention-backend "
                                 f"{' or '.join(names)}")
            table = getattr(tables[getattr(group, GROUP_KV_CACHE_GROUP)], BLOCK_TABLE_DEVICE)(num_reqs)
            for name in getattr(group, GROUP_LAYER_NAMES):
                layer = layers[name]
                out.append((getattr(layer, LAYER_KV_CACHE_ATTR), table, getattr(layer, LAYER_HEAD_SIZE)))
    return out


def runner_input_ids(runner):
    return getattr(getattr(runner, RUNNER_INPUT_IDS), BUFFER_GPU)

#: The MTP drafter (``"method": "mtp"`` builds an EagleProposer, a SpecDecodeBaseProposer): its propose, which a
#: served MTP tree replaces (called by the runner with these arguments, in this order), and the first pass's draft
#: sampling, whose input is each request's root MTP output; what the tree passes read off the proposer: the draft
#: model, the config a forward context takes, the drafter's attention layers, whether its positions are M-RoPE's rows.
PROPOSER_MODULE, PROPOSER, PROPOSE = "vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "propose"
PROPOSE_PARAMS = ("self", "num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
                  "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
                  "mm_embed_inputs", "num_rejected_tokens_gpu", "slot_mappings")
SAMPLE_DRAFT, SAMPLE_DRAFT_PARAMS = "_sample_draft_tokens", ("self", "hidden_states", "sampling_metadata")
PROPOSER_MODEL, PROPOSER_CONFIG, PROPOSER_LAYERS, PROPOSER_MROPE, PROPOSER_NUM_SPEC = (
    "model", "vllm_config", "_draft_attn_layer_names", "uses_mrope", "num_speculative_tokens")
#: The CommonAttentionMetadata the runner hands the drafter: its requests' packed starts and block table (the
#: drafter's KV-cache group's, the one FlashAttention's metadata holds).
COMMON_MD_MODULE, COMMON_MD = "vllm.v1.attention.backend", "CommonAttentionMetadata"
CM_QUERY_START, CM_BLOCK_TABLE = "query_start_loc", "block_table_tensor"
#: The forward context a drafter pass runs in (vLLM's chain loop enters it around every pass), by keyword.
SET_FORWARD_CONTEXT = "set_forward_context"
SET_FORWARD_CONTEXT_PARAMS = ("attn_metadata", "vllm_config", "num_tokens", "slot_mapping")
#: The MTP models' forward (vLLM's chain loop calls it with these keywords) and logits.
MTP_MODELS = (("vllm.model_executor.models.qwen3_5_mtp", "Qwen3_5MTP"),
              ("vllm.model_executor.models.qwen3_next_mtp", "Qwen3NextMTP"))
MTP_FORWARD, MTP_FORWARD_PARAMS = "forward", ("self", "input_ids", "positions", "hidden_states")
COMPUTE_LOGITS, COMPUTE_LOGITS_PARAMS = "compute_logits", ("self", "hidden_states")


def proposer_class():
    return getattr(importlib.import_module(PROPOSER_MODULE), PROPOSER)


def common_windows(common_attn_metadata) -> tuple:
    """(query_start_loc [B + 1], block_table_tensor [B, blocks]) of a CommonAttentionMetadata (device tensors)."""
    return getattr(common_attn_metadata, CM_QUERY_START), getattr(common_attn_metadata, CM_BLOCK_TABLE)


def proposer_uses_mrope(proposer) -> bool:
    return bool(getattr(proposer, PROPOSER_MROPE))


def set_proposer_num_spec(proposer, k: int) -> None:
    """What propose records of its call (``self.num_speculative_tokens = num_speculative_tokens``)."""
    setattr(proposer, PROPOSER_NUM_SPEC, k)


def draft_forward(proposer, input_ids, positions, hidden_states, attn_metadata):
    """One eager forward of the drafter's model, as vLLM's chain loop calls it, inside a forward context that gives
    every drafter attention layer ``attn_metadata`` and no slot mapping (so no layer writes K/V into its cache)."""
    context = getattr(importlib.import_module(FORWARD_CONTEXT_MODULE), SET_FORWARD_CONTEXT)
    layers = getattr(proposer, PROPOSER_LAYERS)
    args = ({name: attn_metadata for name in layers}, getattr(proposer, PROPOSER_CONFIG), input_ids.shape[0], {})
    with context(**dict(zip(SET_FORWARD_CONTEXT_PARAMS, args))):
        return getattr(proposer, PROPOSER_MODEL)(**dict(zip(MTP_FORWARD_PARAMS[1:],
                                                                (input_ids, positions, hidden_states))))


def draft_logits(proposer, hidden_states):
    """The drafter's logits [n, V] of MTP outputs [n, H] (its model's compute_logits, the shared lm_head)."""
    return getattr(getattr(proposer, PROPOSER_MODEL), COMPUTE_LOGITS)(hidden_states)
