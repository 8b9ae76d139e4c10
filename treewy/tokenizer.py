"""A byte-level tokenizer: ids 0..255 are bytes, then a few specials. Lets notebooks write prompts as text.

The tiny checkpoint (treewy.models) and its vLLM export (treewy.serve.export) both read it; treewy.models.tokenizer
re-exports it.
"""

from __future__ import annotations

BOS, EOS, PAD = 256, 257, 258
#: Vocabulary size of the tiny checkpoint (256 bytes + 3 specials, rounded up to a multiple of 8).
VOCAB_SIZE = 264
SPECIALS = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


def encode(text: str | bytes, bos: bool = True) -> list[int]:
    """Token ids of ``text`` (UTF-8 bytes), with a leading <bos> unless ``bos=False``."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return ([BOS] if bos else []) + list(data)


def decode(ids, errors: str = "replace") -> str:
    """Text of a list of ids; specials are dropped, invalid UTF-8 is replaced."""
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors=errors)
