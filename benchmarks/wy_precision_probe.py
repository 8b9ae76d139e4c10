"""Where does the WY pair's output error at (3,3,3) come from on the GPU? Each launch's precision and each stream
config separately, against the fp64 reference (outputs and pseudo-values, relative RMS).

    PYTHONPATH=. python benchmarks/wy_precision_probe.py --out DIR

bench_kernels.py (H200, 2026-11-30) found the default "tf32" outputs 4-6 % off at (3,3,3) while "ieee" and
"tf32_plain" were accurate; the interpreter shows no error. This probe runs the prepare and the stream kernel
with different precisions and the stream kernel with each of its configs, so the faulty piece is named.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treewy.ops import naive_tree_verify  # noqa: E402
from treewy.ops.tree_verify.wy import STREAM_CONFIGS, wy_prepare_fwd, wy_stream_fwd  # noqa: E402
from treewy.testing import rel_err  # noqa: E402
from treewy.tree import DraftTree  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--B", type=int, default=8)
    args = ap.parse_args(argv)
    import triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    rows = []
    for widths in ((3, 3, 3), (2, 2, 2)):
        tree = DraftTree.from_widths(widths)
        T, B, H, HV, K, V = tree.num_nodes, args.B, 16, 32, 128, 128
        q = torch.randn(B, T, H, K, generator=gen)
        k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
        v = torch.randn(B, T, HV, V, generator=gen)
        g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 4
        beta = torch.rand(B, T, HV, generator=gen)
        S = torch.randn(B, HV, V, K, generator=gen) * 0.3
        par = tree.parents.to(dev, torch.int32)
        for dtype in (torch.bfloat16, torch.float32):
            x = [t.to(dev, dtype) for t in (q, k, v)] + [t.to(dev) for t in (g, beta)]
            o_ref, u_ref = naive_tree_verify(*[t.double().cpu() for t in x], S.double(), tree.parents)
            BT = max(16, triton.next_power_of_2(T))
            cases = [(pp, sp, None) for pp in ("tf32", "tf32_plain", "ieee") for sp in ("tf32", "tf32_plain")]
            prec_key = {"tf32": "tf32", "tf32_plain": "tf32"}
            cases += [("tf32", "tf32", c) for c in STREAM_CONFIGS[(prec_key["tf32"], BT)]]
            for pp, sp, cfg in cases:
                prep = wy_prepare_fwd(x[0], x[1], x[3], x[4], par, 0, None, K ** -0.5, False, pp)
                o = torch.empty_like(x[2])
                u = torch.empty(x[2].shape, device=dev, dtype=torch.float32)
                config = None if cfg is None else triton.Config({"BV": cfg[0], "BK": cfg[1]}, num_warps=cfg[2],
                                                                num_stages=cfg[3])
                wy_stream_fwd(x[0], x[1], x[2], S.to(dev).clone(), None, prep, None, False, o, u, sp, config=config)
                torch.cuda.synchronize() if dev == "cuda" else None
                row = {"tree": str(widths), "inputs": str(dtype).replace("torch.", ""), "prepare": pp, "stream": sp,
                       "config": cfg, "o_err": rel_err(o.cpu(), o_ref), "u_err": rel_err(u.cpu(), u_ref)}
                rows.append(row)
                print(f"{row['tree']} {row['inputs']:8s} prepare {pp:10s} stream {sp:10s} cfg {str(cfg):18s} "
                      f"o {row['o_err']:.2e}  u {row['u_err']:.2e}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev_name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    (out / "wy_precision_probe.json").write_text(json.dumps({"device": dev_name, "date": time.strftime("%Y-%m-%d"),
                                                             "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
