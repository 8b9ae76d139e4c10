"""Train the tiny Qwen3.5-style checkpoint: ``python -m treewy.models.train_tiny [--out DIR] [--minutes M]``.

A byte-level text hybrid (GDN : attention = 3 : 1) with one MTP layer trained jointly (MTP loss on
the next-next token, on detached target hidden states), on the Python standard library's sources
with a held-out split by file (treewy.models.corpus). The run is bounded by wall time; the
learning rate follows the elapsed fraction of it (warmup, then cosine). Writes config.json +
model.safetensors (HF layout, bf16) + README.md (the model card) to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SIZES = {
    # the committed checkpoint
    "tiny": dict(),
    # a toy for end-to-end CPU checks of this script
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=512),
}


def losses(spec, mtp, batch: torch.Tensor, use_fla=None):
    """(main loss, MTP loss, main top-1 acc, MTP top-1 acc) on a batch of windows [B, L + 1]."""
    from treewy.models.hybrid import forward_sequence
    from treewy.models.mtp import mtp_forward
    x, y = batch[:, :-1], batch[:, 1:]
    L = x.shape[1]
    h = forward_sequence(spec, x, use_fla=use_fla)                       # [B, L, hidden]
    logits = spec.lm_head(h).float()
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    # entry at position i + 1 pairs h_i with x_{i+1} and predicts x_{i+2}
    pos = torch.arange(1, L, device=x.device)[None].expand(x.shape[0], -1)
    out, _, _ = mtp_forward(spec, mtp, x[:, 1:], h[:, :-1].detach(), pos)
    mlog = spec.lm_head(out).float()
    mt = y[:, 1:]
    mloss = F.cross_entropy(mlog.reshape(-1, mlog.shape[-1]), mt.reshape(-1))
    acc = (logits.argmax(-1) == y).float().mean()
    macc = (mlog.argmax(-1) == mt).float().mean()
    return main, mloss, acc, macc


def _windows(data: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length, (n,), generator=gen)
    return torch.stack([data[s:s + length] for s in starts.tolist()])


@torch.no_grad()
def evaluate(spec, mtp, data: torch.Tensor, windows: int, length: int, batch: int, device, use_fla=None,
             autocast=False) -> dict:
    gen = torch.Generator().manual_seed(1234)
    w = _windows(data, windows, length, gen)
    tot = {"loss": 0.0, "mtp_loss": 0.0, "top1": 0.0, "mtp_top1": 0.0}
    n = 0
    for i in range(0, windows, batch):
        xb = w[i:i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            main, ml, acc, macc = losses(spec, mtp, xb, use_fla)
        k = xb.shape[0]
        for key, val in zip(tot, (main, ml, acc, macc)):
            tot[key] += float(val) * k
        n += k
    return {k: v / n for k, v in tot.items()}


def model_card(info: dict) -> str:
    i = info
    return f"""# treewy tiny: a byte-level Qwen3.5-style hybrid with one MTP layer

A small model of the Qwen3.5 text architecture, trained by `python -m treewy.models.train_tiny`, so
that tree speculative decoding (GDN layers verified by TreeWY) runs on any laptop and in CI.
Load it with `treewy.models.load("tiny")`; it is a plain Hugging Face checkpoint
(`{i['architecture']}`, config.json + model.safetensors, MTP weights under `mtp.*`).

| | |
|---|---|
| architecture | {i['num_hidden_layers']} layers, {i['layer_pattern']}; hidden {i['hidden_size']}, MLP {i['intermediate_size']} |
| GDN | {i['linear_num_key_heads']} key / {i['linear_num_value_heads']} value heads, K = V = {i['linear_key_head_dim']}, conv {i['linear_conv_kernel_dim']}; state {i['state_bytes']} bytes per layer per request (fp32) |
| attention | {i['num_attention_heads']} query / {i['num_key_value_heads']} KV heads, head dim {i['head_dim']}, partial RoPE 0.25, output gate |
| MTP | 1 layer (fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0, norm; shared lm_head) |
| vocabulary | {i['vocab_size']}: bytes 0..255, `<bos>` 256, `<eos>` 257, `<pad>` 258 (`treewy.models.tokenizer`) |
| parameters | {i['params']:,} (main {i['params_main']:,} + MTP {i['params_mtp']:,}); weights stored in bf16, {i['file_mb']:.1f} MB |
| data | Python {i['python']} standard library `*.py` files; held out by file (SHA-1 of the relative path, ~5 %): {i['train_files']} train files ({i['train_tokens']:,} tokens), {i['heldout_files']} held-out files ({i['heldout_tokens']:,} tokens) |
| training | {i['steps']} steps of {i['batch']} x {i['seq']} tokens ({i['tokens_seen']:,} tokens, {i['epochs']:.2f} epochs) in {i['train_seconds']:.0f} s; AdamW lr {i['lr']} (warmup, cosine), weight decay 0.1, {i['precision']}; loss = next token + {i['mtp_weight']} x MTP next-next token; GDN chunk kernel: {i['gdn_kernel']} |
| final train loss (last 50 steps) | {i['train_loss']:.4f} nats/byte (MTP {i['train_mtp_loss']:.4f}) |
| held-out loss | {i['heldout_loss']:.4f} nats/byte ({i['heldout_bpb']:.3f} bits/byte); top-1 {i['heldout_top1']:.3f} |
| MTP held-out | loss {i['heldout_mtp_loss']:.4f}; top-1 accuracy on the next-next token {i['heldout_mtp_top1']:.3f} |
| date, device | {i['date']}, {i['device']} (torch {i['torch']}, transformers {i['transformers']}) |

