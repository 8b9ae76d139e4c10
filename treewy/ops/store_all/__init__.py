"""The store-all baseline: every node advances its parent's state and keeps a snapshot; the commit is a select.
``naive.py`` holds the reference (the recurrence every other op is tested against); the kernels (``kernel.py``:
``store_all_verify``, ``store_all_commit``) need triton and are imported on first use through ``treewy.ops``.
README.md holds what the kernel does."""

from treewy.ops.store_all.naive import naive_tree_recurrent

__all__ = ["naive_tree_recurrent"]
