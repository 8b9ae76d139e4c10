"""Analytic memory accounting for a vLLM-style server running a GDN hybrid (Qwen3.5 / Qwen3-Next).

What a request costs, in bytes and in pool blocks, and how many requests a GPU holds:

    model = ModelSpec.from_name("qwen3.5-35b-a3b")
    model.kv_bytes_per_token()            # 20 KiB: softmax K and V of every attention layer, bf16
    model.gdn_state_bytes("bfloat16")     # 30 MiB: one state per GDN layer
    model.state_blocks("store_all", (1, 1, 1))   # 4 (N + 1); reconstruct: 1
    layout = paging(model, GPU.from_name("b200"), gmu=0.6, mode="store_all", tree=(1, 1, 1))
    layout.max_requests(4096)             # requests of 4096 tokens that fit in the pool

Modules: ``specs`` (``ModelSpec`` and its presets, ``GPU``, units and tree helpers), ``server``
(``ServerConfig``: vLLM's knobs and the fixed costs of an engine step), ``paging`` (vLLM's hybrid paging:
``paging``, ``PagingLayout``, the activation reserve), ``capacity`` (``max_requests``, ``memory_table``).
"""

from treewy.memory.capacity import max_requests, memory_table
from treewy.memory.paging import PagingLayout, activation_reserve_bytes, paging
from treewy.memory.server import ServerConfig
from treewy.memory.specs import (DTYPE_BYTES, GIB, GPU, KIB, MIB, MODES, TINY_CONFIG, ModelSpec, check_tp, tp_degrees,
                                 tree_depth, tree_num_nodes, tree_widths)

__all__ = ["DTYPE_BYTES", "GIB", "GPU", "KIB", "MIB", "MODES", "TINY_CONFIG", "ModelSpec", "PagingLayout",
           "ServerConfig", "activation_reserve_bytes", "check_tp", "max_requests", "memory_table", "paging",
           "tp_degrees", "tree_depth", "tree_num_nodes", "tree_widths"]
