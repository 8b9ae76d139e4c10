"""Tree verification ops: readable torch references (``naive_*``) beside the Triton kernels.

Importing this package imports the kernel modules, which set ``TRITON_INTERPRET=1`` on a machine
without CUDA (unless the variable is already set), so the kernels run on CPU tensors there.
"""

from treewy.ops.naive import naive_tree_commit, naive_tree_recurrent, naive_tree_verify, path_cumsum
from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit
from treewy.ops.pending import PendingCommit, flush_pending, naive_flush, naive_tree_step
from treewy.ops.store_all import store_all_commit, store_all_verify
from treewy.ops.tree_commit import tree_commit
from treewy.ops.tree_conv import tree_conv1d, tree_conv1d_commit
from treewy.ops.tree_verify import MAX_KERNEL_NODES, tree_verify

__all__ = [
    "MAX_KERNEL_NODES",
    "PendingCommit",
    "flush_pending",
    "naive_flush",
    "naive_tree_step",
    "naive_tree_commit",
    "naive_tree_conv1d",
    "naive_tree_conv1d_commit",
    "naive_tree_recurrent",
    "naive_tree_verify",
    "path_cumsum",
    "store_all_commit",
    "store_all_verify",
    "tree_commit",
    "tree_conv1d",
    "tree_conv1d_commit",
    "tree_verify",
]
