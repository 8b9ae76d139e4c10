"""Acceptance sweep: real greedy tree speculation over held-out prompts (or MT-Bench's questions:
``--prompt-set mt-bench``), one row per (drafter, tree shape, commit mode). ``treewy sweep`` is the CLI;
``sweep()`` the function behind it. The CLI's table adds prompt_set, prompt_tokens and max_new_tokens.

Columns: model, drafter, kind (tree | chain | none), shape, N (drafts), T, depth, mode, state_blocks
(GDN state blocks per request per layer the mode holds), requests, steps, tokens, acceptance
(mean tokens per step) with a 95 % interval (normal, over per-request means), accept_ge_d1..d6
(fraction of steps that accepted at least d drafts), gdn_state_bytes (measured per request, all
GDN layers), transient_bytes, step_ms / draft_ms (means over steps after the first), step_ms_median
and {draft, verify, accept, commit, host}_ms_median (medians over steps after the first; verify,
accept and commit only with timing="phases"), dtype, backend, device, date, paper_acceptance
(DESIGN.md section 4, trees only).
"""

from __future__ import annotations

import datetime
import math
import platform
import re
import time

import torch

from treewy.decode import PHASES
from treewy.paper import ACCEPTANCE
from treewy.paper import SHAPES as PAPER_SHAPES  # noqa: N811
from treewy.tree import DraftTree

SHAPES = list(PAPER_SHAPES)
CHAINS = [1, 2, 3, 4, 5, 6]
MODES = ("reconstruct", "store_all")
MAX_DEPTH_COLS = 6


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()})"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def summarize(result, *, drafter: str, kind: str, widths: tuple, mode: str, model_name: str, dtype: str,
              backend: str, device: str) -> dict:
    """One sweep row from a GenerateResult."""
    steps = result.steps
    lengths = [s.length for s in steps]
    per_req: dict[int, list[int]] = {}
    for s in steps:
        per_req.setdefault(s.request, []).append(s.length)
    means = [sum(v) / len(v) for v in per_req.values()]
    mean = sum(lengths) / max(1, len(lengths))
    if len(means) > 1:
        mu = sum(means) / len(means)
        sd = math.sqrt(sum((m - mu) ** 2 for m in means) / (len(means) - 1))
        half = 1.96 * sd / math.sqrt(len(means))
    elif len(lengths) > 1:
        sd = math.sqrt(sum((x - mean) ** 2 for x in lengths) / (len(lengths) - 1))
        half = 1.96 * sd / math.sqrt(len(lengths))
    else:
        half = float("nan")
    tree = DraftTree.from_widths(widths) if widths else DraftTree([-1])
    per_step = {}
    for s in steps:
        per_step.setdefault(s.step, s)  # the step's times are the batch's, repeated per request
    later = [s for k, s in sorted(per_step.items()) if k > 0] or list(per_step.values())
    row = dict(
        model=model_name, drafter=drafter, kind=kind, shape=str(tuple(widths)) if widths else "()",
        N=tree.num_drafts, T=tree.num_nodes, depth=len(widths), mode=mode,
        state_blocks=tree.state_blocks(mode) if mode in MODES else 1,
        requests=len(per_req), steps=len(steps), tokens=sum(lengths),
        acceptance=mean, acceptance_lo=mean - half, acceptance_hi=mean + half,
    )
    for d in range(1, MAX_DEPTH_COLS + 1):
        row[f"accept_ge_d{d}"] = (sum(1 for x in lengths if x - 1 >= d) / len(lengths)
                                  if d <= len(widths) and lengths else None)
    row.update(
        gdn_state_bytes=max((s.gdn_state_bytes for s in steps), default=0),
        transient_bytes=max((s.transient_bytes for s in steps), default=0),
        step_ms=_mean([s.step_ms for s in later]), step_ms_median=_median([s.step_ms for s in later]),
        draft_ms=_mean([s.draft_ms for s in later]),
        **{f"{p}_ms_median": _median([getattr(s, f"{p}_ms") for s in later]) for p in PHASES},
        dtype=dtype, backend=backend, device=device, date=datetime.date.today().isoformat(),
        paper_acceptance=ACCEPTANCE.get(tuple(widths)) if kind == "tree" else None,
    )
    return row


