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


def _squeeze_loop_bounds() -> None:
    """Triton 3.6's interpreter makes a tensor a Python index (a ``range`` bound such as a path's depth) with
    ``int(data)``, which NumPy 2.4 refuses for the 1-element arrays it holds scalars in; 3.9 squeezes them first.
    Give every release the squeeze (a no-op where the release has it)."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes_index", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.squeezes_index = True
    interpreter._patch_lang_tensor = patched


_squeeze_loop_bounds()


def is_capturing() -> bool:
    """True while a CUDA graph is being captured on the current stream (no host syncs allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
