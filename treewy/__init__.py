"""TreeWY lab: tree speculative decoding for Gated DeltaNet hybrid models.

On a machine without CUDA the Triton kernels run under the Triton interpreter. The interpreter
must be switched on (``TRITON_INTERPRET=1``) before triton itself is imported — by anything:
transformers imports it while building a model — so it is done here, when the package is first
imported, unless the variable is already set. ``TRITON_INTERPRET=0`` opts out.
"""

import os
import sys

import torch

#: True when triton was already imported when treewy switched the interpreter on (too late to take effect).
TRITON_IMPORTED_FIRST = False

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    TRITON_IMPORTED_FIRST = "triton" in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"
