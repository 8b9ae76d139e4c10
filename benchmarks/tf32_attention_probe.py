"""Would tf32 attention move an fp32 near-tie? The tiny model on the CPU, attention's operands rounded to tf32 (CPU).

    python -m benchmarks.tf32_attention_probe REPORT --prompt 6 --tokens 79 69

vLLM serves fp32 models with its Triton attention, whose ``tl.dot`` reads fp32 tiles as tf32 by default. This
re-scores a prompt of a ``vllm_serve_gpu.py tiny`` report with the tiny model in fp32 four ways: torch's attention,
the same attention written out (a check that the substitute is exact), and with q, k, softmax(qk) and v rounded to
tf32 (to nearest and truncated) before each product, sums in fp32. It prints logit[a] - logit[b] at the prompt's
last position for each: whether rounding attention's operands to tf32 alone can flip the two tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F



def tf32_nearest(x):
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_truncated(x):
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def attention_with(rnd):
    """A stand-in for F.scaled_dot_product_attention with every product's operands passed through ``rnd``."""
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **_):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            r = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(r, -3), v.repeat_interleave(r, -3)
        s = (rnd(q) @ rnd(k).transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        L, S = q.shape[-2], k.shape[-2]
        if is_causal:
            s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).tril(S - L).logical_not(), float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return rnd(torch.softmax(s, -1)) @ rnd(v)
    return sdpa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--tokens", type=int, nargs=2, required=True, metavar=("A", "B"))
    args = ap.parse_args(argv)

    from treewy.models import load

    prompt = json.loads(Path(args.report).read_text())["prompts"][args.prompt]
    model = load("tiny", dtype=torch.float32)
    a, b = args.tokens
    stock = F.scaled_dot_product_attention
    ways = (("torch sdpa, fp32", None), ("written out, fp32", lambda x: x), ("tf32, to nearest", tf32_nearest),
            ("tf32, truncated", tf32_truncated))
    try:
        for name, rnd in ways:
            F.scaled_dot_product_attention = stock if rnd is None else attention_with(rnd)
            with torch.no_grad():
                logits = model(torch.tensor([prompt])).logits[0, -1].double()
            print(f"{name:18s} logit[{a}] - logit[{b}] = {float(logits[a] - logits[b]):+.5f}, "
                  f"argmax {int(logits.argmax())}")
    finally:
        F.scaled_dot_product_attention = stock
    return 0


if __name__ == "__main__":
    sys.exit(main())
