"""Properties of every public op against its fp64 reference, on random batches drawn by hypothesis.

A batch mixes per-request topologies (chains, stars, random trees in DFS, BFS and other topological orders),
ragged ``num_nodes`` (0 included), GVA ratios, fp32 and bf16 inputs and states, non-contiguous inputs, scales
and keys normalized in the kernel. Each kernel output must lie within ``FP32_FACTOR`` times the error of the same
reference run in fp32 on the same inputs (``treewy.testing.fp32_bound``; and, for bf16 outputs, the rounding of the fp64 result to bf16), so a
regression of the kernels' error by ten fails where the old blanket 1e-5 let it pass.

Examples per property: ``TREEWY_PROPERTY_EXAMPLES`` (default 20 under the Triton interpreter, about a minute in all on
2 cores; 400 on a GPU; the engine properties half as many).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from treewy.ops import (
    PendingCommit, flush_pending, naive_flush, naive_tree_commit, naive_tree_conv1d, naive_tree_conv1d_commit,
    naive_tree_recurrent, naive_tree_step, naive_tree_verify, store_all_commit, store_all_verify, tree_commit,
    tree_conv1d, tree_conv1d_commit, tree_verify,
)
from treewy.ops.verify import KERNELS
from treewy.ops.verify.kernel import tree_verify_fwd
from treewy.testing import FP32_FACTOR, fp32_bound, normalized, rel_err

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
EXAMPLES = int(os.environ.get("TREEWY_PROPERTY_EXAMPLES", 400 if GPU else 20))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, print_blob=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: A bf16 output may be this many times the error of rounding the fp64 result to bf16 (the interpreter's
#: conversion truncates, up to twice the rounding error; a GPU rounds to nearest), and at least BF16_ULP.
BF16_FACTOR = 3.0
#: One bf16 unit in the last place relative to the value, at most: the least a bf16 bound allows (a few-element
#: tensor's rounding error can be far below its worst element's).
BF16_ULP = 2.0 ** -7
#: Head dims: any small size under the interpreter; on a GPU a few awkward ones and the model's, so that the
#: compiled and autotuned kernels are reused across examples.
SIZES_K = st.sampled_from([5, 33, 128]) if GPU else st.integers(3, 20)
SIZES_V = st.sampled_from([7, 16, 128]) if GPU else st.integers(2, 17)
#: Exact fp32 products, which the fp32 bound is for (tf32 has its own bound in tests/test_verify.py).
EXACT = "ieee"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


#: the properties check results, the same under every config: on a GPU one config per shape, untimed
pytestmark = pytest.mark.usefixtures("one_config_per_shape")


# ---- topologies ----

def _relabel(parents: list[int], order: str) -> list[int]:
    """The same tree with its nodes numbered in DFS preorder or BFS order (both topological)."""
    children: list[list[int]] = [[] for _ in parents]
    for t, p in enumerate(parents[1:], 1):
        children[p].append(t)
    seq, frontier = [], [0]
    while frontier:
        node = frontier.pop() if order == "dfs" else frontier.pop(0)
        seq.append(node)
        frontier.extend(reversed(children[node]) if order == "dfs" else children[node])
    new = {old: i for i, old in enumerate(seq)}
    return [-1] + [new[parents[old]] for old in seq[1:]]


@st.composite
def topologies(draw, T: int) -> list[int]:
    kind = draw(st.sampled_from(["chain", "star", "random", "dfs", "bfs"]))
    if kind == "chain":
        return list(range(-1, T - 1))
    if kind == "star":
        return [-1] + [0] * (T - 1)
    parents = [-1] + [draw(st.integers(0, t - 1)) for t in range(1, T)]
    return parents if kind == "random" else _relabel(parents, kind)


def _is_chain(par: torch.Tensor, num_nodes) -> bool:
    rows = par.reshape(-1, par.shape[-1])
    t = torch.arange(rows.shape[-1])
    ok = rows == t - 1
    if num_nodes is not None:
        ok = ok | (t >= torch.as_tensor(num_nodes)[:, None])
    return bool(ok.all())


# ---- batches ----

@st.composite
def batches(draw, max_T: int = 9, ragged: bool = True):
    """A verify batch: sizes, per-request (or one shared) topology, num_nodes, dtypes and flags."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, max_T))
    H = draw(st.sampled_from([1, 2]))
    shared = draw(st.booleans())
    tops = [draw(topologies(T))] * (1 if shared else B)
    return dict(
        B=B, T=T, H=H, HV=H * draw(st.sampled_from([1, 2, 4])), K=draw(SIZES_K), V=draw(SIZES_V),
        parents=torch.tensor(tops[0] if shared else tops, dtype=torch.int32),
        num_nodes=draw(st.none() | st.lists(st.integers(0, T), min_size=B, max_size=B)) if ragged else None,
        dtype=draw(st.sampled_from(list(DTYPES))), state_dtype=draw(st.sampled_from(list(DTYPES))),
        l2norm=draw(st.booleans()), hard=draw(st.booleans()), strided=draw(st.booleans()),
        scale=draw(st.none() | st.floats(0.05, 2.0)), seed=draw(st.integers(0, 2**31 - 1)),
    )


