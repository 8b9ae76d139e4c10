"""Where the Triton kernels run: on a CUDA GPU, or on the CPU under the Triton interpreter.

``import treewy`` sets ``TRITON_INTERPRET=1`` when no CUDA device is available and the variable
is unset (see treewy/__init__.py), so the same kernels run on a CPU machine (slowly: keep shapes
small). Every kernel module imports this one first. Set ``TRITON_INTERPRET=0`` explicitly to opt
out; the kernels then refuse CPU tensors with a clear error instead of failing inside Triton.
"""

from __future__ import annotations

import os

import torch

import treewy
from treewy.env import MISSING_TRITON, has_triton

if not has_triton():
    raise ImportError(MISSING_TRITON)

#: True when the kernels run under the Triton interpreter (CPU tensors).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")

if INTERPRET and treewy.TRITON_IMPORTED_FIRST:
    raise ImportError("triton was imported before treewy on a machine without CUDA, so the Triton interpreter "
                      "the kernels need is not active: import treewy before triton (or anything that loads "
                      "it), or start Python with TRITON_INTERPRET=1")


def is_capturing() -> bool:
    """True while a CUDA graph is being captured on the current stream (no host syncs allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
