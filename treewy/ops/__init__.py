"""Tree verification ops, one folder per op (``verify/``, ``commit/``, ``conv/``, ``store_all/``, ``attention/``),
each with its readable torch reference (``naive.py``) beside its Triton kernels (``kernel.py`` and, for verify, one
file per kernel family).

The references need only torch and are imported with the package. The kernels need triton and are imported on
first use (``treewy.ops.tree_verify`` and friends: the module ``__getattr__`` below), so the torch engine works
without triton installed; the kernel modules set ``TRITON_INTERPRET=1`` on a machine without CUDA (unless the
variable is already set), so the kernels run on CPU tensors there.
"""

from importlib import import_module

from treewy.ops.attention import (
    merge_attention_states, naive_compact_accepted_kv, naive_tree_attention, naive_tree_attention_merged,
)
from treewy.ops.commit import naive_tree_commit
from treewy.ops.conv import naive_tree_conv1d, naive_tree_conv1d_commit, naive_tree_conv_update
from treewy.ops.gdn import gdn_step, gdn_step_textbook, path_cumsum
from treewy.ops.store_all import naive_tree_recurrent
from treewy.ops.verify import (
    PendingCommit, naive_flush, naive_tree_step, naive_tree_verify, solve_forward, solve_neumann, tree_system,
)

#: Each kernel name and the module that defines it (imported on first use: they need triton).
_KERNELS = {
    "MAX_KERNEL_NODES": "treewy.ops.common",
    "compact_accepted_kv": "treewy.ops.attention.kernel",
    "flush_pending": "treewy.ops.verify.kernel",
    "store_all_commit": "treewy.ops.store_all.kernel",
    "store_all_verify": "treewy.ops.store_all.kernel",
    "tree_commit": "treewy.ops.commit.kernel",
    "tree_conv1d": "treewy.ops.conv.kernel",
    "tree_conv1d_commit": "treewy.ops.conv.kernel",
    "tree_attention": "treewy.ops.attention.kernel",
    "tree_verify": "treewy.ops.verify.kernel",
}


def __getattr__(name: str):
    if name in _KERNELS:
        value = getattr(import_module(_KERNELS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'treewy.ops' has no attribute {name!r}")


__all__ = [
    "MAX_KERNEL_NODES",
    "PendingCommit",
    "compact_accepted_kv",
    "flush_pending",
    "gdn_step",
    "gdn_step_textbook",
    "merge_attention_states",
    "naive_compact_accepted_kv",
    "naive_flush",
    "naive_tree_attention",
    "naive_tree_attention_merged",
    "naive_tree_commit",
    "naive_tree_conv1d",
    "naive_tree_conv1d_commit",
    "naive_tree_conv_update",
    "naive_tree_recurrent",
    "naive_tree_step",
    "naive_tree_verify",
    "path_cumsum",
    "solve_forward",
    "solve_neumann",
    "store_all_commit",
    "store_all_verify",
    "tree_attention",
    "tree_commit",
    "tree_conv1d",
    "tree_conv1d_commit",
    "tree_system",
    "tree_verify",
]
