import pytest
import torch

from treewy.tree import MAX_NODES, DraftTree, ancestor_mask, validate_parents

PAPER_SHAPES = {(2, 1, 1): 6, (2, 2, 1): 10, (2, 2, 2): 14, (3, 2, 2): 21, (3, 3, 2): 30, (3, 3, 3): 39}


@pytest.mark.parametrize("widths,n", PAPER_SHAPES.items(), ids=str)
def test_paper_shapes_have_the_papers_draft_counts(widths, n):
    tree = DraftTree.from_widths(widths)
    assert tree.num_drafts == n and tree.num_nodes == n + 1
    assert tree.state_blocks("store_all") == n + 1
    assert tree.state_blocks("reconstruct") == 1


def test_from_widths_is_dfs_preorder():
    tree = DraftTree.from_widths((2, 2))
    assert tree.parents.tolist() == [-1, 0, 1, 1, 0, 4, 4]
    assert tree.parents.dtype == torch.int32
    assert tree.depth.tolist() == [0, 1, 2, 2, 1, 2, 2]
    assert tree.leaves == [2, 3, 5, 6]
    assert tree.children(0) == [1, 4]


def test_chain_is_widths_of_ones():
    assert DraftTree.chain(3) == DraftTree.from_widths((1, 1, 1))
    assert DraftTree.chain(3).parents.tolist() == [-1, 0, 1, 2]
    assert DraftTree.chain(0).num_nodes == 1


def test_tree_is_paths():
    """Row t of the inclusive ancestor mask is exactly the root..t path."""
    tree = DraftTree.from_widths((3, 2, 2))
    mask = tree.ancestor_mask()
    for t in range(tree.num_nodes):
        path = tree.path(t)
        assert path[0] == 0 and path[-1] == t
        assert torch.nonzero(mask[t]).flatten().tolist() == sorted(path)
        assert len(path) == int(tree.depth[t]) + 1
    strict = tree.ancestor_mask(inclusive=False)
    assert torch.equal(strict, mask & ~torch.eye(tree.num_nodes, dtype=torch.bool))


def test_any_topological_order_is_accepted():
    tree = DraftTree([-1, 0, 0, 2, 1, 3, 0])  # BFS-like, not DFS pre-order
    assert tree.path(5) == [0, 2, 3, 5]


def test_batched_ancestor_mask_matches_per_tree():
    a, b = DraftTree.from_widths((2, 1)), DraftTree.chain(4)
    both = ancestor_mask(torch.stack([a.parents, b.parents]))
    assert torch.equal(both[0], a.ancestor_mask()) and torch.equal(both[1], b.ancestor_mask())


@pytest.mark.parametrize("parents,match", [
    ([0, 0], r"node 0 has parent 0.*root"),
    ([-1, 0, 2], r"node 2 has parent 2.*every parent comes before"),
    ([-1, 0, 3, 1], r"node 2 has parent 3.*every parent comes before"),
    ([-1, 0, 7], r"node 2 has parent 7.*index of another node"),
    ([-1, -5], r"node 1 has parent -5.*index of another node"),
    ([-1, 0, -1], r"node 2 has parent -1.*only node 0"),
    ([], r"empty"),
], ids=["root-not-minus-one", "self-parent", "parent-after-child", "out-of-range", "negative",
        "second-root", "empty"])
def test_malformed_trees_name_the_first_bad_node(parents, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(parents)


def test_batched_error_names_the_request():
    with pytest.raises(ValueError, match=r"request 1, node 2"):
        validate_parents(torch.tensor([[-1, 0, 1], [-1, 0, 2]]))


def test_float_parents_are_rejected():
    with pytest.raises(ValueError, match="integers"):
        DraftTree(torch.tensor([-1.0, 0.0]))


@pytest.mark.parametrize("widths", [(0, 2), (2, -1), (1.5,), (True,)], ids=str)
def test_widths_must_be_positive_integers(widths):
    with pytest.raises(ValueError, match=r"widths\[\d\].*positive integers"):
        DraftTree.from_widths(widths)


def test_tree_over_the_kernel_limit_is_rejected():
    with pytest.raises(ValueError, match=f"limit of {MAX_NODES}"):
        DraftTree.from_widths((8, 8, 2))
    with pytest.raises(ValueError, match=f"limit of {MAX_NODES}"):
        DraftTree.chain(MAX_NODES)
    assert DraftTree.chain(MAX_NODES - 1).num_nodes == MAX_NODES


def test_unknown_state_mode_is_rejected():
    with pytest.raises(ValueError, match="store_all"):
        DraftTree.chain(2).state_blocks("snapshot")
