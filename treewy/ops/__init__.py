"""Tree verification ops: readable torch references (``naive_*``) beside the Triton kernels.

The references need only torch and are imported with the package. The kernels are imported on first
use (``treewy.ops.tree_verify`` and friends), so the torch engine works without triton installed and
whatever was imported first; the kernel modules set ``TRITON_INTERPRET=1`` on a machine without CUDA
(unless the variable is already set), so the kernels run on CPU tensors there.
"""

import sys
from importlib import import_module
from types import ModuleType

from treewy.ops.naive import naive_tree_commit, naive_tree_recurrent, naive_tree_verify, path_cumsum
from treewy.ops.naive_conv import naive_tree_conv1d, naive_tree_conv1d_commit
from treewy.ops.pending import PendingCommit, flush_pending, naive_flush, naive_tree_step

_KERNELS = {
    "store_all_commit": "store_all",
    "store_all_verify": "store_all",
    "tree_commit": "tree_commit",
    "tree_conv1d": "tree_conv",
    "tree_conv1d_commit": "tree_conv",
    "MAX_KERNEL_NODES": "tree_verify",
    "tree_verify": "tree_verify",
}


class _Ops(ModuleType):
    """``treewy.ops.tree_verify`` and ``treewy.ops.tree_commit`` stay the functions even after their modules of the
    same name are imported (the import system would set the package attribute to the module)."""

    def __setattr__(self, name, value):
        if _KERNELS.get(name) == name and isinstance(value, ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Ops


def __getattr__(name: str):
    if name in _KERNELS:
        value = getattr(import_module(f"treewy.ops.{_KERNELS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'treewy.ops' has no attribute {name!r}")


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
