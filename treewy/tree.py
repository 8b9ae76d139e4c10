"""Draft-tree topology: parent arrays, depths, ancestor masks, paths and state-block costs.

A verify window has T = N + 1 nodes. Node 0 is the root (the last verified token, always
accepted); nodes 1..N are drafts. ``parents[0] = -1`` and ``parents[t] < t`` for every other
node, so any topological order works (DFS pre-order is the canonical one).
"""

from __future__ import annotations

import operator
import reprlib
from collections.abc import Iterable
from functools import cached_property

import torch

#: Largest window (root + drafts) the kernels accept per request.
MAX_NODES = 128

STATE_MODES = ("store_all", "reconstruct")


def as_int(x) -> int | None:
    """x as a Python int when it is an integer of any kind (int, numpy or 0-d torch integer), else None;
    booleans are not integers here, so True never passes for a token, a width or a count."""
    if isinstance(x, bool) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def short_repr(x) -> str:
    """repr(x), cut short for long sequences and tensors (error messages quote what they got)."""
    return reprlib.repr(x.tolist() if isinstance(x, torch.Tensor) else x)


def _first_bad_node(parents: torch.Tensor) -> tuple[int, int, int, str] | None:
    """Return (request, node, parent, reason) of the first malformed node of a [B, T] parent array."""
    B, T = parents.shape
    t = torch.arange(T, device=parents.device).expand(B, T)
    root_bad = parents[:, 0] != -1
    is_second_root = (parents == -1) & (t > 0)
    out_of_range = (parents < -1) | (parents >= T)
    not_before = (parents >= t) & (parents < T) & (t > 0)
    bad = is_second_root | out_of_range | not_before
    bad[:, 0] = root_bad
    if not bool(bad.any()):
        return None
    flat = int(torch.nonzero(bad.flatten())[0])
    b, node = divmod(flat, T)
    parent = int(parents[b, node])
    if node == 0:
        reason = "root"
    elif is_second_root[b, node]:
        reason = "second_root"
    elif out_of_range[b, node]:
        reason = "out_of_range"
    else:
        reason = "not_before"
    return b, node, parent, reason


_FIXES = {
    "root": "node 0 is the root and must have parent -1; put the root first",
    "second_root": "only node 0 may have parent -1; attach this node to a node that comes before it",
    "out_of_range": "a parent must be the index of another node of the same tree",
    "not_before": "number the nodes so that every parent comes before its children "
    "(DFS pre-order or BFS order both do)",
}


def validate_parents(parents, *, name: str = "parents", max_nodes: int = MAX_NODES) -> torch.Tensor:
    """Check a parent array ([T] or [B, T], integers) and return it as an int64 CPU tensor of the same shape."""
    if isinstance(parents, DraftTree):
        return parents.parents.long()
    t = parents
    if not isinstance(t, torch.Tensor):
        try:
            if isinstance(parents, (str, bytes)):
                raise TypeError
            t = torch.as_tensor(parents)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name} = {short_repr(parents)}: expected a list or tensor of integer parent indices, "
                             "-1 for the root, e.g. [-1, 0, 0, 1]") from None
    if t.numel() == 0:
        raise ValueError(f"{name} is empty: a draft tree needs at least its root; "
                         "use parents=[-1] for a window with no drafts")
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must hold integers (int32 or int64), got dtype {t.dtype}; "
                         "pass the parent index of every node, -1 for the root")
    if t.ndim not in (1, 2):
        raise ValueError(f"{name} must be [T] (one tree) or [B, T] (a tree per request), "
                         f"got shape {tuple(t.shape)}")
    if t.shape[-1] > max_nodes:
        raise ValueError(f"{name} has {t.shape[-1]} nodes, more than the kernels' limit of "
                         f"{max_nodes}; prune the tree to at most {max_nodes - 1} drafts")
    rows = t.detach().to("cpu", torch.int64).reshape(-1, t.shape[-1])
    bad = _first_bad_node(rows)
    if bad is not None:
        b, node, parent, reason = bad
        where = f"node {node}" if t.ndim == 1 else f"request {b}, node {node}"
        raise ValueError(f"{name}: {where} has parent {parent}: {_FIXES[reason]}")
    return rows.reshape(t.shape)


