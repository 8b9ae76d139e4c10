"""treewy.decode.generate: tree speculation emits exactly the plain greedy tokens (fp32, CPU), for every
tree shape and both commit modes; store_all and reconstruct accept the same nodes; state bytes held."""

import random

import pytest
import torch

pytest.importorskip("transformers")

from treewy.decode import generate  # noqa: E402
from treewy.models import build, save, tiny_config  # noqa: E402
from treewy.models.spec import spec_of  # noqa: E402
from treewy.models.train_tiny import SIZES  # noqa: E402
from treewy.experiments.acceptance import SHAPES, summarize  # noqa: E402
from treewy.tree import MAX_NODES, DraftTree  # noqa: E402

PROMPTS = [[256] + list(b"def foo(x):\n    return x"), [256] + list(b"import os\n"), [256, 10]]
NEW = 14


pytestmark = pytest.mark.usefixtures("one_thread")  # decoding on a shared 2-core CPU


@pytest.fixture(scope="module")
def model():
    return build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=3)


@pytest.fixture(scope="module")
def reference(model):
    return generate(model, PROMPTS, max_new_tokens=NEW).tokens


class OracleDrafter:
    """Knows the greedy continuation; puts it under a random child of each on-path node with
    probability p_hit, and wrong tokens everywhere else, so acceptance stops at varied nodes."""

    name = "oracle"

    def __init__(self, reference, p_hit=0.8, seed=0):
        self.ref, self.p_hit, self.rng = reference, p_hit, random.Random(seed)

    def begin(self, model, prompts, hidden, roots, capacity=None):
        self.pos = [0] * len(prompts)  # index of the root in the reference continuation

    def propose(self, tree):
        B, T = len(self.pos), tree.num_nodes
        tokens = torch.full((B, T), -1, dtype=torch.long)
        children = [tree.children(t) for t in range(T)]
        for b in range(B):
            ref = self.ref[b]
            on_path = {0: 0}  # node -> its index in ref
            tokens[b, 0] = ref[self.pos[b]] if self.pos[b] < len(ref) else 0
            for t in range(T):
                ch = children[t]
                if not ch:
                    continue
                wrong = [x for x in range(256) if t not in on_path or on_path[t] + self.pos[b] + 1 >= len(ref)
                         or x != ref[on_path[t] + self.pos[b] + 1]]
                picks = self.rng.sample(wrong, len(ch))
                if t in on_path and on_path[t] + self.pos[b] + 1 < len(ref) and self.rng.random() < self.p_hit:
                    j = self.rng.randrange(len(ch))
                    picks[j] = ref[on_path[t] + self.pos[b] + 1]
                    on_path[ch[j]] = on_path[t] + 1
                tokens[b, ch] = torch.tensor(picks)
        return tokens

    def advance(self, emitted, path_hidden):
        for b, e in enumerate(emitted):
            self.pos[b] += len(e)


def test_plain_greedy_matches_transformers(model, reference):
    for p, gen in zip(PROMPTS, reference):
        ids = torch.tensor([p + gen])
        with torch.no_grad():
            am = model(ids).logits.argmax(-1)[0]
        assert am[len(p) - 1:-1].tolist() == gen


@pytest.mark.parametrize("widths", SHAPES + [(1,), (1,) * 6], ids=lambda w: "x".join(map(str, w)))
def test_tree_speculation_is_plain_greedy(model, reference, widths):
    runs = {}
    for mode in ("reconstruct", "store_all"):
        res = generate(model, PROMPTS, drafter=OracleDrafter(reference, seed=len(widths)), tree=widths,
                       commit=mode, max_new_tokens=NEW)
        assert res.tokens == reference, mode
        runs[mode] = [(s.step, s.request, s.accepted) for s in res.steps]
        assert max(s.length for s in res.steps) > 1  # the oracle made some drafts stick
    assert runs["reconstruct"] == runs["store_all"]


@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
def test_real_drafters_are_plain_greedy(model, reference, drafter):
    for widths, mode in (((2, 2, 1), "reconstruct"), ((3, 1), "store_all")):
        res = generate(model, PROMPTS, drafter=drafter, tree=widths, commit=mode, max_new_tokens=NEW)
        assert res.tokens == reference


def test_gdn_state_bytes_held(model, reference):
    spec = spec_of(model)
    block = spec.HV * spec.V * spec.K * 4
    n_gdn = len(spec.gdn_layers)
    tree = DraftTree.from_widths((2, 2, 1))
    for mode, blocks in (("store_all", tree.num_nodes), ("reconstruct", 1)):
        res = generate(model, PROMPTS, drafter="ngram", tree=tree, commit=mode, max_new_tokens=6)
        assert {s.gdn_state_bytes for s in res.steps} == {blocks * block * n_gdn}, mode
        assert blocks == tree.state_blocks(mode)
    res = generate(model, PROMPTS, drafter="ngram", tree=tree, commit="reconstruct", max_new_tokens=6)
    assert {s.transient_bytes for s in res.steps} == {tree.num_nodes * spec.HV * spec.V * 4 * n_gdn}


