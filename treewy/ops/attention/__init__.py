"""Tree attention for the softmax layers' verify over a paged KV cache, and the compaction of the accepted path's
K/V. ``naive.py`` holds the references; the kernels (``kernel.py``: ``tree_attention``, ``compact_accepted_kv``)
need triton and are imported on first use through ``treewy.ops``. README.md says what they compute and how."""

from treewy.ops.attention.naive import (
    merge_attention_states, naive_compact_accepted_kv, naive_tree_attention, naive_tree_attention_merged,
)

__all__ = ["merge_attention_states", "naive_compact_accepted_kv", "naive_tree_attention",
           "naive_tree_attention_merged"]
