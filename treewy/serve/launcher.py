"""Build, start, watch and stop ``vllm serve`` with MTP speculation, in store_all or reconstruct mode.

``build_command`` is pure (the dry run prints it); ``VLLMServer`` owns the process: it refuses a
port in use, starts vLLM in its own process group, streams its log, waits for ``/health`` and
stops the whole group (SIGINT, then SIGTERM, then SIGKILL) on exit or Ctrl-C. On Linux the kernel
also sends the server SIGTERM when the process that started it dies, even by SIGKILL.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from treewy.serve.acceptance import Acceptance, parse_acceptance
from treewy.serve.presets import ServePreset
from treewy.serve.vllm_adapter import SERVE_REQUIREMENT, SUPPORTED, release_line, unsupported_message
from treewy.tree import STATE_MODES

#: The plugin's entry-point name (pyproject: [project.entry-points."vllm.general_plugins"] treewy).
PLUGIN_NAME = "treewy"


class ServeError(RuntimeError):
    """A failure with a message meant for the person running the command."""


@dataclass
class ServeOptions:
    model: str
    mode: str = "store_all"
    tp: int = 1
    gmu: float = 0.9
    num_speculative_tokens: int = 3
    max_num_seqs: int = 256
    prefix_caching: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int | None = None
    served_model_name: str | None = None
    vllm: str = "vllm"
    extra_args: list[str] = field(default_factory=list)
    acceptance: str | None = None        # treewy.serve.acceptance form; None: paper-35b on dummy weights, else none
    cudagraph_max_size: int | None = None  # largest step captured as a CUDA graph; None: max_num_seqs x (1 + k)

    @classmethod
    def from_preset(cls, preset: ServePreset, **overrides) -> ServeOptions:
        base = dict(model=preset.model, tp=preset.tp, gmu=preset.gmu,
                    num_speculative_tokens=preset.num_speculative_tokens,
                    max_num_seqs=preset.max_num_seqs, max_model_len=preset.max_model_len)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _positive_int(flag: str, value, fix: str, top: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top is not None and value > top):
        want = f"an integer in 1..{top}" if top else "a positive integer"
        raise ServeError(f"{flag} {value}: expected {want}; {fix}")


def _binding_flag(arg: str) -> str | None:
    """"--host" or "--port" when ``arg`` sets one in a spelling vLLM's parser accepts: ``--host X``, ``--host=X``,
    underscores for dashes, or an abbreviation argparse expands (``--hos``)."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0].replace("_", "-")
    return next((f"--{flag}" for flag in ("host", "port") if len(name) >= 2 and flag.startswith(name)), None)


def _flag_name(arg: str) -> str:
    """An argument's flag as vLLM reads it: underscores in a ``--`` name are dashes (up to a first dot)."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name.partition(".")
    return head.replace("_", "-") + dot + tail


def extra_value(args: list[str], flag: str) -> str | None:
    """The value the last ``flag X`` or ``flag=X`` among vLLM's extra arguments gives (None when absent)."""
    value = None
    for i, a in enumerate(args):
        if _flag_name(a) != flag:
            continue
        if "=" in a:
            value = a.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def dummy_weights(opts: ServeOptions) -> bool:
    """Whether the server loads random weights (``--load-format dummy``), which accept no draft."""
    return extra_value(opts.extra_args, "--load-format") == "dummy"


def acceptance_of(opts: ServeOptions) -> Acceptance:
    """The acceptance the server is asked for (treewy.serve.acceptance), checked against its chain length."""
    try:
        return parse_acceptance(opts.acceptance, opts.num_speculative_tokens, dummy=dummy_weights(opts))
    except ValueError as e:
        raise ServeError(str(e)) from None


#: vLLM 0.26's own capture-size names: flags of ``vllm serve`` and keys of its --compilation-config, mutually exclusive
#: there (vllm/engine/arg_utils.py); a user who sets one keeps theirs.
CAPTURE_KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
COMPILATION_FLAGS = ("--compilation-config", "-cc")


