"""Acceptance length against temperature on the tiny checkpoint, and the chi-square checks of sampled
speculation, in one scripted run (CPU or GPU).

    python -m benchmarks.temperature_sweep --out DIR [--device cpu] [--prompts 16] [--max-new-tokens 48]

Writes into DIR, named <date>_<device>_tiny_temperature_sweep.*:
  .parquet   one row per (drafter, shape, rule, temperature): treewy.sampling.sweep.temperature_sweep
  .txt       the acceptance table (rows: drafter, shape, rule; columns: temperature) and the checks
  .json      the chi-square figures: toy chain (every rule, and the deliberately wrong one) and the tiny
             model's second token (treewy.sampling.check), with device and date
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

import treewy.accept as accept
from treewy.experiments.sampling_check import second_token_check, toy_check
from treewy.experiments.sampling_sweep import SHAPES, TEMPERATURES, cpu_name, temperature_sweep
from treewy.results import publish

ROOT = Path(__file__).resolve().parents[1]


def checks(model) -> list[dict]:
    from treewy.models.tokenizer import encode

    rows = []
    for rule in accept.RULES:
        t, per_step = toy_check(rule)
        rows.append(dict(check="toy chain, tree (3, 2), first 3 tokens", rule=rule, **t.__dict__, per_step=per_step))
    right = accept.residual
    accept.residual = lambda r, q: r  # the wrong rule: after a rejection, keep the target
    try:
        for rule in ("rrs", "rrs_wor"):
            t, per_step = toy_check(rule)
            rows.append(dict(check="toy chain, WRONG rule (target kept after a rejection)", rule=rule, **t.__dict__,
                             per_step=per_step))
    finally:
        accept.residual = right
    for drafter, rule in (("mtp", "match"), ("mtp", "rrs"), ("mtp", "rrs_wor"), ("ngram", "rrs")):
        t, per_step = second_token_check(model, encode("a = a"), drafter, rule)
        rows.append(dict(check=f"tiny model, 2nd token, {drafter} drafts, tree (3,), top_k 4, temperature 1",
                         rule=rule, **t.__dict__, per_step=per_step))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (the tiny model's steps are too small to split across cores)")
    args = ap.parse_args(argv)
    import polars as pl

    from treewy.models import load
    from treewy.models.corpus import heldout_prompts

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    device = f"CPU: {cpu_name()}" if args.device == "cpu" else torch.cuda.get_device_name()
    tag = "cpu" if args.device == "cpu" else "gpu"
    stem = out / f"{date}_{tag}_tiny_temperature_sweep"
    model = load("tiny", device=args.device)
    t0 = time.time()
    found = checks(model)
    Path(f"{stem}.json").write_text(json.dumps(dict(device=device, date=date, checks=found), indent=1) + "\n")
    prompts = heldout_prompts(args.prompts, args.prompt_len, seed=0)
    df = temperature_sweep(model, prompts, shapes=SHAPES, temperatures=TEMPERATURES,
                           max_new_tokens=args.max_new_tokens)
    df.write_parquet(f"{stem}.parquet")
    print(f"published {publish('temperature_sweeps', f'{stem}.parquet')}")
    table = (df.with_columns(pl.format("{} ± {}", pl.col("acceptance").round(2),
                                       ((pl.col("acceptance_hi") - pl.col("acceptance_lo")) / 2).round(2)).alias("a"))
             .pivot(on="temperature", index=["drafter", "shape", "rule"], values="a").sort("drafter", "shape", "rule"))
    lines = [f"tiny checkpoint, {device}, {date}; {args.prompts} held-out prompts of {args.prompt_len} tokens, "
             f"{args.max_new_tokens} new tokens each; acceptance length (tokens per step) ± the 95 % half-interval "
             f"over prompts; columns: temperature (0 = greedy, one run shown under every rule)", ""]
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        lines.append(str(table))
    lines += ["", "chi-square checks (pass: p > 0.01):"]
    lines += [f"  {c['check']}, {c['rule']}: statistic {c['statistic']:.1f}, dof {c['dof']}, p = {c['p_value']:.3g}, "
              f"{c['draws']} draws, {c['per_step']:.2f} tokens per step" for c in found]
    lines.append(f"\nwall time {time.time() - t0:.0f} s")
    Path(f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
