"""Greedy tree speculative decoding on a Qwen3.5 / Qwen3-Next hybrid, read top to bottom in ``generate``.

One step for a batch: the drafter proposes a token tree per request; one verify pass runs the
window (root + drafts) through the model from the committed caches (GDN: tree conv1d + TreeWY
verify, or the store-all recurrence; attention: committed prefix + ancestor mask); greedy
acceptance picks the accepted node a; commit moves the GDN/conv states to a and keeps only the
accepted path in the KV caches; the request emits the accepted drafts and the bonus token (the
target's argmax at a), which is the next step's root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from treewy.accept import greedy
from treewy.tree import DraftTree, as_tree

COMMIT_MODES = ("reconstruct", "store_all")


@dataclass
class StepStat:
    step: int
    request: int
    accepted: int            # the committed node
    length: int              # tokens emitted this step = depth(accepted) + 1
    gdn_state_bytes: int     # GDN state blocks held by this request after the step, all GDN layers
    transient_bytes: int     # per request during the step: U (reconstruct) or the snapshots (store_all)
    step_ms: float           # wall time of the batch step (draft + verify + accept + commit)
    draft_ms: float


@dataclass
class GenerateResult:
    tokens: list[list[int]]
    steps: list[StepStat] = field(default_factory=list)
    tree: DraftTree | None = None
    commit: str | None = None
    drafter: str | None = None

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per request-step."""
        return sum(s.length for s in self.steps) / max(1, len(self.steps))

    def frame(self):
        import polars as pl
        return pl.DataFrame([s.__dict__ for s in self.steps])


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _check_prompts(prompts, vocab: int, context: int, max_new_tokens: int, T: int) -> list[list[int]]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists, e.g. [[256, 104, 105]]; "
                         "use treewy.models.tokenizer.encode(text) for text")
    if all(isinstance(t, int) for t in prompts):
        raise ValueError("prompts is a flat list of ints; wrap a single prompt in a list: [prompt]")
    out = []
    for i, p in enumerate(prompts):
        p = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        if not p:
            raise ValueError(f"prompt {i} is empty: every request needs at least one token "
                             "(start it with <bos>, e.g. treewy.models.tokenizer.encode(''))")
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in p):
            raise ValueError(f"prompt {i} holds ids outside 0..{vocab - 1}; tokenize with the model's vocabulary")
        need = len(p) + max_new_tokens + T
        if need > context:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens = {max_new_tokens} and a "
                             f"window of {T} nodes it needs {need} positions, more than the model's context of "
                             f"{context}; shorten the prompt or lower max_new_tokens")
        out.append(p)
    return out


@torch.no_grad()
def generate(model, prompts, drafter=None, tree=(3, 3, 3), commit="reconstruct", max_new_tokens: int = 32,
             eos_token_id: int | None = None, backend: str = "auto") -> GenerateResult:
    """Greedy decoding of a batch of prompts (lists of token ids), speculative when ``drafter`` is given.

    drafter: None (plain greedy), "mtp", "ngram" or a Drafter; tree: branching factors such as
    (3, 3, 3), a DraftTree or a parent array; commit: "reconstruct" (TreeWY: one GDN state block per
    request) or "store_all" (N + 1 snapshots); backend: "auto" | "torch" | "triton" for the GDN ops.
    """
    from treewy.drafters import make_drafter
    from treewy.models.hybrid import commit as commit_window, prefill, verify
    from treewy.models.cache import HybridCache
    from treewy.models.backends import get_ops
    from treewy.models.spec import spec_of

    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected a positive integer")
    spec = spec_of(model)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    d = make_drafter(drafter, model)
    if d is None:
        tr, mode = DraftTree([-1]), "store_all"  # plain decoding: one state, written in place
    else:
        if commit is None:
            commit = "reconstruct"
        if commit not in COMMIT_MODES:
            raise ValueError(f"commit = {commit!r}: expected 'reconstruct', 'store_all' or None")
        tr, mode = as_tree(tree), commit
    T = tr.num_nodes
    prompts = _check_prompts(prompts, spec.config.vocab_size, spec.config.max_position_embeddings,
                             max_new_tokens, T)
    B = len(prompts)
    capacity = max(len(p) for p in prompts) + max_new_tokens + T + 1
    cache = HybridCache.empty(spec, B, capacity, dtype, device)
    ops = get_ops(device, backend)

    hidden, logits = prefill(spec, cache, prompts, device)
    roots = logits.argmax(-1)                                            # [B]
    out = [[int(r)] for r in roots.tolist()]
    done = [max_new_tokens <= 1 or (eos_token_id is not None and o[0] == eos_token_id) for o in out]
    if d is not None:
        d.begin(model, prompts, hidden, [o[0] for o in out], capacity=capacity + max_new_tokens + 1)
    parents = tr.parents.long().to(device)[None].expand(B, T).contiguous()
    result = GenerateResult(out, tree=tr if d is not None else None,
                            commit=mode if d is not None else None, drafter=getattr(d, "name", None))
    step = 0
    while not all(done):
        t0 = _sync(device)
        if d is None:
            draft = roots[:, None]
        else:
            draft = d.propose(tr).to(device)                             # [B, T], -1 = no token
            draft[:, 0] = roots
        t1 = _sync(device)
        logits, hid, pend = verify(spec, cache, draft.clamp(min=0), parents, mode, ops)
        acc = greedy(parents, draft, logits.argmax(-1))
        live = torch.tensor([not x for x in done], device=device)
        commit_window(spec, cache, pend, parents, acc.accepted, acc.path, acc.length, ops, live)
        t2 = _sync(device)
        held = cache.gdn_state_bytes()
        emitted, path_hidden = [], []
        lengths = acc.length.tolist()
        for b in range(B):
            e = acc.emitted(draft, b)
            if done[b]:
                emitted.append(e[-1:])
                path_hidden.append(hid[b, acc.accepted[b]][None])
                continue
            emitted.append(e)
            path_hidden.append(hid[b, acc.path[b, :lengths[b]]])
            result.steps.append(StepStat(step, b, int(acc.accepted[b]), lengths[b], held, pend.transient_bytes,
                                         (t2 - t0) * 1e3, (t1 - t0) * 1e3))
            for t in e:
                out[b].append(int(t))
                if len(out[b]) >= max_new_tokens or (eos_token_id is not None and t == eos_token_id):
                    done[b] = True
                    break
        roots = acc.bonus
        if d is not None:
            d.advance(emitted, path_hidden)
        step += 1
    return result
