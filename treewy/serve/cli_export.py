"""``treewy export-vllm``: a checkpoint in the layout vLLM serves (see treewy.serve.export).

    treewy export-vllm treewy/models/tiny /tmp/tiny-vllm          # text-only Qwen3.5 -> composite layout
    treewy export-vllm --dummy qwen3.5-35b-a3b /tmp/35b-dummy      # config + tokenizer for --load-format dummy
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", nargs="?", help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("out", help="output folder (must be empty or absent unless --force)")
    p.add_argument("--dummy", metavar="PRESET", help="write a config for --load-format dummy from a treewy.memory "
                   "preset (e.g. qwen3.5-35b-a3b) instead of converting SRC")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="tokenizer model_max_length with --dummy (default 8192)")
    p.add_argument("--force", action="store_true", help="write into a non-empty output folder: files the export "
                   "writes are replaced, every other file is kept")


def _check_preset(name: str) -> None:
    from treewy.memory import ModelSpec

    try:
        ModelSpec.from_name(name)
    except ValueError as e:
        raise ValueError(f"--dummy {name!r}: {e}") from e


def run(args: argparse.Namespace) -> int:
    from treewy.serve.export import export_dummy, export_vllm

    if (args.src is None) == (args.dummy is None):
        print("treewy export-vllm: error: give either SRC OUT or --dummy PRESET OUT", file=sys.stderr)
        return 2
    if args.max_model_len is not None and args.dummy is None:
        print("treewy export-vllm: error: --max-model-len applies to --dummy only (a converted checkpoint keeps "
              "its own max_position_embeddings)", file=sys.stderr)
        return 2
    if args.max_model_len is not None and args.max_model_len < 1:
        print(f"treewy export-vllm: error: --max-model-len {args.max_model_len}: expected a positive number of "
              "tokens, e.g. 8192", file=sys.stderr)
        return 2
    try:
        if args.dummy:
            _check_preset(args.dummy)
        out = (export_dummy(args.dummy, args.out, max_len=args.max_model_len or 8192, overwrite=args.force)
               if args.dummy else export_vllm(args.src, args.out, overwrite=args.force))
    except ValueError as e:
        print(f"treewy export-vllm: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