def capture_grid(max_size: int) -> list[int]:
    """vLLM 0.26's capture sizes up to ``max_size`` (vllm/config/vllm.py, ``_set_cudagraph_sizes``): 1, 2, 4, then
    every 8 below 256 and every 16 from 256; here ``max_size`` itself is always included, so the largest step is
    captured even off that grid (vLLM's own list would stop at the grid point below it)."""
    sizes = [s for s in (1, 2, 4) if s <= max_size] + list(range(8, min(max_size + 1, 256), 8))
    sizes += list(range(256, max_size + 1, 16))
    return sorted(set(sizes) | {max_size})


@dataclass(frozen=True)
class CapturePlan:
    """The CUDA graphs a server captures. ``needed``: the largest decode step the server can admit (max_num_seqs
    requests of 1 + k tokens); ``max_size``: the largest step captured (0: none, eager); ``flags``: what the launcher
    adds to vLLM's command line; ``compilation_config``: the --compilation-config JSON among the extra arguments."""

    needed: int
    max_size: int
    flags: tuple[str, ...]
    compilation_config: str | None
    why: str

    @property
    def eager_fallback_possible(self) -> bool:
        return self.max_size < self.needed


def _compilation_config(args: list[str]) -> tuple[str | None, dict]:
    for a in args:
        if _flag_name(a).startswith(("--compilation-config.", "-cc.")):
            raise ServeError(f"extra vLLM argument {a!r}: pass the compilation config as one JSON object "
                             "(--compilation-config '{...}'), so that the launcher can see its CUDA graph settings")
    text = next((v for v in (extra_value(args, f) for f in COMPILATION_FLAGS) if v is not None), None)
    if text is None:
        return None, {}
    try:
        cfg = json.loads(text)
    except ValueError:
        cfg = None
    if not isinstance(cfg, dict):
        raise ServeError(f"--compilation-config {text!r}: expected a JSON object, e.g. '{{\"cudagraph_mode\": "
                         "\"FULL_DECODE_ONLY\"}'")
    return text, cfg


def capture_plan(opts: ServeOptions) -> CapturePlan:
    """CUDA graphs covering every decode step the server admits: vLLM 0.26 captures steps of up to
    min(2 x max_num_seqs x (1 + k), 512) tokens by default and runs larger ones eagerly (at 256 requests of 4 tokens,
    half of what the server may admit), so the launcher asks for the larger of max_num_seqs x (1 + k) and that
    default. vLLM drops sizes above --max-num-batched-tokens (8,192 by default on GPUs of 70 GiB or more): an
    explicit smaller value caps the plan, and says so. Capture sizes set among the extra arguments win."""
    k, args = opts.num_speculative_tokens, opts.extra_args
    needed = opts.max_num_seqs * (1 + k)
    cc_text, cc = _compilation_config(args)
    names = [_flag_name(a) for a in args]
    eager = next((f == "--enforce-eager" for f in reversed(names) if f in ("--enforce-eager", "--no-enforce-eager")),
                 False)
    if eager or str(cc.get("cudagraph_mode", "")).upper() == "NONE":
        return CapturePlan(needed, 0, (), cc_text, "CUDA graphs off (--enforce-eager or cudagraph_mode NONE)")
    user = {key: cc[key] if key in cc else _flag_values(args, "--" + key.replace("_", "-")) for key in CAPTURE_KEYS}
    if any(v is not None for v in user.values()):
        if opts.cudagraph_max_size is not None:
            raise ServeError(f"--cudagraph-max-size {opts.cudagraph_max_size} and the extra vLLM arguments both set "
                             "the CUDA graph capture sizes; keep one of them")
        sizes = [x for v in user.values() if v is not None for x in (v if isinstance(v, list) else [v])]
        try:
            top = max(int(x) for x in sizes)
        except (TypeError, ValueError):
            raise ServeError(f"CUDA graph capture sizes {sizes!r} in the extra vLLM arguments: expected integers "
                             "(tokens per step)") from None
        return CapturePlan(needed, top, (), cc_text, f"set in the extra vLLM arguments ({top} tokens)")
    vllm_default = min(2 * needed, 512)  # vllm/config/vllm.py, _set_cudagraph_sizes: kept when it is larger
    target, why = max(needed, vllm_default), f"max_num_seqs x (1 + k) = {opts.max_num_seqs} x {1 + k}"
    if vllm_default > needed:
        why = f"vLLM's default {vllm_default}, above max_num_seqs x (1 + k) = {needed}"
    if opts.cudagraph_max_size is not None:
        target, why = opts.cudagraph_max_size, f"--cudagraph-max-size {opts.cudagraph_max_size}"
    budget = extra_value(args, "--max-num-batched-tokens")
    if budget is not None and budget.isdigit() and int(budget) < target:
        target, why = int(budget), f"{why}, capped by --max-num-batched-tokens {budget}"
    if target % (1 + k) and target > 1 + k:  # vLLM rounds decode graph sizes up to multiples of 1 + k, dropping any
        target -= target % (1 + k)          # above the largest size: a decode step past the last multiple runs eagerly
        why += f", rounded down to a multiple of 1 + k = {1 + k}"
    on_grid = target in (1, 2, 4) or target % (8 if target < 256 else 16) == 0
    flags = (("--max-cudagraph-capture-size", str(target)) if on_grid
             else ("--cudagraph-capture-sizes", *map(str, capture_grid(target))))
    return CapturePlan(needed, target, flags, cc_text, why)


