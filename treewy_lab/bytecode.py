"""A bytecode cache of the lab's own, for a Python that keeps none beside its packages.

Python compiles a module's source on every import unless its bytecode sits in the package's ``__pycache__``. An
install made with ``PYTHONDONTWRITEBYTECODE=1`` into a read-only or shared site keeps none, so every new notebook
kernel compiles again the ~2,400 modules that torch and transformers' Qwen3.5 model import: on a 2-core CPU that
import took 8.5 s compiling against 2.8 s reading bytecode (``benchmarks/import_cost.py``), and on a GPU host whose
Python keeps none it was half of notebook 04's warm start
(``benchmarks/results/lab_startup_h100_2026-12-06_bytecode/``).

``keep_bytecode()``, run when ``treewy_lab`` is imported (before it loads torch), checks whether torch and
transformers have bytecode beside their sources; where one has none it points Python's bytecode at
``~/.cache/treewy_lab/bytecode`` (``sys.pycache_prefix``; ``XDG_CACHE_HOME`` moves it) and lets Python write there
even under ``PYTHONDONTWRITEBYTECODE``, which then keeps only the package folders clean: the first kernel compiles,
later ones read. A Python whose packages hold their bytecode, or a ``PYTHONPYCACHEPREFIX`` of your own, is left as it
is; ``TREEWY_LAB_BYTECODE=0`` turns this off. Python processes the kernel starts (the simulator's workers, which
import torch) inherit the cache through ``PYTHONPYCACHEPREFIX``: they read what the kernel wrote.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

#: The packages whose bytecode decides: the bulk of what a notebook imports.
PROBES = ("torch", "transformers")


def beside_source(path: str) -> Path:
    """Where this interpreter keeps the bytecode of the source ``path`` without a prefix (``__pycache__``)."""
    src = Path(path)
    opt = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    return src.parent / "__pycache__" / f"{src.stem}.{sys.implementation.cache_tag}{opt}.pyc"


def missing_bytecode(packages=PROBES) -> list[str]:
    """The installed packages among ``packages`` with no bytecode beside their ``__init__.py`` (none is imported)."""
    missing = []
    for name in packages:
        origin = getattr(importlib.util.find_spec(name), "origin", None)   # an imported one: its __spec__
        if origin and origin.endswith(".py") and not beside_source(origin).exists():
            missing.append(name)
    return missing


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "treewy_lab" / "bytecode"


def keep_bytecode(packages=PROBES) -> Path | None:
    """Point bytecode at the lab's cache where ``packages`` have none beside them; returns the cache, else None."""
    if os.environ.get("TREEWY_LAB_BYTECODE", "1") == "0" or sys.pycache_prefix is not None:
        return None
    if not missing_bytecode(packages):
        return None
    root = cache_dir()
    sys.pycache_prefix = str(root)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(root)   # child interpreters (the simulator's workers) read it too
    return root
