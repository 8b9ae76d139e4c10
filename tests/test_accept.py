import pytest
import torch

from treewy.accept import greedy
from treewy.testing import random_tree
from treewy.tree import DraftTree


def walk(tree: DraftTree, tokens: list[int], argmax: list[int]) -> int:
    """The greedy walk, one request, written as plainly as possible."""
    cur = 0
    while True:
        nxt = [c for c in tree.children(cur) if tokens[c] == argmax[cur]]
        if not nxt:
            return cur
        cur = nxt[0]


def test_greedy_follows_matching_children():
    tree = DraftTree.from_widths((2, 2))           # parents [-1, 0, 1, 1, 0, 4, 4]
    tokens = torch.tensor([[9, 5, 6, 7, 8, 1, 2]])
    argmax = torch.tensor([[8, 0, 0, 0, 2, 0, 3]])  # root -> 8 (node 4) -> 2 (node 6) -> bonus 3
    r = greedy(tree, tokens, argmax)
    assert r.accepted.tolist() == [6]
    assert r.path[0].tolist() == [0, 4, 6]
    assert r.length.tolist() == [3]
    assert r.bonus.tolist() == [3]
    assert r.emitted(tokens, 0) == [8, 2, 3]


def test_nothing_accepted_emits_the_bonus_only():
    tree = DraftTree.chain(3)
    r = greedy(tree, torch.tensor([[0, 1, 2, 3]]), torch.tensor([[7, 7, 7, 7]]))
    assert r.accepted.tolist() == [0] and r.length.tolist() == [1] and r.bonus.tolist() == [7]


def test_greedy_equals_the_plain_walk_on_random_trees():
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        tree = random_tree(int(torch.randint(1, 40, (1,), generator=gen)), gen)
        T, B = tree.num_nodes, 4
        tokens = torch.randint(0, 3, (B, T), generator=gen)   # few symbols: many matches, sibling ties
        argmax = torch.randint(0, 3, (B, T), generator=gen)
        r = greedy(tree, tokens, argmax)
        for b in range(B):
            a = walk(tree, tokens[b].tolist(), argmax[b].tolist())
            assert int(r.accepted[b]) == a
            assert r.path[b, : r.length[b]].tolist() == tree.path(a)
            assert int(r.length[b]) == int(tree.depth[a]) + 1
            assert int(r.bonus[b]) == int(argmax[b, a])


def test_per_request_topologies():
    trees = [DraftTree.from_widths((3,)), DraftTree.chain(3)]
    parents = torch.stack([t.parents for t in trees])
    tokens = torch.tensor([[0, 4, 5, 6], [0, 5, 6, 7]])
    argmax = torch.tensor([[5, 0, 0, 0], [5, 6, 9, 1]])
    r = greedy(parents, tokens, argmax)
    assert r.accepted.tolist() == [2, 2]
    assert r.length.tolist() == [2, 3]


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="target_argmax"):
        greedy(DraftTree.chain(2), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_tokens must be an integer"):
        greedy(DraftTree.chain(2), torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.long))