def sweep_rows(model, prompts, drafters=("mtp", "ngram"), shapes=SHAPES, chains=CHAINS, modes=MODES,
               max_new_tokens: int = 64, model_name: str = "tiny", backend: str = "auto", baseline: bool = True,
               progress: bool = True, deadline: float | None = None, timing: str = "step") -> list[dict]:
    """One row (a dict) per (drafter, shape, mode) plus a plain-decoding baseline row; stops starting
    rows once time.time() passes ``deadline``."""
    from treewy.decode import generate
    from treewy.drafters import make_drafter
    from treewy.models.backends import get_ops

    param = next(model.parameters())
    dev = device_name(param.device)
    dtype = str(param.dtype).removeprefix("torch.")
    backend_name = get_ops(param.device, backend).name
    for dname in drafters:
        make_drafter(dname, model)  # fail fast (e.g. no MTP weights)
    rows = []
    for dname, kind, widths, mode in progress_bar(sweep_jobs(drafters, shapes, chains, modes, baseline), "sweep",
                                                  progress):
        if deadline is not None and time.time() > deadline:
            break
        res = generate(model, prompts, drafter=None if dname == "none" else dname, tree=widths or (1,),
                       commit=None if mode == "none" else mode, max_new_tokens=max_new_tokens, backend=backend,
                       timing=timing)
        rows.append(summarize(res, drafter=dname, kind=kind, widths=widths, mode=mode, model_name=model_name,
                              dtype=dtype, backend=backend_name, device=dev))
    return rows


def sweep_jobs(drafters=("mtp", "ngram"), shapes=SHAPES, chains=CHAINS, modes=MODES, baseline: bool = True):
    """(drafter, kind, widths, mode) of every sweep row, the baseline ("none") first."""
    jobs = [("none", "none", (), "none")] if baseline else []
    for dname in drafters:
        for kind, widths in [("tree", tuple(s)) for s in shapes] + [("chain", (1,) * k) for k in chains]:
            for mode in modes:
                jobs.append((dname, kind, widths, mode))
    return jobs


def sweep(model, prompts, **kwargs):
    """``sweep_rows`` as a tidy polars frame."""
    import polars as pl
    return pl.DataFrame(sweep_rows(model, prompts, **kwargs), infer_schema_length=None)


def progress_bar(items, desc: str, enabled: bool = True):
    """tqdm over items when it is installed, else a printed line per item."""
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return _printed(list(items), desc)
    return tqdm(items, desc=desc)


def _printed(items, desc):
    for i, x in enumerate(items):
        print(f"{desc}: {i + 1}/{len(items)} {x}", flush=True)
        yield x


def _parse_shapes(text: str) -> list[tuple[int, ...]]:
    """Trees as the docs write them: '2,2,1', '(2, 2, 1)', '1,1,1;2,2,1' or '(1,1,1) (2,2,1)' (any of ',;' between
    parenthesized trees)."""
    if not text.strip():
        return []
    hint = "write branching factors per level, e.g. '2,2,1', '(2, 2, 1)' or '(1,1,1);(2,2,1)'"
    if "(" in text or ")" in text:
        parts = re.findall(r"\(([^()]*)\)", text)
        if re.sub(r"\([^()]*\)", "", text).strip(" ,;") or not parts:
            raise ValueError(f"--shapes {text!r}: unbalanced parentheses or text outside them; {hint}")
    else:
        parts = [part for part in text.split(";") if part.strip()]
    try:
        shapes = [tuple(int(x) for x in part.split(",")) for part in parts]
        for widths in shapes:
            DraftTree.from_widths(widths)
    except ValueError as e:
        raise ValueError(f"--shapes {text!r}: {hint} ({e})") from e
    return shapes


def _parse_chains(text: str) -> list[int]:
    if not text:
        return []
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))  # one dash: a range; more is a ValueError too
            if lo > hi:
                raise ValueError(f"the range runs from {lo} down to {hi}")
            chains = list(range(lo, hi + 1))
        else:
            chains = [int(x) for x in text.split(",")]
        for k in chains:
            if k < 1:
                raise ValueError(f"chain length {k}")
            DraftTree.from_widths((1,) * k)
    except ValueError as e:
        raise ValueError(f"--chains {text!r}: expected chain lengths from 1 up as a range lo-hi or a list, "
                         f"e.g. 1-6 or 1,3 ({e})") from e
    return chains


def _parse_names(flag: str, text: str, allowed) -> list[str]:
    names = [x for x in text.split(",") if x]
    bad = [x for x in names if x not in allowed]
    if bad:
        raise ValueError(f"{flag} {text!r}: unknown {', '.join(map(repr, bad))}; expected a comma-separated list of "
                         f"{', '.join(allowed)}")
    return names


def _check_device(text: str) -> None:
    try:
        dev = torch.device(text)
    except RuntimeError as e:
        raise ValueError(f"--device {text!r}: expected cpu or cuda (cuda:0, ...)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text!r}: no CUDA GPU is available here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {text!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")


