"""TreeWY commit: the accepted node's state rebuilt from S0 and the pseudo-values. ``naive.py`` holds the
reference; the kernel (``kernel.py``: ``tree_commit``, ``tree_commit_fwd``) needs triton and is imported on first
use through ``treewy.ops.tree_commit``. README.md holds the derivation."""

from treewy.ops.commit.naive import naive_tree_commit

__all__ = ["naive_tree_commit"]
