"""Every vLLM name the plugin and the launcher rely on, with the parameters they are called with.

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


@dataclass(frozen=True)
class Name:
    module: str
    qualname: str                 # "Class", "Class.method", "function", "CONSTANT", "Dataclass.field"
    params: tuple[str, ...] = ()  # parameter names that must exist (positional order of those listed)
    kind: str = "callable"        # callable | class | attr | field


GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
FLA = "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"
MAMBA = "vllm.model_executor.layers.mamba.abstract"
NAMES: tuple[Name, ...] = (
    Name("vllm.plugins", "DEFAULT_PLUGINS_GROUP", kind="attr"),
    Name("vllm.plugins", "load_general_plugins"),
    Name("vllm.model_executor.custom_op", "op_registry_oot", kind="attr"),
    Name("vllm.model_executor.custom_op", "PluggableLayer.register_oot", ("cls", "_decorated_layer_cls", "name")),
    Name(GDN, "QwenGatedDeltaNetAttention", kind="class"),
    Name(GDN, "QwenGatedDeltaNetAttention.__init__", ("self", "config", "vllm_config", "prefix")),
    Name(GDN, "QwenGatedDeltaNetAttention._forward_core", ("self", "mixed_qkv", "b", "a", "core_attn_out")),
    Name(GDN, "QwenGatedDeltaNetAttention.rearrange_mixed_qkv", ("self", "mixed_qkv")),
    Name(GDN, "qwen_gdn_attention_core", ("qkv_or_qkvz", "b_or_ba", "a_or_z_out", "core_attn_out", "layer_name")),
    # the spec-row kernel the plugin stands in for (called by keyword inside _forward_core)
    Name(FLA, "fused_sigmoid_gating_delta_rule_update",
         ("A_log", "a", "b", "dt_bias", "q", "k", "v", "initial_state", "cu_seqlens", "ssm_state_indices",
          "num_accepted_tokens", "use_qk_l2norm_in_kernel")),
    # the prefill op whose Triton path fp32_prefill replaces (called by keyword)
    Name(GDN, "ChunkGatedDeltaRule.forward_native",
         ("self", "q", "k", "v", "g", "beta", "initial_state", "output_final_state", "cu_seqlens", "chunk_indices",
          "chunk_offsets", "use_qk_l2norm_in_kernel", "core_attn_out")),
    Name(MAMBA, "MambaBase.get_kv_cache_spec", ("self", "vllm_config")),
    Name("vllm.v1.kv_cache_interface", "MambaSpec.num_speculative_blocks", kind="field"),
    Name("vllm.v1.kv_cache_interface", "MambaSpec.shapes", kind="field"),
    Name("vllm.v1.kv_cache_interface", "MambaSpec.dtypes", kind="field"),
    Name("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadata", kind="class"),
    *(Name("vllm.v1.attention.backends.gdn_attn", f"GDNAttentionMetadata.{f}", kind="field") for f in (
        "num_prefills", "num_decodes", "non_spec_state_indices_tensor", "spec_state_indices_tensor",
        "spec_query_start_loc", "num_accepted_tokens")),
    Name("vllm.forward_context", "get_forward_context"),
)


def names_for(line: str) -> tuple[Name, ...]:
    """NAMES plus the model classes whose page-planning methods the plugin patches in release ``line``."""
    from treewy.serve.vllm_adapter import MODEL_CLASSES

    return NAMES + tuple(Name(m, f"{c}.{meth}", ("cls", "vllm_config")) for m, c in MODEL_CLASSES[line]
                         for meth in ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config"))


#: CLI flags the launcher and the sweep pass (checked in the source text of these files).
FLAGS: dict[str, tuple[str, ...]] = {
    "vllm/engine/arg_utils.py": ("--speculative-config", "--gpu-memory-utilization", "--tensor-parallel-size",
                                 "--max-num-seqs", "--enable-prefix-caching", "--compilation-config",
                                 "--max-model-len", "--served-model-name"),
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
}


def _check_params(name: Name, got: list[str]) -> str | None:
    missing = [p for p in name.params if p not in got]
    if missing:
        return f"{name.module}.{name.qualname}: parameters {missing} missing (has {got})"
    order = [got.index(p) for p in name.params]
    if order != sorted(order):
        return f"{name.module}.{name.qualname}: parameters {list(name.params)} not in that order (has {got})"
    return None


def check_installed() -> list[str]:
    from treewy.serve.vllm_adapter import check_version, installed_version

    problems = []
    for n in names_for(check_version(installed_version() or "(none)")):
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
        if node is None:
            return None
        body = getattr(node, "body", [])
    return node


def check_source(root: str | Path, line: str = "0.33") -> list[str]:
    """Check ``names_for(line)`` and FLAGS against vLLM's source tree (the folder holding ``vllm/``)."""
    root = Path(root)
    problems = []
    for n in names_for(line):
        path = root / (n.module.replace(".", "/") + ".py")
        if not path.is_file():
            path = root / n.module.replace(".", "/") / "__init__.py"
        if not path.is_file():
            problems.append(f"{n.module}: no source file")
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
    for rel, needles in FLAGS.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: no source file")
            continue
        text = path.read_text()
        problems += [f"{rel}: {s} not found" for s in needles if s not in text]
    return problems
