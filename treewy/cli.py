"""The ``treewy`` command. Each subcommand lives in its own module with ``add_arguments(parser)``
and ``run(args) -> int``; only the module of the command being run is imported."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("treewy.check", "parity suite: closed form vs recurrence on random trees (and kernels)"),
    "sweep": ("treewy.experiments.acceptance", "acceptance sweep: tree speculative decoding over held-out prompts"),
    "serve": ("treewy.serve.cli_serve", "start vLLM with MTP speculation, store_all or reconstruct (TreeWY plugin)"),
    "export-vllm": ("treewy.serve.cli_export", "write a checkpoint (or a dummy-weight config) in the layout vLLM serves"),
    "bench-serve": ("treewy.serve.cli_bench", "serving sweep with vllm bench serve: one tidy row per point"),
    "simulate": ("treewy.sim.cli", "simulated serving sweep: TreeWY / store-all ratio table (memory, admission, TTFT)"),
    "warmup": ("treewy.decode_warmup", "decode a few tokens in every variant the lab runs: kernels compiled and tuned once"),
    "lab": ("treewy.lab_command", "copy the notebooks into a folder (default ./treewy-lab) and open JupyterLab on 00"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("treewy")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="treewy", description="TreeWY lab: tree speculative decoding for GDN hybrids")
    parser.add_argument("--version", action="version", version=f"treewy {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pass_through = False
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(run=mod.run)
            pass_through = getattr(mod, "PASS_THROUGH", False)   # a command that hands unknown options on
    if pass_through:
        args, args.extra = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    from treewy.env import MissingExtra
    try:
        return int(args.run(args) or 0)
    except (ValueError, MissingExtra) as e:  # bad input, or an extra to install: one line, not a traceback
        print(f"treewy {args.command}: error: {' '.join(line.strip() for line in str(e).splitlines())}",
              file=sys.stderr)
        return 2


def output_file(path, flag: str = "--out", suffix: str = ".parquet") -> Path:
    """``path`` checked as a file the command can write, before the command computes anything: its suffix, not a
    folder, its folder created and writable."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a folder: name a {suffix} file in it, "
                         f"e.g. {out / ('results' + suffix)}")
    if out.suffix != suffix:
        raise ValueError(f"{flag} {str(path)!r}: expected a {suffix} file, e.g. {out.with_suffix(suffix)}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {str(path)!r}: cannot write in {out.parent} ({e.strerror or e})") from e
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r}: the file exists and is not writable")
    return out


if __name__ == "__main__":
    sys.exit(main())