def _strided(x: torch.Tensor, strided: bool) -> torch.Tensor:
    """x itself, or the same values as a non-contiguous view (every other element of the last dim)."""
    if not strided:
        return x
    wide = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    return wide[..., ::2]


def gdn_inputs(c: dict, T: int | None = None, gen: torch.Generator | None = None):
    """q, k, v, g, beta in the case's dtype (possibly non-contiguous) and a state in its state dtype; ``hard``:
    half the nodes decay by g = -20, the others barely, and beta is 0.999."""
    B, H, HV, K, V = c["B"], c["H"], c["HV"], c["K"], c["V"]
    T = c["T"] if T is None else T
    gen = gen or torch.Generator().manual_seed(c["seed"])
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if not c["l2norm"]:
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    if c["hard"]:
        g = torch.where(torch.rand(B, T, HV, generator=gen) < 0.5, -20.0, -1e-4)
        beta = torch.full((B, T, HV), 0.999)
    else:
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 2
        beta = torch.rand(B, T, HV, generator=gen)
    dt = DTYPES[c["dtype"]]
    ins = [_strided(x.to(DEVICE, dt), c["strided"]) for x in (q, k, v, g, beta)]
    S = (torch.randn(B, HV, V, K, generator=gen) * 0.5).to(DEVICE, DTYPES[c["state_dtype"]])
    return ins, S


def as_ref(ins, dtype, l2norm: bool):
    """The inputs (already rounded to their own dtype) in the reference's dtype, keys normalized if asked."""
    q, k, v, g, beta = (x.to(dtype) for x in ins)
    if l2norm:
        q, k = normalized(q), normalized(k)
    return [q, k, v, g, beta]


def active(x: torch.Tensor, num_nodes) -> torch.Tensor:
    """The nodes each request uses, flattened: [sum of num_nodes, ...]."""
    if num_nodes is None:
        return x.reshape(-1, *x.shape[2:])
    return torch.cat([x[b, :n] for b, n in enumerate(num_nodes)])


def assert_within(name: str, out, ref64, ref32, num_nodes=None, rounded_to=None):
    """out within FP32_FACTOR x ref32's error against ref64 (plus BF16_FACTOR x the rounding of ref64 to the
    output's dtype when that is bf16), over the active nodes; inactive nodes exactly zero."""
    if num_nodes is not None:
        idle = torch.cat([out[b, n:].reshape(-1) for b, n in enumerate(num_nodes)])
        assert not bool(idle.any()), f"{name}: a node past num_nodes was written"
        out, ref64, ref32 = (active(x, num_nodes) for x in (out, ref64, ref32))
    if ref64.numel() == 0:
        return
    bound = fp32_bound(ref32, ref64, FP32_FACTOR)
    if (rounded_to or out.dtype) == torch.bfloat16:
        bound += max(BF16_FACTOR * rel_err(ref64.to(torch.bfloat16), ref64), BF16_ULP)
    err = rel_err(out, ref64)
    assert err <= bound, f"{name}: error {err:.3g} against fp64 above the bound {bound:.3g}"


