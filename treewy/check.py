"""`treewy check`: the TreeWY closed form against the store-all recurrence on random trees.

For every shape and dtype it reports the relative RMS error, against the fp64 recurrence, of
the outputs and of the state committed at every node (the worst node), beside the error of the
recurrence itself run in that dtype. With --kernels, each Triton kernel against its fp64 reference,
beside that reference's own error in the row's dtype, within FP32_FACTOR times it in fp32
(``treewy.bench.parity``). Exits non-zero if any row misses its tolerance or bound.
"""

from __future__ import annotations

import argparse
import time

import torch

from treewy.ops import naive_tree_commit, naive_tree_recurrent, naive_tree_verify
from treewy.testing import random_gdn_inputs, random_tree, rel_err
from treewy.tree import DraftTree

#: Relative RMS tolerance of the closed form per dtype (issue 2's claims). A fixed bar, not a multiple of the
#: recurrence's own fp32 error: the closed form is a different algorithm whose fp32 error grows with depth
#: (about 20 times the recurrence's on 48-64-deep chains).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}

#: (name, tree, H, HV, K, V): chains, stars, the paper's shapes, random trees, GVA 2x and 4x, awkward dims.
def default_cases(seed: int = 0) -> list[tuple[str, DraftTree, int, int, int, int]]:
    gen = torch.Generator().manual_seed(seed)
    cases = [("chain 1", DraftTree.chain(1), 2, 4, 16, 16), ("chain 7", DraftTree.chain(7), 2, 4, 16, 16)]
    for w in [(2, 1, 1), (2, 2, 2), (3, 3, 3)]:
        cases.append((str(w), DraftTree.from_widths(w), 2, 4, 16, 16))
    cases.append(("star 16", DraftTree.from_widths((16,)), 2, 8, 16, 16))
    cases.append(("random 64", random_tree(64, gen), 2, 4, 60, 100))
    cases.append(("random 33", random_tree(33, gen), 4, 8, 32, 24))
    return cases


def parity_row(name: str, tree: DraftTree, H: int, HV: int, K: int, V: int, dtype, seed: int = 0,
               **input_kwargs) -> dict:
    x = random_gdn_inputs(tree, B=2, H=H, HV=HV, K=K, V=V, seed=seed, **input_kwargs)
    o_ref, states_ref = naive_tree_recurrent(*x.args())                      # fp64 truth
    xd = x.to(dtype=dtype)
    o_rec, states_rec = naive_tree_recurrent(*xd.args())
    o, u = naive_tree_verify(*xd.args())
    state_err = rec_state_err = 0.0
    for a in range(tree.num_nodes):
        S = naive_tree_commit(xd.initial_state, u, xd.k, xd.g, tree, torch.full((2,), a))
        state_err = max(state_err, rel_err(S, states_ref[:, a]))
        rec_state_err = max(rec_state_err, rel_err(states_rec[:, a], states_ref[:, a]))
    tol = TOLERANCE[dtype]
    o_err = rel_err(o, o_ref)
    return {
        "shape": name, "T": tree.num_nodes, "H": H, "HV": HV, "K": K, "V": V,
        "dtype": str(dtype).removeprefix("torch."),
        "o_err": o_err, "state_err": state_err,
        "recurrence_o_err": rel_err(o_rec, o_ref), "recurrence_state_err": rec_state_err,
        "tol": tol, "ok": o_err <= tol and state_err <= tol,
    }


def reference_parity_rows(dtypes=(torch.float64, torch.float32), seed: int = 0) -> list[dict]:
    return [parity_row(*case, dtype=dt, seed=seed) for case in default_cases(seed) for dt in dtypes]


def format_table(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.2e}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernels", action="store_true",
                        help="also check the Triton kernels against the fp64 reference "
                             "(GPU when present, the Triton interpreter on CPU)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows = reference_parity_rows(seed=args.seed)
    print("closed form (TreeWY) vs store-all recurrence; relative RMS error against the fp64 recurrence")
    print(format_table(rows))
    ok = all(r["ok"] for r in rows)
    if args.kernels:
        from treewy.bench.parity import BF16_FACTOR, O_TF32_TOL, kernel_parity_rows
        from treewy.testing import FP32_FACTOR

        krows = kernel_parity_rows(quick=True)
        print("\nkernels vs fp64 reference; ref_err: the reference's own error run in the row's dtype; bound: "
              f"{FP32_FACTOR:g} x ref_err in fp32, {BF16_FACTOR:g} x in bf16 (fp32 o through one tf32 pass: "
              f"{O_TF32_TOL:g})")
        print(format_table(krows))
        ok = ok and all(r["ok"] for r in krows)
    print(f"\n{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1
