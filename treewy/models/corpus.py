"""The tiny checkpoint's corpus: the running interpreter's standard-library ``*.py`` files, as bytes.

Split by file, deterministically: a file is held out when the first byte of the SHA-1 of its path
relative to the stdlib directory is below 13 (about 5 % of files). Every machine with Python has it.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

from treewy.tokenizer import BOS, EOS


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: str) -> bool:
    return hashlib.sha1(rel.encode()).digest()[0] < 13


def stdlib_files(split: str = "train", root: Path | None = None, max_files: int | None = None) -> list[Path]:
    """Sorted stdlib source files of one split ("train" or "heldout"); site-packages excluded."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split = {split!r}: expected 'train' or 'heldout'")
    root = stdlib_dir() if root is None else Path(root)
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        if is_heldout(rel) == (split == "heldout"):
            out.append(p)
    return out[:max_files] if max_files else out


def corpus_ids(split: str = "train", max_files: int | None = None, max_bytes: int | None = None) -> list[int]:
    """One long id stream: <bos> file bytes <eos> for every file of the split."""
    ids: list[int] = []
    for p in stdlib_files(split, max_files=max_files):
        try:
            data = p.read_bytes()
        except OSError:
            continue
        ids.append(BOS)
        ids.extend(data)
        ids.append(EOS)
        if max_bytes and len(ids) >= max_bytes:
            break
    return ids[:max_bytes] if max_bytes else ids


def heldout_prompts(n: int = 16, length: int = 128, seed: int = 0) -> list[list[int]]:
    """n prompts of ``length`` tokens from held-out files: <bos> and the start of a line, chosen by seed."""
    import random
    rng = random.Random(seed)
    files = stdlib_files("heldout")
    if not files:
        raise ValueError(f"no held-out stdlib files under {stdlib_dir()}")
    out: list[list[int]] = []
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        data = files[rng.randrange(len(files))].read_bytes()
        if len(data) < 4 * length:
            continue
        start = data.rfind(b"\n", 0, rng.randrange(len(data) - 2 * length)) + 1
        out.append([BOS] + list(data[start:start + length - 1]))
    return out
