"""The MTP proposer's tree passes (issue 30, step 1f), as torch over a callable MTP entry: what vLLM's
``SpecDecodeBaseProposer.propose`` runs for a served tree in place of its chain loop (``tree_vllm`` installs it).

vLLM's first pass (``set_inputs_first_pass``: the accepted tokens' entries with the target's hidden states, written
into the drafter's KV) is kept; its output at the root (``token_indices_to_sample``) is ``root_out`` here. Instead of
the argmax of that pass and ``num_speculative_tokens - 1`` chain passes, a tree takes the top-widths[0] of the root's
logits and runs D - 1 passes: pass d holds one entry per drafted node of depth 1..d (its token, its parent's MTP
output, position root + depth, attention over the drafter's KV plus its own root..node path). The passes index with
the engine's own plan (``treewy.drafters._TreePlan``, which ``MTPDrafter`` and ``decode_graph``'s static drafter
use too) and pick children with its ``fill``, so the three drafting loops differ only in where an entry's attention
reads its prefix: here, whatever ``entry`` does. A pass recomputes the shallower nodes rather than reading their K/V
back from the drafter's cache: the drafts then write nothing into vLLM's paged cache, whose slots past the root
belong to the next verify window. Shapes are fixed by the tree (pass d: B x (n_1 + ... + n_d) tokens), and nothing
reads the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from treewy.drafters import _TreePlan
from treewy.serve.tree_spec import TreeLayout

#: entry(tokens [B, n] int64, hidden [B, n, H], positions [B, n] int64, mask [n, n] bool) -> MTP outputs [B, n, H]
#: after the module's final norm; mask[i, j]: window entry i attends to window entry j (beside the drafter's KV).
MTPEntry = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TreePasses:
    """The D - 1 tree passes of one layout (built once per server): ``plan``, the engine's ``_TreePlan`` of the
    layout's tree on its device (per pass: the nodes of depth 1..d in DFS order, their parents and depths, the
    window's ancestor mask, where the depth-d nodes sit; per node with children: who takes its top-w)."""

    def __init__(self, layout: TreeLayout):
        if not isinstance(layout, TreeLayout):
            raise ValueError(f"layout must be a treewy.serve.tree_spec.TreeLayout, got {type(layout).__name__}")
        self.layout = layout
        self.plan = _TreePlan(layout.tree, layout.device)


def mtp_tree_passes(entry: MTPEntry, lm_head: Callable[[torch.Tensor], torch.Tensor], root_out: torch.Tensor,
                    roots: torch.Tensor, root_pos: torch.Tensor, passes: TreePasses) -> torch.Tensor:
    """draft_token_ids [B, N] int64 in DFS order: the MTP tree from the root pass's output (``MTPDrafter._draft``'s
    loop, the entry abstracted).

    root_out [B, H]: the first pass's MTP output at each request's root; roots int [B]: the root tokens; root_pos int
    [B]: the root entry's position (a node of depth k sits at root_pos + k); lm_head: MTP outputs -> logits."""
    layout, plan = passes.layout, passes.plan
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
    tokens = torch.full((B, T), -1, dtype=torch.long, device=root_out.device)
    tokens[:, 0] = roots
    outs = root_out.new_zeros(B, T, root_out.shape[-1])
    outs[:, 0] = root_out
    plan.fill(tokens, lm_head(root_out)[:, None], plan.root_fill)
    for lv in plan.levels:   # pass d: every node of depth 1..d, the depth-d ones new
        pos = root_pos.long()[:, None] + lv.depth[None]
        out = entry(tokens[:, lv.nodes].clamp(min=0), outs[:, lv.parents], pos, lv.mask[0])
        new = out[:, lv.new]
        outs[:, lv.new_nodes] = new
        plan.fill(tokens, lm_head(new), lv.fill)
    return tokens[:, 1:]
