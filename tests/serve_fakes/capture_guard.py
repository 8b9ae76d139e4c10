"""What a CUDA-graph capture refuses, checked on a CPU: ``no_host_copies()`` runs a block as vLLM captures its step
and raises ``HostCopyInCapture`` where the code under watch (``treewy/serve`` by default) copies host data to the
device or reads the device on the host.

A capture records kernels; it cannot record a copy out of pageable host memory (torch refuses one: "Cannot copy
between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned") nor wait for the device (a
sync raises "operation not permitted when stream is capturing"). On a CPU there is no device to tell apart, so the
guard watches for what would be one (``torch.utils._python_dispatch``, torch's own operator hook, and the few
``Tensor`` methods that leave the dispatcher):

- host data turned into a tensor: ``torch.tensor`` / ``as_tensor`` / ``from_numpy`` / ``new_tensor`` of a list or an
  array (torch's ``lift_fresh``), and a Python number assigned through an index tensor (``x[idx] = 5``: torch makes a
  host scalar tensor of it and copies it into ``index_put_``, the copy that stopped vLLM's capture on the H200). A
  number that stays a kernel argument is fine: ``x[:, 0] = 5`` (``fill_``), ``index_fill_``, ``masked_fill``,
  ``torch.where(m, x, 5)`` and any other pointwise op;
- the device read on the host: ``.item()``, ``int()`` / ``float()`` / ``bool()`` of a tensor, ``torch.equal``,
  ``.tolist()``, ``.numpy()``, ``.cpu()``, and ops whose output size depends on the data (``nonzero``, indexing
  with a boolean mask, ``masked_select``, ``unique``, ``repeat_interleave`` of a tensor without ``output_size``).

An op counts against the innermost Python frame outside torch (and outside this module): only frames in a watched
file fail, so the CPU references of ``treewy.ops`` (stand-ins for the CUDA kernels, which have their own capture
tests on the GPU) and the stand-in engine's code run as they are.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH = os.path.dirname(torch.__file__) + os.sep
_SKIP = (_TORCH, __file__, contextlib.__file__)
#: what ``no_host_copies`` watches by default: the plugin's code (the hooks vLLM's captured step runs)
SERVE = str(Path(__file__).resolve().parents[2] / "treewy" / "serve") + os.sep

aten = torch.ops.aten
_SYNC = {aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.nonzero, aten.masked_select, aten._unique,
         aten._unique2, aten.unique_consecutive, aten.unique_dim, aten.bincount}
_INDEX = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_HOST_DATA = {aten.lift_fresh, aten.lift_fresh_copy}
_SCALAR_OK = {aten.fill_, aten.fill}   # fill takes a host scalar tensor's value as a kernel argument


class HostCopyInCapture(RuntimeError):
    """Code under a capture copied host data to the device or read the device on the host."""


def _blame(watch: tuple[str, ...]) -> str | None:
    """'file:line' of the innermost frame outside torch and this module, when that frame is in a watched file."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    if f is None:
        return None
    name = os.path.abspath(f.f_code.co_filename)
    return f"{name}:{f.f_lineno}" if name.startswith(watch) else None


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class _Guard(TorchDispatchMode):
    def __init__(self, watch: tuple[str, ...]):
        super().__init__()
        self.watch = watch
        self.host_scalars: dict[int, torch.Tensor] = {}   # 0-dim tensors made of a Python number, by id (kept alive)

    def fail(self, what: str) -> None:
        where = _blame(self.watch)
        if where is not None:
            raise HostCopyInCapture(f"{where}: {what} inside a CUDA-graph capture (vLLM captures this step; torch "
                                    "refuses a host-to-device copy or a device read there)")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _SYNC:
            self.fail(f"{packet.__name__} reads the device on the host")
        elif packet is aten.repeat_interleave and kwargs.get("output_size") is None and \
                isinstance(args[0], torch.Tensor) and func is not aten.repeat_interleave.self_int:
            self.fail("repeat_interleave of a tensor without output_size reads the device on the host")
        elif packet in _INDEX and any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1])):
            self.fail(f"{packet.__name__} with a boolean mask reads the device on the host")
        if packet not in _HOST_DATA and packet not in _SCALAR_OK and torch.Tag.pointwise not in func.tags:
            for t in _tensors((args, kwargs)):
                if id(t) in self.host_scalars:
                    self.fail(f"a Python number copied into {packet.__name__} (a host tensor to the device)")
        out = func(*args, **kwargs)
        if packet in _HOST_DATA:
            if args[0].ndim:
                self.fail("host data (a list, an array) made into a tensor, i.e. copied to the device")
            else:
                self.host_scalars[id(out)] = out
        return out


def _host_method(name: str, original, guard: _Guard):
    def method(self, *args, **kwargs):
        guard.fail(f"Tensor.{name}() reads the device on the host")
        return original(self, *args, **kwargs)
    return method


@contextlib.contextmanager
def no_host_copies(watch=(SERVE,)):
    """Run the block as a CUDA-graph capture would: ``HostCopyInCapture`` where a watched file (paths or folders
    ending in a separator) copies from the host or reads the device."""
    watch = tuple(os.path.abspath(w) + (os.sep if str(w).endswith(os.sep) else "") for w in watch)
    guard = _Guard(watch)
    saved = {n: (getattr(torch.Tensor, n), n in vars(torch.Tensor)) for n in ("tolist", "numpy", "cpu")}
    for n, (original, _) in saved.items():
        setattr(torch.Tensor, n, _host_method(n, original, guard))
    try:
        with guard:
            yield guard
    finally:
        for n, (original, own) in saved.items():
            if own:
                setattr(torch.Tensor, n, original)
            else:
                delattr(torch.Tensor, n)