def _flag_values(args: list[str], flag: str):
    """The value of a vLLM flag among the extra arguments (the last one given): the text after ``flag=``, or every
    argument after ``flag`` up to the next option (``--cudagraph-capture-sizes 1 2 4`` gives a list); None when
    absent."""
    for i in range(len(args) - 1, -1, -1):
        if _flag_name(args[i]) != flag:
            continue
        if "=" in args[i]:
            return args[i].split("=", 1)[1]
        vals = []
        for b in args[i + 1:]:
            if b.startswith("-"):
                break
            vals.append(b)
        return vals
    return None


def build_command(opts: ServeOptions) -> tuple[list[str], dict[str, str]]:
    """(argv, env): the exact ``vllm serve`` command and the environment variables it adds."""
    if opts.mode not in STATE_MODES:
        raise ServeError(f"mode = {opts.mode!r}: expected one of {', '.join(STATE_MODES)}")
    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        raise ServeError(f"host = {opts.host!r}: the launcher binds to 127.0.0.1 only; "
                         "put a reverse proxy in front if the server must be reachable")
    _positive_int("--tp", opts.tp, "the tensor-parallel size is a number of GPUs, e.g. 1, 2, 4 or 8")
    _positive_int("--port", opts.port, "pick a free TCP port, e.g. 8000", top=65535)
    _positive_int("--max-num-seqs", opts.max_num_seqs, "the most requests vLLM runs at once, e.g. 256")
    if opts.max_model_len is not None:
        _positive_int("--max-model-len", opts.max_model_len, "a context length in tokens, or leave it out for the "
                      "model's own")
    for arg in opts.extra_args:  # vLLM keeps the last --host / --port: an extra one would override the launcher's
        if flag := _binding_flag(arg):
            raise ServeError(f"extra vLLM argument {arg!r} sets the server's {flag}: the launcher binds to "
                             f"127.0.0.1 only and passes {flag} itself; use treewy's own --port to pick the port "
                             "(and a reverse proxy in front if the server must be reachable from elsewhere)")
    if opts.num_speculative_tokens < 1:
        raise ServeError(f"num_speculative_tokens = {opts.num_speculative_tokens}: MTP needs at least 1")
    if not 0 < opts.gmu <= 1:
        raise ServeError(f"gpu-memory-utilization = {opts.gmu}: expected a fraction in (0, 1]")
    if opts.mode == "reconstruct" and opts.prefix_caching:
        raise ServeError("reconstruct mode does not support prefix caching: the plugin keeps one state block "
                         "per request (mamba_cache_mode 'none'); drop --prefix-caching or use --mode store_all")
    if opts.cudagraph_max_size is not None:
        _positive_int("--cudagraph-max-size", opts.cudagraph_max_size, "the largest step, in tokens, to capture as a "
                      "CUDA graph; leave it out for max_num_seqs x (1 + k)")
    acceptance = acceptance_of(opts)
    plan = capture_plan(opts)
    spec = {"method": "mtp", "num_speculative_tokens": opts.num_speculative_tokens,
            **acceptance.speculative_config()}
    argv = [opts.vllm, "serve", opts.model,
            "--speculative-config", json.dumps(spec),
            "--gpu-memory-utilization", str(opts.gmu),
            "--tensor-parallel-size", str(opts.tp),
            "--max-num-seqs", str(opts.max_num_seqs),
            "--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching",
            "--host", opts.host, "--port", str(opts.port)]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    argv += list(plan.flags)
    env = {"TREEWY_MODE": opts.mode}
    if opts.mode == "reconstruct":
        env["VLLM_PLUGINS"] = PLUGIN_NAME
    argv += list(opts.extra_args)
    return argv, env


