"""Where the Triton kernels run: on a CUDA GPU, or on the CPU under the Triton interpreter.

Importing a kernel module (``treewy.ops.tree_verify`` and its siblings) sets
``TRITON_INTERPRET=1`` when no CUDA device is available and the variable is unset, so the same
kernels run on a CPU machine (slowly: keep shapes small). The variable must be set before a
kernel is defined, which is why this module is imported first by every kernel module. Set
``TRITON_INTERPRET=0`` explicitly to opt out; the kernels then refuse CPU tensors with a clear
error instead of failing inside Triton.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

#: True when the kernels run under the Triton interpreter (CPU tensors).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def is_capturing() -> bool:
    """True while a CUDA graph is being captured on the current stream (no host syncs allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
