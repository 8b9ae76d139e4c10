"""Kernel rows of the `treewy check --kernels` parity table: each Triton kernel against its fp64 reference.

On a GPU the kernels run natively (tf32 off); on CPU under the Triton interpreter, so the quick
set stays small (a few seconds). Errors are relative RMS against the fp64 reference on the kernel's own
inputs (drawn in fp32). Each row also gives ``ref_err``, the error of the same reference run in the row's
dtype: fp32 rows must stay within FP32_FACTOR times it (``treewy.testing.fp32_bound``), bf16 rows within
twice it. Where the tree kernels take their outputs o through one tf32 pass (GPUs, by default), the fp32 o
rows are bounded by O_TF32_TOL instead (``treewy.testing.output_bound``).
"""

from __future__ import annotations

import torch

from treewy.ops.verify import select_kernel
from treewy.testing import (
    FP32_FACTOR, FP32_FLOOR, O_TF32_TOL, output_bound, output_tf32, picked_kernel, random_gdn_inputs, random_tree,
    rel_err,
)
from treewy.tree import DraftTree, path_depth

#: A bf16 kernel may be this many times the error of its reference run in bf16.
BF16_FACTOR = 2.0


def bound(dtype, ref_err: float) -> float:
    """A kernel's bound in ``dtype`` from ``ref_err``, the error of its reference run in that dtype."""
    if dtype == torch.float32:
        return FP32_FACTOR * max(ref_err, FP32_FLOOR)
    return BF16_FACTOR * ref_err


def worst(pairs, dtype) -> tuple[float, float]:
    """The (err, ref_err) pair nearest its bound (or furthest past it)."""
    return max(pairs, key=lambda p: p[0] / max(bound(dtype, p[1]), 1e-300))


def _cases(quick: bool, on_gpu: bool):
    gen = torch.Generator().manual_seed(0)
    if on_gpu:
        cases = [("chain 3", DraftTree.chain(3), 2, 16, 32, 128, 128),
                 ("(2, 2, 2)", DraftTree.from_widths((2, 2, 2)), 2, 16, 32, 128, 128),
                 ("(3, 3, 3)", DraftTree.from_widths((3, 3, 3)), 2, 16, 64, 128, 128),
                 ("random 64", random_tree(64, gen), 2, 4, 16, 60, 100)]
        return cases if quick else cases + [("chain 7", DraftTree.chain(7), 8, 16, 32, 128, 128)]
    cases = [("chain 3", DraftTree.chain(3), 2, 2, 4, 16, 16),
             ("(2, 2, 1)", DraftTree.from_widths((2, 2, 1)), 2, 1, 4, 32, 24)]
    if not quick:
        cases += [("(3, 3, 3)", DraftTree.from_widths((3, 3, 3)), 1, 1, 2, 60, 100),
                  ("random 33", random_tree(33, gen), 2, 2, 4, 32, 24)]
    return cases


def _row(op, shape, dtype, B, T, H, HV, K, V, err, ref_err, tol=None):
    tol = bound(dtype, ref_err) if tol is None else tol
    return {"op": op, "shape": shape, "dtype": str(dtype).removeprefix("torch."), "B": B, "T": T, "H": H,
            "HV": HV, "K": K, "V": V, "err": float(err), "ref_err": float(ref_err), "bound": float(tol),
            "ok": bool(err <= tol)}