def test_requests_finish_at_different_times(model, reference):
    eos = reference[0][3]
    res = generate(model, PROMPTS, drafter=OracleDrafter(reference), tree=(2, 2), max_new_tokens=NEW,
                   eos_token_id=eos)
    for got, ref in zip(res.tokens, reference):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert got == ref[:cut]
    assert len(res.tokens[0]) == 4 < len(res.tokens[1]) or eos in reference[1][:4]


def test_bad_input_is_a_clear_error(model, tmp_path):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[256, 1], []])
    with pytest.raises(ValueError, match="more than the model's context"):
        generate(model, [[1] * 510], max_new_tokens=8)
    with pytest.raises(ValueError, match=f"kernels' limit of {MAX_NODES}"):
        generate(model, PROMPTS, drafter="ngram", tree=(12, 12))
    with pytest.raises(ValueError, match="commit"):
        generate(model, PROMPTS, drafter="ngram", commit="copy")
    with pytest.raises(ValueError, match="drafter"):
        generate(model, PROMPTS, drafter="medusa")
    with pytest.raises(ValueError, match="outside 0..263"):
        generate(model, [[300]])


def test_checkpoint_without_mtp_refuses_the_mtp_drafter(tmp_path):
    from treewy.models import load
    save(build(tiny_config(**SIZES["toy"]), mtp=False), tmp_path / "nomtp", dtype=torch.float32)
    m = load(tmp_path / "nomtp")
    assert m.mtp is None
    with pytest.raises(ValueError, match="no.*mtp.*use drafter='ngram'|has none; use drafter='ngram'"):
        generate(m, PROMPTS, drafter="mtp")
    assert len(generate(m, PROMPTS[:1], drafter="ngram", tree=(2, 1), max_new_tokens=4).tokens[0]) == 4


@pytest.mark.parametrize("mode", ["reconstruct", "store_all"])
def test_engine_on_the_triton_kernels_is_plain_greedy(model, reference, mode):
    """The engine's kernel backend (here under the Triton interpreter) decodes exactly like the references."""
    res = generate(model, PROMPTS, drafter=OracleDrafter(reference, seed=5), tree=(2, 1), commit=mode,
                   max_new_tokens=NEW, backend="triton")
    assert res.tokens == reference
    assert max(s.length for s in res.steps) > 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_deferred_commit_flushes_to_the_immediate_state(model, reference, backend):
    """reconstruct's commit folded into the next verify: the same logits and tokens as committing at once,
    and a flush mid-generation (reading the committed state) gives the immediately committed state."""
    from treewy.accept import greedy_fwd
    from treewy.models.backends import get_ops
    from treewy.models.cache import HybridCache
    from treewy.models.hybrid import Window, commit, prefill, verify

    spec, ops = spec_of(model), get_ops("cpu", backend)
    tree, prompts = DraftTree.from_widths((2, 1)), PROMPTS[:2]
    win = Window.of(tree, len(prompts), "cpu")
    caches = {defer: HybridCache.empty(spec, len(prompts), 64, torch.float32, "cpu") for defer in (True, False)}
    for c in caches.values():
        _, logits = prefill(spec, c, prompts, "cpu")
    roots, out = logits.argmax(-1), [[] for _ in prompts]
    drafter = OracleDrafter(reference[:2], seed=1)
    drafter.begin(model, prompts, None, None)

    def committed(c):
        return [c.committed_state(i).clone() for i in spec.gdn_layers]

    for step in range(4):
        draft = drafter.propose(tree)
        draft[:, 0] = roots
        got = {}
        for defer, c in caches.items():
            logits, _, pend = verify(spec, c, draft.clamp(min=0), win, "reconstruct", ops)
            acc = greedy_fwd(win.rows, draft, logits.argmax(-1), win.max_depth)
            commit(spec, c, pend, win, acc.accepted, acc.path, acc.length, ops, defer=defer)
            got[defer] = (logits, acc)
        assert bool(caches[True].pending) and not caches[False].pending
        # fp32 tolerances: a fused step kernel may sum in another order than commit + verify
        torch.testing.assert_close(got[True][0], got[False][0], rtol=1e-4, atol=1e-5)
        acc = got[True][1]
        assert torch.equal(acc.accepted, got[False][1].accepted)
        emitted = [acc.emitted(draft, b) for b in range(len(prompts))]
        drafter.advance(emitted, None)
        for o, e in zip(out, emitted):
            o.extend(e)
        roots = acc.bonus
        if step in (1, 3):  # mid-generation, and at the end
            for a, b in zip(committed(caches[True]), committed(caches[False])):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert not caches[True].pending
    for o, ref in zip(out, reference):
        assert o == ref[1:1 + len(o)]


