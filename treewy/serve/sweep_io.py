"""What a serving sweep keeps on disk between runs: the JSONL checkpoint of finished points (one record per point,
the last of a key wins) and the record of a running server (OUT.server.pid), which the next run uses to stop a
server that a killed run left behind."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from treewy.serve.launcher_command import ServeError
from treewy.serve.launcher_process import group_members, has_proc, process_alive, process_start_time


def load_checkpoint(path: Path) -> dict[str, dict]:
    """{key: record} of the points already finished (the last record of a key wins)."""
    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
            done[rec["key"]] = rec
    return done


def append_record(path: Path, rec: dict) -> None:
    """Append one record to the JSONL checkpoint at ``path`` (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as f:
        # a line cut short by an interruption gets its newline first, so this record starts a line of its own
        if f.seek(0, os.SEEK_END):
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(json.dumps(rec).encode() + b"\n")


def write_server_pid(path: Path, pid: int, port: int) -> None:
    """Record a started server (pid, start time, port) beside the table, for the next run if this one is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(json.dumps({"pid": pid, "start_time": process_start_time(pid), "port": port}) + "\n")
    os.replace(tmp, path)


def stop_leftover_server(path: Path, log: Callable[[str], None]) -> None:
    """Stop the server an earlier run recorded in ``path`` and never stopped: that run was killed where the kernel's
    parent-death signal is missing, or the server's engine processes outlived it. The server leads its own process
    group, and the whole group is stopped; a record of a process that is gone, or of another process that got the
    same pid since (another start time), is removed."""
    if not path.is_file():
        return
    try:
        rec = json.loads(path.read_text())
        pid, start, port = int(rec["pid"]), rec.get("start_time"), rec.get("port")
    except (ValueError, KeyError, TypeError):
        raise ServeError(f"{path} is not a server record bench-serve wrote; if no vLLM server of this sweep is "
                         "still running, delete it and rerun") from None
    if not has_proc():
        if process_alive(pid):
            raise ServeError(f"a vLLM server an earlier run of this sweep started may still be running (pid {pid}, "
                             f"port {port}, recorded in {path}): stop it with `kill -TERM -{pid}`, delete {path}, "
                             "then rerun")
        path.unlink()
        return
    reused = start is not None and process_alive(pid) and not process_alive(pid, start)
    if not reused and group_members(pid):
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                raise ServeError(f"the vLLM server an earlier run of this sweep left running (pid {pid}, port {port}) "
                                 f"cannot be stopped from here (permission denied): stop it, delete {path}, then "
                                 "rerun") from None
            deadline = time.monotonic() + wait
            while group_members(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not group_members(pid):
                break
        if left := group_members(pid):
            raise ServeError(f"the vLLM server an earlier run of this sweep left running (pid {pid}, port {port}) "
                             f"did not stop on SIGKILL (processes {left}); stop them, delete {path}, then rerun")
        log(f"stopped the vLLM server (pid {pid}, port {port}) that an earlier run of this sweep left running")
    path.unlink(missing_ok=True)
