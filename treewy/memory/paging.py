"""vLLM's KV pool for a GDN hybrid: how it pages the layers, and how many blocks a request holds.

    layout = paging("qwen3.5-35b-a3b", "b200", gmu=0.6, mode="store_all", tree=(1, 1, 1))
    layout.max_requests(4096)             # requests of 4096 tokens that fit in the pool at once

The rules, vLLM's hybrid KV-cache manager's (read at commit 37ce349; the layout reproduces vLLM 0.26.0's logged
block size and maximum concurrency in both modes, tests/test_memory.py):

* One block pool shared by all layer groups. Layers are grouped by type into groups of ``group_size`` layers:
  the smaller per-type layer count (the 10 attention layers plus the MTP layer, ``mtp_in_pool``), or the larger
  one when the two are within 25% of each other. A block id names one page in each of ``group_size`` tensors,
  so a block costs ``group_size * page`` bytes. A type whose layer count is not a multiple of ``group_size``
  gets a last, partly empty group (vLLM pads it the same way).
* Attention page = ``block_size`` tokens of K and V for one layer. A GDN ("mamba") page holds one conv state
  and one SSM state for one layer, and in reconstruct mode TreeWY's pending commit (``reconstruct_stash_bytes``,
  what the vLLM plugin appends to the page). vLLM raises the attention block size to a multiple of the kernel
  alignment (16) until an attention page is at least a mamba page, then pads the mamba page up to it.
* A request holds ``cdiv(tokens, block_size)`` blocks in each attention group, and in each GDN group
  1 + num_speculative_blocks pages (``mamba_cache_mode="none"``): store-all N + 1, reconstruct 1. The conv
  state is vLLM's sliding window, ``kernel - 1 + N`` wide, in both modes (the plugin keeps vLLM's conv path).
* Pool = gmu * GPU memory - weights - activation reserve. The reserve stands in for vLLM's profile run; see
  ``activation_reserve_bytes`` for its terms.

Approximations: the activation reserve is a formula, not a profile (two of its terms are fitted to one, see
``ServerConfig``); weights as ``ModelSpec.weight_bytes`` counts them; prefix caching is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from treewy.memory.server import ServerConfig
from treewy.memory.specs import GIB, GPU, KIB, MODES, ModelSpec, _positive, tree_num_nodes


def activation_reserve_bytes(model: ModelSpec, tp: int = 1, mode: str = "store_all", tree=(1, 1, 1),
                             server: ServerConfig = ServerConfig()) -> dict[str, int]:
    """What vLLM keeps out of the KV pool besides weights, term by term (bytes per GPU).

    activations: max_num_batched_tokens tokens of hidden states (4 live copies), the widest
      projection (GDN qkvz or gated q) and the routed experts' gate/up/down intermediates, bf16;
    sampler: vLLM's dummy sampler run over min(max_num_seqs, max_num_batched_tokens) rows with top-k /
      top-p on: fp32 logits, their sort (fp32 values + int64 indices) and fp32 probabilities, at
      ``sampler_bytes_per_logit`` bytes per vocabulary entry (fitted to one profile: the largest and least
      certain term);
    pseudo_values: reconstruct only, TreeWY's U for max_num_seqs requests (one layer at a time);
    cudagraph, non_torch: fixed sizes from the server config.
    """
    proj = max(2 * model.gdn_key_heads * model.gdn_key_dim + 2 * model.gdn_value_heads * model.gdn_value_dim,
               model.num_attention_heads * model.head_dim * 2)
    mlp = model.experts_per_token * model.moe_intermediate_size * 3 if model.num_experts else model.intermediate_size * 3
    per_token = 2 * (4 * model.hidden_size + proj / tp + mlp / tp)
    terms = {
        "activations": int(server.max_num_batched_tokens * per_token),
        "sampler": int(min(server.max_num_seqs, server.max_num_batched_tokens) * model.vocab_size
                       * server.sampler_bytes_per_logit),
        "pseudo_values": model.pseudo_value_bytes(tree, tp) * server.max_num_seqs if mode == "reconstruct" else 0,
        "cudagraph": int(server.cudagraph_gib * GIB),
        "non_torch": int(server.non_torch_gib * GIB),
    }
    return terms


@dataclass(frozen=True)
class PagingLayout:
    """The KV pool of one GPU for one (model, gpu, tp, gmu, mode, tree): vLLM's hybrid paging."""

    model: ModelSpec
    gpu: GPU
    tp: int
    gmu: float
    mode: str
    num_nodes: int
    state_dtype: str
    attn_bytes_per_token_layer: int
    block_size: int
    page_bytes: int
    mamba_page_raw_bytes: int
    group_size: int
    attn_groups: int
    gdn_groups: int
    pages_per_gdn_group: int
    weight_bytes: int
    reserve_bytes: int
    pool_bytes: int
    num_blocks: int
    reserve_terms: dict = field(default_factory=dict)

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def mamba_padding_bytes(self) -> int:
        return self.page_bytes - self.mamba_page_raw_bytes

    @property
    def state_blocks_per_request(self) -> int:
        """Pool blocks a request's GDN state takes (all GDN groups)."""
        return self.gdn_groups * self.pages_per_gdn_group

    def attn_blocks(self, tokens: int) -> int:
        return self.attn_groups * -(-int(tokens) // self.block_size)

    def blocks_per_request(self, tokens: int) -> int:
        """Pool blocks of a request holding ``tokens`` tokens of KV."""
        _positive("tokens", tokens, "pass the context length of a request (prompt + output)", integer=True)
        return self.attn_blocks(tokens) + self.state_blocks_per_request

    def max_requests(self, tokens: int) -> int:
        """How many requests of ``tokens`` tokens fit in the pool at once."""
        return self.num_blocks // self.blocks_per_request(tokens)

    def max_concurrency(self, tokens: int) -> float:
        """vLLM's own figure ("Maximum concurrency for N tokens per request: X x"): blocks / blocks per request."""
        return self.num_blocks / self.blocks_per_request(tokens)

    def summary(self) -> dict:
        return {
            "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp, "gmu": self.gmu, "mode": self.mode,
            "state_dtype": self.state_dtype, "weights_gib": self.weight_bytes / GIB,
            "reserve_gib": self.reserve_bytes / GIB, "pool_gib": self.pool_bytes / GIB,
            "block_size": self.block_size, "page_kib": self.page_bytes / KIB,
            "mamba_padding_kib": self.mamba_padding_bytes / KIB, "group_size": self.group_size,
            "num_blocks": self.num_blocks, "state_blocks_per_request": self.state_blocks_per_request,
        }


def paging(model: ModelSpec | str, gpu: GPU | str, *, tp: int = 1, gmu: float = 0.9, mode: str = "store_all",
           tree=(1, 1, 1), state_dtype: str | None = None, server: ServerConfig = ServerConfig()) -> PagingLayout:
    """Lay out the KV pool the way vLLM does for a GDN hybrid; raises if the weights do not fit."""
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    gpu = gpu if isinstance(gpu, GPU) else GPU.from_name(gpu)
    model.check_tp(tp)
    if isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1:
        raise ValueError(f"gmu = {gmu!r}: gpu-memory-utilization is a fraction in (0, 1], e.g. 0.6 or 0.9")
    if mode not in MODES:
        raise ValueError(f"mode = {mode!r}: expected one of {MODES}")
    state_dtype = state_dtype or model.default_state_dtype
    T = tree_num_nodes(tree)
    N = T - 1

    attn_layers = model.num_attn_layers + (model.mtp_layers if server.mtp_in_pool else 0)
    attn_tok = int(2 * model.kv_heads_per_gpu(tp) * model.head_dim * 2)   # one layer, bf16 K and V
    conv_width = model.conv_kernel - 1 + N                                 # vLLM's sliding conv window, both modes
    mamba_raw = model.conv_state_bytes(conv_width, tp) + model.gdn_state_bytes(state_dtype, tp) // model.num_gdn_layers
    if mode == "reconstruct":
        mamba_raw += model.reconstruct_stash_bytes(tree, tp)
    align = server.kernel_block_alignment
    block_size = align * -(-mamba_raw // (align * attn_tok))
    page = block_size * attn_tok
    group_size = min(attn_layers, model.num_gdn_layers)
    if max(attn_layers, model.num_gdn_layers) < 1.25 * group_size:
        group_size = max(attn_layers, model.num_gdn_layers)
    attn_groups = -(-attn_layers // group_size)
    gdn_groups = -(-model.num_gdn_layers // group_size)

    weights = model.weight_bytes(tp, vision=not server.language_model_only)
    terms = activation_reserve_bytes(model, tp, mode, tree, server)
    reserve = sum(terms.values())
    budget = gmu * gpu.memory_bytes
    pool = budget - weights - reserve
    if pool <= 0:
        need = (weights + reserve) / gpu.memory_bytes
        raise ValueError(
            f"gmu = {gmu}: {gmu} x {gpu.memory_gib:.0f} GiB ({gpu.name}) = {budget / GIB:.1f} GiB leaves no room for the "
            f"KV pool: weights take {weights / GIB:.1f} GiB per GPU at tp = {tp} and the activation reserve "
            f"{reserve / GIB:.1f} GiB; " + (f"raise gmu above {need:.2f} or raise tp" if need < 1 else
                                               "the model does not fit this GPU at this tp: raise tp"))
    num_blocks = int(pool // (page * group_size))
    return PagingLayout(
        model=model, gpu=gpu, tp=tp, gmu=float(gmu), mode=mode, num_nodes=T, state_dtype=state_dtype,
        attn_bytes_per_token_layer=attn_tok, block_size=block_size, page_bytes=page, mamba_page_raw_bytes=mamba_raw,
        group_size=group_size, attn_groups=attn_groups, gdn_groups=gdn_groups,
        pages_per_gdn_group=model.state_blocks(mode, tree), weight_bytes=weights, reserve_bytes=reserve,
        pool_bytes=int(pool), num_blocks=num_blocks, reserve_terms=terms)
