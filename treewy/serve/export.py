"""Checkpoints in the layout vLLM serves: ``treewy export-vllm SRC OUT`` and ``treewy export-vllm --dummy NAME OUT``.

vLLM 0.26 registers Qwen3.5 only as the composite ``*ForConditionalGeneration`` classes (text + vision),
served text-only with ``--language-model-only``. A text-only Qwen3.5 checkpoint (such as our tiny one)
is rewritten into that layout:

- config.json: ``{"architectures": [<composite class>], "model_type": "qwen3_5[_moe]", "text_config":
  <the text config>, "vision_config": <a small one that --language-model-only never builds>}``; the text
  config gains ``mamba_ssm_dtype: float32`` where it names none (Qwen3.5's fp32 GDN state, which
  treewy's engine keeps too) and ``dtype: bfloat16`` where it names none;
- weights: ``model.*`` renamed ``model.language_model.*`` (``lm_head.*`` and ``mtp.*`` unchanged), values
  untouched;
- tokenizer.json: the byte-level vocabulary of ``treewy.tokenizer`` (bytes 0-255, <bos> 256,
  <eos> 257, <pad> 258, then placeholder tokens up to the model's vocabulary size).

A checkpoint already in the composite layout (a real Qwen3.5 release) is copied as it is. ``--dummy``
writes only a config (and the tokenizer) for ``vllm serve --load-format dummy``: the architecture of a
``treewy.memory`` preset, so memory and speed are real while the weights are random.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from treewy.tokenizer import BOS, EOS, PAD, SPECIALS

COMPOSITE = {"qwen3_5_text": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
             "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")}
WEIGHT_PREFIX = ("model.", "model.language_model.")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the byte-level pre-tokenizer and decoder use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def byte_tokenizer(vocab_size: int):
    """A ``tokenizers.Tokenizer`` whose ids are ``treewy.tokenizer``'s: byte b is id b, then the specials,
    then placeholders ``<|tN|>`` up to ``vocab_size`` (never produced by encoding; they decode to their text)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < PAD + 1:
        raise ValueError(f"vocab_size = {vocab_size}: the byte tokenizer needs at least {PAD + 1} ids")
    vocab = {c: b for b, c in _bytes_to_unicode().items()}
    vocab.update({name: i for i, name in SPECIALS.items()})
    vocab.update({f"<|t{i}|>": i for i in range(PAD + 1, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(SPECIALS[i], special=True, normalized=False) for i in (BOS, EOS, PAD)])
    return tok


def write_tokenizer(out: Path, vocab_size: int, max_len: int) -> None:
    byte_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[BOS], "eos_token": SPECIALS[EOS],
        "pad_token": SPECIALS[PAD], "model_max_length": max_len, "clean_up_tokenization_spaces": False}, indent=1))


