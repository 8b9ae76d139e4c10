"""The engine's decode step over static buffers: run as it is (``graphs="static"``, the CPU path) or captured
once as one CUDA graph and replayed (``graphs=True``; ``"auto"`` on CUDA). ``treewy.decode.generate`` calls
``run``; ``treewy.decode`` stays the readable loop.

One ``Engine`` per (tree, batch bucket, commit mode, context bucket, drafter kind, sampling, backend), kept on
the model and reused by later ``generate`` calls. Everything a step reads or writes lives in buffers allocated
once: the KV caches of the bucketed context (attention reads the whole context under its validity mask, so
no shape depends on how far a request got), the GDN state (one block; store_all's pool of T snapshots), the
conv states, reconstruct's pending commit (u, k, g copied out of the window: the next verify reads them while
it writes its own u), the MTP drafter's KV cache and root entry, the emitted tokens and the live flags. A step
is draft (MTP inside the step; a host drafter such as n-gram fills ``draft_in`` before it), verify with the
folded commit, acceptance, commit and the tokens' bookkeeping, with no host sync and no data-dependent shape;
the host reads one small packed tensor per step (acceptance, live flags) to decide when to stop.

Rows past the real batch (bucket padding) start finished: a finished row's KV caches, lengths and tokens never
change, and every op works row by row, so what a padding row holds never reaches a real one (a test fills
padding rows with noise). Sampled decoding keeps the eager run's random stream: the bucket is the batch itself
(the uniforms' layout depends on it) and the engine's generator is reseeded per run with the run's seed.
"""

from __future__ import annotations

import time

import torch

from treewy.accept import accept_draft, sample_categorical, sampled_walk_tables
from treewy.decode_records import StepStat, progress_reporter
from treewy.drafters import MTPDrafter, _TreePlan
from treewy.models.cache import HybridCache, KVCache
from treewy.models.hybrid import Window, prefill
from treewy.models.layers import attn_window, conv_weight, gdn_inputs, gdn_output, gdn_project, mlp, rope
from treewy.models.mtp import mtp_forward, mtp_of
from treewy.ops.verify.pending import PendingCommit
from treewy.sampling.params import Sampling

#: Batch buckets of greedy runs: a batch runs in the smallest bucket that holds it, its other rows padding.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: The smallest context bucket; larger ones are powers of two.
MIN_CONTEXT = 64
#: What ``generate(graphs=...)`` takes.
GRAPHS = ("auto", True, False, "static")


def batch_bucket(B: int, exact: bool = False) -> int:
    """The batch rows an engine holds for B requests: the smallest of BUCKETS >= B (B itself when ``exact``).
    A ValueError names the fix for a batch above the largest bucket."""
    if exact:
        return B
    for b in BUCKETS:
        if B <= b:
            return b
    raise ValueError(f"prompts holds {B} requests, more than the largest batch bucket ({BUCKETS[-1]}) of a "
                     f"static-buffer step; pass at most {BUCKETS[-1]} prompts per generate call (split the batch) "
                     "or graphs=False for the eager loop")


def context_bucket(n: int) -> int:
    """KV positions an engine holds for a run that needs n: the next power of two, at least MIN_CONTEXT."""
    c = MIN_CONTEXT
    while c < n:
        c *= 2
    return c


def check_graphs(graphs) -> None:
    if not (graphs is True or graphs is False or graphs in ("auto", "static")):
        raise ValueError(f"graphs = {graphs!r}: expected 'auto' (captured on CUDA, the eager loop elsewhere), True "
                         "(captured; needs CUDA), 'static' (the same static-buffer step, run without capture) or "
                         "False (the eager loop)")


def choose(graphs, device, ops, timing: str, B: int) -> str | None:
    """How generate runs: "capture", "static" or None (the eager loop). "auto" picks capture only where it
    applies; an explicit choice that cannot apply is a ValueError naming the fix."""
    check_graphs(graphs)
    if graphs is False:
        return None
    cuda = torch.device(device).type == "cuda"
    if graphs == "auto":
        ok = cuda and ops.name == "triton" and timing == "step" and B <= BUCKETS[-1]
        return "capture" if ok else None
    if timing != "step":
        raise ValueError(f"timing = {timing!r} syncs between the phases of a step, which a static-buffer step does "
                         "not do; use timing='step' or graphs=False")
    batch_bucket(B)
    if graphs == "static":
        return "static"
    if not cuda:
        raise ValueError("graphs=True captures CUDA graphs, but the model is on the CPU; use graphs='static' (the "
                         "same step without capture) or graphs=False")
    if ops.name != "triton":
        raise ValueError(f"graphs=True needs the Triton kernels, but backend {ops.name!r} validates on the host "
                         "every call; use backend='triton' (or 'auto') or graphs=False")
    return "capture"