Held-out numbers are over {i['eval_windows']} random windows of {i['seq']} tokens from the held-out files.
Not a useful language model: a test article for decoding engines.
"""


def main(argv=None) -> int:
    from tqdm import tqdm

    from treewy.models import build, save, tiny_config
    from treewy.models.corpus import corpus_ids, stdlib_files
    from treewy.models.layers import fla_chunk
    from treewy.models.spec import spec_of

    ap = argparse.ArgumentParser(prog="python -m treewy.models.train_tiny", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="checkpoint directory (default: treewy/models/tiny)")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-time budget of the training loop")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--max-files", type=int, default=None, help="use only the first N files per split")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--metrics", default=None, help="also write the card's numbers to this JSON file")
    args = ap.parse_args(argv)

    import transformers

    from treewy.models import TINY_DIR
    out = Path(args.out) if args.out else TINY_DIR
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    train = torch.tensor(corpus_ids("train", args.max_files), dtype=torch.int16)
    held = torch.tensor(corpus_ids("heldout", args.max_files), dtype=torch.int16)
    train_files, held_files = len(stdlib_files("train", max_files=args.max_files)), \
        len(stdlib_files("heldout", max_files=args.max_files))
    cfg = tiny_config(**SIZES[args.size])
    model = build(cfg, seed=args.seed).to(device).train()
    spec = spec_of(model)
    mtp = model.mtp
    use_fla = None
    autocast = device.type == "cuda"
    if device.type == "cuda" and fla_chunk() is not None:
        try:  # fla's chunk kernel, if it compiles here; else the torch closed form
            w = _windows(train, 2, args.seq + 1, torch.Generator().manual_seed(0)).long().to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                m, ml, _, _ = losses(spec, mtp, w, use_fla=True)
            (m + ml).backward()
            model.zero_grad(set_to_none=True)
            use_fla = True
        except Exception as e:  # noqa: BLE001
            print(f"fla chunk kernel failed ({type(e).__name__}: {e}); using the torch closed form", file=sys.stderr)
            use_fla = False
    kernel = "fla-core chunk_gated_delta_rule" if use_fla else "torch chunked closed form (treewy)"
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in n or n.endswith(("A_log", "dt_bias")) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    budget = args.minutes * 60
    t0 = time.time()
    hist = []
    step = 0
    bar = tqdm(total=args.max_steps or None, desc="train tiny", unit="step", mininterval=2.0)
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1 or (args.max_steps and step >= args.max_steps):
            break
        if args.max_steps:
            frac = max(frac, step / args.max_steps)
        lr = args.lr * (min(1.0, step / 100) if step < 100 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gidx in opt.param_groups:
            gidx["lr"] = lr
        xb = _windows(train, args.batch, args.seq + 1, gen).long().to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            main_loss, mtp_loss, acc, macc = losses(spec, mtp, xb, use_fla)
        loss = main_loss + args.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            hist.append((step, main_loss.item(), mtp_loss.item()))
            bar.set_postfix(loss=f"{hist[-1][1]:.3f}", mtp=f"{hist[-1][2]:.3f}", lr=f"{lr:.1e}")
        bar.update(1)
    bar.close()
    train_seconds = time.time() - t0
    model.eval()
    ev = evaluate(spec, mtp, held.long(), args.eval_windows, args.seq + 1, args.batch, device, use_fla, autocast)
    last = hist[-5:] if hist else [(0, float("nan"), float("nan"))]
    save(model, out)
    n_mtp = sum(p.numel() for p in mtp.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    info = dict(
        architecture=type(model).__name__,
        layer_pattern=" / ".join("GDN" if t == "linear_attention" else "attention" for t in cfg.layer_types),
        **{k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                        "linear_conv_kernel_dim", "num_attention_heads", "num_key_value_heads",
                                        "head_dim", "vocab_size")},
        state_bytes=spec.state_block_bytes, params=n_all, params_main=n_all - n_mtp, params_mtp=n_mtp,
        file_mb=(out / "model.safetensors").stat().st_size / 2**20,
        python=platform.python_version(), train_files=train_files, heldout_files=held_files,
        train_tokens=train.numel(), heldout_tokens=held.numel(), steps=step, batch=args.batch, seq=args.seq,
        tokens_seen=step * args.batch * args.seq, epochs=step * args.batch * args.seq / max(1, train.numel()),
        train_seconds=train_seconds, lr=args.lr, mtp_weight=args.mtp_weight, gdn_kernel=kernel,
        train_loss=sum(h[1] for h in last) / len(last), train_mtp_loss=sum(h[2] for h in last) / len(last),
        heldout_loss=ev["loss"], heldout_bpb=ev["loss"] / math.log(2), heldout_top1=ev["top1"],
        heldout_mtp_loss=ev["mtp_loss"], heldout_mtp_top1=ev["mtp_top1"], eval_windows=args.eval_windows,
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})",
        precision="bf16 autocast" if autocast else "fp32",
        torch=torch.__version__, transformers=transformers.__version__, size=args.size,
        history=hist,
    )
    (out / "README.md").write_text(model_card(info))
    if args.metrics:
        Path(args.metrics).write_text(json.dumps(info, indent=1))
    print(f"saved {out}: {step} steps, held-out loss {ev['loss']:.4f}, MTP top-1 {ev['mtp_top1']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
