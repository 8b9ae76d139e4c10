"""A served tree's trace: where a server's first tree windows part from vLLM's own ops (``TREEWY_TREE_TRACE=FILE``).

For an eager server (``cudagraph_mode`` NONE: the trace reads values back to the host). On each of the first
``TREEWY_TREE_TRACE_STEPS`` (default 4) steps with full tree windows, every hooked op also runs vLLM's own op on
copies of what it reads and compares the rows of each window's leftmost path: in DFS order nodes 0..D are the chain
root, first child, its first child, ..., which vLLM's causal ops compute exactly as the tree's must (positions
num_computed + j there). One JSON line per record, appended to FILE:

- ``{"op": "inputs", ...}``: the windows' requests, positions (first M-RoPE row) and input ids;
- ``{"op": "attention" | "conv" | "gdn", "layer": i, "max_diff": ..., "max_ref": ...}``: the largest difference on
  the leftmost paths between the tree's op and vLLM's, and the largest magnitude of vLLM's (``gdn``: store-all only;
  reconstruct's pools hold no state vLLM's kernel can read; ``conv``: only windows whose previous accepted node is
  on the leftmost path, both null when there is none);
- reconstruct only, ``{"op": "gdn_reference", "layer": i, "max_diff": {"o", "state", "u", "k", "g"}, ...}``: the
  served GDN step against its torch references (``tree_spec_update(kernels=False)``) run on copies of the step's
  slots, every node of every window and what it leaves in the pools, with the slots and their meta words before
  the step (nonzero: a window pending; a request's first window should find 0);
- reconstruct only, once per GDN layer, ``{"op": "page", "layer": i, "page": bytes, "parts": [[name, start, end],
  ...], "overlap": bool, "outside": bool}``: where each of the layer's pool views (conv state, state, u, k, g, meta)
  lies within a slot's page (byte offsets from the slot's start) and whether two overlap or one leaves the page;
- reconstruct only, ``{"op": "conv_untouched" | "gdn_untouched", "layer": i, "slots": n, "max_diff": [...]}``: how
  much the slots this op wrote on its previous call in the layer changed since, among those still pending now (a
  request's prefill flushes its slot first, so nothing else should have written them: a change is another op
  writing into the page);
- ``{"op": "sample", ...}``: per window the argmax of every node's logits, the drafts, the accepted node and the
  tokens the sampler hands vLLM.

A layer index counts the op's calls within the step. Not for a served benchmark: every record syncs with the host.
"""

from __future__ import annotations

import json
import os

import torch

from treewy.serve import vllm_adapter as adapter

TRACE_ENV, TRACE_STEPS_ENV = "TREEWY_TREE_TRACE", "TREEWY_TREE_TRACE_STEPS"


