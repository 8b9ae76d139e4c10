"""Compile once: decode a few tokens with every variant the lab runs, so a notebook's first GPU cell finds the
Triton kernels compiled and tuned instead of compiling each variant (``treewy warmup`` is the command).

Each variant is one (drafter, tree, commit mode, batch) of notebook 04's sweep and first cell: plain decoding,
the paper's shapes and chains k = 1..6, both modes, MTP and n-gram drafts. A decode compiles the kernels its
window selects (Triton keeps the binaries in its on-disk cache, ``TRITON_CACHE_DIR``, for later processes),
autotunes them (the tuned kernels cache their picks on disk where the Triton release can, see
``treewy.ops.verify.tuning.AUTOTUNE_EXTRA``) and, on CUDA, captures the step's graph, which this process keeps
on the model for the decodes that follow. What a cold and a warm start cost: ``benchmarks/engine_step_gpu.py``.
"""

from __future__ import annotations

import time

from treewy.experiments.acceptance import CHAINS, SHAPES, progress_bar

BATCHES = (1, 16)   # notebook 04: its first cell decodes one prompt, the sweep panel 16


def variants(drafters=("mtp", "ngram"), shapes=SHAPES, chains=CHAINS, modes=("reconstruct", "store_all"),
             batches=BATCHES) -> list[tuple]:
    """(drafter, tree widths, mode, batch) of every warmed decode; plain decoding first."""
    trees = [tuple(s) for s in shapes] + [(1,) * k for k in chains]
    out = [(None, None, None, B) for B in batches]
    out += [(d, t, m, B) for B in batches for d in drafters for t in trees for m in modes]
    return out


def warmup(model, batches=BATCHES, drafters=("mtp", "ngram"), new_tokens: int = 4, progress: bool = True,
           **kwargs) -> list[dict]:
    """Decode ``new_tokens`` with every variant (``variants(drafters, batches=batches, **kwargs)``) on the
    model's device; returns one dict per variant with its seconds (the first of a kind pays the compile)."""
    from treewy.decode import generate
    from treewy.models.corpus import heldout_prompts

    for B in batches:
        if isinstance(B, bool) or not isinstance(B, int) or B < 1:
            raise ValueError(f"batches holds {B!r}: expected positive integers, e.g. (1, 16)")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens = {new_tokens!r}: expected an integer >= 2 (one step past the prefill, one "
                         "replay of a captured step)")
    rows = []
    for drafter, tree, mode, B in progress_bar(variants(drafters, batches=batches, **kwargs), "warmup", progress):
        t0 = time.perf_counter()
        generate(model, heldout_prompts(B, 96, seed=0), drafter=drafter, tree=tree, commit=mode,
                 max_new_tokens=new_tokens)
        rows.append(dict(drafter=drafter or "none", tree=str(tree), mode=mode or "none", B=B,
                         seconds=time.perf_counter() - t0))
    return rows


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise ValueError(f"{flag} {text!r}: expected positive integers separated by commas, e.g. 1,16")
    return out


def add_arguments(p) -> None:
    p.add_argument("--device", default=None, help="cuda or cpu (default: TREEWY_DEVICE, else cuda when present)")
    p.add_argument("--batch", default="1,16", help="batch sizes to warm, comma-separated (default 1,16)")
    p.add_argument("--drafters", default="mtp,ngram", help="comma-separated: mtp, ngram (default both)")
    p.add_argument("--tokens", type=int, default=4, help="new tokens per warm-up decode (default 4)")


def run(args) -> int:
    from treewy.env import default_device
    from treewy.models import load

    batches = _ints("--batch", args.batch)
    drafters = tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    bad = [d for d in drafters if d not in ("mtp", "ngram")]
    if bad or not drafters:
        raise ValueError(f"--drafters {args.drafters!r}: expected mtp, ngram or both, comma-separated")
    device = args.device or default_device()
    if device not in ("cuda", "cpu"):
        raise ValueError(f"--device {device!r}: expected cuda or cpu")
    t0 = time.perf_counter()
    rows = warmup(load("tiny", device=device), batches, drafters, args.tokens)
    slow = max(rows, key=lambda r: r["seconds"])
    print(f"warmed {len(rows)} decodes in {time.perf_counter() - t0:.1f} s on {device}; the slowest, "
          f"{slow['drafter']} {slow['tree']} {slow['mode']} B = {slow['B']}: {slow['seconds']:.1f} s")
    return 0
