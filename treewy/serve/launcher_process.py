"""The ``vllm serve`` process: ``VLLMServer`` starts it in its own process group, streams its log, waits for
``/health`` and stops the whole group (SIGINT, then SIGTERM, then SIGKILL) on exit or Ctrl-C. On Linux the kernel
also sends the server SIGTERM when the process that started it dies, even by SIGKILL. The ``/proc`` readers here
(process_alive, group_members, descendants) are what a sweep uses to find a server an earlier run left behind."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from treewy.serve.launcher_command import ServeError


PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: The signal on which a server's processes write their Python stacks (``treewy.serve.plugin.register``).
STACKS_SIGNAL, STACKS_ENV = signal.SIGUSR2, "TREEWY_STACKS"


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

    def dump_stacks(self, settle: float = 3.0) -> list[int]:
        """Ask every process of the server's group for its Python stacks (``STACKS_SIGNAL``: the plugin has each
        process that loads it with ``TREEWY_STACKS=1`` in its environment write all threads' stacks to its log).
        Returns the pids signalled. For a stalled server just before it is stopped: a process of the group that did
        not load the plugin ends on the signal."""
        if not self.alive:
            return []
        pids = group_members(self.proc.pid)
        for pid in pids:
            try:
                os.kill(pid, STACKS_SIGNAL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(settle)    # the dumps reach the log through the reader thread
        return pids

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
