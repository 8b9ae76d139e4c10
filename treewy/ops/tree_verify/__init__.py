"""Tree verification of the gated delta rule, in fla's manner: the references (``reference.py``, and
``treewy.ops.naive``), one file per kernel family (``chain.py``, ``dense.py``, ``path.py``), the pending commit's
fold written once (``fold.py``), the choice of family (``select.py``) and the launcher and public function
(``verify.py``). README.md holds the derivation and which kernel serves which window, as last measured.

On a machine without CUDA, importing this package sets TRITON_INTERPRET=1 (see treewy/ops/_triton.py).
"""

from treewy.ops.tree_verify.common import MAX_KERNEL_NODES
from treewy.ops.tree_verify.select import KERNELS, LAUNCHES, select_kernel
from treewy.ops.tree_verify.tuning import DOT_PRECISIONS, PRECISION_ENV, batch_bucket, default_dot_precision
from treewy.ops.tree_verify.verify import KERNEL_FNS, tree_verify, tree_verify_fwd

__all__ = [
    "DOT_PRECISIONS",
    "KERNELS",
    "KERNEL_FNS",
    "LAUNCHES",
    "MAX_KERNEL_NODES",
    "PRECISION_ENV",
    "batch_bucket",
    "default_dot_precision",
    "select_kernel",
    "tree_verify",
    "tree_verify_fwd",
]
