"""Tree speculative decoding on a Qwen3.5 / Qwen3-Next hybrid, read top to bottom in ``generate``.

One step for a batch: the drafter proposes a token tree per request; one verify pass runs the
window (root + drafts) through the model from the committed caches (GDN: tree conv1d + TreeWY
verify, or the store-all recurrence; attention: committed prefix + ancestor mask); acceptance picks
the accepted node a (greedy at temperature 0; at temperature > 0 a rule of ``treewy.accept`` that keeps
the target's sampling distribution exactly); commit moves the conv states to a, keeps only the accepted
path in the KV caches and moves the GDN state to a (store_all: picks a's snapshot; reconstruct:
leaves a pending commit that the next verify folds in); the request emits the accepted drafts and
the bonus token (the target's argmax at a, or its sample there), which is the next step's root.

The step loop launches the step's device work without host syncs (the tree is validated and put on
the device once per ``generate``); the host waits for the device after the draft, once in verify
(the longest committed prefix, which sizes the attention window), and after the commit, then reads
the step's outcome in one transfer. On CUDA ``generate`` runs the same step as one replayed CUDA graph over
static buffers instead (``graphs``, treewy/decode_graph.py); this loop stays the readable one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from treewy import decode_graph
from treewy.accept import accept_draft, sample_categorical, sampled_walk_tables
from treewy.decode_records import StepStat, progress_reporter
from treewy.drafters import make_drafter
from treewy.models.backends import get_ops
from treewy.models.cache import HybridCache
from treewy.models.hybrid import Window, prefill, verify
from treewy.models.hybrid import commit as commit_window
from treewy.models.spec import spec_of
from treewy.sampling.params import Sampling, sampling_of
from treewy.tree import DraftTree, short_repr, as_int, as_tree

COMMIT_MODES = ("reconstruct", "store_all")


PHASES = ("draft", "verify", "accept", "commit", "host")
TIMINGS = ("step", "phases")


class _Clock:
    """Per-step phase times. A phase ends with a device sync only where it must be timed: after the
    draft and after the commit (the step's device work) always, after verify and accept with
    ``phases`` (two more syncs per step, which also keep the host from running ahead)."""

    def __init__(self, device, phases: bool):
        self.device, self.phases = device, phases

    def start(self) -> None:
        self.t = time.perf_counter()  # the previous step ended with the device idle
        self.ms: dict[str, float] = {}

    def end(self, phase: str, sync: bool = False) -> None:
        now = _sync(self.device) if sync else time.perf_counter()
        self.ms[phase] = (now - self.t) * 1e3
        self.t = now

    def stat_fields(self) -> dict:
        ms = self.ms
        device_ms = ms["verify"] + ms["accept"] + ms["commit"]
        out = dict(step_ms=ms["draft"] + device_ms + ms["host"], draft_ms=ms["draft"], host_ms=ms["host"])
        if self.phases:
            out.update(verify_ms=ms["verify"], accept_ms=ms["accept"], commit_ms=ms["commit"])
        return out


@dataclass
class GenerateResult:
    tokens: list[list[int]]
    steps: list[StepStat] = field(default_factory=list)
    tree: DraftTree | None = None
    commit: str | None = None
    drafter: str | None = None
    sampling: Sampling | None = None  # None: greedy

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
    if all(as_int(t) is not None for t in prompts):
        raise ValueError("prompts is a flat list of ints; wrap a single prompt in a list: [prompt]")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            raise ValueError(f"prompt {i} = {short_repr(p)} is text: pass token ids, e.g. "
                             "treewy.models.tokenizer.encode(text)")
        if isinstance(p, torch.Tensor) or type(p).__module__ == "numpy":
            if getattr(p, "ndim", None) != 1:
                raise ValueError(f"prompt {i} has shape {tuple(getattr(p, 'shape', ()))}: expected a 1-D array "
                                 "of token ids")
            p = p.tolist()
        elif not isinstance(p, (list, tuple)):
            raise ValueError(f"prompt {i} = {short_repr(p)}: expected a list of token ids such as [256, 104, 105]")
        ids = [as_int(t) for t in p]
        if not ids:
            raise ValueError(f"prompt {i} is empty: every request needs at least one token "
                             "(start it with <bos>, e.g. treewy.models.tokenizer.encode(''))")
        for j, (t, k) in enumerate(zip(p, ids)):
            if k is None:
                raise ValueError(f"prompt {i}, token {j} = {t!r}: expected an integer token id, got "
                                 f"{type(t).__name__}")
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt {i} holds ids outside 0..{vocab - 1}; tokenize with the model's vocabulary")
        need = len(ids) + max_new_tokens + T
        if need > context:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; with max_new_tokens = {max_new_tokens} and a "
                             f"window of {T} nodes it needs {need} positions, more than the model's context of "
                             f"{context}; shorten the prompt or lower max_new_tokens")
        out.append(ids)
    return out


@torch.no_grad()
def generate(model, prompts, drafter=None, tree=(3, 3, 3), commit="reconstruct", max_new_tokens: int = 32,
             eos_token_id: int | None = None, backend: str = "auto", timing: str = "step",
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, rule: str = "match", progress=False, graphs="auto") -> GenerateResult:
    """Decoding of a batch of prompts (lists of token ids), speculative when ``drafter`` is given.

    drafter: None (plain decoding), "mtp", "ngram" or a Drafter; tree: branching factors such as
    (3, 3, 3), a DraftTree or a parent array; commit: "reconstruct" (TreeWY: one GDN state block per
    request, each step's commit folded into the next verify) or "store_all" (N + 1 snapshots); plain
    decoding uses neither but checks both (tree may then also be None);
    backend: "auto" | "torch" | "triton" for the GDN ops; timing: "step" (two device syncs per step:
    draft and step times) or "phases" (also verify / accept / commit times, two more syncs).

    temperature: 0 is greedy (top_k, top_p, seed and rule are then checked but unused); above 0 every token is
    distributed as sampling softmax(logits / temperature), cut to top_k and top_p, would draw it;
    rule: how the tree is drafted and accepted ("match": fixed top-w / n-gram children; "rrs" /
    "rrs_wor": children sampled from the drafter, with / without replacement; see treewy.accept);
    seed: the same seed reproduces a run on the same device. progress: True shows a tqdm bar over
    the tokens; a callable gets (tokens so far, most tokens) after every step.

    graphs: "auto" (on CUDA with the Triton kernels and timing="step", each step one replayed CUDA graph over
    static buffers; elsewhere this loop), True (captured, or a ValueError saying why not), "static" (the same
    static-buffer step without capture: what the CPU checks it by) or False (this loop). Both give the same
    tokens; see treewy.decode_graph.
    """
    if as_int(max_new_tokens) is None or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected a positive integer")
    max_new_tokens = as_int(max_new_tokens)
    if timing not in TIMINGS:
        raise ValueError(f"timing = {timing!r}: expected one of {TIMINGS}")
    spec = spec_of(model)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    vocab = spec.config.vocab_size
    if eos_token_id is not None:
        if as_int(eos_token_id) is None or not 0 <= eos_token_id < vocab:
            raise ValueError(f"eos_token_id = {eos_token_id!r}: expected None (no end token) or a token id in "
                             f"0..{vocab - 1}")
        eos_token_id = as_int(eos_token_id)
    sampling = sampling_of(temperature, top_k, top_p, seed, rule, vocab)
    d = make_drafter(drafter, model)
    if sampling is not None and sampling.sampled_children and d is not None \
            and not callable(getattr(d, "propose_sampled", None)):
        raise ValueError(f"rule = {rule!r} samples the children from the drafter, but drafter {d!r} has no "
                         "propose_sampled(); use rule='match' (fixed-token children) or a drafter that "
                         "returns its probabilities (see treewy.drafters)")
    # tree and commit are checked even when plain decoding does not use them: a typo is an error there too
    if commit is not None and commit not in COMMIT_MODES:
        raise ValueError(f"commit = {commit!r}: expected 'reconstruct', 'store_all' or None")
    if d is None:
        if tree is not None:
            as_tree(tree)
        tr, mode = DraftTree([-1]), "store_all"  # plain decoding: one state, written in place
    else:
        tr, mode = as_tree(tree), commit or "reconstruct"
    T = tr.num_nodes
    prompts = _check_prompts(prompts, vocab, spec.config.max_position_embeddings, max_new_tokens, T)
    B = len(prompts)
    ops = get_ops(device, backend)
    how = decode_graph.choose(graphs, device, ops, timing, B)
    if how is not None:
        result = GenerateResult([], tree=tr if d is not None else None, commit=mode if d is not None else None,
                                drafter=getattr(d, "name", None), sampling=sampling)
        decode_graph.run(model, spec, prompts, d, tr, mode, sampling, max_new_tokens, eos_token_id, ops, how,
                         progress, result)
        return result
    capacity = max(len(p) for p in prompts) + max_new_tokens + T + 1
    cache = HybridCache.empty(spec, B, capacity, dtype, device)
    window = Window.of(tr, B, device)

    with record_function("treewy.prefill"):
        hidden, logits = prefill(spec, cache, prompts, device)
    if sampling is None:
        roots = logits.argmax(-1)                                        # [B]
    else:
        roots = sample_categorical(sampling.warp(logits), sampling.uniforms((B,), device)[1])
    out = [[int(r)] for r in roots.tolist()]
    done = [max_new_tokens <= 1 or (eos_token_id is not None and o[0] == eos_token_id) for o in out]
    if d is not None:
        d.begin(model, prompts, hidden, [o[0] for o in out], capacity=capacity + max_new_tokens + 1)
    result = GenerateResult(out, tree=tr if d is not None else None, commit=mode if d is not None else None,
                            drafter=getattr(d, "name", None), sampling=sampling)
    loop = _Loop(spec, cache, ops, tr, window, mode, d, _Clock(device, timing == "phases"), sampling)
    report = progress_reporter(progress, B * max_new_tokens)
    while not all(done):
        roots = loop.step(roots, done, out, max_new_tokens, eos_token_id, result.steps)
        report(sum(len(o) for o in out))
    report(None)
    cache.flush()
    return result


class _Loop:
    """The step of ``generate``: draft, verify, accept, commit, then the outcome on the host."""

    def __init__(self, spec, cache, ops, tree, window, mode, drafter, clock, sampling=None):
        self.spec, self.cache, self.ops, self.tree, self.window, self.mode = spec, cache, ops, tree, window, mode
        self.drafter, self.clock, self.sampling = drafter, clock, sampling
        self.rank, self.width = sampled_walk_tables(tree, window.rows) if sampling is not None else (None, None)
        self.step_no = 0
        self.live, self.live_for = None, None

    def step(self, roots, done, out, max_new_tokens, eos_token_id, stats):
        """One batch step; appends tokens to ``out`` and StepStats to ``stats``; returns the next roots."""
        clock, win, d = self.clock, self.window, self.drafter
        clock.start()
        with record_function("treewy.draft"):
            draft, q_draft = (roots[:, None], None) if d is None else _propose(d, self.tree, roots, self.sampling)
        clock.end("draft", sync=True)
        with record_function("treewy.verify"):
            logits, hid, pend = verify(self.spec, self.cache, draft.clamp(min=0), win, self.mode, self.ops)
        clock.end("verify", sync=clock.phases)
        with record_function("treewy.accept"):
            acc = self._accept(draft, logits, q_draft)
        clock.end("accept", sync=clock.phases)
        with record_function("treewy.commit"):
            commit_window(self.spec, self.cache, pend, win, acc.accepted, acc.path, acc.length, self.ops,
                          self._live(done, roots.device))
        clock.end("commit", sync=True)
        with record_function("treewy.host"):
            emitted, path_hidden, accepted, lengths = _outcome(draft, hid, acc, done)
            held = self.cache.gdn_state_bytes()
            rows = []
            for b in range(len(done)):
                if done[b]:
                    continue
                rows.append((b, accepted[b], lengths[b]))
                _extend(out, b, emitted[b], done, max_new_tokens, eos_token_id)
            if d is not None:
                d.advance(emitted, path_hidden)
        clock.end("host")
        times = clock.stat_fields()
        stats.extend(StepStat(self.step_no, b, a, n, held, pend.transient_bytes, **times) for b, a, n in rows)
        self.step_no += 1
        return acc.bonus

    def _accept(self, draft, logits, q_draft):
        win = self.window
        return accept_draft(win.rows, win.max_depth, draft, logits, q_draft, self.sampling, self.width, self.rank)

    def _live(self, done, device):
        """live [B] on the device, rebuilt only when a request finishes."""
        if self.live_for != done:
            self.live, self.live_for = torch.tensor([not x for x in done], device=device), list(done)
        return self.live


def _propose(drafter, tree, roots, sampling=None):
    """The drafted tokens [B, T] (-1 = no token) on the roots' device, and q_draft [B, T, V] when the
    children were sampled from the drafter (else None)."""
    if sampling is not None and sampling.sampled_children:
        draft, q_draft = drafter.propose_sampled(tree, sampling)
        q_draft = q_draft.to(roots.device)
    else:
        draft, q_draft = drafter.propose(tree), None
    draft = draft.to(roots.device)
    draft[:, 0] = roots
    return draft, q_draft


def _outcome(draft, hid, acc, done):
    """The step's outcome on the host in one transfer: per request the emitted tokens (accepted drafts
    then the bonus; only the bonus for a finished request), the target hidden states along them,
    the accepted node and the acceptance length."""
    B, n = acc.path.shape
    nodes = acc.path.clamp(min=0)
    along = hid[torch.arange(B, device=hid.device)[:, None], nodes]   # [B, n, hidden]
    packed = torch.cat([draft.gather(1, nodes), acc.bonus[:, None], acc.length[:, None], acc.accepted[:, None]],
                       1).tolist()
    emitted, path_hidden, accepted, lengths = [], [], [], []
    for b, row in enumerate(packed):
        length, a = row[n + 1], row[n + 2]
        lo = length - 1 if done[b] else 0
        emitted.append(row[1 + lo:length] + [row[n]])
        path_hidden.append(along[b, lo:length])
        accepted.append(a)
        lengths.append(length)
    return emitted, path_hidden, accepted, lengths


def _extend(out, b, tokens, done, max_new_tokens, eos_token_id):
    """Append request b's emitted tokens, stopping at max_new_tokens or the end-of-sequence token."""
    for t in tokens:
        out[b].append(t)
        if len(out[b]) >= max_new_tokens or (eos_token_id is not None and t == eos_token_id):
            done[b] = True
            break