def test_phase_timing(model):
    plain = generate(model, PROMPTS[:1], drafter="ngram", tree=(2, 1), max_new_tokens=4)
    phases = generate(model, PROMPTS[:1], drafter="ngram", tree=(2, 1), max_new_tokens=4, timing="phases")
    assert plain.tokens == phases.tokens
    assert all(s.verify_ms is None and s.host_ms >= 0 for s in plain.steps)
    for s in phases.steps:
        parts = s.draft_ms + s.verify_ms + s.accept_ms + s.commit_ms + s.host_ms
        assert min(s.verify_ms, s.accept_ms, s.commit_ms) >= 0 and parts == pytest.approx(s.step_ms)
    meta = dict(drafter="ngram", kind="tree", widths=(2, 1), mode="reconstruct", model_name="toy", dtype="float32",
                backend="torch", device="cpu")
    rows = {name: summarize(res, **meta) for name, res in (("plain", plain), ("phases", phases))}
    assert rows["plain"]["verify_ms_median"] is None and rows["plain"]["step_ms_median"] > 0
    assert all(rows["phases"][f"{p}_ms_median"] >= 0 for p in ("draft", "verify", "accept", "commit", "host"))
    with pytest.raises(ValueError, match="timing"):
        generate(model, PROMPTS[:1], timing="profile")


def test_node_counts_past_int64_are_refused_before_decoding(model):
    with pytest.raises(ValueError, match=f"limit of {MAX_NODES} nodes"):
        generate(model, [[256, 65]], drafter="ngram", tree=(2,) * 64, max_new_tokens=2)


def test_integer_arrays_are_prompts_and_widths(model, reference):
    np = pytest.importorskip("numpy")
    kw = dict(drafter="ngram", max_new_tokens=4)
    want = generate(model, PROMPTS[:2], tree=(2, 2), **kw).tokens
    got = generate(model, [np.array(PROMPTS[0]), torch.tensor(PROMPTS[1])], tree=np.array([2, 2]), **kw).tokens
    assert got == want
    assert generate(model, [[np.int64(t) for t in PROMPTS[2]]], max_new_tokens=np.int64(NEW)).tokens == reference[2:]


@pytest.mark.parametrize("kw, match", [
    (dict(prompts=[[256, 3.0]]), r"prompt 0, token 1 = 3.0: expected an integer token id, got float"),
    (dict(prompts=[[256, True]]), r"prompt 0, token 1 = True: expected an integer token id, got bool"),
    (dict(prompts=["hello"]), r"prompt 0 = 'hello' is text: pass token ids.*encode"),
    (dict(prompts=[[256], 7]), r"prompt 1 = 7: expected a list of token ids"),
    (dict(prompts=[torch.tensor([256.0, 1.0])]), r"prompt 0, token 0 = 256.0: expected an integer"),
    (dict(max_new_tokens=True), r"max_new_tokens = True: expected a positive integer"),
    (dict(max_new_tokens=2.0), r"max_new_tokens = 2.0: expected a positive integer"),
    (dict(eos_token_id="x"), r"eos_token_id = 'x': expected None \(no end token\) or a token id in 0..263"),
    (dict(eos_token_id=264), r"eos_token_id = 264: expected None"),
    (dict(commit="bogus"), r"commit = 'bogus': expected 'reconstruct', 'store_all' or None"),
    (dict(tree="bogus"), r"tree = 'bogus': expected branching factors"),
    (dict(tree=(12, 12)), f"limit of {MAX_NODES}"),
    (dict(temperature=1.0, seed=2**70), rf"seed = {2**70}: expected None or an integer in 0..2\*\*63 - 1"),
    (dict(temperature=1.0, seed=-1), r"seed = -1: expected None or an integer in 0..2\*\*63 - 1"),
    (dict(seed=2**70), r"seed = .*0..2\*\*63 - 1"),
    (dict(rule="rss"), r"rule = 'rss'"),
], ids=["float-token", "bool-token", "text-prompt", "int-prompt", "float-tensor", "bool-max-new", "float-max-new",
        "text-eos", "eos-outside", "bogus-commit", "bogus-tree", "big-tree", "seed-2**70", "seed-negative",
        "greedy-seed", "greedy-rule"])
def test_plain_decoding_checks_every_argument(model, kw, match):
    """With drafter=None (plain greedy decoding) too: an argument it does not use is still checked."""
    kw = dict(prompts=[[256, 65]], max_new_tokens=2) | kw
    with pytest.raises(ValueError, match=match):
        generate(model, kw.pop("prompts"), **kw)
