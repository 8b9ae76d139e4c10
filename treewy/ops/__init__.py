"""Tree verification ops: readable torch references (``naive_*``) beside the Triton kernels."""

from treewy.ops.naive import naive_tree_commit, naive_tree_recurrent, naive_tree_verify, path_cumsum
from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit

__all__ = [
    "naive_tree_commit",
    "naive_tree_conv1d",
    "naive_tree_conv1d_commit",
    "naive_tree_recurrent",
    "naive_tree_verify",
    "path_cumsum",
]
