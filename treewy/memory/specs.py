"""What a model and a GPU are, in the numbers memory and step cost depend on.

``ModelSpec`` describes a hybrid GDN / softmax-attention model (presets by name, or any Hugging Face Qwen3.5 /
Qwen3-Next config) and what one request costs in bytes: softmax KV per token, one GDN state per layer, the conv
state, the state blocks of a mode (store-all N + 1, reconstruct 1), TreeWY's stash and transient U, and the
weights. ``GPU`` holds the spec-sheet figures of a few GPUs. The tree helpers read T, depth and widths off a draft
tree in any of its forms.

Weights are counted from the published architecture: bf16, every expert resident, split evenly over TP ranks.
The Qwen3.5 presets carry a ~0.4 B-parameter vision tower as a round number (not read from a config), which
``weight_bytes(vision=False)`` leaves out, as a text-only server does. KV heads are replicated when
tp > num_kv_heads (as vLLM does); a tp that does not split the GDN and attention heads evenly is refused (vLLM
refuses it too).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from treewy.tree import as_tree

GIB = 1024**3
MIB = 1024**2
KIB = 1024

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
MODES = ("store_all", "reconstruct")

TINY_CONFIG = Path(__file__).parents[1] / "models" / "tiny" / "config.json"

def _bytes_of(dtype: str, name: str = "dtype") -> int:
    key = str(dtype).replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"{name} = {dtype!r}: expected one of {sorted(set(DTYPE_BYTES))}; "
                         "the GDN state is usually 'float32' (Qwen3.5) or 'bfloat16' (Qwen3-Next)")
    return DTYPE_BYTES[key]


def _positive(name: str, value, fix: str, *, integer: bool = False, allow_zero: bool = False):
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int))
    if bad_type or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} = {value!r}: expected {kind}; {fix}")
    return value


def tp_degrees(heads: dict[str, int]) -> tuple[int, ...]:
    """Tensor-parallel degrees that split ``heads`` ({kind: count}) as vLLM shards them: every kind evenly, except
    the softmax KV heads ("KV"), which may also be replicated (tp a multiple of them)."""
    split = [n for kind, n in heads.items() if kind != "KV"]
    kv = heads.get("KV")
    top = min(split) if split else (kv or 1)
    return tuple(d for d in range(1, top + 1) if all(n % d == 0 for n in split)
                 and (kv is None or kv % d == 0 or d % kv == 0))


def check_tp(tp: int, heads: dict[str, int], *, model: str, arg: str = "tp") -> int:
    """``tp`` when it splits ``heads`` (see ``tp_degrees``); else a ValueError naming ``arg`` and the degrees that do."""
    ok = tp_degrees(heads)
    if tp not in ok:
        counts = ", ".join(f"{n} {kind}" for kind, n in heads.items())
        got = f"{arg} {tp}" if arg.startswith("-") else f"{arg} = {tp}"
        raise ValueError(f"{got}: {model}'s heads ({counts}) do not split evenly over {tp} GPUs, as vLLM shards them; "
                         f"tensor-parallel degrees that do: {', '.join(map(str, ok))}")
    return tp


def tree_num_nodes(tree) -> int:
    """T = N + 1 of a draft tree: branching factors (1, 1, 1), a DraftTree or a parent array."""
    return as_tree(tree).num_nodes


def tree_depth(tree) -> int:
    return as_tree(tree).max_depth


def tree_widths(tree) -> tuple[int, ...]:
    """Branching factors per level (for a general tree: the widest fan-out of each level)."""
    t = as_tree(tree)
    if t.widths is not None:
        return t.widths
    par = t.parents[1:].long()
    fanout = torch.bincount(par, minlength=t.num_nodes)             # children per node
    depth = t.depth.long()
    return tuple(int(fanout[depth == d - 1].max()) for d in range(1, t.max_depth + 1))


@dataclass(frozen=True)
class ModelSpec:
    """A hybrid GDN / softmax-attention model: the numbers memory and cost depend on."""

    name: str
    hidden_size: int
    num_gdn_layers: int
    num_attn_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_key_dim: int
    gdn_value_dim: int
    conv_kernel: int
    vocab_size: int
    num_experts: int = 0               # 0: a dense MLP of intermediate_size
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    intermediate_size: int = 0
    attn_output_gate: bool = True
    tie_embeddings: bool = False
    mtp_layers: int = 1
    extra_params: float = 0.0          # vision tower etc.: never read while decoding text (weight_bytes(vision=))
    default_state_dtype: str = "float32"
    weight_dtype: str = "bfloat16"
    source: str = "preset"

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        key = str(name).lower()
        if key == "tiny":
            return cls.from_config(TINY_CONFIG, name="tiny")      # the checkpoint the package ships
        if key not in _PRESETS:
            raise ValueError(f"model = {name!r}: unknown preset; known presets are {sorted([*_PRESETS, 'tiny'])}, "
                             "or build one with ModelSpec.from_config(path_to_config_json)")
        return _PRESETS[key]

    @classmethod
    def from_config(cls, config, *, name: str | None = None, source: str | None = None) -> ModelSpec:
        """A spec from a Hugging Face Qwen3.5 / Qwen3-Next config (dict or path to config.json)."""
        path = None
        if not isinstance(config, dict):
            path = Path(config)
            config = json.loads(path.read_text())
        cfg = dict(config.get("text_config", config))
        n = int(cfg["num_hidden_layers"])
        if "layer_types" in cfg:
            types = list(cfg["layer_types"])[:n]
        else:
            every = int(cfg.get("full_attention_interval", 4))
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
        n_attn = sum(t == "full_attention" for t in types)
        heads = int(cfg["num_attention_heads"])
        experts = int(cfg.get("num_experts", 0) or 0)
        return cls(
            name=name or cfg.get("_name_or_path") or (path.parent.name if path else "custom"),
            hidden_size=int(cfg["hidden_size"]),
            num_gdn_layers=n - n_attn,
            num_attn_layers=n_attn,
            num_attention_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim", cfg["hidden_size"] // heads)),
            gdn_key_heads=int(cfg["linear_num_key_heads"]),
            gdn_value_heads=int(cfg["linear_num_value_heads"]),
            gdn_key_dim=int(cfg["linear_key_head_dim"]),
            gdn_value_dim=int(cfg["linear_value_head_dim"]),
            conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
            vocab_size=int(cfg["vocab_size"]),
            num_experts=experts,
            experts_per_token=int(cfg.get("num_experts_per_tok", 0) or 0) if experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 0) or 0) if experts else 0,
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0) or 0) if experts else 0,
            intermediate_size=int(cfg.get("intermediate_size", 0) or 0),
            attn_output_gate=bool(cfg.get("attn_output_gate", True)),
            tie_embeddings=bool(config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            mtp_layers=int(cfg.get("mtp_num_hidden_layers", cfg.get("num_nextn_predict_layers", 0)) or 0),
            default_state_dtype=str(cfg.get("mamba_ssm_dtype", "bfloat16")),
            source=source or (str(path) if path else "config dict"),
        )

    # --- tensor parallelism ---------------------------------------------------------------------
    @property
    def heads(self) -> dict[str, int]:
        return {"GDN key": self.gdn_key_heads, "GDN value": self.gdn_value_heads,
                "attention": self.num_attention_heads, "KV": self.num_kv_heads}

    def tp_degrees(self) -> tuple[int, ...]:
        """The tensor-parallel degrees vLLM can shard this model over."""
        return tp_degrees(self.heads)

    def check_tp(self, tp: int) -> int:
        """``tp``, or a ValueError: per-rank head counts below are exact only for a degree in ``tp_degrees()``."""
        _positive("tp", tp, "use the tensor-parallel degree, e.g. 1, 2, 4 or 8", integer=True)
        return check_tp(tp, self.heads, model=self.name)

    # --- per token / per sequence -------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int = 1) -> float:
        """KV heads a rank stores: heads / tp, at least 1 (vLLM replicates KV heads when tp > heads)."""
        return max(self.num_kv_heads / self.check_tp(tp), 1.0)

    def kv_bytes_per_token(self, tp: int = 1, dtype: str = "bfloat16", *, include_mtp: bool = False) -> int:
        """Softmax K + V bytes per token over all attention layers (per GPU when tp > 1)."""
        layers = self.num_attn_layers + (self.mtp_layers if include_mtp else 0)
        return int(2 * layers * self.kv_heads_per_gpu(tp) * self.head_dim * _bytes_of(dtype))

    def gdn_state_bytes(self, dtype: str | None = None, tp: int = 1) -> int:
        """One recurrent state [HV, V, K] per GDN layer, per sequence (per GPU when tp > 1)."""
        dtype = dtype or self.default_state_dtype
        return int(self.num_gdn_layers * self.gdn_value_heads / self.check_tp(tp) * self.gdn_value_dim * self.gdn_key_dim
                   * _bytes_of(dtype))

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv in front of each GDN layer (q, k and v)."""
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim

    def conv_state_bytes(self, width: int | None = None, tp: int = 1, dtype: str = "bfloat16") -> int:
        """Conv state per GDN layer per sequence: ``width`` (default kernel - 1) past inputs of conv_dim channels."""
        width = self.conv_kernel - 1 if width is None else width
        return int(self.conv_dim / self.check_tp(tp) * width * _bytes_of(dtype))

    def state_blocks(self, mode: str, tree=(1, 1, 1)) -> int:
        """GDN state blocks a request holds per layer: store_all N + 1, reconstruct 1."""
        if mode not in MODES:
            raise ValueError(f"mode = {mode!r}: expected one of {MODES}")
        return tree_num_nodes(tree) if mode == "store_all" else 1

    def state_bytes(self, mode: str, tree=(1, 1, 1), dtype: str | None = None, tp: int = 1) -> int:
        """GDN state memory of one sequence under a mode (no conv state, no padding)."""
        return self.state_blocks(mode, tree) * self.gdn_state_bytes(dtype, tp)

    def reconstruct_stash_bytes(self, tree=(1, 1, 1), tp: int = 1, halves: int = 2, key_dtype: str = "bfloat16"
                                ) -> int:
        """TreeWY's pending commit kept in each GDN page by the vLLM plugin (treewy.serve.reconstruct.stash_layout):
        u [T, HV, V] in fp32, the raw keys k [halves, T, H, K] in the activations' dtype, the decays g [halves, T, HV]
        in fp32 and the window length (int32), per layer and request. The plugin double-buffers keys and decays (a
        step writes the new window while it still reads the pending one) and keeps the keys in bf16, as they arrive:
        ``halves=1, key_dtype="float32"`` is the page of the vLLM runs made before (the capacity logs and serving
        sweep that tests/test_memory.py and tests/test_sim_calibration.py check the model against)."""
        T = tree_num_nodes(tree)
        hv, h = self.gdn_value_heads // self.check_tp(tp), self.gdn_key_heads // tp
        return int(T * (hv * self.gdn_value_dim * 4 + halves * (h * self.gdn_key_dim * _bytes_of(key_dtype, "key_dtype")
                                                               + hv * 4)) + 4)

    def pseudo_value_bytes(self, tree=(1, 1, 1), tp: int = 1) -> int:
        """TreeWY's transient U, T x V per value head in fp32, for one GDN layer of one request."""
        return int(tree_num_nodes(tree) * self.gdn_value_heads / self.check_tp(tp) * self.gdn_value_dim * 4)

    # --- parameters -----------------------------------------------------------------------------
    @property
    def attn_layer_params(self) -> int:
        q = self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + kv) + self.num_attention_heads * self.head_dim * self.hidden_size

    @property
    def gdn_layer_params(self) -> int:
        qkvz = 2 * self.gdn_key_heads * self.gdn_key_dim + 2 * self.gdn_value_heads * self.gdn_value_dim
        return (self.hidden_size * (qkvz + 2 * self.gdn_value_heads) + self.conv_dim * self.conv_kernel
                + self.gdn_value_heads * self.gdn_value_dim * self.hidden_size)

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def mlp_dense_params(self) -> int:
        """The MLP part every token reads: a dense MLP, or the shared expert + router of an MoE layer."""
        if self.num_experts:
            return 3 * self.hidden_size * self.shared_expert_intermediate_size + self.hidden_size * (self.num_experts + 1)
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def num_layers(self) -> int:
        return self.num_gdn_layers + self.num_attn_layers

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    def mtp_params(self) -> int:
        per = self.attn_layer_params + self.mlp_dense_params + self.num_experts * self.expert_params \
            + 2 * self.hidden_size * self.hidden_size
        return self.mtp_layers * per

    def param_count(self) -> int:
        """All weights the server loads: text model, MTP layer(s), every expert, extra towers."""
        per_layer_mlp = self.mlp_dense_params + self.num_experts * self.expert_params
        return int(self.embedding_params + self.num_attn_layers * self.attn_layer_params
                   + self.num_gdn_layers * self.gdn_layer_params + self.num_layers * per_layer_mlp
                   + self.mtp_params() + self.extra_params)

    def active_params_per_token(self) -> int:
        """Weights one token multiplies with (embedding lookup excluded, lm_head included)."""
        mlp = self.mlp_dense_params + self.experts_per_token * self.expert_params
        return int(self.vocab_size * self.hidden_size + self.num_attn_layers * self.attn_layer_params
                   + self.num_gdn_layers * self.gdn_layer_params + self.num_layers * mlp)

    def weight_bytes(self, tp: int = 1, vision: bool = True) -> int:
        """Weights per GPU: every expert resident, split evenly over TP ranks; ``vision=False`` leaves out
        ``extra_params`` (vLLM's --language-model-only never loads the vision tower)."""
        params = self.param_count() - (0 if vision else self.extra_params)
        return int(params * _bytes_of(self.weight_dtype) / tp)


