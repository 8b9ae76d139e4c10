"""Build, start, watch and stop ``vllm serve`` with MTP speculation, in store_all or reconstruct mode.

``build_command`` is pure (the dry run prints it); ``VLLMServer`` owns the process: it refuses a
port in use, starts vLLM in its own process group, streams its log, waits for ``/health`` and
stops the whole group (SIGINT, then SIGTERM, then SIGKILL) on exit or Ctrl-C.
"""

from __future__ import annotations

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

from treewy.serve.presets import ServePreset
from treewy.serve.vllm_adapter import SERVE_REQUIREMENT, release_line, unsupported_message
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


def build_command(opts: ServeOptions) -> tuple[list[str], dict[str, str]]:
    """(argv, env): the exact ``vllm serve`` command and the environment variables it adds."""
    if opts.mode not in STATE_MODES:
        raise ServeError(f"mode = {opts.mode!r}: expected one of {', '.join(STATE_MODES)}")
    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        raise ServeError(f"host = {opts.host!r}: the launcher binds to 127.0.0.1 only; "
                         "put a reverse proxy in front if the server must be reachable")
    if opts.num_speculative_tokens < 1:
        raise ServeError(f"num_speculative_tokens = {opts.num_speculative_tokens}: MTP needs at least 1")
    if not 0 < opts.gmu <= 1:
        raise ServeError(f"gpu-memory-utilization = {opts.gmu}: expected a fraction in (0, 1]")
    if opts.mode == "reconstruct" and opts.prefix_caching:
        raise ServeError("reconstruct mode does not support prefix caching: the plugin keeps one state block "
                         "per request (mamba_cache_mode 'none'); drop --prefix-caching or use --mode store_all")
    spec = {"method": "mtp", "num_speculative_tokens": opts.num_speculative_tokens}
    argv = [opts.vllm, "serve", opts.model,
            "--speculative-config", json.dumps(spec),
            "--gpu-memory-utilization", str(opts.gmu),
            "--tensor-parallel-size", str(opts.tp),
            "--max-num-seqs", str(opts.max_num_seqs),
            "--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching",
            "--host", opts.host, "--port", str(opts.port)]
    if opts.max_model_len:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
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
        raise ServeError(f"vLLM is not installed: no '{exe}' executable on PATH. On a CUDA machine run "
                         f"`pip install 'treewy[serve]'` ({SERVE_REQUIREMENT}); CPU-only machines cannot "
                         "run it (use --dry-run to see the command)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"'{exe} --version' failed ({e})") from None
    version = (out.stdout.strip().splitlines() or ["(unknown)"])[-1].strip()
    if out.returncode != 0 or release_line(version) is None:
        raise ServeError(unsupported_message(version))
    return path


def check_gpu() -> str:
    """The first GPU's name, or a ServeError saying there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise ServeError("no GPU: nvidia-smi is not on PATH. vLLM serving needs an NVIDIA GPU; "
                         "use --dry-run to print the command on this machine")
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"no GPU: nvidia-smi failed ({e})") from None
    names = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode != 0 or not names:
        raise ServeError(f"no GPU: nvidia-smi found none ({(out.stderr or out.stdout).strip()[:200]})")
    return names[0]


def _safetensors_keys(path: Path) -> list[str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return [k for k in header if k != "__metadata__"]


def check_mtp_weights(model: str) -> None:
    """A local checkpoint must declare MTP layers in its config and ship ``mtp.*`` weights.

    Hub ids are not checked here (vLLM resolves them). Raises ServeError with what is missing.
    """
    d = Path(model)
    if not d.is_dir():
        return
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ServeError(f"{d} has no config.json: not a Hugging Face checkpoint directory")
    cfg = json.loads(cfg_path.read_text())
    text = cfg.get("text_config", cfg)
    n_mtp = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)) or 0
    if n_mtp < 1:
        raise ServeError(f"{d}/config.json declares no MTP layers (mtp_num_hidden_layers / "
                         "num_nextn_predict_layers missing or 0); MTP speculation needs a checkpoint "
                         "that ships its MTP head")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        keys = list(json.loads(index.read_text()).get("weight_map", {}))
    else:
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise ServeError(f"{d} has no safetensors weights (model.safetensors.index.json or *.safetensors)")
        keys = [k for f in files for k in _safetensors_keys(f)]
    if not any(k.startswith("mtp.") or ".mtp." in k for k in keys):
        raise ServeError(f"{d} has no MTP weights: none of its {len(keys)} tensors is named 'mtp.*' "
                         "(quantized or stripped exports often drop them); use the full checkpoint")


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
                                     stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1)
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
