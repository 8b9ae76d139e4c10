"""The byte tokenizer lives in ``treewy.tokenizer`` (models and serving both import it); this name stays for users."""

from treewy.tokenizer import BOS, EOS, PAD, SPECIALS, VOCAB_SIZE, decode, encode

__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "VOCAB_SIZE", "decode", "encode"]