def _qwen35(name, hidden, layers, heads, value_heads, experts, topk, moe_inter, vocab=248320):
    return ModelSpec(
        name=name, hidden_size=hidden, num_gdn_layers=layers * 3 // 4, num_attn_layers=layers // 4,
        num_attention_heads=heads, num_kv_heads=2, head_dim=256, gdn_key_heads=16, gdn_value_heads=value_heads,
        gdn_key_dim=128, gdn_value_dim=128, conv_kernel=4, vocab_size=vocab, num_experts=experts,
        experts_per_token=topk, moe_intermediate_size=moe_inter, shared_expert_intermediate_size=moe_inter,
        mtp_layers=1, default_state_dtype="float32",
        source="published config (hidden, layers, heads, experts as in the Hugging Face config.json)")


_PRESETS: dict[str, ModelSpec] = {
    "qwen3.5-35b-a3b": replace(_qwen35("qwen3.5-35b-a3b", 2048, 40, 16, 32, 256, 8, 512), extra_params=0.4e9),
    "qwen3.5-397b-a17b": replace(_qwen35("qwen3.5-397b-a17b", 4096, 60, 32, 64, 512, 10, 1024), extra_params=0.4e9),
    # Qwen3-Next has no mamba_ssm_dtype field: vLLM serves its GDN state in bf16 unless told otherwise.
    "qwen3-next-80b-a3b": replace(_qwen35("qwen3-next-80b-a3b", 2048, 48, 16, 32, 512, 10, 512, vocab=151936),
                                  default_state_dtype="bfloat16"),
}


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    hbm_tb_s: float            # spec-sheet HBM bandwidth
    bf16_tflops: float         # dense bf16 tensor-core peak
    link_gb_s: float           # NVLink per-GPU bandwidth (one direction), for TP all-reduces

    @classmethod
    def from_name(cls, name: str) -> GPU:
        key = str(name).lower()
        if key not in _GPUS:
            raise ValueError(f"gpu = {name!r}: unknown GPU; known GPUs are {sorted(_GPUS)}, "
                             "or build one with GPU(name, memory_gib, hbm_tb_s, bf16_tflops, link_gb_s)")
        return _GPUS[key]

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


_GPUS = {
    "b200": GPU("b200", 178.0, 8.0, 2250.0, 900.0),
    "h200": GPU("h200", 139.8, 4.8, 989.0, 450.0),     # what CUDA reports (as vLLM 0.26's log prints it)
    "h100": GPU("h100", 80.0, 3.35, 989.0, 450.0),
}