def _vision_config(text: dict) -> dict:
    return {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": int(text["hidden_size"]), "num_position_embeddings": 64}


def composite_config(text: dict, architecture: str | None = None) -> dict:
    """The composite config vLLM 0.26 serves, around a Qwen3.5 text config."""
    mtype = text.get("model_type")
    if mtype not in COMPOSITE:
        raise ValueError(f"config model_type = {mtype!r}: expected a Qwen3.5 text model {sorted(COMPOSITE)}")
    top_type, arch = COMPOSITE[mtype]
    vocab = int(text["vocab_size"])
    text = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version")}
    text["dtype"] = text.get("dtype") or "bfloat16"
    text["mamba_ssm_dtype"] = text.get("mamba_ssm_dtype") or "float32"   # Qwen3.5 serves an fp32 GDN state
    unused = [vocab - 1 - i for i in range(4)]     # image/video ids: ids the text never uses
    return {"architectures": [architecture or arch], "model_type": top_type, "text_config": text,
            "vision_config": _vision_config(text), "image_token_id": unused[0], "video_token_id": unused[1],
            "vision_start_token_id": unused[2], "vision_end_token_id": unused[3],
            "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}


def _rename_weights(src: Path, out: Path) -> int:
    from safetensors.torch import load_file, save_file

    old, new = WEIGHT_PREFIX
    files = sorted(src.glob("*.safetensors"))
    renamed = {}
    for f in files:
        tensors = load_file(str(f))
        moved = {(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()}
        save_file(moved, str(out / f.name), metadata={"format": "pt"})
        renamed.update({k: f.name for k in moved})
    index = src / "model.safetensors.index.json"
    if index.is_file():
        meta = json.loads(index.read_text())
        meta["weight_map"] = renamed
        (out / index.name).write_text(json.dumps(meta, indent=1))
    return len(renamed)


def _check_out(out: Path, overwrite: bool, src: Path | None = None) -> None:
    """Refuse an output folder the export would damage, before anything is written: a file, the source itself,
    a folder inside it or around it, or (without ``overwrite``) a folder holding files."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT {out} is a file: the export writes a folder; pick a folder path")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"OUT {out}: {parent} is a file, so no folder can be made under it")
            break
    if src is not None:
        s, o = src.resolve(), out.resolve()
        where = ("is the source folder" if o == s else "is inside the source folder" if s in o.parents
                 else "holds the source folder" if o in s.parents else None)
        if where:
            raise ValueError(f"OUT {out} {where} {src}: write the export to a folder outside it")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty: pick another folder or pass overwrite=True (--force)")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}): pass a Hugging Face checkpoint folder") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a config object")
    return data


def _refuse_stale_weights(out: Path, written: set[str]) -> None:
    """vLLM loads every *.safetensors in the folder: weights left there from something else would be served too."""
    stale = sorted(p.name for p in out.glob("*.safetensors*") if p.name not in written) if out.is_dir() else []
    if stale:
        raise ValueError(f"{out} holds weights this export does not write ({', '.join(stale)}); vLLM would load them "
                         "too: remove them or pick another folder")


def export_vllm(src, out, *, overwrite: bool = False) -> Path:
    """Write ``src`` (a folder with config.json and safetensors weights) in vLLM's layout to ``out``. With
    ``overwrite``, files of the same names are replaced and every other file in ``out`` is kept."""
    src, out = Path(src), Path(out)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{src} has no config.json: pass a Hugging Face checkpoint folder")
    _check_out(out, overwrite, src)
    cfg = _read_json(cfg_path)
    if "text_config" in cfg:  # already the composite layout: copied file by file, nothing in out deleted
        _refuse_stale_weights(out, {p.name for p in src.iterdir()})
        out.mkdir(parents=True, exist_ok=True)
        for item in src.iterdir():
            if item.is_dir():
                shutil.copytree(item, out / item.name, dirs_exist_ok=True)
            else:
                shutil.copy2(item, out / item.name)
        return out
    composite = composite_config(cfg)
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{src} holds no *.safetensors weights")
    index = "model.safetensors.index.json"
    _refuse_stale_weights(out, {f.name for f in weights} | ({index} if (src / index).is_file() else set()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(composite, indent=1))
    _rename_weights(src, out)
    gen = {"bos_token_id": cfg.get("bos_token_id", BOS), "eos_token_id": cfg.get("eos_token_id", EOS),
           "pad_token_id": cfg.get("pad_token_id", PAD)}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    if (src / "tokenizer.json").is_file():
        for f in src.glob("tokenizer*"):
            shutil.copy2(f, out / f.name)
    else:
        write_tokenizer(out, int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 2048)))
    return out


def dummy_text_config(name: str) -> dict:
    """The text config of a ``treewy.memory`` preset (e.g. "qwen3.5-35b-a3b"): transformers' Qwen3.5 defaults
    with every architecture field the memory model encodes set from the preset."""
    from treewy.memory import ModelSpec

    spec = ModelSpec.from_name(name)
    if spec.num_experts:
        from transformers import Qwen3_5MoeTextConfig as Config
    else:
        from transformers import Qwen3_5TextConfig as Config
    n = spec.num_gdn_layers + spec.num_attn_layers
    every = n // spec.num_attn_layers
    text = Config().to_dict()
    text.update(
        hidden_size=spec.hidden_size, num_hidden_layers=n,
        layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)],
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
        linear_num_key_heads=spec.gdn_key_heads, linear_num_value_heads=spec.gdn_value_heads,
        linear_key_head_dim=spec.gdn_key_dim, linear_value_head_dim=spec.gdn_value_dim,
        linear_conv_kernel_dim=spec.conv_kernel, vocab_size=spec.vocab_size, mtp_num_hidden_layers=spec.mtp_layers,
        tie_word_embeddings=spec.tie_embeddings, attn_output_gate=spec.attn_output_gate)
    if spec.num_experts:
        text.update(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                    moe_intermediate_size=spec.moe_intermediate_size,
                    shared_expert_intermediate_size=spec.shared_expert_intermediate_size)
    else:
        text.update(intermediate_size=spec.intermediate_size)
    return text


def export_dummy(name: str, out, *, max_len: int = 8192, overwrite: bool = False) -> Path:
    """A folder for ``vllm serve --load-format dummy``: preset ``name``'s composite config and the byte tokenizer."""
    out = Path(out)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len = {max_len!r}: expected a positive number of tokens (the tokenizer's "
                         "model_max_length), e.g. 8192")
    _check_out(out, overwrite)
    text = dummy_text_config(name)  # an unknown preset fails here, before the folder is made
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(composite_config(text), indent=1))
    write_tokenizer(out, int(text["vocab_size"]), max_len)
    return out
