"""Helpers for the serving tests: a fake ``vllm`` on PATH, free ports, checkpoint directories."""

from __future__ import annotations

import json
import socket
import stat
import struct
import sys
from pathlib import Path

FAKE = Path(__file__).with_name("fake_vllm.py")


def fake_vllm_bin(tmp_path: Path) -> Path:
    """A folder holding an executable ``vllm`` that runs fake_vllm.py with this interpreter."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "vllm"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return d


def fake_nvidia_smi(bin_dir: Path, n: int) -> Path:
    """An ``nvidia-smi`` in ``bin_dir`` listing ``n`` H200s (index, uuid, name), as the launcher queries it."""
    exe = bin_dir / "nvidia-smi"
    rows = "\\n".join(f"{i}, GPU-fake-{i:04d}, NVIDIA H200" for i in range(n))
    exe.write_text(f"#!/bin/sh\nprintf '{rows}\\n'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _safetensors(path: Path, names: list[str]) -> None:
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * (4 * len(names)))


def checkpoint(tmp_path: Path, *, mtp_layers: int = 1, mtp_weights: bool = True, indexed: bool = True) -> Path:
    """A Qwen3.5-like checkpoint folder: config.json plus weights (an index, or one safetensors file)."""
    d = tmp_path / ("ckpt-mtp" if mtp_weights else "ckpt-nomtp") / ("indexed" if indexed else "single")
    d.mkdir(parents=True, exist_ok=True)
    text = {"model_type": "qwen3_5_moe_text", "linear_num_key_heads": 16, "linear_num_value_heads": 32}
    if mtp_layers:
        text["mtp_num_hidden_layers"] = mtp_layers
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    names = ["model.language_model.embed_tokens.weight", "model.language_model.layers.0.linear_attn.A_log"]
    if mtp_weights:
        names += ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"]
    if indexed:
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))
    else:
        _safetensors(d / "model.safetensors", names)
    return d
