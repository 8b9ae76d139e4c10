"""The flush test's failure on the H200 at 788123f (slot 5 after a flush at node 2; fixed in bad4380): the pools of
tests/test_serve_spec_step.py's flush_case, flushed by the GPU kernel and, in a second process, by the Triton
interpreter, each against fp64, per slot and (for the GPU) per value head.

    PYTHONPATH=$PWD python3 benchmarks/flush_error_probe.py OUT
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_serve_spec_step as T  # noqa: E402

from treewy.serve.reconstruct import ReconstructPools  # noqa: E402
from treewy.testing import rel_err  # noqa: E402

ACCEPTED = 2
FLUSHED = (2, 4, 5)


def flush_on_this_device(out: Path) -> None:
    pools, flush = T.flush_case()
    torch.save({"pools": [t.cpu().clone() for t in (pools.state, pools.u, pools.k, pools.g, pools.meta)],
                "flush": flush.cpu()}, out / "pools.pt")
    T.flush_slots(pools, flush, ACCEPTED)
    torch.save(pools.state.cpu(), out / "gpu_state.pt")


def compare_under_the_interpreter(out: Path) -> None:
    saved = torch.load(out / "pools.pt")
    flush = saved["flush"]
    pools = ReconstructPools(*(t.clone() for t in saved["pools"]))
    ref = ReconstructPools(*(t.double() if t.is_floating_point() else t.clone() for t in saved["pools"]))
    T.naive_flush_slots(ref, flush, ACCEPTED, dtype=torch.float64)
    T.flush_slots(pools, flush, ACCEPTED)
    gpu = torch.load(out / "gpu_state.pt")
    for s in FLUSHED:
        print(f"slot {s}: gpu vs fp64 {rel_err(gpu[s], ref.state[s]):.3g}, interpreter vs fp64 "
              f"{rel_err(pools.state[s], ref.state[s]):.3g}, gpu vs interpreter "
              f"{rel_err(gpu[s], pools.state[s].double()):.3g}")
        per_head = (gpu[s].double() - ref.state[s]).norm(dim=(1, 2)) / ref.state[s].norm(dim=(1, 2))
        print("   per head gpu vs fp64:", [f"{v:.2g}" for v in per_head.tolist()])


if __name__ == "__main__":
    out = Path(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "interpreter":
        compare_under_the_interpreter(out)
    else:
        flush_on_this_device(out)
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([sys.executable, __file__, str(out), "interpreter"], env=env, check=True)