# ---- tree_verify ----

def _verify_refs(c, ins, S):
    par = c["parents"]
    scale = c["scale"]
    r64 = naive_tree_verify(*as_ref(ins, torch.float64, c["l2norm"]), S.double(), par, scale)
    r32 = naive_tree_verify(*as_ref(ins, torch.float32, c["l2norm"]), S.float(), par, scale)
    return r64, r32


#: The H200's failure at bad4380 (o 1.97e-07 against the bound's floor, 1.79e-07); the likely cause, the GPU's
#: approximate square root and division in the q and k norms and its approximate exp of the gates, is correctly
#: rounded since (not yet run on a GPU)
H200_NORMS = dict(B=1, T=1, H=2, HV=2, K=128, V=7, parents=torch.tensor([[-1]], dtype=torch.int32), num_nodes=None,
                  dtype="fp32", state_dtype="fp32", l2norm=True, hard=True, strided=False, scale=None, seed=608)


@PROPERTY
@given(c=batches(), kernel=st.sampled_from((None,) + KERNELS))
@example(c=H200_NORMS, kernel=None)
def test_tree_verify_matches_fp64_on_random_batches(c, kernel):
    """Every family forced where it applies (chain: every request's window a chain), and the selector's own choice."""
    if kernel == "chain":
        assume(_is_chain(c["parents"], c["num_nodes"]))
    ins, S = gdn_inputs(c)
    (o64, u64), (o32, u32) = _verify_refs(c, ins, S)
    nn = None if c["num_nodes"] is None else torch.tensor(c["num_nodes"], device=DEVICE)
    state = S.clone()
    o, u = tree_verify(*ins, state, c["parents"].to(DEVICE), scale=c["scale"], use_qk_l2norm_in_kernel=c["l2norm"],
                       num_nodes=nn, kernel=kernel, dot_precision=EXACT)
    assert o.dtype == ins[2].dtype and u.dtype == torch.float32
    assert torch.equal(state, S), "verify without a pending commit wrote the state"
    assert_within("o", o, o64, o32, c["num_nodes"])
    assert_within("u", u, u64, u32, c["num_nodes"])


@st.composite
def window_sequences(draw):
    """A batch and 2-3 windows of varying sizes, each with its own topologies and accepted nodes (-1: none)."""
    c = draw(batches(ragged=False))
    windows = []
    for _ in range(draw(st.integers(2, 3))):
        T = draw(st.integers(1, 7))
        tops = [draw(topologies(T)) for _ in range(c["B"])]
        accepted = [draw(st.integers(-1, T - 1)) for _ in range(c["B"])]
        windows.append((torch.tensor(tops, dtype=torch.int32), accepted))
    return c, windows, draw(st.sampled_from((None,) + KERNELS))


def check_step(name, ins, before, after, o, u, parents, pendings, c):
    """One folded step, piece by piece from the kernel's own states: the fold (``before`` -> ``after``) against
    the fp64 flush of ``before``, then o and u against the fp64 verify from ``after``, exactly the state the
    kernel stored and verified from. ``pendings``: the fp64 and fp32 PendingCommit (or None, None).
    Returns the fp64 and fp32 u (the next step's pending)."""
    refs = []
    for dt, pend in zip((torch.float64, torch.float32), pendings):
        flushed = before.to(dt) if pend is None else naive_flush(before.to(dt), pend)
        refs.append((flushed, *naive_tree_verify(*as_ref(ins, dt, c["l2norm"]), after.to(dt), parents, c["scale"])))
    (f64, o64, u64), (f32, o32, u32) = refs
    assert_within(f"{name}: state after the fold", after, f64, f32, rounded_to=after.dtype)
    assert_within(f"{name}: o", o, o64, o32)
    assert_within(f"{name}: u", u, u64, u32)
    return u64, u32


