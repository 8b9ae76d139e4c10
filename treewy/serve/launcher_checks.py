"""Checks before ``vllm serve`` starts: the port, vLLM on PATH, the GPUs this process sees, the checkpoint's MTP
weights and whether ``--tp`` splits its heads. Each raises ``ServeError`` with what is wrong and how to fix it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
from pathlib import Path

from treewy.serve.launcher_command import ServeError
from treewy.serve.vllm_adapter import SERVE_REQUIREMENT, SUPPORTED, release_line, unsupported_message


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is not "in use"
        try:
            s.bind((host, port))
        except OSError:
            raise ServeError(f"port {port} on {host} is already in use (another vLLM server?); "
                             f"stop it or pick another port with --port") from None


def check_vllm_installed(exe: str = "vllm") -> str:
    """The path of the ``vllm`` executable; ServeError if there is none or its version is unsupported."""
    path = shutil.which(exe)
    if path is None:
        lines = ", ".join(f"{k}.x ({v})" for k, v in SUPPORTED.items())
        raise ServeError(f"vLLM is not installed: no '{exe}' executable on PATH; supported: {lines}. On a CUDA "
                         f"machine run `pip install 'treewy[serve]'` ({SERVE_REQUIREMENT}); CPU-only machines cannot "
                         "run it (use --dry-run to see the command)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"'{exe} --version' failed ({e})") from None
    version = (out.stdout.strip().splitlines() or ["(unknown)"])[-1].strip()
    if out.returncode != 0 or release_line(version) is None:
        raise ServeError(unsupported_message(version))
    return path


def visible_gpus(gpus: list[tuple[str, str, str]], cuda_visible: str | None) -> list[str]:
    """Names of the GPUs a CUDA process sees: ``gpus`` as nvidia-smi lists them (index, uuid, name), filtered by
    CUDA_VISIBLE_DEVICES as CUDA reads it (indices or GPU- / MIG- uuid prefixes, up to the first entry that names
    no device; empty: none)."""
    if cuda_visible is None:
        return [name for _, _, name in gpus]
    seen: list[str] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.isdigit():
            hit = [g for g in gpus if g[0] == str(int(entry))]
        elif entry.startswith(("GPU-", "MIG-")):
            hit = [g for g in gpus if g[1].startswith(entry)] or ([("", entry, entry)] if entry.startswith("MIG-")
                                                                  else [])
        else:
            hit = []
        if len(hit) != 1:
            break
        if hit[0][1] not in seen:
            seen.append(hit[0][1])
    return [next((n for _, u, n in gpus if u == uuid), uuid) for uuid in seen]


def check_gpu(tp: int = 1) -> str:
    """The first visible GPU's name; a ServeError when there is none, or fewer than ``tp`` (vLLM's
    --tensor-parallel-size) are visible to this process (CUDA_VISIBLE_DEVICES honoured)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise ServeError("no GPU: nvidia-smi is not on PATH. vLLM serving needs an NVIDIA GPU; "
                         "use --dry-run to print the command on this machine")
    try:
        out = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"no GPU: nvidia-smi failed ({e})") from None
    rows = [tuple(c.strip() for c in ln.split(",", 2)) for ln in out.stdout.splitlines() if ln.strip()]
    gpus = [r for r in rows if len(r) == 3]
    if out.returncode != 0 or not gpus:
        raise ServeError(f"no GPU: nvidia-smi found none ({(out.stderr or out.stdout).strip()[:200]})")
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible_gpus(gpus, cuda_visible)
    if len(names) < tp:
        where = (f"CUDA_VISIBLE_DEVICES={cuda_visible!r} shows {len(names)} of the {len(gpus)} on this machine"
                 if cuda_visible is not None else f"this machine has {len(gpus)}")
        need = f"--tp {tp} needs {tp} GPU{'s' if tp > 1 else ''}"
        raise ServeError(f"{need}, {len(names)} visible ({where}): lower --tp to {len(names)} or less, or make more "
                         "GPUs visible" if names else
                         f"{need}, none visible ({where}): unset CUDA_VISIBLE_DEVICES or list the GPUs to use in it")
    return names[0]


