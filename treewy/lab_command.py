"""``treewy lab [DIR]``: the lab without a checkout. Copies the notebooks shipped in the package (and the READMEs
they link) into DIR, laid out as in the checkout, then opens JupyterLab there on 00 at 127.0.0.1.

A copy the user has edited is never overwritten without asking: DIR/.treewy-lab.json records what each file was
when copied, so a file that still matches it takes the shipped version of a newer release, and one that matches
neither is asked about on a terminal, refused (one line) elsewhere, or overwritten with ``--force``. Outputs are not
edits: notebooks are compared without them (tools/nbstrip.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

PASS_THROUGH = True   # options this command does not know go to JupyterLab (e.g. --ServerApp.token=...)
MANIFEST = ".treewy-lab.json"
START = "notebooks/00_start_here.ipynb"


def add_arguments(p) -> None:
    p.add_argument("dir", nargs="?", default="treewy-lab", help="where the notebooks go (default: ./treewy-lab)")
    p.add_argument("--force", action="store_true", help="overwrite copies you have edited, without asking")
    p.add_argument("--port", type=int, default=None, help="JupyterLab's port (default: 8888, or the next free one)")
    p.add_argument("--no-browser", action="store_true", help="print the URL instead of opening a browser")
    p.add_argument("--print-command", action="store_true", help="copy, then print the JupyterLab command instead "
                   "of running it")
    p.epilog = "Other options (--ServerApp.x=y, ...) are passed to JupyterLab."


def sources() -> tuple[dict[str, Path], Path]:
    """What ``treewy lab`` copies (path in DIR -> shipped file) and the folder holding jupyter_lab_config.py: from
    the installed wheel (treewy_lab/notebooks, treewy_lab/tools) or, in a checkout, from its notebooks/ and tools/."""
    lab = Path(importlib.util.find_spec("treewy_lab").origin).parent
    base = lab if (lab / "notebooks").is_dir() else lab.parent
    files = {f"notebooks/{p.name}": p for p in sorted((base / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    if not files:
        raise FileNotFoundError(f"no notebooks under {base / 'notebooks'}: reinstall treewy")
    treewy_dir = lab.parent / "treewy"
    files.update({f"treewy/{p.relative_to(treewy_dir).as_posix()}": p for p in sorted(treewy_dir.rglob("*.md"))})
    notes = base / "benchmarks" / "NOTES.md"
    if notes.is_file():
        files["benchmarks/NOTES.md"] = notes
    return files, base / "tools"


@functools.cache
def _nbstrip():
    spec = importlib.util.spec_from_file_location("nbstrip", sources()[1] / "nbstrip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(path: Path) -> str:
    """A notebook's digest without outputs or run-time metadata; any other file's bytes."""
    data = path.read_bytes()
    if path.suffix == ".ipynb":
        try:
            data = _nbstrip().dumps(_nbstrip().strip(json.loads(data))).encode()
        except ValueError:   # not JSON (a half-written file): its bytes decide
            pass
    return hashlib.sha256(data).hexdigest()


def _ask_tty(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def copy_lab(dest: Path, force: bool = False, ask=None) -> dict[str, list[str]]:
    """Copy the shipped files into ``dest``. Returns the paths ``copied`` (new or updated), ``current`` (already the
    shipped version) and ``kept`` (edited copies left alone). An edited copy that the shipped version would replace
    is asked about (``ask(question) -> bool``); with ``ask=None`` and no ``force`` it is a ValueError, raised before
    anything is written."""
    files, _ = sources()
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"DIR {str(dest)!r} is a file: name a folder for the notebooks (default ./treewy-lab)")
    try:
        recorded = json.loads((dest / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    plan: dict[str, str] = {}
    edited = []
    for rel, src in files.items():
        target = dest / rel
        shipped = _digest(src)
        if not target.exists():
            plan[rel] = "copy"
            continue
        have = _digest(target)
        if have == shipped:
            plan[rel] = "current"
        elif force or have == recorded.get(rel):   # asked to, or unedited since copied: a newer release's version
            plan[rel] = "copy"
        elif recorded.get(rel) == shipped:   # edited since copied, and nothing newer to give
            plan[rel] = "kept"
        else:
            plan[rel] = "edited"
            edited.append(rel)
    if edited and ask is None and not force:
        more = f" (and {len(edited) - 1} more)" if len(edited) > 1 else ""
        raise ValueError(f"{dest / edited[0]}{more} differs from the version this treewy ships and from the copy it "
                         f"made: it looks edited; rerun with --force to overwrite, or move it aside to keep it")
    for rel in edited:
        plan[rel] = "copy" if ask(f"{dest / rel} has edits; overwrite it with the shipped version?") else "kept"
    done: dict[str, list[str]] = {"copied": [], "current": [], "kept": []}
    for rel, action in plan.items():
        if action == "copy":
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files[rel], dest / rel)
            recorded[rel] = _digest(dest / rel)
        elif action == "current":
            recorded[rel] = _digest(files[rel])
        done["copied" if action == "copy" else action].append(rel)   # an edit kept keeps its old record
    (dest / MANIFEST).write_text(json.dumps({"files": recorded}, indent=1, sort_keys=True) + "\n")
    return done


def jupyter_command(dest: Path, port: int | None = None, no_browser: bool = False, extra=()) -> list[str]:
    """JupyterLab on ``dest`` at 127.0.0.1 with the lab's settings (tools/jupyter_lab_config.py: no news prompt, a
    quiet terminal), opening 00: the URL it prints opens 00 too."""
    _, tools = sources()
    cmd = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--ServerApp.root_dir={Path(dest).resolve()}",
           f"--config={tools / 'jupyter_lab_config.py'}", f"--LabApp.default_url=/lab/tree/{START}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")   # JupyterLab refuses root without it (containers, CI)
    if port is not None:
        cmd.append(f"--port={port}")
    if no_browser:
        cmd.append("--no-browser")
    return cmd + list(extra)


def run(args) -> int:
    from treewy.env import LAB_EXTRAS, MissingExtra, install_command

    if importlib.util.find_spec("jupyterlab") is None:
        raise MissingExtra(f"JupyterLab is not installed: {install_command(LAB_EXTRAS)}")
    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: expected a port number from 1 to 65535, e.g. 8888")
    bad = [a for a in args.extra if not a.startswith("--")]
    if bad:
        raise ValueError(f"{bad[0]!r}: one DIR only; options for JupyterLab are written --Name.option=value")
    dest = Path(args.dir)
    ask = _ask_tty if sys.stdin.isatty() and not args.force else None
    done = copy_lab(dest, force=args.force, ask=ask)
    kept = f", kept {len(done['kept'])} edited" if done["kept"] else ""
    print(f"treewy lab: {dest}: {len(done['copied'])} files copied, {len(done['current'])} already current{kept}")
    cmd = jupyter_command(dest, args.port, args.no_browser, args.extra)
    env = {**os.environ, "TREEWY_DEVICE": os.environ.get("TREEWY_DEVICE", "cpu")}   # as `make lab`
    if args.print_command:
        print(shlex.join(cmd))
        return 0
    print(f"treewy lab: JupyterLab runs in this terminal until Ctrl-C; it opens {START} "
          f"(TREEWY_DEVICE={env['TREEWY_DEVICE']})", flush=True)
    if os.name == "posix":
        os.execve(sys.executable, cmd, env)   # JupyterLab takes this process: Ctrl-C reaches it alone
    return subprocess.call(cmd, env=env)
