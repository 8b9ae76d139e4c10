"""The ``treewy`` command. Each subcommand lives in its own module with ``add_arguments(parser)``
and ``run(args) -> int``; only the module of the command being run is imported."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("treewy.check", "parity suite: closed form vs recurrence on random trees (and kernels)"),
    "sweep": ("treewy.sweep", "acceptance sweep: tree speculative decoding over held-out prompts"),
    "serve": ("treewy.serve.cli_serve", "start vLLM with MTP speculation, store_all or reconstruct (TreeWY plugin)"),
    "export-vllm": ("treewy.serve.cli_export", "write a checkpoint (or a dummy-weight config) in the layout vLLM serves"),
    "bench-serve": ("treewy.serve.cli_bench", "serving sweep with vllm bench serve: one tidy row per point"),
    "simulate": ("treewy.sim.cli", "simulated serving sweep: TreeWY / store-all ratio table (memory, admission, TTFT)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="treewy", description="TreeWY lab: tree speculative decoding for GDN hybrids")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(run=mod.run)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
