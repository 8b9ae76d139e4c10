"""The MTP proposer's tree passes (issue 30, step 1f), as torch over a callable MTP entry: what vLLM's
``SpecDecodeBaseProposer.propose`` must run for a served tree in place of its chain loop.

vLLM's first pass (``set_inputs_first_pass``: the accepted tokens' entries with the target's hidden states, written
into the drafter's KV) is kept; its output at the root (``token_indices_to_sample``) is ``root_out`` here. Instead of
the argmax of that pass and ``num_speculative_tokens - 1`` chain passes, a tree takes the top-widths[0] of the root's
logits and runs D - 1 passes: pass d holds one entry per drafted node of depth 1..d (its token, its parent's MTP
output, position root + depth, attention over the drafter's KV plus its own root..node path), as
``treewy.drafters.MTPDrafter`` does, so the drafts equal the engine's. A pass recomputes the shallower nodes rather
than reading their K/V back from the drafter's cache: the drafts then write nothing into vLLM's paged cache, whose
slots past the root belong to the next verify window. Shapes are fixed by the tree (pass d: B x (n_1 + ... + n_d)
tokens), and nothing reads the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from treewy.serve.tree_spec import TreeLayout, propose_mtp_tree

#: entry(tokens [B, n] int64, hidden [B, n, H], positions [B, n] int64, mask [n, n] bool) -> MTP outputs [B, n, H]
#: after the module's final norm; mask[i, j]: window entry i attends to window entry j (beside the drafter's KV).
MTPEntry = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TreePasses:
    """Index tables of the D - 1 tree passes of one layout (built once per server): pass d's window ``nodes[d - 1]``
    (the nodes of depth 1..d, DFS order), their ``parents`` and ``depth``, the window's ancestor ``mask`` and
    ``new[d - 1]``, where the depth-d nodes sit in that window."""

    def __init__(self, layout: TreeLayout):
        if not isinstance(layout, TreeLayout):
            raise ValueError(f"layout must be a treewy.serve.tree_spec.TreeLayout, got {type(layout).__name__}")
        self.layout = layout
        self.nodes, self.parents, self.depth, self.mask, self.new = [], [], [], [], []
        for d in range(1, layout.max_depth):
            win = torch.nonzero((layout.depth >= 1) & (layout.depth <= d)).flatten()
            self.nodes.append(win)
            self.parents.append(layout.parents[win])
            self.depth.append(layout.depth[win])
            self.mask.append(layout.anc[win][:, win])
            self.new.append(torch.nonzero(layout.depth[win] == d).flatten())


def mtp_tree_passes(entry: MTPEntry, lm_head: Callable[[torch.Tensor], torch.Tensor], root_out: torch.Tensor,
                    roots: torch.Tensor, root_pos: torch.Tensor, passes: TreePasses) -> torch.Tensor:
    """draft_token_ids [B, N] int64 in DFS order: the MTP tree from the root pass's output.

    root_out [B, H]: the first pass's MTP output at each request's root; roots int [B]: the root tokens; root_pos int
    [B]: the root entry's position (a node of depth k sits at root_pos + k); lm_head: MTP outputs -> logits."""
    layout = passes.layout
    if not isinstance(root_out, torch.Tensor) or root_out.ndim != 2 or not root_out.dtype.is_floating_point:
        raise ValueError(f"root_out must be a floating tensor [B, hidden] (the first MTP pass's output at each root), "
                         f"got {getattr(root_out, 'dtype', type(root_out).__name__)} "
                         f"{tuple(getattr(root_out, 'shape', ()))}")
    B = root_out.shape[0]
    for name, x in (("roots", roots), ("root_pos", root_pos)):
        if not isinstance(x, torch.Tensor) or x.shape != (B,) or x.dtype.is_floating_point:
            raise ValueError(f"{name} must be an integer tensor [B] = [{B}] (one per request of root_out), got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    T = layout.num_nodes
    tokens = torch.zeros(B, T, dtype=torch.long, device=root_out.device)
    tokens[:, 0] = roots
    outs = root_out.new_zeros(B, T, root_out.shape[-1])
    outs[:, 0] = root_out
    levels = [lm_head(root_out)[:, None]]
    for d in range(1, layout.max_depth):
        # the children of depth d - 1 first: pass d reads them as its depth-d nodes' tokens
        top = levels[-1].topk(layout.widths[d - 1], dim=-1).indices
        tokens[:, layout.children[d - 1].flatten()] = top.reshape(B, -1)
        nodes = passes.nodes[d - 1]
        out = entry(tokens[:, nodes], outs[:, passes.parents[d - 1]], root_pos[:, None] + passes.depth[d - 1][None],
                    passes.mask[d - 1])
        new = out[:, passes.new[d - 1]]
        outs[:, nodes[passes.new[d - 1]]] = new
        levels.append(lm_head(new))
    return propose_mtp_tree(levels, layout, roots)[:, 1:]