def format_command(argv: list[str], env: dict[str, str]) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)


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


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal():
    """A ``preexec_fn`` asking the kernel to send the child SIGTERM when its parent dies, however it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``); None where libc has no prctl. The kernel's "parent" is the thread that forked:
    start servers from the main thread, as the CLI does."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):
        return None
    parent, sig = os.getpid(), ctypes.c_ulong(signal.SIGTERM)  # prctl's second argument is an unsigned long

    def preexec() -> None:  # runs in the forked child before exec: kept to two system calls
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None: no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def has_proc() -> bool:
    return Path("/proc/self/stat").is_file()


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None: no such process."""
    f = _proc_stat(pid)
    return int(f[19]) if f else None


def process_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not), and, given ``start_time``, is the process that started then."""
    if not has_proc():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive all the same
            pass
        return True
    f = _proc_stat(pid)
    return f is not None and f[0] not in "ZX" and (start_time is None or int(f[19]) == start_time)


def _live_processes():
    """(pid, stat fields) of every running process, from /proc."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (f := _proc_stat(int(d.name))) is not None and f[0] not in "ZX":
            yield int(d.name), f


def group_members(pgid: int) -> list[int]:
    """The running processes of process group ``pgid`` (a server started by VLLMServer leads its own group)."""
    return [pid for pid, f in _live_processes() if int(f[2]) == pgid]


def descendants(pid: int) -> list[int]:
    """The running children of ``pid``, their children and so on, found through /proc's parent links."""
    children: dict[int, list[int]] = {}
    for child, f in _live_processes():
        children.setdefault(int(f[1]), []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class VLLMServer:
    """``with VLLMServer(argv, env, base_url) as srv: srv.wait_healthy()`` — the process group is
    stopped on exit, including on KeyboardInterrupt."""

    def __init__(self, argv: list[str], env: dict[str, str], base_url: str, *, log_path: str | None = None,
                 echo: bool = True, log_prefix: str = "[vllm] "):
        self.argv, self.env, self.base_url = argv, env, base_url
        self.log_path, self.echo, self.log_prefix = log_path, echo, log_prefix
        self.proc: subprocess.Popen | None = None
        self.tail: deque[str] = deque(maxlen=40)
        self._reader: threading.Thread | None = None

    def start(self) -> VLLMServer:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1,
                                     preexec_fn=_parent_death_signal())
        self._reader = threading.Thread(target=self._stream, daemon=True)
        self._reader.start()
        return self

    def _stream(self) -> None:
        log = open(self.log_path, "a") if self.log_path else None
        try:
            for line in self.proc.stdout:
                self.tail.append(line.rstrip("\n"))
                if log:
                    log.write(line)
                    log.flush()
                if self.echo:
                    sys.stdout.write(self.log_prefix + line)
                    sys.stdout.flush()
        finally:
            if log:
                log.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = 1800.0, poll: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                code = self.proc.poll() if self.proc else None
                raise ServeError(f"vLLM exited with code {code} before becoming healthy; last log lines:\n"
                                 + self.last_log())
            if self.healthy():
                return
            time.sleep(poll)
        raise ServeError(f"vLLM did not answer {self.base_url}/health within {timeout:.0f} s; last log lines:\n"
                         + self.last_log())

    def last_log(self, n: int = 15) -> str:
        return "\n".join(list(self.tail)[-n:]) or "(no output)"

    def stop(self, grace: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:  # the leader is gone; children it left in the group must not outlive it
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._reader is not None:
            self._reader.join(timeout=5)
        return self.proc.returncode

    def __enter__(self) -> VLLMServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
