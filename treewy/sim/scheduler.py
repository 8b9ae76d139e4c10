"""Step-level continuous batching, the way vLLM's V1 scheduler runs a GDN hybrid with speculation.

Every step:

1. Running requests, oldest first: a decoding request schedules T = N + 1 tokens (its last token
   and N drafts); a prefilling request a chunk of what is left of its prompt (chunked prefill),
   while the step's token budget (``max_num_batched_tokens``) lasts. Each needs attention blocks
   for its KV slots (``cdiv(tokens, block_size)`` per attention group); when the pool has too few
   free blocks, the newest running request is preempted (recompute: its blocks are freed, it goes
   back to the front of the waiting queue and later prefills prompt + generated tokens again), as
   many times as needed, possibly the request itself.
2. If nothing was preempted, waiting requests are admitted in arrival order while the budget,
   ``max_num_seqs`` and the pool allow: a request's first chunk of KV blocks and all its GDN state
   pages (store-all N + 1 per GDN group, reconstruct 1) must fit. The first that does not fit
   stops admission (FCFS).
3. The step takes ``cost(...)`` seconds. A prefill that completes samples the first token (TTFT).
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

Between events (a finish, an arrival, a shortage of blocks) a batch of pure decode steps is
advanced in one vectorized block (``_fast_decode``): the same draws, the same costs, the same
block growth, just not one Python iteration per step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from treewy.memory import PagingLayout, ServerConfig
from treewy.sim.cost import StepCost


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
    capacity_violations: int
    duration: float


def run(layout: PagingLayout, cost: StepCost, prompt: np.ndarray, output: np.ndarray, *,
        accept_cum: np.ndarray, rng: np.random.Generator, concurrency: int | None = None,
        send_times: np.ndarray | None = None, server: ServerConfig = ServerConfig()) -> PointResult:
    """Simulate one load point: a closed loop of ``concurrency`` or Poisson ``send_times``."""
    R = len(prompt)
    T = cost.T
    bs = layout.block_size
    ag = layout.attn_groups
    mamba = layout.state_blocks_per_request
    total = layout.num_blocks
    free = total
    cum_p = np.asarray(accept_cum, dtype=float)        # P(accepted depth >= i), i = 1..D
    max_seqs, max_tok = server.max_num_seqs, server.max_num_batched_tokens

    gen = np.zeros(R, np.int64)
    comp = np.zeros(R, np.int64)
    held = np.zeros(R, np.int64)
    prefilling = np.ones(R, bool)
    pf_target = prompt.astype(np.int64).copy()
    t_send = np.full(R, np.nan)
    t_first = np.full(R, np.nan)
    t_done = np.full(R, np.nan)
    failed = np.zeros(R, bool)
    finish_count = np.zeros(R, np.int64)
    too_big = ag * -(-(prompt + output) // bs) + mamba > total
    lag = server.async_scheduling
    pending: deque[tuple[int, list[int]]] = deque()   # (step, requests it finished): read by the scheduler at step + 2
    transit: list[int] = []                          # sent after the last schedule: seen by the next one
    sure_done = np.zeros(R, bool)                    # finished by a step's one sure token (not scheduled again)
    last_start: float | None = None                  # start of the step before the one about to run

    running: list[int] = []
    waiting: deque[int] = deque()
    now = 0.0
    peak_blocks = peak_running = preemptions = steps = violations = 0
    decode_steps = decode_tokens = 0
    next_req = 0
    closed = send_times is None

    def send(r: int, t: float, late: bool = False) -> None:
        t_send[r] = t
        if too_big[r]:
            failed[r] = True
            t_done[r] = t
        else:
            (transit if late else waiting).append(r)

    in_flight = lambda: len(running) + len(waiting) + len(transit)  # noqa: E731

    def refill(t: float, late: bool = False) -> None:
        nonlocal next_req
        while closed and next_req < R and in_flight() < concurrency:
            send(next_req, t, late)
            next_req += 1

    def finish(r: int, t: float) -> None:
        nonlocal free
        if r in running:
            free += held[r] + mamba
            running.remove(r)
        else:                              # preempted after its last step, before the scheduler read that step
            waiting.remove(r)
        held[r] = 0
        t_done[r] = t
        finish_count[r] += 1

    def read_outputs(upto: float) -> None:
        """The scheduler reads the outputs of the steps up to index ``upto``: their finished requests free their
        blocks and slots, and a closed loop sends their successors (seen by the next schedule)."""
        while pending and pending[0][0] <= upto:
            for r in pending.popleft()[1]:
                finish(r, float(t_done[r]))
                refill(float(t_done[r]), late=True)

    def preempt(r: int) -> None:
        nonlocal free, preemptions
        free += held[r] + mamba
        held[r] = 0
        comp[r] = 0
        prefilling[r] = True
        pf_target[r] = prompt[r] + gen[r]
        running.remove(r)
        waiting.appendleft(r)
        preemptions += 1

    def head_admissible(budget: int) -> bool:
        if not waiting or len(running) >= max_seqs or budget <= 0:
            return False
        r = waiting[0]
        chunk = min(int(pf_target[r] - comp[r]), budget)
        return ag * -(-chunk // bs) + mamba <= free

    refill(0.0)
    window = 8
    while True:
        if lag:
            waiting.extend(transit)
            transit.clear()
            read_outputs(steps - 2)
        if not closed:
            seen = last_start if (lag and last_start is not None) else now
            while next_req < R and send_times[next_req] <= seen:
                send(next_req, float(send_times[next_req]))
                next_req += 1
        if not running and not waiting:
            if pending or transit:         # an idle engine reads every output and request at once
                read_outputs(np.inf)
                continue
            last_start = None
            if closed or next_req >= R:
                break
            now = float(send_times[next_req])
            continue

        # ---- fast path: only decodes, nothing to admit until something finishes
        if (running and not pending and not transit and not prefilling[running].any()
                and not head_admissible(max_tok - len(running) * T)):
            t_next = np.inf if (closed or waiting or next_req >= R) else float(send_times[next_req])
            k = _fast_decode(ids=np.array(running), gen=gen, comp=comp, held=held, output=output,
                             T=T, bs=bs, ag=ag, free=free, cum_p=cum_p, rng=rng, cost=cost,
                             now=now, t_next=t_next, window=window)
            if k is not None:
                n_steps, new_now, used_delta, done_ids, emitted, start, sure = k
                window = max(8, 2 * n_steps)
                free -= used_delta
                now = new_now
                last_start = start
                steps += n_steps
                decode_steps += n_steps * len(running)
                decode_tokens += emitted
                peak_blocks = max(peak_blocks, total - free)
                t_done[done_ids] = now
                if lag:
                    sure_done[done_ids] = sure
                    pending.append((steps - 1, done_ids.tolist()))
                else:
                    for r in done_ids:
                        finish(int(r), now)
                if free < 0:
                    violations += 1
                if not lag:
                    refill(now)
                continue

        # ---- regular step
        budget = max_tok
        sched_ids, sched_tok, sched_pf = [], [], []
        preempted_now = False
        gone: set[int] = set()
        order = list(running)
        if running:
            ids = np.array(running)
            pfm = prefilling[ids]
            want = np.where(pfm, pf_target[ids] - comp[ids], np.where(sure_done[ids], 0, T))
            take = np.clip(budget - (np.cumsum(want) - want), 0, want)
            take[~pfm & (take < T)] = 0
            need = np.where(take > 0, np.maximum(ag * -(-(comp[ids] + take) // bs) - held[ids], 0), 0)
            cneed = np.cumsum(need)
            k = len(ids) if cneed[-1] <= free else int(np.argmax(cneed > free))
            if k:                          # the oldest k requests fit without preempting anyone
                sel = take[:k] > 0
                free -= int(cneed[k - 1])
                held[ids[:k]] += need[:k]
                budget -= int(take[:k].sum())
                sched_ids, sched_tok = ids[:k][sel].tolist(), take[:k][sel].tolist()
                sched_pf = pfm[:k][sel].tolist()
            order = running[k:]
        for r in order:
            if r in gone or sure_done[r]:  # preempted earlier in this step; finished for sure, not scheduled
                continue
            if prefilling[r]:
                if budget <= 0:
                    continue
                tok = min(int(pf_target[r] - comp[r]), budget)
                slots = comp[r] + tok
            else:
                tok = T
                slots = comp[r] + T
            need = max(ag * -(-int(slots) // bs) - held[r], 0)
            while need > free:
                victim = running[-1]
                preempt(victim)
                gone.add(victim)
                preempted_now = True
                if victim == r:
                    break
            if r in gone:
                continue
            free -= need
            held[r] += need
            budget -= tok
            sched_ids.append(r)
            sched_tok.append(tok)
            sched_pf.append(bool(prefilling[r]))
        if not preempted_now:
            while head_admissible(budget):
                r = waiting.popleft()
                tok = min(int(pf_target[r] - comp[r]), budget)
                need = ag * -(-tok // bs) + mamba
                free -= need
                held[r] = need - mamba
                running.append(r)
                budget -= tok
                sched_ids.append(r)
                sched_tok.append(tok)
                sched_pf.append(True)
        if free < 0:
            violations += 1
        peak_blocks = max(peak_blocks, total - free)
        peak_running = max(peak_running, len(running))
        if not sched_ids:
            if pending or transit:         # nothing to run: the engine waits for the outputs in flight
                read_outputs(np.inf)
                continue
            if not running and waiting:
                # nothing fits even in an empty pool: cannot happen, too_big requests fail at send
                raise AssertionError("a waiting request cannot be admitted into an empty pool")
            continue

        ids = np.array(sched_ids)
        tok = np.array(sched_tok)
        is_pf = np.array(sched_pf)
        dec = ids[~is_pf]
        pf, pf_tok = ids[is_pf], tok[is_pf]
        prefix = comp[pf]
        dt = cost.scalar(len(dec), int(comp[dec].sum()), int(pf_tok.sum()),
                         float((pf_tok * (prefix + pf_tok / 2)).sum()), len(pf), int(prefix.sum()))
        last_start = now
        now += dt
        steps += 1

        done: list[int] = []
        if len(pf):
            comp[pf] += pf_tok
            complete = pf[comp[pf] >= pf_target[pf]]
            if len(complete):
                prefilling[complete] = False
                gen[complete] += 1
                first = complete[np.isnan(t_first[complete])]
                t_first[first] = now
                ended = complete[gen[complete] >= output[complete]]
                sure_done[ended] = True
                done.extend(ended.tolist())
        if len(dec):
            dec = dec[gen[dec] < output[dec]]          # a wasted verify (finished a step ago) emits nothing
            u = rng.random(len(dec))
            emit = 1 + (u[:, None] < cum_p[None, :]).sum(1)
            left = output[dec] - gen[dec]
            emit = np.minimum(emit, left)
            gen[dec] += emit
            comp[dec] += emit
            decode_steps += len(dec)
            decode_tokens += int(emit.sum())
            ended = gen[dec] >= output[dec]
            sure_done[dec[ended & (left <= 1)]] = True
            done.extend(dec[ended].tolist())
        t_done[done] = now
        if lag:
            if done:
                pending.append((steps - 1, done))
        else:
            for r in done:
                finish(r, now)
            refill(now)

    ok = ~failed
    start = np.nanmin(t_send) if R else 0.0
    end = np.nanmax(t_done[ok]) if ok.any() else start
    return PointResult(t_send=t_send, t_first=t_first, t_done=t_done, prompt=prompt, output=output, generated=gen,
                       failed=failed, finish_count=finish_count, peak_blocks=int(peak_blocks), num_blocks=total,
                       peak_running=int(peak_running), preemptions=int(preemptions), decode_steps=int(decode_steps),
                       decode_tokens=int(decode_tokens), steps=int(steps), capacity_violations=int(violations),
                       duration=float(end - start))


def _fast_decode(*, ids, gen, comp, held, output, T, bs, ag, free, cum_p, rng, cost, now, t_next, window: int):
    """Advance pure-decode steps up to (and including) the first finish, stopping before a block
    shortage or an arrival. Returns (steps, now, blocks allocated, finished ids, tokens emitted, start of the
    last step, whether each finished id was finished by that step's sure token), or None when not even one step
    can be taken this way (the regular path handles it)."""
    remaining = output[ids] - gen[ids]
    M = int(min(remaining.min(), window))
    n = len(ids)
    u = rng.random((M, n))
    emit = 1 + (u[:, :, None] < cum_p).sum(-1)                      # [M, n]
    cum = np.cumsum(emit, axis=0)
    before = cum - emit                                             # emitted before step s
    comp_s = comp[ids][None, :] + before                            # [M, n] cached tokens at step s
    held_s = np.maximum(held[ids][None, :], ag * -(-(comp_s + T) // bs))
    alloc = (held_s - held[ids][None, :]).sum(1)                    # [M] blocks allocated by step s
    fits = alloc <= free
    k_fit = M if fits.all() else int(np.argmin(fits))               # steps before the shortage
    fin = (cum >= remaining[None, :]).any(1)
    k_fin = int(np.argmax(fin)) + 1 if fin.any() else M
    dts = cost(n, comp_s.sum(1))
    ends = now + np.cumsum(dts)
    starts = ends - dts
    k_arr = int(np.searchsorted(starts, t_next, side="left"))       # steps starting before the arrival
    K = min(k_fit, k_fin, k_arr, M)
    if K <= 0:
        return None
    step_emit = np.minimum(cum[K - 1], remaining)
    gen[ids] += step_emit
    comp[ids] += step_emit
    used = int(alloc[K - 1])
    held[ids] = held_s[K - 1]
    ended = gen[ids] >= output[ids]
    before_last = cum[K - 2] if K >= 2 else np.zeros(n, cum.dtype)
    sure = (remaining - before_last)[ended] <= 1                     # the last step's sure token finished them
    return K, float(ends[K - 1]), used, ids[ended], int(step_emit.sum()), float(starts[K - 1]), sure
