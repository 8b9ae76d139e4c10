"""Qwen3.5 / Qwen3-Next hybrids from Hugging Face checkpoints, ready for tree verification.

``load(path_or_preset)`` reads a checkpoint directory (config.json + safetensors, sharded or not)
into the transformers model class of its ``model_type``, attaches the ``mtp.*`` weights (which
transformers drops) as ``model.mtp``, and returns the module in eval mode. ``load("tiny")`` loads
the checkpoint committed under ``treewy/models/tiny``. transformers is imported only here, inside
functions (the extras ``treewy.env.TINY_MODEL_EXTRAS``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_DIR = Path(__file__).parent / "tiny"

#: model_type -> (transformers module, config class, causal-LM class, is a vision-language wrapper)
MODEL_TYPES = {
    "qwen3_5_text": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", False),
    "qwen3_5": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", True),
    "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", False),
    "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", True),
    "qwen3_next": ("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", False),
}


def _transformers():
    try:
        import transformers
    except ImportError as e:
        from treewy.env import TINY_MODEL_EXTRAS, MissingExtra, install_command
        raise MissingExtra(f"treewy.models needs transformers and safetensors: "
                           f"{install_command(TINY_MODEL_EXTRAS)}") from e
    return transformers


def _classes(model_type: str, where: str = ""):
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type {model_type!r}{where}: treewy runs Qwen3.5 / Qwen3-Next hybrids "
                         f"({', '.join(MODEL_TYPES)}); point load() at such a checkpoint or use load('tiny')")
    _transformers()
    import importlib
    mod_name, cfg_name, cls_name, wrapper = MODEL_TYPES[model_type]
    cfg_mod = importlib.import_module(f"transformers.models.{mod_name}.configuration_{mod_name}")
    mdl_mod = importlib.import_module(f"transformers.models.{mod_name}.modeling_{mod_name}")
    return getattr(cfg_mod, cfg_name), getattr(mdl_mod, cls_name), wrapper


def tiny_config(**overrides):
    """The Qwen3.5-style text config of the tiny checkpoint (byte vocabulary; GDN : attention = 3 : 1)."""
    from treewy.tokenizer import BOS, EOS, PAD, VOCAB_SIZE
    cfg_cls, _, _ = _classes("qwen3_5_text")
    kw = dict(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=640, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, mtp_num_hidden_layers=1,
    )
    kw.update(overrides)
    return cfg_cls(**kw)


def _attach_mtp(model, num_layers: int):
    from treewy.models.mtp import MTP
    base = model.model
    model.mtp = MTP(model.config, type(base.layers[0]), type(base.norm), num_layers)
    return model.mtp


def build(config, mtp: bool = True, seed: int | None = 0):
    """A randomly initialised model (with an MTP module) for a text config: for tests and training."""
    model_type = getattr(config, "model_type", None)
    _, model_cls, _ = _classes(model_type)
    if seed is not None:
        torch.manual_seed(seed)
    model = model_cls(config)
    if mtp:
        _attach_mtp(model, int(getattr(config, "mtp_num_hidden_layers", 1) or 1))
        model.mtp.apply(model._init_weights)
    return model.eval()


def save(model, path, dtype=torch.bfloat16) -> Path:
    """Write config.json + model.safetensors (HF layout: model.*, lm_head.weight, mtp.*)."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(model.config.to_json_string())
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _read_json(path: Path) -> dict:
    """A JSON object from a checkpoint file; ValueError naming the file otherwise."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path}: not a JSON object ({e}); the checkpoint is damaged or incomplete") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, not an object; the checkpoint is damaged")
    return data


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map object; the checkpoint is damaged")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights; a checkpoint directory holds config.json "
                         "and model.safetensors (or shards listed in model.safetensors.index.json)")
    out = {}
    for f in files:
        try:  # safetensors checks the header length against the file size itself
            with safe_open(str(path / f), framework="pt") as fh:
                for k in fh.keys():
                    out[k] = fh.get_tensor(k)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path / f}: not a readable safetensors file ({e}); the checkpoint is damaged or "
                             "incomplete") from None
    return out


def _resolve(path_or_preset) -> Path:
    if isinstance(path_or_preset, str) and path_or_preset == "tiny":
        if not (TINY_DIR / "config.json").exists():
            raise ValueError(f"the tiny checkpoint is missing from {TINY_DIR}; train it with "
                             "python -m treewy.models.train_tiny")
        return TINY_DIR
    path = Path(path_or_preset)
    if not (path / "config.json").exists():
        raise ValueError(f"{path_or_preset!r} is neither a preset ('tiny') nor a checkpoint directory with "
                         "config.json; pass a Hugging Face checkpoint directory")
    return path


def load(path_or_preset="tiny", dtype=torch.float32, device="cpu"):
    """The transformers causal LM of a Qwen3.5 / Qwen3-Next checkpoint, with ``model.mtp`` when the
    checkpoint has ``mtp.*`` weights (else ``model.mtp`` is None), in eval mode."""
    path = _resolve(path_or_preset)
    raw = _read_json(path / "config.json")
    model_type = raw.get("model_type")
    cfg_cls, model_cls, wrapper = _classes(model_type, f" in {path / 'config.json'}")
    text = dict(raw.get("text_config") or {}) if wrapper else dict(raw)
    if wrapper and not text:
        raise ValueError(f"{path / 'config.json'} has model_type {model_type!r} but no text_config")
    for key in ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "auto_map"):
        text.pop(key, None)
    config = cfg_cls(**text)
    if not any(t == "linear_attention" for t in config.layer_types):
        raise ValueError(f"{path} has no linear_attention (GDN) layers; treewy needs a hybrid model")
    weights = _read_weights(path)
    main, mtp_sd = {}, {}
    for k, v in weights.items():
        if k.startswith("mtp."):
            mtp_sd[k[4:]] = v
        elif wrapper and (k.startswith("model.visual.") or k.startswith("visual.")):
            continue
        elif wrapper and k.startswith("model.language_model."):
            main["model." + k[len("model.language_model."):]] = v
        else:
            main[k] = v
    with torch.device("meta"):
        model = model_cls(config)
        if mtp_sd:
            n = 1 + max(int(k.split(".")[1]) for k in mtp_sd if k.startswith("layers."))
            _attach_mtp(model, n)
    if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in main:
        main["lm_head.weight"] = main["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(main, strict=False, assign=True)
    missing = [m for m in missing if not m.startswith("mtp.")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match {model_cls.__name__}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if mtp_sd:
        missing, unexpected = model.mtp.load_state_dict(mtp_sd, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(f"{path}: mtp.* weights do not match the MTP module: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    else:
        model.mtp = None
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were on meta
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_meta:
            raise ValueError(f"{path}: {name} was not in the checkpoint")
    model.treewy_path = str(path)
    model = model.to(device=device, dtype=dtype).eval()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config).to(device)  # fp32 frequencies
    return model


__all__ = ["MODEL_TYPES", "TINY_DIR", "build", "load", "save", "tiny_config"]
