"""Every vLLM name the plugin and the launcher rely on, with the parameters they are called with.

The names are ``vllm_adapter``'s constants, so what the plugin reads and what is checked are spelled once.
``check_installed()`` imports vLLM and inspects the live objects (the ``vllm``-marked test);
``check_source(root)`` reads an unpacked vllm wheel with ``ast`` and needs no vLLM install
(``pip download --no-deps vllm==0.33.0`` and unzip it). Both return a list of problems (empty = ok).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

from treewy.serve import vllm_adapter as A


@dataclass(frozen=True)
class Name:
    module: str
    qualname: str                 # "Class", "Class.method", "function", "CONSTANT", "Dataclass.field"
    params: tuple[str, ...] = ()  # parameter names that must exist (positional order of those listed)
    kind: str = "callable"        # callable | class | attr | field | instance (set on self, or declared in the
                                  # class body, in the class or one of its bases)


GDN = A.GDN_MODULE
FLA = "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"
MAMBA = "vllm.model_executor.layers.mamba.abstract"
KV = A.KV_CACHE_MODULE
MD = "vllm.v1.attention.backends.gdn_attn"
NAMES: tuple[Name, ...] = (
    Name("vllm.plugins", "DEFAULT_PLUGINS_GROUP", kind="attr"),
    Name("vllm.plugins", "load_general_plugins"),
    Name(A.CUSTOM_OP_MODULE, A.OOT_REGISTRY, kind="attr"),
    Name(A.CUSTOM_OP_MODULE, f"PluggableLayer.{A.REGISTER_OOT}", ("cls", "_decorated_layer_cls", "name")),
    Name(GDN, A.GDN_LAYER, kind="class"),
    # the three methods the plugin's subclass overrides, and what it reads off the built layer
    Name(GDN, f"{A.GDN_LAYER}.__init__", ("self", "config", "vllm_config", "prefix")),
    Name(GDN, f"{A.GDN_LAYER}._forward_core", ("self", "mixed_qkv", "b", "a", "core_attn_out")),
    Name(MAMBA, "MambaBase.get_kv_cache_spec", ("self", "vllm_config")),
    *(Name(GDN, f"{A.GDN_LAYER}.{attr}", kind="instance") for attr in (
        *A.LAYER_DIMS.values(), A.LAYER_CACHE_CONFIG, A.LAYER_PREFIX, A.LAYER_KV_CACHE)),
    Name(GDN, f"{A.GDN_LAYER}.rearrange_mixed_qkv", ("self", "mixed_qkv")),
    Name(GDN, "qwen_gdn_attention_core", ("qkv_or_qkvz", "b_or_ba", "a_or_z_out", "core_attn_out", "layer_name")),
    # the spec-row kernel the plugin stands in for (called by keyword inside _forward_core)
    Name(FLA, A.SPEC_UPDATE, A.SPEC_UPDATE_PARAMS),
    Name(GDN, A.SPEC_UPDATE, kind="attr"),   # imported into the layer's module, where the plugin wraps it
    # the prefill op whose Triton path fp32_prefill replaces (called by keyword)
    Name(GDN, f"{A.PREFILL_OP}.{A.PREFILL_METHOD}", A.PREFILL_PARAMS),
    Name(KV, A.MAMBA_SPEC, kind="class"),
    *(Name(KV, f"{A.MAMBA_SPEC}.{f}", kind="field") for f in (A.SPEC_SPARE_BLOCKS, A.SPEC_SHAPES, A.SPEC_DTYPES)),
    Name(MD, "GDNAttentionMetadata", kind="class"),
    *(Name(MD, f"GDNAttentionMetadata.{f}", kind="field") for f in (
        A.MD_NUM_PREFILLS, A.MD_NUM_DECODES, A.MD_NON_SPEC_SLOTS, A.MD_SPEC_SLOTS, A.MD_HAS_INITIAL_STATE,
        "spec_query_start_loc", "num_accepted_tokens")),
    Name(A.FORWARD_CONTEXT_MODULE, A.GET_FORWARD_CONTEXT),
    Name(A.FORWARD_CONTEXT_MODULE, f"ForwardContext.{A.ATTN_METADATA}", kind="field"),
    # the path from a VllmConfig to the shape the model classes' page planning needs
    Name("vllm.config.vllm", f"VllmConfig.{A.MODEL_CONFIG}", kind="field"),
    Name("vllm.config.vllm", f"VllmConfig.{A.PARALLEL_CONFIG}", kind="field"),
    Name("vllm.config.vllm", f"VllmConfig.{A.SPECULATIVE_CONFIG}", kind="field"),
    Name("vllm.config.model", f"ModelConfig.{A.HF_TEXT_CONFIG}", kind="field"),
    Name("vllm.config.parallel", f"ParallelConfig.{A.TP_SIZE}", kind="field"),
    Name("vllm.config.speculative", f"SpeculativeConfig.{A.NUM_SPECULATIVE_TOKENS}", kind="field"),
    Name("vllm.config.cache", f"CacheConfig.{A.MAMBA_CACHE_MODE}", kind="field"),
)


#: What ``tree_vllm`` replaces and reads, for the lines in ``vllm_adapter.TREE_LINES``.
TREE_NAMES: tuple[Name, ...] = (
    Name(GDN, A.CONV_UPDATE, kind="attr"),   # imported into the layer's module, where tree_vllm wraps it
    Name(A.CONV_UPDATE_MODULE, A.CONV_UPDATE, A.CONV_UPDATE_PARAMS),
    Name(FLA, A.SPEC_UPDATE, (A.SPEC_INITIAL_STATE, "ssm_state_indices", A.NUM_ACCEPTED)),
    Name(A.SAMPLER_MODULE, f"{A.REJECTION_SAMPLER}.{A.SAMPLER_FORWARD}", A.SAMPLER_FORWARD_PARAMS),
    *(Name(A.SPEC_METADATA_MODULE, f"{A.SPEC_METADATA}.{f}", kind="field")
      for f in (A.MD_DRAFT_TOKENS, A.MD_NUM_DRAFT_TOKENS)),
    *(Name(A.SAMPLING_METADATA_MODULE, f"{A.SAMPLING_METADATA}.{f}", kind="field")
      for f in (A.SAMPLING_ALL_GREEDY, A.SAMPLING_TEMPERATURE, A.SAMPLING_GENERATORS)),
    *(Name(A.OUTPUTS_MODULE, f"{A.SAMPLER_OUTPUT}.{f}", kind="field") for f in (A.SAMPLED_TOKEN_IDS,
                                                                                A.LOGPROBS_TENSORS)),
    Name(A.RUNNER_MODULE, f"{A.RUNNER}.{A.PREPARE_INPUTS}", A.PREPARE_INPUTS_PARAMS),
    Name(A.RUNNER_MODULE, f"{A.RUNNER}.{A.AFTER_SAMPLE}", A.AFTER_SAMPLE_PARAMS),
    Name(A.RUNNER_MODULE, f"{A.RUNNER}.{A.DUMMY_SAMPLER_RUN}", A.DUMMY_SAMPLER_RUN_PARAMS),
    *(Name(A.RUNNER_MODULE, f"{A.RUNNER}.{attr}", kind="instance") for attr in (
        A.RUNNER_POSITIONS, A.RUNNER_USES_MROPE, A.RUNNER_MROPE_POSITIONS, A.RUNNER_QUERY_START,
        A.RUNNER_NUM_ACCEPTED, A.RUNNER_ACCEPTED_EVENT, A.RUNNER_INPUT_BATCH, A.RUNNER_ASYNC_SPEC)),
    Name(A.INPUT_BATCH_MODULE, f"{A.INPUT_BATCH}.{A.BATCH_ACCEPTED_CPU}", kind="instance"),
    *(Name(A.BUFFER_MODULE, f"{A.BUFFER}.{attr}", kind="instance") for attr in (A.BUFFER_GPU, A.BUFFER_NP)),
    # the softmax layers' attention on every backend a tree runs on (FlashAttention, Triton) and the compaction's way
    # to every layer's cache and block table
    *(n for module, impl, md, backend, _ in A.TREE_ATTN_BACKENDS for n in (
        Name(module, f"{impl}.{A.ATTN_FORWARD}", A.ATTN_FORWARD_PARAMS),
        *(Name(module, f"{impl}.{attr}", kind="instance") for attr in (A.IMPL_HEAD_SIZE, A.IMPL_SCALE,
                                                                       A.IMPL_ATTN_TYPE)),
        Name(module, f"{backend}.get_name"),
        *(Name(module, f"{md}.{f}", kind="field") for f in (
            A.FA_NUM_TOKENS, A.FA_MAX_QUERY_LEN, A.FA_QUERY_START, A.FA_SEQ_LENS, A.FA_BLOCK_TABLE)))),
    Name("vllm.v1.attention.backend", "AttentionType.DECODER", kind="attr"),
    *(Name(A.RUNNER_MODULE, f"{A.RUNNER}.{attr}", kind="instance") for attr in (
        A.RUNNER_ATTN_GROUPS, A.RUNNER_COMPILATION_CONFIG, A.RUNNER_INPUT_IDS)),
    Name("vllm.config.compilation", f"CompilationConfig.{A.STATIC_FORWARD_CONTEXT}", kind="field"),
    *(Name("vllm.v1.worker.utils", f"AttentionGroup.{f}", kind="field") for f in (
        A.GROUP_BACKEND, A.GROUP_LAYER_NAMES, A.GROUP_KV_CACHE_GROUP, A.GROUP_KV_CACHE_SPEC)),
    Name(A.INPUT_BATCH_MODULE, f"{A.INPUT_BATCH}.{A.BATCH_BLOCK_TABLE}", kind="instance"),
    Name("vllm.v1.worker.block_table", f"MultiGroupBlockTable.{A.BLOCK_TABLES}", kind="instance"),
    Name("vllm.v1.worker.block_table", f"BlockTable.{A.BLOCK_TABLE_DEVICE}", ("self", "num_reqs")),
    *(Name("vllm.model_executor.layers.attention.attention", f"Attention.{attr}", kind="instance") for attr in (
        A.LAYER_KV_CACHE_ATTR, A.LAYER_HEAD_SIZE)),
    # the n-gram drafter a served tree drafts through
    Name(A.NGRAM_MODULE, f"{A.NGRAM_PROPOSER}.{A.NGRAM_PROPOSE}", A.NGRAM_PROPOSE_PARAMS),
    *(Name(A.NGRAM_MODULE, f"{A.NGRAM_PROPOSER}.{attr}", kind="instance") for attr in (
        A.NGRAM_MAX_N, A.NGRAM_MAX_MODEL_LEN)),
    # the MTP drafter: propose replaced, its first pass's draft sampling read, what the tree passes call
    Name(A.PROPOSER_MODULE, f"{A.PROPOSER}.{A.PROPOSE}", A.PROPOSE_PARAMS),
    Name(A.PROPOSER_MODULE, f"{A.PROPOSER}.{A.SAMPLE_DRAFT}", A.SAMPLE_DRAFT_PARAMS),
    *(Name(A.PROPOSER_MODULE, f"{A.PROPOSER}.{attr}", kind="instance") for attr in (
        A.PROPOSER_MODEL, A.PROPOSER_CONFIG, A.PROPOSER_LAYERS, A.PROPOSER_MROPE, A.PROPOSER_NUM_SPEC)),
    *(Name(A.COMMON_MD_MODULE, f"{A.COMMON_MD}.{f}", kind="field") for f in (A.CM_QUERY_START, A.CM_BLOCK_TABLE)),
    Name(A.FORWARD_CONTEXT_MODULE, A.SET_FORWARD_CONTEXT, A.SET_FORWARD_CONTEXT_PARAMS),
    *(Name(m, f"{c}.{meth}", params) for m, c in A.MTP_MODELS for meth, params in (
        (A.MTP_FORWARD, A.MTP_FORWARD_PARAMS), (A.COMPUTE_LOGITS, A.COMPUTE_LOGITS_PARAMS))),
)


def names_for(line: str) -> tuple[Name, ...]:
    """NAMES plus release ``line``'s own: the layer's fused-path flags, the model classes whose page-planning
    methods the plugin patches, and TREE_NAMES where trees are wired for ``line``."""
    return (NAMES + (TREE_NAMES if line in A.TREE_LINES else ())
            + tuple(Name(GDN, f"{A.GDN_LAYER}.{flag}", kind="instance") for flag in A.FUSED_PATH_FLAGS[line])
            + tuple(Name(m, f"{c}.{meth}", ("cls", "vllm_config")) for m, c in A.MODEL_CLASSES[line]
                    for meth in A.PAGE_METHODS))


#: CLI flags the launcher and the sweep pass (checked in the source text of these files).
FLAGS: dict[str, tuple[str, ...]] = {
    "vllm/engine/arg_utils.py": ("--speculative-config", "--gpu-memory-utilization", "--tensor-parallel-size",
                                 "--max-num-seqs", "--enable-prefix-caching", "--compilation-config",
                                 "--max-model-len", "--served-model-name", "--async-scheduling",
                                 "--cudagraph-metrics"),
    "vllm/benchmarks/serve.py": ("--backend", "--base-url", "--endpoint", "--model", "--max-concurrency",
                                 "--request-rate", "--percentile-metrics", "--metric-percentiles", "--save-result",
                                 "--result-dir", "--result-filename", "--ignore-eos"),
    "vllm/benchmarks/datasets/datasets.py": ("--dataset-name", "--dataset-path", "--num-prompts", "--seed",
                                             "--random-input-len", "--random-output-len", "--spec-bench-output-len",
                                             "--sharegpt-output-len", '"spec_bench"', '"sharegpt"', '"random"'),
    "vllm/v1/metrics/loggers.py": ('"vllm:kv_cache_usage_perc"', '"vllm:num_requests_running"',
                                   '"vllm:num_preemptions"'),
    "vllm/v1/spec_decode/metrics.py": ('"vllm:spec_decode_num_drafts"', '"vllm:spec_decode_num_draft_tokens"',
                                       '"vllm:spec_decode_num_accepted_tokens"'),
    "vllm/config/compilation.py": ('"vllm::qwen_gdn_attention_core"', "cudagraph_mode", "PIECEWISE"),
    # the HF config fields the plugin reads off hf_text_config are the ones vLLM's layer reads off its config
    GDN.replace(".", "/") + ".py": tuple(f"config.{a}" for a in A.CONFIG_HEADS.values()),
    "vllm/config/cache.py": (f'"{A.NO_MAMBA_CACHE}"',),
    # the backend name tree_vllm's compaction picks layers by, and AttentionType.DECODER's value
    A.FLASH_MODULE.replace(".", "/") + ".py": (f'return "{A.FLASH_BACKEND_NAME}"',),
    "vllm/v1/attention/backend.py": (f'DECODER = "{A.DECODER_ATTN}"',),
}

#: Source text the tree hooks rely on, checked for the lines in ``vllm_adapter.TREE_LINES``: a layer the forward
#: context gives no slot mapping writes no K/V (the MTP tree passes run so); FlashAttention and Triton keep K and V
#: packed in one cache [num_blocks, Hkv, block_size, 2 * D], split as ``vllm_adapter.split_kv_cache`` splits it, and
#: Triton's backend is named as the compaction picks its layers.
_PACKED_KV = "return (num_blocks, num_kv_heads, block_size, 2 * head_size)"
TREE_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm/model_executor/layers/attention/attention.py": ("layer_slot_mapping = slot_mapping.get(layer_name)",
                                                          "if layer_slot_mapping is not None:"),
    A.FLASH_MODULE.replace(".", "/") + ".py": (_PACKED_KV,
                                               "kv_cache.transpose(1, 2).split(self.head_size, dim=-1)"),
    A.TRITON_MODULE.replace(".", "/") + ".py": (f'return "{A.TRITON_BACKEND_NAME}"', _PACKED_KV,
                                                "kv_cache = kv_cache.transpose(1, 2)",
                                                "key_cache, value_cache = kv_cache.split(hs, dim=-1)"),
}


def _check_params(name: Name, got: list[str]) -> str | None:
    missing = [p for p in name.params if p not in got]
    if missing:
        return f"{name.module}.{name.qualname}: parameters {missing} missing (has {got})"
    order = [got.index(p) for p in name.params]
    if order != sorted(order):
        return f"{name.module}.{name.qualname}: parameters {list(name.params)} not in that order (has {got})"
    return None


def _sets_on_self(cls_node: ast.ClassDef, attr: str) -> bool:
    """Whether a class body declares ``attr`` or one of its methods assigns ``self.<attr>``."""
    for stmt in cls_node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
            return True
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
            return True
    for node in ast.walk(cls_node):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if (isinstance(e, ast.Attribute) and e.attr == attr and isinstance(e.value, ast.Name)
                        and e.value.id == "self"):
                    return True
    return False


def _installed_instance_attr(cls, attr: str) -> bool:
    for klass in getattr(cls, "__mro__", ()):
        if attr in vars(klass) or attr in vars(klass).get("__annotations__", {}):
            return True
        try:
            tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        if any(isinstance(c, ast.ClassDef) and _sets_on_self(c, attr) for c in tree.body):
            return True
    return False


def check_installed() -> list[str]:
    problems = []
    for n in names_for(A.check_version(A.installed_version() or "(none)")):
        try:
            obj = importlib.import_module(n.module)
        except ImportError as e:
            problems.append(f"{n.module}: cannot import ({e})")
            continue
        parts = n.qualname.split(".")
        if n.kind == "field":
            cls = getattr(obj, parts[0], None)
            fields = getattr(cls, "__dataclass_fields__", {}) if cls is not None else {}
            if parts[1] not in fields:
                problems.append(f"{n.module}.{n.qualname}: no such dataclass field")
            continue
        if n.kind == "instance":
            if not _installed_instance_attr(getattr(obj, parts[0], None), parts[1]):
                problems.append(f"{n.module}.{n.qualname}: not set on the layer (nor on a base class)")
            continue
        for p in parts:
            obj = getattr(obj, p, None)
            if obj is None:
                problems.append(f"{n.module}.{n.qualname}: missing")
                break
        else:
            if n.params:
                fn = inspect.unwrap(obj.__func__ if hasattr(obj, "__func__") else obj)
                got = list(inspect.signature(fn).parameters)
                msg = _check_params(n, got)
                if msg:
                    problems.append(msg)
    return problems


def _find(tree: ast.Module, parts: list[str]):
    body = tree.body
    node = None
    for p in parts:
        node = None
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == p:
                node = stmt
            elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == p for t in stmt.targets):
                node = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == p:
                node = stmt
            elif isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == p for a in stmt.names):
                node = stmt
        if node is None:
            return None
        body = getattr(node, "body", [])
    return node


def _source_file(root: Path, module: str) -> Path | None:
    for path in (root / (module.replace(".", "/") + ".py"), root / module.replace(".", "/") / "__init__.py"):
        if path.is_file():
            return path
    return None


def _source_instance_attr(root: Path, module: str, cls: str, attr: str, depth: int = 0) -> bool:
    """Whether class ``cls`` of ``module`` (or a base, followed through the module's ``from X import Base``) sets
    or declares ``attr``."""
    path = _source_file(root, module)
    if path is None or depth > 8:
        return False
    tree = ast.parse(path.read_text())
    node = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls), None)
    if node is None:
        return False
    if _sets_on_self(node, attr):
        return True
    imports = {(a.asname or a.name): (s.module, a.name) for s in tree.body if isinstance(s, ast.ImportFrom)
               and s.module and not s.level for a in s.names}
    for base in (b.id for b in node.bases if isinstance(b, ast.Name)):
        where, name = imports.get(base, (module, base))
        if _source_instance_attr(root, where, name, attr, depth + 1):
            return True
    return False


def check_source(root: str | Path, line: str = "0.33") -> list[str]:
    """Check ``names_for(line)`` and FLAGS (and TREE_FLAGS for a tree line) against vLLM's source tree (the folder
    holding ``vllm/``)."""
    root = Path(root)
    problems = []
    for n in names_for(line):
        path = _source_file(root, n.module)
        if path is None:
            problems.append(f"{n.module}: no source file")
            continue
        if n.kind == "instance":
            cls, attr = n.qualname.split(".")
            if not _source_instance_attr(root, n.module, cls, attr):
                problems.append(f"{n.module}.{n.qualname}: not set on the class (nor on a base class)")
            continue
        node = _find(ast.parse(path.read_text()), n.qualname.split("."))
        if node is None:
            problems.append(f"{n.module}.{n.qualname}: missing")
            continue
        if n.params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            got = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            msg = _check_params(n, got)
            if msg:
                problems.append(msg)
    for rel, needles in {**FLAGS, **(TREE_FLAGS if line in A.TREE_LINES else {})}.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: no source file")
            continue
        text = path.read_text()
        problems += [f"{rel}: {s} not found" for s in needles if s not in text]
    return problems
