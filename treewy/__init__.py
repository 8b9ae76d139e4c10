"""TreeWY lab: tree speculative decoding for Gated DeltaNet hybrid models.

    from treewy import DraftTree, generate, load
    out = generate(load("tiny"), [[1, 2, 3]], drafter="mtp", tree=(3, 3, 3), max_new_tokens=32)

On a machine without CUDA the Triton kernels run under the Triton interpreter. The interpreter
must be switched on (``TRITON_INTERPRET=1``) before triton itself is imported — by anything:
transformers imports it while building a model — so it is done here, when the package is first
imported, unless the variable is already set. ``TRITON_INTERPRET=0`` opts out. The torch engine
(``generate`` on a CPU) needs neither triton nor the interpreter, whatever was imported first.
"""

import os
import sys
from importlib import import_module

import torch

#: True when triton was already imported when treewy switched the interpreter on (too late to take effect).
TRITON_IMPORTED_FIRST = False

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    TRITON_IMPORTED_FIRST = "triton" in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"

_EXPORTS = {"DraftTree": "treewy.tree", "generate": "treewy.decode", "load": "treewy.models"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    """``DraftTree``, ``generate`` and ``load`` on first use, so ``import treewy`` stays light."""
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'treewy' has no attribute {name!r}")