def ref_pendings(us, ins, parents, accepted, c):
    return [PendingCommit(u, as_ref(ins, dt, c["l2norm"])[1], ins[3].to(dt), parents, accepted)
            for u, dt in zip(us, (torch.float64, torch.float32))]


@PROPERTY
@given(case=window_sequences())
def test_pending_fold_over_several_windows_matches_fp64(case):
    """Each window verified with the previous window's commit folded in, the last commit flushed by the commit
    kernel; every fold, output and the final state against fp64."""
    c, windows, kernel = case
    gen = torch.Generator().manual_seed(c["seed"])
    _, state = gdn_inputs(c, T=1, gen=gen)
    pend, pendings = None, (None, None)
    for i, (par, accepted) in enumerate(windows):
        ins, _ = gdn_inputs(c, T=par.shape[-1], gen=gen)
        fam = kernel if kernel != "chain" or _is_chain(par, None) else None
        before = state.clone()
        o, u = tree_verify(*ins, state, par.to(DEVICE), scale=c["scale"], use_qk_l2norm_in_kernel=c["l2norm"],
                           pending=pend, kernel=fam, dot_precision=EXACT)
        us = check_step(f"window {i}", ins, before, state, o, u, par, pendings, c)
        acc = torch.tensor(accepted, dtype=torch.int32)
        pend = PendingCommit(u, ins[1], ins[3], par.to(DEVICE), acc.to(DEVICE), c["l2norm"])
        pendings = ref_pendings(us, ins, par, acc, c)
    before = state.clone()
    flush_pending(state, pend)
    assert_within("final state", state, *(naive_flush(before.to(p.u.dtype), p) for p in pendings),
                  rounded_to=state.dtype)


@PROPERTY
@given(c=batches(ragged=False), spare=st.integers(1, 3), kernel=st.sampled_from((None,) + KERNELS),
       order=st.randoms(use_true_random=False))
def test_state_pool_slots_through_state_indices(c, spare, kernel, order):
    """A serving engine's pool: request b's state and pending stash in slot state_indices[b] of a pool with spare
    slots (never named, as a padding slot) in a shuffled order; the named slots match the fp64 step, the others
    keep every bit."""
    par = c["parents"].expand(c["B"], c["T"]).contiguous()
    chain = _is_chain(par, None)
    if kernel == "chain":
        assume(chain)
    B, T, H, HV, K, V = (c[x] for x in ("B", "T", "H", "HV", "K", "V"))
    c = dict(c, strided=False, scale=None)
    gen = torch.Generator().manual_seed(c["seed"])
    prev, _ = gdn_inputs(c, gen=gen)
    ins, S = gdn_inputs(c, gen=gen)
    slots = list(range(B + spare))
    order.shuffle(slots)
    idx, others = torch.tensor(slots[:B]), torch.tensor(slots[B:])
    pool = (torch.randn(B + spare, HV, V, K, generator=gen) * 0.5).to(DEVICE, S.dtype)
    pool[idx] = S
    us = [naive_tree_verify(*as_ref(prev, dt, c["l2norm"]), S.to(dt), par)[1] for dt in (torch.float64, torch.float32)]
    acc = torch.randint(-1, T, (B,), generator=gen, dtype=torch.int32)
    stash = []
    for x in (us[1], prev[1], prev[3]):
        slot_x = torch.randn(B + spare, *x.shape[1:], generator=gen).to(DEVICE, x.dtype)
        slot_x[idx] = x.to(DEVICE)
        stash.append(slot_x)
    before = pool.clone()
    pend = PendingCommit(*stash, par.to(DEVICE), acc.to(DEVICE), c["l2norm"])
    o, u = tree_verify_fwd(*ins, pool, par.to(DEVICE), T, K ** -0.5, c["l2norm"], pending=pend, kernel=kernel,
                           chain=chain, state_indices=idx.to(DEVICE, torch.int32), dot_precision=EXACT)
    assert torch.equal(pool[others], before[others]), "a slot no request names was written"
    check_step("pool", ins, S, pool[idx], o, u, par, ref_pendings(us, prev, par, acc, c), c)


