"""What this machine can run: the device, the library versions and which features are live."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import torch


#: The optional dependencies (pyproject.toml's extras) that a plain ``pip install treewy`` lacks for the tiny model
#: and the decoding engine: transformers' Qwen3.5 classes and safetensors. Every message that asks for them says
#: ``install_command(TINY_MODEL_EXTRAS)``; the [lab] extra includes them.
TINY_MODEL_EXTRAS = ("hf",)

#: The extras `treewy lab` needs: JupyterLab, the widgets and charts, and (through [lab]) the tiny model's.
LAB_EXTRAS = ("lab",)


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extras to install and how. The ``treewy``
    command prints it as a one-line error."""


def install_command(extras) -> str:
    """The command that adds ``extras``: to the checkout this package runs from (an editable install), else to the
    installed package."""
    from treewy.results import checkout_dirs

    names = ",".join(extras)
    return f"pip install -e '.[{names}]' in the checkout" if checkout_dirs() else f'pip install "treewy[{names}]"'


#: One line for wherever the kernels are wanted but triton is not installed (it has wheels for Linux only).
MISSING_TRITON = ("Triton is not installed here (it has wheels for Linux only): the kernels run on Linux, on a CPU "
                  "under the interpreter, or on a CUDA GPU; the torch references and the CPU engine run without it")


def has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except ImportError:  # a finder that refuses triton outright
        return False


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "CPU: Triton interpreter"


def default_device() -> str:
    """'cuda' when a GPU is present and TREEWY_DEVICE does not say otherwise, else 'cpu'."""
    want = os.environ.get("TREEWY_DEVICE", "").strip().lower()
    if want == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"


def small() -> bool:
    """True when notebooks should use small sizes (CPU, or TREEWY_SMALL=1)."""
    return os.environ.get("TREEWY_SMALL", "") == "1" or default_device() == "cpu"


def describe() -> dict:
    """Device, versions and live features, for the lab's banner and `treewy check`."""
    versions = {name: _version(name) for name in ("torch", "triton", "transformers", "vllm", "fla-core")}
    return {
        "device": device_name(),
        "versions": versions,
        "features": {
            "triton kernels": ("not installed (Linux or a GPU machine only)" if not has_triton()
                               else "GPU" if torch.cuda.is_available() else "interpreter (small sizes)"),
            "tiny model engine": ("live" if importlib.util.find_spec("transformers")
                                  else f"needs {install_command(TINY_MODEL_EXTRAS)}"),
            "fla baseline": "live" if versions["fla-core"] and torch.cuda.is_available() else "GPU + fla-core only",
            "vLLM serving": "live" if versions["vllm"] and torch.cuda.is_available() else "GPU + vllm only",
        },
    }