PROMPT_SETS = ("heldout", "mt-bench")


def mt_bench_prompts(n: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """``n`` MT-Bench first turns as byte tokens (<bos> first), the categories taken in turn (8 prompts: one of
    each), the question within a category chosen by seed; a question longer than ``max_len`` tokens keeps its
    last ``max_len - 1`` bytes (its end, which the model continues)."""
    import random

    from treewy.tokenizer import BOS
    from treewy.workloads import prompt_rows
    rows = prompt_rows("mt-bench")
    if not 1 <= n <= len(rows):
        raise ValueError(f"--prompts {n}: the mt-bench prompt set has {len(rows)} prompts; expected 1 to {len(rows)}")
    if max_len < 2:
        raise ValueError(f"--prompt-len {max_len}: expected at least 2 (<bos> and one byte)")
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)
    rng = random.Random(seed)
    for group in by_cat.values():
        rng.shuffle(group)
    order = [g[i] for i in range(max(map(len, by_cat.values()))) for g in by_cat.values() if i < len(g)]
    return [[BOS] + list(r["prompt"].encode("utf-8")[-(max_len - 1):]) for r in order[:n]]


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' or a Qwen3.5 / Qwen3-Next checkpoint directory")
    p.add_argument("--drafters", default="mtp,ngram", help="comma-separated: mtp, ngram")
    p.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                   help="tree shapes as branching factors, ';'-separated (default: the paper's seven)")
    p.add_argument("--chains", default="1-6", help="chain lengths, e.g. 1-6 or 1,3 ('' for none)")
    p.add_argument("--modes", default="reconstruct", help="reconstruct,store_all (acceptance is identical; store_all adds its state bytes and step time)")
    p.add_argument("--prompt-set", default="heldout", choices=PROMPT_SETS,
                   help="heldout: windows of the tiny model's held-out files; mt-bench: MT-Bench's first turns "
                        "(treewy/data/mt_bench/), byte tokens")
    p.add_argument("--prompts", type=int, default=4, help="number of prompts (the batch size)")
    p.add_argument("--prompt-len", type=int, default=96,
                   help="heldout: every prompt's length; mt-bench: the longest a prompt may be (longer ones keep "
                        "their end)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the frame to this .parquet file")


def run(args) -> int:
    from treewy.cli import output_file
    from treewy.models import load
    from treewy.models.corpus import heldout_prompts

    # every argument is checked before the model loads, so a typo costs nothing and a bad --out loses no results
    drafters = _parse_names("--drafters", args.drafters, ("mtp", "ngram"))
    modes = _parse_names("--modes", args.modes, MODES)
    if not modes:
        raise ValueError(f"--modes {args.modes!r}: expected one or more of {', '.join(MODES)}")
    shapes, chains = _parse_shapes(args.shapes), _parse_chains(args.chains)
    for flag, value in (("--prompts", args.prompts), ("--prompt-len", args.prompt_len),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ValueError(f"{flag} {value}: expected a positive integer")
    _check_device(args.device)
    out = output_file(args.out) if args.out else None
    if args.prompt_set == "mt-bench":
        prompts = mt_bench_prompts(args.prompts, args.prompt_len, seed=args.seed)
    else:
        prompts = heldout_prompts(args.prompts, args.prompt_len, seed=args.seed)
    if len(prompts) < args.prompts:
        raise ValueError(f"--prompt-len {args.prompt_len}: only {len(prompts)} of the {args.prompts} held-out prompts "
                         "can be that long; lower --prompt-len or --prompts")
    try:
        model = load(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    except ValueError as e:
        raise ValueError(f"--model {args.model!r}: {e}") from e
    df = sweep(model, prompts, drafters=drafters, shapes=shapes, chains=chains, modes=modes,
               max_new_tokens=args.max_new_tokens, model_name=str(args.model), backend=args.backend)
    pl = __import__("polars")
    df = df.with_columns(prompt_set=pl.lit(args.prompt_set), prompt_tokens=pl.lit(sum(map(len, prompts))),
                         max_new_tokens=pl.lit(args.max_new_tokens))
    with pl.Config(tbl_rows=100, tbl_cols=12):
        print(df.select("drafter", "shape", "N", "mode", "state_blocks", "acceptance", "acceptance_lo",
                        "acceptance_hi", "gdn_state_bytes", "step_ms"))
    if out is not None:
        df.write_parquet(out)
        print(f"wrote {out}")
    return 0