# ---- tree_commit ----

@PROPERTY
@given(c=batches(ragged=False), data=st.data())
def test_tree_commit_matches_fp64(c, data):
    """The commit kernel from the verify's pseudo-values, accepted = -1 (allow_none) leaving a row as it is."""
    ins, S = gdn_inputs(c)
    u = naive_tree_verify(*as_ref(ins, torch.float32, c["l2norm"]), S.float(), c["parents"])[1]
    acc = torch.tensor(data.draw(st.lists(st.integers(-1, c["T"] - 1), min_size=c["B"], max_size=c["B"])))
    keys = [as_ref(ins, dt, c["l2norm"])[1] for dt in (torch.float64, torch.float32)]
    refs = [naive_flush(S.to(dt), PendingCommit(u.to(dt), kk, ins[3].to(dt), c["parents"], acc))
            for dt, kk in zip((torch.float64, torch.float32), keys)]
    state = S.clone()
    out = tree_commit(state, _strided(u, c["strided"]), ins[1], ins[3], c["parents"].to(DEVICE), acc.to(DEVICE),
                      use_qk_l2norm_in_kernel=c["l2norm"], allow_none=True)
    assert out is state
    keep = (acc < 0).to(DEVICE)
    assert torch.equal(state[keep], S[keep]), "accepted = -1 changed a state"
    assert_within("state", state, *refs, rounded_to=state.dtype)
    ref_plain = naive_tree_commit(S.double(), u.double(), keys[0], ins[3].double(), c["parents"], acc.clamp(min=0))
    assert torch.allclose(refs[0][~keep], ref_plain[~keep])


# ---- store-all ----

@PROPERTY
@given(c=batches(ragged=False), data=st.data())
def test_store_all_verify_and_commit_match_fp64(c, data):
    """Every node's snapshot and output from the store-all kernel; the commit copies the accepted snapshot."""
    ins, S = gdn_inputs(c)
    par, scale = c["parents"], c["scale"]
    r64 = naive_tree_recurrent(*as_ref(ins, torch.float64, c["l2norm"]), S.double(), par, scale)
    r32 = naive_tree_recurrent(*as_ref(ins, torch.float32, c["l2norm"]), S.float(), par, scale)
    o, states = store_all_verify(*ins, S, par.to(DEVICE), scale=scale, use_qk_l2norm_in_kernel=c["l2norm"])
    # a child advances its parent's stored snapshot: over a bf16 state, every output carries bf16 rounding
    assert_within("o", o, r64[0], r32[0], rounded_to=torch.bfloat16 if S.dtype == torch.bfloat16 else None)
    assert_within("states", states, r64[1], r32[1])
    acc = torch.tensor(data.draw(st.lists(st.integers(0, c["T"] - 1), min_size=c["B"], max_size=c["B"])))
    state = torch.zeros_like(S)
    store_all_commit(state, states, acc.to(DEVICE))
    assert torch.equal(state, states[torch.arange(c["B"]), acc].to(state.dtype))


# ---- tree conv1d ----