class _RunSampling(Sampling):
    """A run's sampling parameters drawing, on the engine's device, from the engine's generator (the one its
    graph was captured with), reseeded with the run's seed: the stream an eager run with that seed draws."""

    def __init__(self, s: Sampling, gen: torch.Generator):
        super().__init__(s.temperature, s.top_k, s.top_p, s.seed, s.rule, s.vocab)
        self._gen = gen
        if s.seed is None:
            gen.seed()
        else:
            gen.manual_seed(s.seed)

    def generator(self, device) -> torch.Generator:
        if torch.device(device).type == self._gen.device.type:
            return self._gen
        return super().generator(device)


class _StaticMTP:
    """The MTP drafter over static buffers: its KV cache, the next entry's position and the root entry's
    output per row. ``prime`` enters the prompts (host data, before the first step); a step drafts from
    the root entry and ``enter`` adds that step's emitted tokens, which gives the next root entry."""

    def __init__(self, spec, mtp, tree, rows: int, capacity: int, dtype, device):
        self.spec, self.mtp, self.T = spec, mtp, tree.num_nodes
        self.cache = KVCache(rows, spec.Hkv, capacity, mtp.layers[0].self_attn.head_dim, dtype, device)
        self.next_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.root_out = torch.zeros(rows, spec.config.hidden_size, dtype=dtype, device=device)
        self.plan = _TreePlan(tree, device)

    def prime(self, prompts, hidden, roots) -> None:
        """The entries of MTPDrafter.begin: entry i + 1 pairs h_i with x_{i+1}, the last one the root."""
        for t in (self.cache.k, self.cache.v, self.cache.lens):
            t.zero_()
        rows, dev = self.next_pos.shape[0], self.next_pos.device
        L = max(len(p) for p in prompts)
        tok = torch.zeros(rows, L, dtype=torch.long, device=dev)
        hid = self.root_out.new_zeros(rows, L, self.root_out.shape[-1])
        n = torch.zeros(rows, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tok[b, :len(p)] = torch.tensor(p[1:] + [int(roots[b])], device=dev)
            hid[b, :len(p)] = hidden[b]
            n[b] = len(p)
        self.next_pos.fill_(1)
        self.enter(tok, hid, n, past=0)

    def enter(self, tok, hid, n, past: int | None = None) -> None:
        """Entries tok, hid [rows, L] (the first n[b] real) into the cache; the last real one is the root entry.
        ``past``: how many cached positions to attend (None: the whole context, masked)."""
        rows, L = tok.shape
        dev = tok.device
        ar = torch.arange(L, device=dev)
        valid = ar[None] < n[:, None]
        mask = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
        mask = mask | torch.eye(L, dtype=torch.bool, device=dev)[None]
        out, k, v = mtp_forward(self.spec, self.mtp, tok, hid, self.next_pos[:, None] + ar,
                                self.cache.past(self.cache.capacity if past is None else past), mask)
        self.cache.append(k, v, ar[None].expand(rows, L), n)
        self.next_pos += n
        self.root_out.copy_(out[torch.arange(rows, device=dev), (n - 1).clamp(min=0)])

    def draft(self, roots, sampling=None):
        """MTPDrafter._draft over the static cache: tokens [rows, T] and, with ``sampling``, q_draft."""
        spec, plan = self.spec, self.plan
        rows = roots.shape[0]
        tokens = torch.full((rows, self.T), -1, dtype=torch.long, device=roots.device)
        tokens[:, 0] = roots
        outs = self.root_out.new_zeros(rows, self.T, self.root_out.shape[-1])
        outs[:, 0] = self.root_out
        q = None
        if sampling is not None:
            q = torch.zeros(rows, self.T, spec.config.vocab_size, device=roots.device)
        plan.fill(tokens, spec.lm_head(self.root_out)[:, None], plan.root_fill, q, plan.root, sampling)
        root_pos = self.next_pos - 1
        past = self.cache.past(self.cache.capacity)
        for lv in plan.levels:
            out, _, _ = mtp_forward(spec, self.mtp, tokens[:, lv.nodes].clamp(min=0), outs[:, lv.parents],
                                    root_pos[:, None] + lv.depth[None], past, lv.mask.expand(rows, -1, -1))
            new = out[:, lv.new]
            outs[:, lv.new_nodes] = new
            plan.fill(tokens, spec.lm_head(new), lv.fill, q, lv.new_nodes, sampling)
        return tokens, q


class Engine:
    """Static buffers and the step over them, for one key (see the module docstring)."""

    def __init__(self, spec, tree, rows: int, mode: str, capacity: int, kind: str, sampling_key, ops,
                 dtype, device, capture: bool):
        self.spec, self.tree, self.rows, self.mode, self.kind, self.ops = spec, tree, rows, mode, kind, ops
        self.device, self.capture, self.sampled = torch.device(device), capture, sampling_key is not None
        self.children_sampled = self.sampled and sampling_key[-1] != "match"
        T = tree.num_nodes
        self.window = Window.of(tree, rows, device)
        self.cache = c = HybridCache.empty(spec, rows, capacity, dtype, device)
        if mode == "store_all":
            for i in spec.gdn_layers:
                c.ssm[i] = torch.zeros(rows, T, spec.HV, spec.V, spec.K, device=device)
        self.pend: dict[int, tuple] = {}   # layer -> (u, k, g) of the last window, made by the first step
        self.pacc = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self.roots = torch.zeros(rows, dtype=torch.long, device=device)
        self.live = torch.zeros(rows, dtype=torch.bool, device=device)
        self.n_out = torch.zeros(rows, dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, capacity + 1, dtype=torch.long, device=device)  # last column: scratch
        self.limit = torch.zeros((), dtype=torch.long, device=device)
        self.eos = torch.full((), -1, dtype=torch.long, device=device)
        self.draft_in = torch.full((rows, T), -1, dtype=torch.long, device=device) if kind == "host" else None
        self.q_in = None
        if kind == "host" and self.children_sampled:
            self.q_in = torch.zeros(rows, T, spec.config.vocab_size, device=device)
        self.mtp = _StaticMTP(spec, mtp_of(spec.model), tree, rows, capacity, dtype, device) if kind == "mtp" \
            else None
        self.gen = torch.Generator(device) if self.sampled else None
        self.rank, self.width = sampled_walk_tables(tree, self.window.rows) if self.sampled else (None, None)
        self.sampling = None
        self.transient_bytes = 0
        self.graph, self.outputs, self.warm = None, None, False

    # ------------------------------------------------------------------ per run (host)

    def reset(self, prompts, sampling, max_new_tokens: int, eos_token_id: int | None):
        """Zero the buffers in place (a captured graph keeps reading them), prefill the prompts into rows
        0..B-1 and return the first tokens [B]; the other rows start finished."""
        c = self.cache
        for t in [*c.ssm.values(), *c.conv.values(), c.slot, c.lens, self.n_out, self.tokens, self.roots]:
            t.zero_()
        for kv in c.kv.values():
            for t in (kv.k, kv.v, kv.lens):
                t.zero_()
        self.pacc.fill_(-1)
        self.limit.fill_(max_new_tokens)
        self.eos.fill_(-1 if eos_token_id is None else eos_token_id)
        if self.draft_in is not None:
            self.draft_in.fill_(-1)
        self.sampling = None if sampling is None else _RunSampling(sampling, self.gen)
        B = len(prompts)
        hidden, logits = prefill(self.spec, c, prompts, self.device)
        if self.sampling is None:
            roots = logits.argmax(-1)
        else:
            roots = sample_categorical(self.sampling.warp(logits), self.sampling.uniforms((B,), self.device)[1])
        self.roots[:B] = roots
        self.tokens[:B, 0] = roots
        self.n_out[:B] = 1
        first = roots.tolist()
        done = [max_new_tokens <= 1 or (eos_token_id is not None and r == eos_token_id) for r in first]
        self.live.zero_()
        self.live[:B] = torch.tensor([not x for x in done], device=self.device)
        if self.mtp is not None:
            self.mtp.prime(prompts, hidden, first)
        return hidden, first, done

    def run_step(self):
        """One step: the step itself (``static``; the first step of a captured engine, which compiles and
        tunes the kernels and makes the pending buffers), else a replay of the graph captured on the second."""
        if not self.capture:
            return self.step()
        if self.graph is None:
            if not self.warm:
                self.warm = True
                out = self.step()
                torch.cuda.synchronize(self.device)
                return out
            self.graph = torch.cuda.CUDAGraph()
            if self.sampled:
                self.graph.register_generator_state(self.gen)
            with torch.cuda.graph(self.graph):
                self.outputs = self.step()
        self.graph.replay()
        return self.outputs

    # ------------------------------------------------------------------ the step (device only)

    def step(self):
        """Draft, verify (reconstruct: the last commit folded in), accept, commit, emit. Returns (packed [rows,
        5 + n]: live before, accepted node, acceptance length, live after, tokens out, then the n emitted
        tokens; the target's hidden states along the accepted path [rows, n, hidden])."""
        q = None
        if self.mtp is not None:
            draft, q = self.mtp.draft(self.roots, self.sampling if self.children_sampled else None)
        elif self.draft_in is not None:
            draft, q = self.draft_in.clone(), self.q_in
            draft[:, 0] = self.roots
        else:
            draft = self.roots[:, None].clone()
        logits, hid = self._verify(draft.clamp(min=0))
        acc = self._accept(draft, logits, q)
        self._commit(acc)
        return self._emit(draft, hid, acc)

    def _verify(self, tokens):
        spec, c, win = self.spec, self.cache, self.window
        h = spec.embed(tokens)
        cos, sin = rope(spec, h, c.lens[:, None] + win.depth)
        self._gdn, self._kv, self.transient_bytes = {}, {}, 0
        for i, layer in enumerate(spec.layers):
            r = h
            x = layer.input_layernorm(h)
            if spec.kinds[i] == "gdn":
                x = self._gdn_layer(i, layer.linear_attn, x)
            else:
                x, kw, vw = attn_window(layer.self_attn, x, cos, sin, c.kv[i].past(c.kv[i].capacity), win.anc)
                self._kv[i] = (kw, vw)
            h = r + x
            h = h + mlp(layer, layer.post_attention_layernorm(h))
        h = spec.norm(h)
        return spec.lm_head(h), h

    def _gdn_layer(self, i, gdn, x):
        c, win, ops = self.cache, self.window, self.ops
        mixed, z, b, a = gdn_project(gdn, x)
        mixed = mixed.contiguous()
        y = ops.tree_conv1d(mixed, conv_weight(gdn), c.conv[i], win.parents, gdn.conv1d.bias, "silu")
        q, k, v, g, beta = gdn_inputs(gdn, y, b, a)
        if self.mode == "reconstruct":
            if i not in self.pend:
                self.pend[i] = (torch.zeros(v.shape, device=v.device), torch.zeros_like(k), torch.zeros_like(g))
            pu, pk, pg = self.pend[i]
            o, u = ops.tree_step(q, k, v, g, beta, c.state_view(i), win.parents,
                                 PendingCommit(pu, pk, pg, win.parents, self.pacc), win.max_depth)
            self._gdn[i] = (mixed, (u, k, g))
            self.transient_bytes += u.numel() * u.element_size() // self.rows
        else:
            pool = c.ssm[i]
            S0 = pool[:, 0] if pool.shape[1] == 1 else pool[torch.arange(self.rows, device=pool.device), c.slot]
            o, states = ops.store_all_verify(q, k, v, g, beta, S0, win.parents)
            self._gdn[i] = (mixed, states)
            self.transient_bytes += states.numel() * states.element_size() // self.rows
        return gdn_output(gdn, o, z, x.dtype)

    def _accept(self, draft, logits, q_draft):
        win = self.window
        return accept_draft(win.rows, win.max_depth, draft, logits, q_draft, self.sampling, self.width, self.rank)

    def _commit(self, acc):
        """treewy.models.hybrid.commit into the static buffers: conv states and the KV caches at once; the GDN
        state as reconstruct's pending commit (u, k, g copied out, accepted into pacc) or store_all's pool."""
        c, win = self.cache, self.window
        acc32 = acc.accepted.to(torch.int32)
        count = acc.length * self.live.long()
        for i, (mixed, held) in self._gdn.items():
            conv = self.ops.tree_conv1d_commit(mixed, c.conv[i], win.parents, acc32)
            if conv is not c.conv[i]:
                c.conv[i].copy_(conv)
            if self.mode == "reconstruct":
                for buf, t in zip(self.pend[i], held):
                    buf.copy_(t)
            else:
                c.ssm[i].copy_(held)
        if self.mode == "reconstruct":
            self.pacc.copy_(acc32)
        else:
            c.slot.copy_(acc.accepted)
        for i, (kw, vw) in self._kv.items():
            c.kv[i].append(kw, vw, acc.path, count)
        c.lens += count

    def _emit(self, draft, hid, acc):
        """The emitted tokens (accepted drafts, then the bonus) into ``tokens`` up to the token limit or the end
        token, as decode._extend appends them; the MTP drafter's entries; the next roots."""
        rows, n = acc.path.shape
        dev = draft.device
        nodes = acc.path.clamp(min=0)
        along = hid[torch.arange(rows, device=dev)[:, None], nodes]       # [rows, n, hidden]
        on_path = draft.gather(1, nodes)
        j = torch.arange(n, device=dev)[None]
        last = acc.length[:, None] - 1
        em = torch.where(j == last, acc.bonus[:, None], torch.cat([on_path[:, 1:], on_path[:, :1]], 1))
        live0 = self.live.clone()
        stop = (j <= last) & ((self.n_out[:, None] + j + 1 >= self.limit) | (em == self.eos))
        first = torch.where(stop, j, n).min(1).values
        take = torch.where(first < n, first + 1, acc.length) * live0.long()
        pos = torch.where(j < take[:, None], self.n_out[:, None] + j, self.tokens.shape[1] - 1)
        self.tokens.scatter_(1, pos, em)
        self.n_out += take
        self.live &= ~stop.any(1)
        self.roots.copy_(acc.bonus)
        if self.mtp is not None:
            self.mtp.enter(em, along, acc.length)
        packed = torch.stack([live0.long(), acc.accepted, acc.length, self.live.long(), self.n_out], 1)
        return torch.cat([packed, em], 1), along


def engines(model) -> dict:
    """The engines kept on a model (key -> Engine), to inspect or time; ``drop_engines`` frees them."""
    return model.__dict__.setdefault("_treewy_engines", {})


def drop_engines(model) -> None:
    """Free a model's engines and their graphs (the next generate allocates and captures again)."""
    engines(model).clear()


def run(model, spec, prompts, drafter, tree, mode: str, sampling, max_new_tokens: int, eos_token_id, ops,
        how: str, progress, result) -> None:
    """The decoding loop of ``generate`` over an engine: fills ``result`` (tokens, per-step stats). StepStat
    times: step_ms the whole step (a host drafter's proposal, the step, its one read, the host's bookkeeping);
    draft_ms only a host drafter's proposal (MTP drafts inside the step: 0); no phase times."""
    B = len(prompts)
    T = tree.num_nodes
    param = next(model.parameters())
    kind = "none" if drafter is None else "mtp" if isinstance(drafter, MTPDrafter) else "host"
    skey = None if sampling is None else (sampling.temperature, sampling.top_k, sampling.top_p, sampling.rule)
    rows = batch_bucket(B, exact=sampling is not None)
    capacity = context_bucket(max(len(p) for p in prompts) + max_new_tokens + T + 1)
    key = (tuple(tree.parents.tolist()), rows, mode, capacity, kind, skey, ops.name, how, param.dtype)
    pool = engines(model)
    if key not in pool:
        pool[key] = Engine(spec, tree, rows, mode, capacity, kind, skey, ops, param.dtype, param.device,
                           capture=how == "capture")
    eng = pool[key]
    hidden, first, done = eng.reset(prompts, sampling, max_new_tokens, eos_token_id)
    if kind == "host":
        drafter.begin(model, prompts, hidden, first, capacity=capacity + max_new_tokens + 1)
    held = eng.cache.gdn_state_bytes()
    report = progress_reporter(progress, B * max_new_tokens)
    step_no = 0
    while not all(done):
        t0 = time.perf_counter()
        if kind == "host":
            _host_draft(eng, drafter, tree)
        t1 = time.perf_counter()
        packed_t, along = eng.run_step()
        packed = packed_t[:B].tolist()                          # the step's one read
        t2 = time.perf_counter()
        if kind == "host":
            emitted = [row[5:5 + row[2]] if row[0] else [row[4 + row[2]]] for row in packed]
            drafter.advance(emitted, [along[b, :row[2]].clone() if row[0] else along[b, row[2] - 1:row[2]].clone()
                                      for b, row in enumerate(packed)])
        t3 = time.perf_counter()
        times = dict(step_ms=(t3 - t0) * 1e3, draft_ms=(t1 - t0) * 1e3, host_ms=(t3 - t2) * 1e3)
        result.steps.extend(StepStat(step_no, b, row[1], row[2], held, eng.transient_bytes, **times)
                            for b, row in enumerate(packed) if row[0])
        done = [not row[3] for row in packed]
        step_no += 1
        report(sum(row[4] for row in packed))
    report(None)
    counts = eng.n_out[:B].tolist()
    result.tokens[:] = [row[:n] for row, n in zip(eng.tokens[:B].tolist(), counts)]


def _host_draft(eng: Engine, drafter, tree) -> None:
    """A host drafter's proposal into the engine's draft buffer (and q_draft for sampled children)."""
    if eng.children_sampled:
        draft, q = drafter.propose_sampled(tree, eng.sampling)
        eng.q_in[:q.shape[0]].copy_(q)
    else:
        draft = drafter.propose(tree)
    eng.draft_in[:draft.shape[0]].copy_(draft)