class TreeTrace:
    """The trace of one engine process: ``step()`` at each step with full windows, then the ops' records."""

    def __init__(self, path: str, steps: int = 4):
        if steps < 1:
            raise ValueError(f"{TRACE_STEPS_ENV}={steps}: trace at least one step")
        self.path, self.steps, self.step_no, self.calls = path, steps, 0, {}
        self.left = {}     # (op, layer) -> (slots, [values]): what the op left in its slots on its last call
        self.paged = set()  # the layers whose page record is written

    @classmethod
    def from_env(cls, environ=os.environ) -> TreeTrace | None:
        path = environ.get(TRACE_ENV)
        if not path:
            return None
        try:
            steps = int(environ.get(TRACE_STEPS_ENV, "4"))
        except ValueError:
            raise ValueError(f"{TRACE_STEPS_ENV}={environ[TRACE_STEPS_ENV]!r}: expected a whole number of steps")
        return cls(path, steps)

    @property
    def active(self) -> bool:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        return 0 < self.step_no <= self.steps and not capturing

    def write(self, **record) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": self.step_no, **record}) + "\n")

    def step(self, rows: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor,
             num_nodes: int) -> None:
        """A step with full windows begins: rows [n] its windows' requests, starts [n] their first packed tokens."""
        self.step_no += 1
        self.calls = {}
        if self.active:
            idx = starts.long()[:, None] + torch.arange(num_nodes, device=starts.device)[None]
            self.write(op="inputs", rows=rows.tolist(), positions=positions[idx].tolist(), ids=ids[idx].tolist())

    def compare(self, op: str, ours: torch.Tensor, ref: torch.Tensor, path_rows: torch.Tensor) -> None:
        """ours, ref [rows, ...]: one op's output, the tree's and vLLM's; path_rows: the leftmost paths' rows."""
        layer = self._layer(op)
        if path_rows.numel() == 0:   # no window where vLLM's op is a reference (see spec_window_paths)
            self.write(op=op, layer=layer, max_diff=None, max_ref=None)
            return
        a, b = ours[path_rows].float(), ref[path_rows].float()
        self.write(op=op, layer=layer, max_diff=(a - b).abs().max().item(), max_ref=b.abs().max().item())

    def _layer(self, op: str) -> int:
        layer = self.calls.get(op, 0)
        self.calls[op] = layer + 1
        return layer

    def untouched(self, op: str, parts, meta: torch.Tensor) -> None:
        """Before ``op`` writes its slots: the largest change in ``parts`` (pool tensors indexed by slot) of the slots
        it wrote on its last call in this layer that are still pending (``meta`` > 0: no prefill has flushed them)."""
        layer = self.calls.get(op + "_untouched", 0)
        left = self.left.get((op, layer))
        if left is None:
            return
        slots, values = left
        keep = meta[slots, 0] > 0
        diffs = [(x[slots[keep]].float() - v[keep].float()).abs().max().item() if keep.any() else 0.0
                 for x, v in zip(parts, values)]
        self.write(op=op + "_untouched", layer=layer, slots=int(keep.sum()), max_diff=diffs)

    def leave(self, op: str, slots: torch.Tensor, parts) -> None:
        """After ``op`` wrote ``slots`` (int [B]; rows <= 0 are padding): keep what it left there for ``untouched``."""
        layer = self._layer(op + "_untouched")
        live = slots.long()[slots > 0]
        self.left[(op, layer)] = (live, [x[live].clone() for x in parts])

    def page(self, parts: dict) -> None:
        """Once per layer: where the pool views ``parts`` (name -> [slots, ...] tensor, one page per slot) lie in a
        slot's page (``page_extents``)."""
        layer = self._layer("page")
        if layer in self.paged:
            return
        self.paged.add(layer)
        page, spans = page_extents(parts)
        ordered = sorted(spans)
        overlap = any(a[1] > b[0] for a, b in zip(ordered, ordered[1:]))
        self.write(op="page", layer=layer, page=page, parts=[[n, a, b] for a, b, n in ordered], overlap=overlap,
                   outside=any(a < 0 or b > page for a, b, _ in ordered))

    def reference(self, ours: torch.Tensor, ref: torch.Tensor, pools, copies, slots: torch.Tensor, T: int,
                  meta_before: torch.Tensor) -> None:
        """Reconstruct's GDN step against its references on copies (``pools_on_copies``): o [B * T, ...] both, every
        live window's nodes, and the pools' slots against the copies'; meta_before [B]: the slots' meta words before
        the step."""
        layer = self._layer("gdn_reference")
        live = (slots > 0).nonzero().reshape(-1)
        if live.numel() == 0:
            return
        rows = (live[:, None] * T + torch.arange(T, device=live.device)[None]).reshape(-1)
        diff = {"o": _max_diff(ours[rows], ref[rows])}
        for name in ("state", "u", "k", "g"):
            diff[name] = _max_diff(getattr(pools, name)[slots[live].long()], getattr(copies, name)[live + 1])
        self.write(op="gdn_reference", layer=layer, max_diff=diff, max_ref=ref[rows].float().abs().max().item(),
                   slots=slots.tolist(), meta=meta_before.tolist())

    def sample(self, logits: torch.Tensor, drafts: torch.Tensor, accepted: torch.Tensor, tokens: torch.Tensor) -> None:
        """logits [n, T, V], drafts [n, N], accepted [n], tokens [n, D + 1]: the windows' sampler step."""
        self.write(op="sample", argmax=logits.argmax(-1).tolist(), drafts=drafts.tolist(), accepted=accepted.tolist(),
                   tokens=tokens.tolist())