class DraftTree:
    """A validated draft tree: ``DraftTree([-1, 0, 0, 1])``, ``DraftTree.from_widths((3, 3, 2))``,
    ``DraftTree.chain(3)``."""

    def __init__(self, parents):
        if isinstance(parents, DraftTree):
            parents = parents._parents
        p = validate_parents(parents)
        if p.ndim != 1:
            raise ValueError(f"parents must be one tree [T], got shape {tuple(p.shape)}; "
                             "a batch of topologies is passed to the ops as a [B, T] tensor instead")
        self._parents = p.to(torch.int32)
        self._widths: tuple[int, ...] | None = None

    @classmethod
    def from_widths(cls, widths) -> DraftTree:
        """The tree whose level d has ``widths[d]`` children under each node of level d - 1, in DFS pre-order.
        widths: a sequence of positive integers such as (3, 3, 2) (a list, numpy or torch array also do)."""
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Iterable):
            raise ValueError(f"widths = {widths!r}: expected a sequence of branching factors such as (3, 3, 2) "
                             "(one level of 3 is (3,)); as_tree('3,3,2') reads text")
        given = tuple(widths)
        widths = tuple(as_int(w) for w in given)
        for level, (g, w) in enumerate(zip(given, widths)):
            if w is None or w < 1:
                raise ValueError(f"widths[{level}] = {g!r}: branching factors must be positive integers, "
                                 "e.g. (3, 3, 2)")
        # count in Python ints and stop at the limit: the product of the widths outgrows any fixed-size integer
        total, level_nodes = 1, 1
        for d, w in enumerate(widths):
            level_nodes *= w
            total += level_nodes
            if total > MAX_NODES:
                first = f" ({total} by level {d + 1} of {len(widths)})" if d + 1 < len(widths) else f" ({total})"
                raise ValueError(f"widths {reprlib.repr(widths)} give more than the kernels' limit of {MAX_NODES} "
                                 f"nodes{first}; use smaller branching factors or fewer levels")
        parents = [-1]

        def grow(node: int, level: int) -> None:
            if level == len(widths):
                return
            for _ in range(widths[level]):
                parents.append(node)
                grow(len(parents) - 1, level + 1)

        grow(0, 0)
        tree = cls(parents)
        tree._widths = widths
        return tree

    @classmethod
    def chain(cls, k: int) -> DraftTree:
        """A chain of k drafts (the widths (1,) * k)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k = {k!r}: a chain needs a non-negative integer number of drafts")
        if k == 0:
            return cls([-1])
        return cls.from_widths((1,) * k)

    @property
    def parents(self) -> torch.Tensor:
        """int32 [T], parents[0] = -1: a copy, so writing into it cannot change the tree."""
        return self._parents.clone()

    @property
    def widths(self) -> tuple[int, ...] | None:
        """The branching factors the tree was built from (``from_widths``), else None."""
        return self._widths

    @property
    def num_nodes(self) -> int:
        return int(self._parents.numel())

    @property
    def num_drafts(self) -> int:
        return self.num_nodes - 1

    @cached_property
    def _depth(self) -> torch.Tensor:
        d = [0] * self.num_nodes
        for t, p in enumerate(self._parents.tolist()[1:], start=1):
            d[t] = d[p] + 1
        return torch.tensor(d, dtype=torch.int32)

    @property
    def depth(self) -> torch.Tensor:
        """int32 [T], the root at depth 0 (a copy)."""
        return self._depth.clone()

    @cached_property
    def max_depth(self) -> int:
        return int(self._depth.max())

    def _node(self, node) -> int:
        n = as_int(node)
        if n is None or not 0 <= n < self.num_nodes:
            raise ValueError(f"node = {node!r}: expected an integer node index in 0..{self.num_nodes - 1}")
        return n

    def ancestor_mask(self, inclusive: bool = True) -> torch.Tensor:
        """bool [T, T]: [t, i] is true when i is an ancestor of t (or t itself, if inclusive)."""
        return ancestor_mask(self._parents, inclusive=inclusive)

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` (both included)."""
        out = [self._node(node)]
        while out[-1] != 0:
            out.append(int(self._parents[out[-1]]))
        return out[::-1]

    def children(self, node: int) -> list[int]:
        return torch.nonzero(self._parents == self._node(node)).flatten().tolist()

    @cached_property
    def _leaves(self) -> tuple[int, ...]:
        has_child = torch.zeros(self.num_nodes, dtype=torch.bool)
        has_child[self._parents[1:].long()] = True
        return tuple(torch.nonzero(~has_child).flatten().tolist())

    @property
    def leaves(self) -> list[int]:
        return list(self._leaves)

    def state_blocks(self, mode: str) -> int:
        """GDN state blocks a request holds per layer: store_all keeps N + 1 snapshots, reconstruct 1."""
        if mode == "store_all":
            return self.num_nodes
        if mode == "reconstruct":
            return 1
        raise ValueError(f"mode = {mode!r}: expected one of {STATE_MODES}")

    def __len__(self) -> int:
        return self.num_nodes

    def __eq__(self, other) -> bool:
        return isinstance(other, DraftTree) and torch.equal(self._parents, other._parents)

    def __hash__(self) -> int:
        return hash(tuple(self._parents.tolist()))

    def __repr__(self) -> str:
        if self._widths is not None:
            return f"DraftTree.from_widths({self._widths})  # N = {self.num_drafts}"
        return f"DraftTree({self._parents.tolist()})"