def kernel_parity_rows(device=None, quick: bool = True) -> list[dict]:
    """Rows {op, shape, dtype, B, T, H, HV, K, V, err, ref_err, bound, ok} for verify, commit, store-all and
    conv: err is the kernel's error against the fp64 reference, ref_err the reference's own in the row's dtype."""
    from treewy.ops import (
        PendingCommit, naive_tree_commit, naive_tree_conv1d, naive_tree_conv1d_commit, naive_tree_recurrent,
        naive_tree_step, naive_tree_verify, store_all_verify, tree_commit, tree_conv1d, tree_conv1d_commit,
        tree_verify,
    )

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
    dtypes = (torch.float32, torch.bfloat16) if on_gpu else (torch.float32,)
    rows = []
    f32 = torch.float32
    for shape, tree, B, H, HV, K, V in _cases(quick, on_gpu):
        T = tree.num_nodes
        # the fp32 outputs of the family tree_verify picks (fp32 state, as in every fp32 row): one tf32 pass or not
        o_tf32 = output_tf32(picked_kernel(T, B, tree.max_depth == T - 1, device=device), device)
        row = lambda op, dt, *errs: _row(op, shape, dt, B, T, H, HV, K, V, *errs)  # noqa: E731
        x = random_gdn_inputs(tree, B=B, H=H, HV=HV, K=K, V=V, seed=T, device=device, g_min=-1.0, dtype=f32)
        x.initial_state *= 0.3
        x64 = x.to(dtype=torch.float64)
        ro, ru = naive_tree_verify(*x64.args())
        for dt in dtypes:
            xd = x.to(dtype=dt)
            xd.initial_state = x.initial_state
            bo, bu = naive_tree_verify(*x.to(dtype=dt).args())   # the reference run in dt (bf16: state too)
            o, u = tree_verify(*xd.args())
            rows.append(row("tree_verify o", dt, rel_err(o, ro), rel_err(bo, ro),
                            O_TF32_TOL if o_tf32 and dt == f32 else None))
            rows.append(row("tree_verify u", dt, rel_err(u, ru), rel_err(bu, ru)))
            if dt != f32:
                continue
            pairs = []
            for a in (range(T) if (T <= 16 or not on_gpu) else sorted({0, T // 2, T - 1})):
                acc = torch.full((B,), a)
                st = x.initial_state.clone()
                tree_commit(st, u, x.k, x.g, x.parents, acc)
                ref = naive_tree_commit(x64.initial_state, ru, x64.k, x64.g, tree, acc)
                pairs.append((rel_err(st, ref), rel_err(naive_tree_commit(x.initial_state, bu, x.k, x.g, tree, acc),
                                                        ref)))
            rows.append(row("tree_commit", dt, *worst(pairs, dt)))
            # the previous window's commit (this window, its last node) folded into a verify of it
            acc = torch.full((B,), T - 1, dtype=torch.int32)
            st = x.initial_state.clone()
            o2, u2 = tree_verify(*x.args()[:5], st, x.parents, pending=PendingCommit(u, x.k, x.g, x.parents,
                                                                                   acc.to(device)))
            r64 = naive_tree_step(*x64.args(), pending=PendingCommit(ru, x64.k, x64.g, x.parents, acc))
            r32 = naive_tree_step(*x.args(), pending=PendingCommit(bu, x.k, x.g, x.parents, acc))
            for name, out, a64, a32 in zip(("o", "u", "state"), (o2, u2, st), r64, r32):
                rows.append(row(f"tree_verify + pending {name}", dt, rel_err(out, a64), rel_err(a32, a64),
                                O_TF32_TOL if o_tf32 and name == "o" else None))
            so, states = store_all_verify(*x.args())
            r64, r32 = naive_tree_recurrent(*x64.args()), naive_tree_recurrent(*x.args())
            for name, out, a64, a32 in zip(("o", "states"), (so, states), r64, r32):
                rows.append(row(f"store_all_verify {name}", dt, rel_err(out, a64), rel_err(a32, a64)))
        C = 3 * HV * 8 if not on_gpu else 2 * H * K + HV * V
        gen = torch.Generator().manual_seed(T)
        xc = torch.randn(B, T, C, generator=gen).to(device)
        w = torch.randn(C, 4, generator=gen).to(device)
        cs = torch.randn(B, C, 3, generator=gen).to(device)
        y = tree_conv1d(xc, w, cs, tree)
        ry = naive_tree_conv1d(xc.double(), w.double(), cs.double(), tree)
        rows.append(_row("tree_conv1d", shape, f32, B, T, 0, 0, 0, C, rel_err(y, ry),
                         rel_err(naive_tree_conv1d(xc, w, cs, tree), ry)))
        err = 0.0
        for a in (range(T) if T <= 16 else (0, T - 1)):
            c2 = cs.clone()
            tree_conv1d_commit(xc, c2, tree, torch.full((B,), a))
            err = max(err, rel_err(c2, naive_tree_conv1d_commit(xc.double(), cs.double(), tree, torch.full((B,), a))))
        rows.append(_row("tree_conv1d_commit", shape, f32, B, T, 0, 0, 0, C, err, 0.0, tol=0.0))   # a copy: exact
    return rows


def node_errors(tree: DraftTree, B: int = 2, H: int = 2, HV: int = 4, K: int = 16, V: int = 16, *,
                dtype=torch.float32, device=None, seed: int = 0) -> list[dict]:
    """Per node: the kernels' output error and the error of the state committed at that node, each
    relative RMS against the fp64 recurrence (the store-all truth) on the kernel's inputs (drawn in fp32), with
    the bound that applies (``bound``: from the recurrence itself run in ``dtype``)."""
    from treewy.ops import naive_tree_recurrent, tree_commit, tree_verify

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    x = random_gdn_inputs(tree, B=B, H=H, HV=HV, K=K, V=V, seed=seed, device=device, g_min=-1.0,
                          dtype=torch.float32)
    ro, rstates = naive_tree_recurrent(*x.to(dtype=torch.float64).args())
    xd = x.to(dtype=dtype)
    xd.initial_state = x.initial_state
    low = naive_tree_recurrent(*x.to(dtype=dtype).args())  # the reference run in dtype (bf16: state too)
    T = tree.num_nodes
    o_tf32 = dtype == torch.float32 and output_tf32(picked_kernel(T, B, tree.max_depth == T - 1, device=device),
                                                    device)
    o, u = tree_verify(*xd.args())
    depth = tree.depth.tolist()
    rows = []
    for a in range(tree.num_nodes):
        st = xd.initial_state.clone()
        tree_commit(st, u, xd.k, xd.g, xd.parents, torch.full((B,), a, device=device))
        rows.append({"node": a, "depth": depth[a], "o_err": rel_err(o[:, a], ro[:, a]),
                     "state_err": rel_err(st, rstates[:, a]),
                     "o_tol": output_bound(o_tf32, bound(dtype, rel_err(low[0][:, a], ro[:, a]))),
                     "state_tol": bound(dtype, rel_err(low[1][:, a], rstates[:, a]))})
    return rows


def folded_drift(steps: int = 200, B: int = 2, H: int = 1, HV: int = 1, K: int = 16, V: int = 16, *,
                 trees=None, device=None, seed: int = 11, check_every: int = 20, dot_precision=None,
                 input_dtype=torch.float32, kernel=None, config=None, progress=None) -> dict:
    """Run ``steps`` verify steps with each commit folded into the next verify (random trees, random
    accepted nodes) beside the fp64 recurrence run step by step from the same start.

    trees: a list of DraftTrees drawn from at random each step (default: random topologies of 1-6
    nodes, and 17-19 every eighth step). Returns {"state_err": worst relative
    RMS error of the flushed state against the recurrence over the checkpoints, "final_state_err",
    "out_err": worst output error, "out_tf32": whether any step's kernel took its outputs through one tf32 pass
    (``treewy.testing.output_tf32``: their bound is then O_TF32_TOL), "steps", "history": [{"step", "state_err"}]
    per checkpoint}.
    ``kernel``, ``dot_precision``, ``config``: as in tree_verify_fwd (kernel None: the tree kernel, as for any
    window not known to be a chain). ``progress``: optional callable(step).
    """
    from treewy.ops import PendingCommit, flush_pending, naive_tree_recurrent
    from treewy.ops.verify.kernel import tree_verify_fwd
    from treewy.ops.verify.tuning import check_dot_precision

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(seed)
    S_ref = torch.randn(B, HV, V, K, generator=gen, dtype=torch.float64).to(device) * 0.3
    state = S_ref.float()
    pend, worst_state, worst_out, final, history, out_tf32 = None, 0.0, 0.0, None, [], False
    exact = check_dot_precision(dot_precision, device) == "ieee"
    for step in range(steps):
        if trees is None:
            T = int(torch.randint(1, 7, (1,), generator=gen)) if step % 8 else 17 + step % 3
            tree = torch.tensor([random_tree(T, gen).parents.tolist() for _ in range(B)], dtype=torch.int32)
        else:
            tree = trees[int(torch.randint(0, len(trees), (1,), generator=gen))].parents.to(torch.int32)
        T = tree.shape[-1]
        x = random_gdn_inputs(tree, B=B, H=H, HV=HV, K=K, V=V, seed=int(torch.randint(0, 2**31, (1,), generator=gen)),
                              device=device, g_min=-1.0)
        q, k, v, g, beta = (t.to(input_dtype) for t in (x.q, x.k, x.v, x.g, x.beta))
        par = tree.to(device)
        o, u = tree_verify_fwd(q, k, v, g, beta, state, par, 0 if par.ndim == 1 else T, K ** -0.5, pending=pend,
                               dot_precision=dot_precision, kernel=kernel, config=config,
                               max_depth=int(path_depth(tree).max()))
        ro, states = naive_tree_recurrent(q.double(), k.double(), v.double(), g.double(), beta.double(), S_ref, par)
        worst_out = max(worst_out, rel_err(o, ro))
        # the family tree_verify_fwd ran: kernel=None takes select_kernel's pick for a window not known to be a chain
        out_tf32 |= output_tf32(kernel or select_kernel(T, B, False, False, exact), device, dot_precision)
        acc = torch.randint(0, T, (B,), generator=gen)
        S_ref = states[torch.arange(B, device=device), acc.to(device)]
        pend = PendingCommit(u, k, g, par, acc.to(device, torch.int32))
        if step % check_every == check_every - 1 or step == steps - 1:
            final = rel_err(flush_pending(state.clone(), pend), S_ref)
            worst_state = max(worst_state, final)
            history.append({"step": step + 1, "state_err": final})
        if progress is not None:
            progress(step)
    return {"state_err": worst_state, "final_state_err": final, "out_err": worst_out, "out_tf32": out_tf32,
            "steps": steps, "history": history}