def _read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:  # not JSON, or not UTF-8
        raise ServeError(f"{path} is not a JSON object ({e}); the checkpoint is damaged or incomplete: "
                         "download or export it again") from None
    if not isinstance(data, dict):
        raise ServeError(f"{path} holds a JSON {type(data).__name__}, not a JSON object; the checkpoint is damaged "
                         "or incomplete: download or export it again")
    return data


def _safetensors_keys(path: Path) -> list[str]:
    """The tensor names of a safetensors file, from its header: an 8-byte little-endian length, then that many
    bytes of JSON. The length is checked against the file size before anything is read."""
    size = path.stat().st_size
    fix = "the file is truncated or damaged: download or export the checkpoint again"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ServeError(f"{path} is not a safetensors file: {size} byte(s), fewer than the 8 of its header "
                             f"length; {fix}")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ServeError(f"{path} is not a safetensors file: its header length says {n} bytes, the file holds "
                             f"{size - 8} after it; {fix}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise ServeError(f"{path} is not a safetensors file: its header is not JSON ({e}); {fix}") from None
    if not isinstance(header, dict):
        raise ServeError(f"{path} is not a safetensors file: its header is a JSON {type(header).__name__}, "
                         f"not an object; {fix}")
    return [k for k in header if k != "__metadata__"]


def _heads_from_config(text: dict) -> dict[str, int]:
    names = {"GDN key": "linear_num_key_heads", "GDN value": "linear_num_value_heads",
             "attention": "num_attention_heads", "KV": "num_key_value_heads"}
    return {kind: text[key] for kind, key in names.items()
            if isinstance(text.get(key), int) and not isinstance(text[key], bool) and text[key] > 0}


def check_tensor_parallel(tp, model: str, preset: str | None = None) -> None:
    """vLLM shards the heads evenly over the tp ranks: refuse a ``--tp`` that does not split them, where the heads
    are known here (a preset, or a local checkpoint's config.json; a Hugging Face id is left to vLLM)."""
    from treewy.memory import ModelSpec, check_tp

    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return  # build_command names a tp below 1
    if preset is not None:
        try:
            spec = ModelSpec.from_name(preset)
        except ValueError:  # a serving preset the memory model does not describe: vLLM checks it
            return
        heads, name = spec.heads, spec.name
    else:
        cfg_path = Path(model) / "config.json"
        if not cfg_path.is_file():
            return
        cfg = _read_json_object(cfg_path)
        text = cfg.get("text_config", cfg)
        heads, name = (_heads_from_config(text) if isinstance(text, dict) else {}), str(cfg_path)
    if heads:
        try:
            check_tp(tp, heads, model=name, arg="--tp")
        except ValueError as e:
            raise ServeError(str(e)) from None


def check_mtp_weights(model: str, weights: bool = True) -> None:
    """A local checkpoint must declare MTP layers in its config and, unless ``weights`` is False (vLLM's
    ``--load-format dummy`` reads none), ship ``mtp.*`` weights.

    Hub ids are not checked here (vLLM resolves them). Raises ServeError with what is missing.
    """
    d = Path(model)
    if not d.is_dir():
        return
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ServeError(f"{d} has no config.json: not a Hugging Face checkpoint directory")
    cfg = _read_json_object(cfg_path)
    text = cfg.get("text_config", cfg)
    if not isinstance(text, dict):
        raise ServeError(f"{cfg_path}: text_config is a JSON {type(text).__name__}, not an object; the checkpoint "
                         "is damaged: download or export it again")
    n_mtp = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)) or 0
    if not isinstance(n_mtp, int) or n_mtp < 1:
        raise ServeError(f"{d}/config.json declares no MTP layers (mtp_num_hidden_layers / "
                         "num_nextn_predict_layers missing or 0); MTP speculation needs a checkpoint "
                         "that ships its MTP head")
    if not weights:
        return
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ServeError(f"{index} has no weight_map object; the checkpoint is damaged: download or export it "
                             "again")
        keys = list(weight_map)
    else:
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise ServeError(f"{d} has no safetensors weights (model.safetensors.index.json or *.safetensors)")
        keys = [k for f in files for k in _safetensors_keys(f)]
    if not any(k.startswith("mtp.") or ".mtp." in k for k in keys):
        raise ServeError(f"{d} has no MTP weights: none of its {len(keys)} tensors is named 'mtp.*' "
                         "(quantized or stripped exports often drop them); use the full checkpoint")
