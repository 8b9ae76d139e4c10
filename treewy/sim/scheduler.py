"""Step-level continuous batching, the way vLLM's V1 scheduler runs a GDN hybrid with speculation.

``run`` is the loop; each regular step (``_Engine.step``) does, in order:

1. Running requests, oldest first (``_schedule_oldest``, in one vectorized pass while nobody must be preempted,
   then ``_schedule_rest``): a decoding request schedules T = N + 1 tokens (its last token
   and N drafts); a prefilling request a chunk of what is left of its prompt (chunked prefill),
   while the step's token budget (``max_num_batched_tokens``) lasts. Each needs attention blocks
   for its KV slots (``cdiv(tokens, block_size)`` per attention group); when the pool has too few
   free blocks, the newest running request is preempted (recompute: its blocks are freed, it goes
   back to the front of the waiting queue and later prefills prompt + generated tokens again), as
   many times as needed, possibly the request itself.
2. If nothing was preempted, waiting requests are admitted (``_admit``) in arrival order while the budget,
   ``max_num_seqs`` and the pool allow: a request's first chunk of KV blocks and all its GDN state
   pages (store-all N + 1 per GDN group, reconstruct 1) must fit. The first that does not fit
   stops admission (FCFS).
3. The step takes ``cost(...)`` seconds (``_execute``). A prefill that completes samples the first token (TTFT).
   A verify emits 1 + a tokens, where a is the accepted depth: P(a >= i) = prod of the per-depth
   acceptance rates up to i. Output stops at the request's length.

Asynchronous scheduling (``ServerConfig.async_scheduling``, on in vLLM 0.26): the engine schedules step K + 1
as soon as step K is launched and reads step K's outputs only after that (``EngineCore.step_with_batch_queue``,
a batch queue of 2: "fulfilling the batch queue has a higher priority than getting model outputs"). So step K's
outputs reach the scheduler at step K + 2: a request that finished in step K still holds its blocks and its
slot in step K + 1, and runs in it as a wasted verify unless the step's one sure token finished it (vLLM's
scheduler skips only those, ``Scheduler.schedule``: "Avoid scheduling an extra step when we are sure that the
previous step has reached request.max_tokens"); its blocks serve step K + 2. The client gets the last token at
the end of step K and sends the next request of a closed loop; that request reaches the engine after step K + 2
was scheduled and prefills in step K + 3: its TTFT is three steps, not one. A request arriving during step K
(open loop) is first seen when step K + 2 is scheduled. An idle engine schedules at once.

Between events (a finish, an arrival, a shortage of blocks) a batch of pure decode steps is advanced in one
vectorized block (``treewy.sim.fast_path``): the same rules for draws, costs and block growth, not one Python
iteration per step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from treewy.memory import PagingLayout, ServerConfig
from treewy.sim.cost import StepCost
from treewy.sim.fast_path import decode_until_event


@dataclass
class PointResult:
    t_send: np.ndarray
    t_first: np.ndarray
    t_done: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    generated: np.ndarray
    failed: np.ndarray
    finish_count: np.ndarray     # times each request finished (must be 1, 0 when failed)
    peak_blocks: int
    num_blocks: int
    peak_running: int
    preemptions: int
    decode_steps: int            # request-steps of verification
    decode_tokens: int           # tokens those steps emitted
    steps: int
    eager_steps: int             # steps run without CUDA graphs (StepCost.eager): a prefill chunk, too many tokens
    eager_time: float            # the seconds those steps took
    capacity_violations: int
    duration: float


def run(layout: PagingLayout, cost: StepCost, prompt: np.ndarray, output: np.ndarray, *,
        accept_cum: np.ndarray, rng: np.random.Generator, concurrency: int | None = None,
        send_times: np.ndarray | None = None, server: ServerConfig = ServerConfig()) -> PointResult:
    """Simulate one load point: a closed loop of ``concurrency`` or Poisson ``send_times``."""
    engine = _Engine(layout, cost, prompt, output, accept_cum, rng, concurrency, send_times, server)
    engine.refill(0.0)
    while True:
        engine.see_new_work()
        if not engine.running and not engine.waiting:
            if engine.wait_idle():
                continue
            break
        if not decode_until_event(engine):
            engine.step()
    return engine.result()


class _Batch:
    """The requests one regular step runs: their ids, tokens this step and whether each is a prefill chunk."""

    def __init__(self):
        self.ids: list[int] = []
        self.tokens: list[int] = []
        self.prefill: list[bool] = []

    def add(self, r: int, tokens: int, prefill: bool) -> None:
        self.ids.append(r)
        self.tokens.append(tokens)
        self.prefill.append(prefill)


class _Engine:
    """One load point as the engine sees it: the requests, the block pool, the queues, the clock, the counters."""

    def __init__(self, layout: PagingLayout, cost: StepCost, prompt, output, accept_cum, rng, concurrency,
                 send_times, server: ServerConfig):
        R = self.R = len(prompt)
        self.cost, self.rng, self.prompt, self.output = cost, rng, prompt, output
        self.concurrency, self.send_times, self.closed = concurrency, send_times, send_times is None
        self.T, self.bs, self.ag = cost.T, layout.block_size, layout.attn_groups
        self.mamba = layout.state_blocks_per_request    # state pages: held from admission to finish or preemption
        self.total = self.free = layout.num_blocks
        self.cum_p = np.asarray(accept_cum, dtype=float)    # P(accepted depth >= i), i = 1..D
        self.max_seqs, self.max_tok = server.max_num_seqs, server.max_num_batched_tokens
        self.lag = server.async_scheduling

        self.gen = np.zeros(R, np.int64)              # tokens generated
        self.comp = np.zeros(R, np.int64)             # tokens in the KV cache
        self.held = np.zeros(R, np.int64)             # attention blocks held
        self.prefilling = np.ones(R, bool)
        self.pf_target = prompt.astype(np.int64).copy()   # tokens to prefill: the prompt, + generated after preemption
        self.t_send = np.full(R, np.nan)
        self.t_first = np.full(R, np.nan)
        self.t_done = np.full(R, np.nan)
        self.failed = np.zeros(R, bool)
        self.finish_count = np.zeros(R, np.int64)
        self.too_big = self.ag * -(-(prompt + output) // self.bs) + self.mamba > self.total
        self.sure_done = np.zeros(R, bool)            # finished by a step's one sure token (not scheduled again)

        self.running: list[int] = []
        self.waiting: deque[int] = deque()
        self.pending: deque[tuple[int, list[int]]] = deque()   # (step, requests it finished): read at step + 2
        self.transit: list[int] = []                  # sent after the last schedule: seen by the next one
        self.now = 0.0
        self.last_start: float | None = None          # start of the step before the one about to run
        self.next_req = 0
        self.window = 8                               # pure-decode steps drawn at once by the fast path
        self.peak_blocks = self.peak_running = self.preemptions = self.steps = self.violations = 0
        self.decode_steps = self.decode_tokens = self.eager_steps = 0
        self.eager_time = 0.0

    # --- requests in and out ----------------------------------------------------------------------------------
    def send(self, r: int, t: float, late: bool = False) -> None:
        self.t_send[r] = t
        if self.too_big[r]:
            self.failed[r] = True
            self.t_done[r] = t
        else:
            (self.transit if late else self.waiting).append(r)

    def refill(self, t: float, late: bool = False) -> None:
        """A closed loop keeps ``concurrency`` requests in flight."""
        while self.closed and self.next_req < self.R and self.in_flight() < self.concurrency:
            self.send(self.next_req, t, late)
            self.next_req += 1

    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.transit)

    def finish(self, r: int, t: float) -> None:
        if r in self.running:
            self.free += self.held[r] + self.mamba
            self.running.remove(r)
        else:                              # preempted after its last step, before the scheduler read that step
            self.waiting.remove(r)
        self.held[r] = 0
        self.t_done[r] = t
        self.finish_count[r] += 1

    def read_outputs(self, upto: float) -> None:
        """The scheduler reads the outputs of the steps up to index ``upto``: their finished requests free their
        blocks and slots, and a closed loop sends their successors (seen by the next schedule)."""
        while self.pending and self.pending[0][0] <= upto:
            for r in self.pending.popleft()[1]:
                self.finish(r, float(self.t_done[r]))
                self.refill(float(self.t_done[r]), late=True)

    def preempt(self, r: int) -> None:
        """Recompute preemption: the request frees its blocks and goes back to the front of the waiting queue, to
        prefill its prompt and what it generated again."""
        self.free += self.held[r] + self.mamba
        self.held[r] = 0
        self.comp[r] = 0
        self.prefilling[r] = True
        self.pf_target[r] = self.prompt[r] + self.gen[r]
        self.running.remove(r)
        self.waiting.appendleft(r)
        self.preemptions += 1

    def head_admissible(self, budget: int) -> bool:
        """Whether the first waiting request's first chunk and its state pages fit (FCFS: it alone decides)."""
        if not self.waiting or len(self.running) >= self.max_seqs or budget <= 0:
            return False
        r = self.waiting[0]
        chunk = min(int(self.pf_target[r] - self.comp[r]), budget)
        return self.ag * -(-chunk // self.bs) + self.mamba <= self.free

    # --- the loop's steps -------------------------------------------------------------------------------------
    def see_new_work(self) -> None:
        """What the next schedule sees: under asynchronous scheduling the requests sent after the last schedule and
        the outputs of the step before last; in an open loop the arrivals until the last step started (now when
        scheduling is synchronous or the engine was idle)."""
        if self.lag:
            self.waiting.extend(self.transit)
            self.transit.clear()
            self.read_outputs(self.steps - 2)
        if not self.closed:
            seen = self.last_start if (self.lag and self.last_start is not None) else self.now
            while self.next_req < self.R and self.send_times[self.next_req] <= seen:
                self.send(self.next_req, float(self.send_times[self.next_req]))
                self.next_req += 1

    def wait_idle(self) -> bool:
        """Nothing running or waiting: an idle engine reads every output and request in flight at once, else the
        clock jumps to the next arrival. False when no request is left to come."""
        if self.pending or self.transit:
            self.read_outputs(np.inf)
            return True
        self.last_start = None
        if self.closed or self.next_req >= self.R:
            return False
        self.now = float(self.send_times[self.next_req])
        return True

    def step(self) -> None:
        """One regular step: schedule the running requests, admit waiting ones unless someone was preempted, run."""
        batch = _Batch()
        budget, k = self._schedule_oldest(self.max_tok, batch)
        budget, preempted = self._schedule_rest(self.running[k:], budget, batch)
        if not preempted:
            self._admit(budget, batch)
        if self.free < 0:
            self.violations += 1
        self.peak_blocks = max(self.peak_blocks, self.total - self.free)
        self.peak_running = max(self.peak_running, len(self.running))
        if batch.ids:
            self._execute(batch)
        elif self.pending or self.transit:     # nothing to run: the engine waits for the outputs in flight
            self.read_outputs(np.inf)
        elif not self.running and self.waiting:
            # nothing fits even in an empty pool: cannot happen, too_big requests fail at send
            raise AssertionError("a waiting request cannot be admitted into an empty pool")

    def result(self) -> PointResult:
        ok = ~self.failed
        start = np.nanmin(self.t_send) if self.R else 0.0
        end = np.nanmax(self.t_done[ok]) if ok.any() else start
        return PointResult(t_send=self.t_send, t_first=self.t_first, t_done=self.t_done, prompt=self.prompt,
                           output=self.output, generated=self.gen, failed=self.failed, finish_count=self.finish_count,
                           peak_blocks=int(self.peak_blocks), num_blocks=self.total,
                           peak_running=int(self.peak_running), preemptions=int(self.preemptions),
                           decode_steps=int(self.decode_steps), decode_tokens=int(self.decode_tokens),
                           steps=int(self.steps), eager_steps=int(self.eager_steps),
                           eager_time=float(self.eager_time), capacity_violations=int(self.violations),
                           duration=float(end - start))

    # --- a regular step's parts -------------------------------------------------------------------------------
    def _schedule_oldest(self, budget: int, batch: _Batch) -> tuple[int, int]:
        """The oldest running requests that fit without preempting anyone, in one vectorized pass (a decode takes
        T tokens or waits, a prefill a chunk of what the budget leaves). Returns the budget left and how many."""
        if not self.running:
            return budget, 0
        ids = np.array(self.running)
        comp, held, pfm = self.comp, self.held, self.prefilling[ids]
        want = np.where(pfm, self.pf_target[ids] - comp[ids], np.where(self.sure_done[ids], 0, self.T))
        take = np.clip(budget - (np.cumsum(want) - want), 0, want)
        take[~pfm & (take < self.T)] = 0
        need = np.where(take > 0, np.maximum(self.ag * -(-(comp[ids] + take) // self.bs) - held[ids], 0), 0)
        cneed = np.cumsum(need)
        k = len(ids) if cneed[-1] <= self.free else int(np.argmax(cneed > self.free))
        if k:
            sel = take[:k] > 0
            self.free -= int(cneed[k - 1])
            held[ids[:k]] += need[:k]
            budget -= int(take[:k].sum())
            batch.ids, batch.tokens, batch.prefill = ids[:k][sel].tolist(), take[:k][sel].tolist(), pfm[:k][sel].tolist()
        return budget, k

    def _schedule_rest(self, rest: list[int], budget: int, batch: _Batch) -> tuple[int, bool]:
        """The other running requests one by one; one short of blocks preempts the newest running request, as many
        times as needed, possibly itself. Returns the budget left and whether anyone was preempted."""
        gone: set[int] = set()
        for r in rest:
            if r in gone or self.sure_done[r]:  # preempted earlier in this step; finished for sure, not scheduled
                continue
            if self.prefilling[r]:
                if budget <= 0:
                    continue
                tok = min(int(self.pf_target[r] - self.comp[r]), budget)
            else:
                tok = self.T
            need = max(self.ag * -(-int(self.comp[r] + tok) // self.bs) - self.held[r], 0)
            while need > self.free:
                victim = self.running[-1]
                self.preempt(victim)
                gone.add(victim)
                if victim == r:
                    break
            if r in gone:
                continue
            self.free -= need
            self.held[r] += need
            budget -= tok
            batch.add(r, tok, bool(self.prefilling[r]))
        return budget, bool(gone)

    def _admit(self, budget: int, batch: _Batch) -> None:
        """Waiting requests in arrival order while the budget, max_num_seqs and the pool allow: a request's first
        chunk of KV blocks and all its GDN state pages."""
        while self.head_admissible(budget):
            r = self.waiting.popleft()
            tok = min(int(self.pf_target[r] - self.comp[r]), budget)
            need = self.ag * -(-tok // self.bs) + self.mamba
            self.free -= need
            self.held[r] = need - self.mamba
            self.running.append(r)
            budget -= tok
            batch.add(r, tok, True)

    def _execute(self, batch: _Batch) -> None:
        """Run the batch: its cost advances the clock, then prefills and verifies emit their tokens. What finished
        is read now, or two steps later under asynchronous scheduling."""
        ids, tok, is_pf = np.array(batch.ids), np.array(batch.tokens), np.array(batch.prefill)
        dec, pf, pf_tok = ids[~is_pf], ids[is_pf], tok[is_pf]
        prefix, n_pf_tok = self.comp[pf], int(pf_tok.sum())
        dt = self.cost.scalar(len(dec), int(self.comp[dec].sum()), n_pf_tok,
                              float((pf_tok * (prefix + pf_tok / 2)).sum()), len(pf), int(prefix.sum()))
        self.last_start = self.now
        self.now += dt
        self.steps += 1
        if self.cost.eager(len(dec) * self.T + n_pf_tok, n_pf_tok):
            self.eager_steps += 1
            self.eager_time += dt
        done = self._prefill(pf, pf_tok) + self._verify(dec)
        self.t_done[done] = self.now
        if self.lag:
            if done:
                self.pending.append((self.steps - 1, done))
        else:
            for r in done:
                self.finish(r, self.now)
            self.refill(self.now)

    def _prefill(self, pf: np.ndarray, pf_tok: np.ndarray) -> list[int]:
        """Prefill chunks advance; a prompt that completes samples its first token (TTFT). Returns the requests that
        token finished."""
        if not len(pf):
            return []
        self.comp[pf] += pf_tok
        complete = pf[self.comp[pf] >= self.pf_target[pf]]
        if not len(complete):
            return []
        self.prefilling[complete] = False
        self.gen[complete] += 1
        first = complete[np.isnan(self.t_first[complete])]
        self.t_first[first] = self.now
        ended = complete[self.gen[complete] >= self.output[complete]]
        self.sure_done[ended] = True
        return ended.tolist()

    def _verify(self, dec: np.ndarray) -> list[int]:
        """Each verify emits 1 + a tokens, a the accepted depth (P(a >= i) = cum_p[i - 1]), up to the request's
        length. Returns the requests that finished."""
        if not len(dec):
            return []
        gen, output = self.gen, self.output
        dec = dec[gen[dec] < output[dec]]          # a wasted verify (finished a step ago) emits nothing
        u = self.rng.random(len(dec))
        emit = 1 + (u[:, None] < self.cum_p[None, :]).sum(1)
        left = output[dec] - gen[dec]
        emit = np.minimum(emit, left)
        gen[dec] += emit
        self.comp[dec] += emit
        self.decode_steps += len(dec)
        self.decode_tokens += int(emit.sum())
        ended = gen[dec] >= output[dec]
        self.sure_done[dec[ended & (left <= 1)]] = True
        return dec[ended].tolist()