@st.composite
def conv_cases(draw):
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    shared = draw(st.booleans())
    tops = [draw(topologies(T))] * (1 if shared else B)
    return dict(B=B, T=T, C=draw(st.integers(1, 40)), W=draw(st.integers(2, 4)),
                parents=torch.tensor(tops[0] if shared else tops, dtype=torch.int32),
                dtype=draw(st.sampled_from(list(DTYPES))), bias=draw(st.booleans()),
                activation=draw(st.sampled_from(["silu", None])), strided=draw(st.booleans()),
                accepted=draw(st.lists(st.integers(0, T - 1), min_size=B, max_size=B)),
                seed=draw(st.integers(0, 2**31 - 1)))


@PROPERTY
@given(c=conv_cases())
def test_tree_conv1d_and_commit_match_fp64(c):
    """Each node's conv over its own root..node path; the commit keeps the accepted path's last W - 1 inputs."""
    B, T, C, W = c["B"], c["T"], c["C"], c["W"]
    gen = torch.Generator().manual_seed(c["seed"])
    dt = DTYPES[c["dtype"]]
    x = _strided(torch.randn(B, T, C, generator=gen).to(DEVICE, dt), c["strided"])
    weight = torch.randn(C, W, generator=gen).to(DEVICE, dt)
    bias = torch.randn(C, generator=gen).to(DEVICE, dt) if c["bias"] else None
    conv_state = torch.randn(B, C, W - 1, generator=gen).to(DEVICE, dt)
    par = c["parents"]
    refs = [naive_tree_conv1d(x.to(p), weight.to(p), conv_state.to(p), par, None if bias is None else bias.to(p),
                              c["activation"]) for p in (torch.float64, torch.float32)]
    y = tree_conv1d(x, weight, conv_state, par.to(DEVICE), bias, c["activation"])
    assert y.dtype == dt
    assert_within("y", y, *refs)
    acc = torch.tensor(c["accepted"])
    new = naive_tree_conv1d_commit(x.double(), conv_state.double(), par, acc)
    state = conv_state.clone()
    tree_conv1d_commit(x, state, par.to(DEVICE), acc.to(DEVICE))
    assert torch.equal(state.double(), new), "the committed conv state is a copy of inputs: it must be exact"


# ---- the engine ----

@pytest.fixture(scope="module")
def tiny_model():
    pytest.importorskip("transformers")
    from treewy.models import build, tiny_config
    from treewy.models.train_tiny import SIZES
    return build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=3)


ENGINE = settings(PROPERTY, max_examples=max(4, EXAMPLES // 2))


@st.composite
def engine_cases(draw):
    prompts = draw(st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=12), min_size=1, max_size=3))
    widths = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    return dict(prompts=[[256] + p for p in prompts], tree=tuple(widths),
                drafter=draw(st.sampled_from(["mtp", "ngram"])), commit=draw(st.sampled_from(["reconstruct", "store_all"])),
                new=draw(st.integers(1, 10)))


@ENGINE
@given(c=engine_cases())
def test_greedy_speculation_equals_plain_greedy(tiny_model, one_thread, c):
    """Greedy decoding with a drafted tree emits exactly the tokens of plain greedy decoding."""
    from treewy.decode import generate
    plain = generate(tiny_model, c["prompts"], max_new_tokens=c["new"]).tokens
    spec = generate(tiny_model, c["prompts"], drafter=c["drafter"], tree=c["tree"], commit=c["commit"],
                    max_new_tokens=c["new"]).tokens
    assert spec == plain


@ENGINE
@given(c=engine_cases(), seed=st.integers(0, 2**32 - 1), temperature=st.floats(0.3, 1.5),
       rule=st.sampled_from(["match", "rrs", "rrs_wor"]))
def test_seeded_sampling_reproduces(tiny_model, one_thread, c, seed, temperature, rule):
    """The same seed gives the same sampled tokens, for every rule and both commit modes."""
    from treewy.decode import generate
    runs = [generate(tiny_model, c["prompts"], drafter=c["drafter"], tree=c["tree"], commit=c["commit"],
                     max_new_tokens=c["new"], temperature=temperature, seed=seed, rule=rule).tokens for _ in range(2)]
    assert runs[0] == runs[1]
