"""Where greedy outputs of the tiny-model runs on real vLLM differ, and whether each difference is a near-tie (CPU).

    python -m benchmarks.vllm_divergence benchmarks/results/vllm_h200_2026-11-30/tiny_session5.json

Reads a report of ``vllm_serve_gpu.py tiny`` / ``compare`` and, for every pair of outputs that differ (store_all vs
reconstruct in the same phase, and each run vs ``treewy.decode.generate``), finds the first token where they part
and re-scores the common prefix with the tiny model in fp32 on the CPU. A difference is a near-tie when the fp32
model's top two logits there lie within ``--tie`` of each other: then bf16 rounding in either engine's kernels can
pick either token, and neither side is wrong. A larger margin marks a bug to chase. Prints one line per difference
and writes the rows next to the report (``*.divergence.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import first_difference, next_logits

ROOT = Path(__file__).resolve().parents[1]


def pairs(report: dict):
    """(label, prompt index, tokens a, tokens b) for every differing pair of outputs."""
    ref = report["treewy_generate"]
    by_phase: dict[tuple[str, str], dict[str, list]] = {}
    for run in report["runs"]:
        for ph, d in run.get("phases", {}).items():
            by_phase.setdefault((run["tag"], ph), {})[run["mode"]] = d["outputs"]
            for i, out in enumerate(d["outputs"]):
                if first_difference(out, ref[i]) is not None:
                    yield f"{run['tag']}/{ph} {run['mode']} vs treewy", i, out, ref[i]
    for (tag, ph), modes in by_phase.items():
        if len(modes) == 2:
            for i, (a, b) in enumerate(zip(modes["store_all"], modes["reconstruct"])):
                if first_difference(a, b) is not None:
                    yield f"{tag}/{ph} store_all vs reconstruct", i, a, b


def tie_rate(model, report: dict, tie: float) -> dict:
    """How many greedy positions along treewy's outputs have fp32 top-two logits within ``tie``: the base rate."""
    import torch

    positions = ties = 0
    for prompt, out in zip(report["prompts"], report["treewy_generate"]):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].double()
        top2 = torch.topk(logits, 2, dim=-1).values
        ties += int(((top2[:, 0] - top2[:, 1]) < tie).sum())
        positions += len(out)
    return {"positions": positions, "ties": ties}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--tie", type=float, default=0.05, help="fp32 top-two logit margin below which a split is a tie")
    args = ap.parse_args(argv)
    import torch

    from treewy.models import load

    report = json.loads(Path(args.report).read_text())
    model = load("tiny", dtype=torch.float32)
    rows = []
    for label, i, a, b in pairs(report):
        at = first_difference(a, b)
        logits = next_logits(model, report["prompts"][i] + a[:at])
        top2 = torch.topk(logits, 2)
        margin = float(logits[a[at]] - logits[b[at]])
        rows.append({"pair": label, "prompt": i, "token": at, "a": a[at], "b": b[at], "fp32_argmax": int(top2.indices[0]),
                     "top2_margin": float(top2.values[0] - top2.values[1]), "margin_a_minus_b": margin,
                     "near_tie": abs(margin) < args.tie})
        r = rows[-1]
        side = "a" if r["fp32_argmax"] == r["a"] else "b" if r["fp32_argmax"] == r["b"] else "neither"
        print(f"{label:45s} prompt {i:2d} token {at:3d}: {a[at]:5d} vs {b[at]:5d}, fp32 logit gap {margin:+.4f} "
              f"(fp32 picks {side}){'' if r['near_tie'] else '  NOT A TIE'}")
    base = tie_rate(model, report, args.tie)
    out = Path(args.report).with_suffix(".divergence.json")
    base["percent"] = round(100 * base["ties"] / base["positions"], 2)
    out.write_text(json.dumps({"tie": args.tie, "tie_rate_along_reference": base, "rows": rows}, indent=1))
    ties = sum(r["near_tie"] for r in rows)
    print(f"{len(rows)} differences, {ties} near-ties (|fp32 gap| < {args.tie}); along the reference outputs "
          f"{base['ties']} of {base['positions']} greedy positions ({base['percent']:.2f} %) "
          f"are that close; wrote {out}")
    return 0 if ties == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
