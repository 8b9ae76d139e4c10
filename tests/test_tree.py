import numpy as np
import pytest
import torch

from treewy.tree import MAX_NODES, DraftTree, ancestor_mask, as_tree, validate_parents

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


@pytest.mark.parametrize("widths", [(2,) * 64, (2,) * 100, (10**9,) * 5], ids=["2x64", "2x100", "1e9x5"])
def test_widths_whose_node_count_overflows_int64_are_refused_at_once(widths):
    with pytest.raises(ValueError, match=f"limit of {MAX_NODES} nodes"):
        DraftTree.from_widths(widths)
    with pytest.raises(ValueError, match=f"limit of {MAX_NODES} nodes"):
        as_tree(",".join(map(str, widths)))


def test_integer_arrays_are_read_as_widths_or_parents():
    assert DraftTree.from_widths(np.array([3, 3])) == DraftTree.from_widths((3, 3))
    assert DraftTree.from_widths([np.int64(2), torch.tensor(2)]).widths == (2, 2)
    assert as_tree(torch.tensor([3, 3])) == DraftTree.from_widths((3, 3))  # widths, not parents
    assert as_tree(np.array([-1, 0, 0])) == DraftTree([-1, 0, 0])          # starts with -1: parents
    assert as_tree("3,3,3") == as_tree(" 3, 3 ,3") == DraftTree.from_widths((3, 3, 3))
    assert as_tree("-1,0,1") == DraftTree([-1, 0, 1])


@pytest.mark.parametrize("make, match", [
    (lambda: DraftTree(["-1", "0"]), r"parents = \['-1', '0'\]: expected .*integer parent indices"),
    (lambda: DraftTree(None), r"parents = None: expected"),
    (lambda: DraftTree("-1,0"), r"parents = '-1,0': expected"),
    (lambda: DraftTree.from_widths(3), r"widths = 3: expected a sequence.*\(3,\)"),
    (lambda: DraftTree.from_widths("33"), r"widths = '33': expected a sequence.*as_tree"),
    (lambda: DraftTree.from_widths([3.0]), r"widths\[0\] = 3.0: branching factors must be positive integers"),
    (lambda: DraftTree.from_widths(np.array([True])), r"widths\[0\] = .*True.*positive integers"),
    (lambda: as_tree("bogus"), r"tree = 'bogus': expected branching factors separated by commas"),
    (lambda: as_tree(None), r"tree = None: expected branching factors"),
    (lambda: as_tree(3), r"tree = 3: expected branching factors"),
    (lambda: as_tree(torch.tensor([[3, 3]])), r"tree = .*expected one tree.*shape \(1, 2\)"),
    (lambda: DraftTree.chain(2).path(1.5), r"node = 1.5: expected an integer node index in 0..2"),
    (lambda: DraftTree.chain(2).path(True), r"node = True: expected an integer"),
    (lambda: DraftTree.chain(2).children(0.0), r"node = 0.0: expected an integer"),
], ids=["str-parents", "none", "text-parents", "int-widths", "text-widths", "float-width", "bool-width",
        "bogus-text", "none-tree", "int-tree", "2d-tree", "float-node", "bool-node", "float-children"])
def test_values_of_the_wrong_type_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_writing_into_handed_out_values_leaves_the_tree_alone():
    t = DraftTree.from_widths((1, 1, 1))
    t.parents[2] = 3
    t.depth[3] = 0
    t.leaves.append(0)
    assert t.parents.tolist() == [-1, 0, 1, 2]
    assert t.depth.tolist() == [0, 1, 2, 3] and t.max_depth == 3 and t.leaves == [3]
    assert t.path(3) == [0, 1, 2, 3]
    with pytest.raises(AttributeError):
        t.widths = (5,)
    assert repr(t).startswith("DraftTree.from_widths((1, 1, 1))")
