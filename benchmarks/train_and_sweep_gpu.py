"""One scripted GPU run: train the tiny checkpoint, then measure tree speculative decoding with it.

    python -m benchmarks.train_and_sweep_gpu --out DIR [--minutes 5]
    python -m benchmarks.train_and_sweep_gpu --out /tmp/x --toy        # end-to-end check on a CPU

Writes into DIR:
  tiny/config.json, tiny/model.safetensors, tiny/README.md   the checkpoint and its card
  train_metrics.json                                        the card's numbers and the loss history
  sweep.parquet        acceptance sweep (fp32): both drafters, the paper's 7 tree shapes and chains
                       k = 1..6, reconstruct and store_all, over held-out prompts (treewy.sweep)
  timing.parquet       per-step time at B = 1 and B = 32 (bf16 weights, fp32 GDN state): no-spec,
                       store_all and reconstruct, MTP drafter, the 7 tree shapes
  summary.json         environment, op backend and its cross-check, bf16-vs-fp32 token divergence
Each stage has a wall-time deadline, so a slow stage shortens the next rather than losing the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.common import backend_check, divergence, environment, log

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0, help="training wall time")
    ap.add_argument("--deadline", type=float, default=560.0, help="seconds from start for the whole script")
    ap.add_argument("--toy", action="store_true", help="a toy model and tiny sweep (CPU end-to-end check)")
    args = ap.parse_args(argv)
    t_start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    summary = environment(device)

    def save_summary():
        summary["elapsed_s"] = round(time.time() - t_start, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))

    # 1. train ------------------------------------------------------------------------------------
    from treewy.models.train_tiny import main as train_main
    ck = out / "tiny"
    targs = ["--out", str(ck), "--minutes", str(args.minutes), "--metrics", str(out / "train_metrics.json"),
             "--device", device]
    if args.toy:
        targs += ["--size", "toy", "--max-steps", "8", "--batch", "4", "--seq", "64", "--eval-windows", "8",
                  "--max-files", "30"]
    log(f"training: {' '.join(targs)}")
    train_main(targs)
    log(f"trained in {time.time() - t_start:.0f} s")

    from treewy.decode import generate
    from treewy.models import load
    from treewy.models.corpus import heldout_prompts
    from treewy.models.backends import get_ops
    from treewy.experiments.acceptance import CHAINS, SHAPES, sweep

    n_prompts, plen, new = (4, 48, 12) if args.toy else (32, 128, 48)
    prompts = heldout_prompts(n_prompts, plen, seed=0)
    m32 = load(ck, dtype=torch.float32, device=device)

    # 2. backend: the Triton kernels if they agree with the torch references on real decoding ----------
    backend = "torch"
    auto = get_ops(torch.device(device), "auto").name
    summary["kernels_importable_on_device"] = auto == "triton"
    if auto == "triton":
        try:
            check = backend_check(m32, prompts[:4])
            summary["kernel_check"] = check
            if all(check.values()):
                backend = "triton"
        except Exception as e:  # noqa: BLE001
            summary["kernel_check"] = f"failed: {type(e).__name__}: {e}"
            traceback.print_exc()
    summary["backend"] = backend
    log(f"backend {backend} ({summary.get('kernel_check')})")
    save_summary()

    remaining = lambda: args.deadline - (time.time() - t_start)  # noqa: E731

    # 3. divergence bf16 vs fp32 (greedy, and spec (3,3,3) reconstruct) ---------------------------------
    try:
        m16 = load(ck, dtype=torch.bfloat16, device=device)
        g32 = generate(m32, prompts, max_new_tokens=new, backend=backend)
        g16 = generate(m16, prompts, max_new_tokens=new, backend=backend)
        s16 = generate(m16, prompts, drafter="mtp", tree=(3, 3, 3), commit="reconstruct", max_new_tokens=new,
                       backend=backend)
        s32 = generate(m32, prompts, drafter="mtp", tree=(3, 3, 3), commit="reconstruct", max_new_tokens=new,
                       backend=backend)
        summary["divergence"] = dict(
            greedy_bf16_vs_fp32=divergence(g32.tokens, g16.tokens),
            spec333_bf16_vs_greedy_fp32=divergence(g32.tokens, s16.tokens),
            spec333_bf16_vs_greedy_bf16=divergence(g16.tokens, s16.tokens),
            spec333_fp32_equals_greedy_fp32=s32.tokens == g32.tokens,
            acceptance_fp32=s32.acceptance_length, acceptance_bf16=s16.acceptance_length,
        )
    except Exception as e:  # noqa: BLE001
        summary["divergence"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    log(f"divergence done, {remaining():.0f} s left")
    save_summary()

    # 4. acceptance sweep (fp32) ---------------------------------------------------------------------
    shapes, chains = (SHAPES[:2], CHAINS[:2]) if args.toy else (SHAPES, CHAINS)
    t_sweep_end = time.time() + max(10.0, remaining() - (60 if not args.toy else 0))
    try:
        df = sweep(m32, prompts, shapes=shapes, chains=chains, max_new_tokens=new, model_name="tiny",
                   backend=backend, deadline=t_sweep_end, progress=False)
        df.write_parquet(out / "sweep.parquet")
        summary["sweep_rows"] = df.height
        log(f"sweep: {df.height} rows, {remaining():.0f} s left")
    except Exception as e:  # noqa: BLE001
        summary["sweep"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    save_summary()

    # 5. per-step time, bf16 weights, B = 1 and B = 32 -------------------------------------------------
    try:
        import polars as pl
        frames = []
        m16 = load(ck, dtype=torch.bfloat16, device=device)
        for B in (1, 4) if args.toy else (1, 32):
            if remaining() < 5:
                break
            ps = (prompts * ((B + len(prompts) - 1) // len(prompts)))[:B]
            df = sweep(m16, ps, drafters=("mtp",), shapes=shapes, chains=[], max_new_tokens=min(new, 32),
                       model_name="tiny", backend=backend, deadline=time.time() + remaining() / 2,
                       progress=False)
            frames.append(df.with_columns(pl.lit(B).alias("batch")))
        if frames:
            pl.concat(frames, how="diagonal_relaxed").write_parquet(out / "timing.parquet")
    except Exception as e:  # noqa: BLE001
        summary["timing"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    save_summary()
    log(f"done in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
