"""The tree conv1d in front of each GDN layer and its commit. ``naive.py`` holds the references; the kernels
(``kernel.py``: ``tree_conv1d``, ``tree_conv1d_commit`` and their launchers) need triton and are imported on first
use through ``treewy.ops``. README.md holds the derivation."""

from treewy.ops.conv.naive import naive_tree_conv1d, naive_tree_conv1d_commit, naive_tree_conv_update

__all__ = ["naive_tree_conv1d", "naive_tree_conv1d_commit", "naive_tree_conv_update"]
