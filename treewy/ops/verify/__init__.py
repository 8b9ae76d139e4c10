"""Tree verification of the gated delta rule: the references (``naive.py``), the pending commit (``pending.py``), one
file per kernel family (``chain.py``, ``dense.py``, ``path.py``), the pending commit's fold written once
(``fold.py``), the choice of family (``select.py``), launch plumbing (``tuning.py``) and the launcher and public
functions (``kernel.py``: ``tree_verify``, ``tree_verify_fwd``, ``flush_pending``). README.md holds the derivation
and which kernel serves which window, as last measured.

Only what runs without triton is imported here; the kernels are ``treewy.ops.tree_verify`` and friends (imported
on first use) or ``treewy.ops.verify.kernel``.
"""

from treewy.ops.verify.naive import (
    naive_flush, naive_stash_window, naive_tree_step, naive_tree_verify, path_tables_ref, path_verify_ref,
    solve_forward, solve_neumann, tree_system,
)
from treewy.ops.verify.pending import PendingCommit, unpack
from treewy.ops.verify.select import KERNELS, LAUNCHES, select_kernel

__all__ = [
    "KERNELS",
    "LAUNCHES",
    "PendingCommit",
    "naive_flush",
    "naive_stash_window",
    "naive_tree_step",
    "naive_tree_verify",
    "path_tables_ref",
    "path_verify_ref",
    "select_kernel",
    "solve_forward",
    "solve_neumann",
    "tree_system",
    "unpack",
]