def leftmost_path_rows(starts: torch.Tensor, max_depth: int) -> torch.Tensor:
    """int64 [n * (D + 1)]: the packed rows of each window's nodes 0..D (DFS order: the leftmost root-to-leaf path)."""
    return (starts.long()[:, None] + torch.arange(max_depth + 1, device=starts.device)[None]).reshape(-1)


def spec_window_paths(B: int, layout, device, previous: torch.Tensor | None = None) -> torch.Tensor:
    """The leftmost paths' rows among a GDN layer's spec rows (B windows of the TreeLayout's nodes packed first).
    previous [B]: each window's previous accepted node; windows whose node is off the leftmost path (> D) are left
    out, since vLLM's chain ops read the previous window's first num_accepted stashed inputs as a chain, which they
    are only along that path (2026-12-04: the conv parted by up to 0.35 there while every token was right)."""
    starts = torch.arange(B, device=device) * layout.num_nodes
    if previous is not None:
        starts = starts[previous[:B].to(device) <= layout.max_depth]
    return leftmost_path_rows(starts, layout.max_depth)


def page_extents(parts: dict) -> tuple[int, list]:
    """(page bytes, [(start, end, name)]): each view's bytes within one slot's page, from the first view's slot stride
    (every view of a page pool shares it) and each view's storage offset and strides."""
    first = next(iter(parts.values()))
    page = first.stride(0) * first.element_size()
    base = min(x.storage_offset() * x.element_size() for x in parts.values())
    spans = []
    for name, x in parts.items():
        start = x.storage_offset() * x.element_size() - base
        start = start % page if page else start
        span = sum((n - 1) * st for n, st in zip(x.shape[1:], x.stride()[1:])) + 1
        spans.append((start, start + span * x.element_size(), name))
    return page, spans


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def pools_on_copies(pools, slots: torch.Tensor):
    """(copies, own): the slots' reconstruct pools copied behind an empty slot 0, and each row's slot there (int32
    [B]; 0 for padding rows, slot <= 0), for the references to run on without touching the pools."""
    from treewy.serve.reconstruct import ReconstructPools
    s = slots.long().clamp(min=0)
    copies = ReconstructPools(*(_with_null_block(x[s]) for x in (pools.state, pools.u, pools.k, pools.g, pools.meta)))
    own = torch.arange(1, slots.shape[0] + 1, dtype=torch.int32, device=slots.device)
    return copies, torch.where(slots > 0, own, 0)


def _with_null_block(blocks: torch.Tensor) -> torch.Tensor:
    """The copied blocks behind an unused block 0: vLLM's kernels skip a row whose block is 0 (its null block)."""
    return torch.cat([torch.zeros_like(blocks[:1]), blocks])


def stock_conv_on_copies(stock, args, kwargs) -> torch.Tensor:
    """vLLM's conv (``stock``, called as vLLM's GDN layer calls it: ``args``, ``kwargs``) of the windows as chains, on
    copies of x (it writes its output there) and of the windows' conv state (with the pool's strides), so that the
    tree's conv then reads what it would have read."""
    x, conv_state, *rest = args
    idx = kwargs[adapter.CONV_SLOTS]
    copy = _with_null_block(conv_state[idx.long()]).transpose(-1, -2).contiguous().transpose(-1, -2)
    own = torch.arange(1, idx.shape[0] + 1, dtype=idx.dtype, device=idx.device)
    return stock(x.clone(), copy, *rest, **{**kwargs, adapter.CONV_SLOTS: own})


def stock_spec_on_copies(stock, kwargs) -> torch.Tensor:
    """Store-all: vLLM's spec kernel over the windows as chains, on a copy of their state blocks: o [B * T, HV, V]."""
    B = kwargs["cu_seqlens"].shape[0] - 1
    idx = kwargs["ssm_state_indices"][:B]
    copy = _with_null_block(kwargs[adapter.SPEC_INITIAL_STATE][idx.reshape(-1).long()])
    own = torch.arange(1, idx.numel() + 1, dtype=idx.dtype, device=idx.device).reshape(idx.shape)
    o, _ = stock(**{**kwargs, adapter.SPEC_INITIAL_STATE: copy, "ssm_state_indices": own})
    return o[0]