def ancestor_mask(parents: torch.Tensor, inclusive: bool = True) -> torch.Tensor:
    """bool [..., T, T] from a validated parent array [..., T]: row t marks t's ancestors."""
    p = parents.long()
    T = p.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=p.device).expand(*p.shape[:-1], T, T)
    mask = eye.clone()
    for t in range(1, T):  # parents come first, so row p[t] is complete when row t is built
        par = p[..., t]
        mask[..., t, :] |= torch.gather(mask, -2, par[..., None, None].expand(*p.shape[:-1], 1, T)).squeeze(-2)
    return mask if inclusive else mask & ~eye


def path_depth(parents: torch.Tensor) -> torch.Tensor:
    """int64 [..., T] depth of every node from a validated parent array."""
    return ancestor_mask(parents, inclusive=False).sum(-1)


def as_tree(tree) -> DraftTree:
    """A DraftTree from a DraftTree, branching factors ((3, 3, 2), [3, 3, 2], a numpy or torch array, or
    the text '3,3,2') or a parent array (which always starts with -1, so the two cannot be confused)."""
    if isinstance(tree, DraftTree):
        return tree
    if isinstance(tree, str):
        try:
            tree = [int(x) for x in tree.split(",")]
        except ValueError:
            raise ValueError(f"tree = {tree!r}: expected branching factors separated by commas such as '3,3,2' "
                             "(or a parent array starting with -1, such as '-1,0,0,1')") from None
    elif isinstance(tree, torch.Tensor) or type(tree).__module__ == "numpy":
        if getattr(tree, "ndim", None) != 1:
            raise ValueError(f"tree = {short_repr(tree)}: expected one tree, a 1-D array of branching factors or "
                             f"of parents, got shape {tuple(getattr(tree, 'shape', ()))}")
        tree = tree.tolist()
    if not isinstance(tree, (tuple, list)):
        raise ValueError(f"tree = {short_repr(tree)}: expected branching factors such as (3, 3, 2), a parent array "
                         "starting with -1 such as [-1, 0, 0, 1], or a DraftTree")
    if len(tree) == 0 or as_int(tree[0]) != -1:
        return DraftTree.from_widths(tuple(tree))
    return DraftTree(tree)
