"""Drafters: the n-gram drafter reads continuations from the context; the MTP drafter's tree entries
(its KV cache under the tree mask) agree with a plain causal pass over each root-to-node path."""

import pytest
import torch

pytest.importorskip("transformers")

from treewy.drafters import MTPDrafter, NgramDrafter  # noqa: E402
from treewy.models import build, tiny_config  # noqa: E402
from treewy.models.hybrid import prefill  # noqa: E402
from treewy.models.cache import HybridCache  # noqa: E402
from treewy.models.spec import spec_of  # noqa: E402
from treewy.models.mtp import mtp_forward  # noqa: E402
from treewy.models.train_tiny import SIZES  # noqa: E402
from treewy.tree import DraftTree  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")  # decoding on a shared 2-core CPU


def test_ngram_tree_follows_the_context():
    d = NgramDrafter(max_n=3)
    ctx = list(b"abcXabcYabc")
    d.begin(None, [ctx[:-1]], None, [ctx[-1]])
    tok = d.propose(DraftTree.from_widths((2, 1)))[0].tolist()
    # after "abc" the context continued with X then Y (equal counts: the most recent first)
    assert tok[0] == ord("c") and {tok[1], tok[3]} == {ord("X"), ord("Y")}
    assert tok[1] == ord("Y") and tok[2] == ord("a") and tok[4] == ord("a")


def test_ngram_marks_nodes_it_cannot_fill():
    d = NgramDrafter()
    d.begin(None, [[1, 2, 3]], None, [9])  # 9 never seen before: nothing to propose
    tok = d.propose(DraftTree.from_widths((2, 2)))[0]
    assert tok[0] == 9 and (tok[1:] == -1).all()
    d.advance([[1, 2]], None)
    assert d.ctx[0][-3:] == [9, 1, 2]


def test_mtp_tree_matches_sequential_entries():
    model = build(tiny_config(**SIZES["toy"], initializer_range=0.2), seed=5)
    spec = spec_of(model)
    prompt = [256] + list(b"for i in range(10):")
    cache = HybridCache.empty(spec, 1, 64, torch.float32, "cpu")
    with torch.no_grad():
        hidden, logits = prefill(spec, cache, [prompt], "cpu")
    root = int(logits.argmax(-1))
    d = MTPDrafter(model)
    d.begin(model, [prompt], hidden, [root])
    tree = DraftTree.from_widths((3, 2))
    tok = d.propose(tree)[0]
    siblings = [tok[tree.children(t)].tolist() for t in range(tree.num_nodes) if tree.children(t)]
    assert all(len(set(s)) == len(s) for s in siblings)
    # sequential reference: prompt entries + the root entry, then the depth-1 node's entry on top
    P = len(prompt)
    toks = torch.tensor([prompt[1:] + [root]])
    pos = torch.arange(1, P + 1)[None]
    with torch.no_grad():
        out, _, _ = mtp_forward(spec, model.mtp, toks, hidden[0][None], pos)
        top1 = spec.lm_head(out[:, -1]).topk(3).indices[0]
        assert tok[tree.children(0)].tolist() == top1.tolist()
        for c in tree.children(0):
            seq_t = torch.cat([toks, tok[c].view(1, 1)], 1)
            seq_h = torch.cat([hidden[0][None], out[:, -1:]], 1)
            o2, _, _ = mtp_forward(spec, model.mtp, seq_t, seq_h, torch.arange(1, P + 2)[None])
            want = spec.lm_head(o2[:, -1]).topk(2).indices[0].tolist()
            assert tok[tree.children(c)].tolist() == want


def test_mtp_drafter_needs_mtp_weights():
    model = build(tiny_config(**SIZES["toy"]), mtp=False)
    model.mtp = None
    with pytest.raises(ValueError, match="needs mtp.* weights"):
        MTPDrafter(model)
