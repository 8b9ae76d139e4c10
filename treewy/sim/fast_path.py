"""The scheduler's fast path: pure decode steps advanced in one vectorized block up to the next event.

While every running request decodes, no output or request is in flight and the head of the waiting queue cannot be
admitted, the steps until the next event (a finish, an arrival, a shortage of blocks) differ only in their draws,
their costs and the blocks they add: ``decode_block`` draws up to ``window`` steps at once and keeps those up to
the event. Draws, costs and block growth follow the same rules as the regular step's; the draws past the event are
thrown away, so the random stream, not the model, differs from stepping one at a time.
"""

from __future__ import annotations

import numpy as np


def decode_until_event(e) -> bool:
    """Advance the scheduler's engine ``e`` (``treewy.sim.scheduler``) by a block of pure decode steps when the
    module docstring's conditions hold; False when the regular path must take this step."""
    running = e.running
    if not running or e.pending or e.transit or e.prefilling[running].any() \
            or e.head_admissible(e.max_tok - len(running) * e.T):
        return False
    t_next = np.inf if (e.closed or e.waiting or e.next_req >= e.R) else float(e.send_times[e.next_req])
    k = decode_block(ids=np.array(running), gen=e.gen, comp=e.comp, held=e.held, output=e.output,
                     T=e.T, bs=e.bs, ag=e.ag, free=e.free, cum_p=e.cum_p, rng=e.rng,
                     cost=e.cost, now=e.now, t_next=t_next, window=e.window)
    if k is None:
        return False
    n_steps, t_end, used, done_ids, emitted, e.last_start, sure = k
    if e.cost.eager(len(running) * e.T, 0):           # more tokens than the largest captured graph
        e.eager_steps += n_steps
        e.eager_time += t_end - e.now
    e.now = t_end
    e.window = max(8, 2 * n_steps)
    e.free -= used
    e.steps += n_steps
    e.decode_steps += n_steps * len(running)
    e.decode_tokens += emitted
    e.peak_blocks = max(e.peak_blocks, e.total - e.free)
    e.t_done[done_ids] = e.now
    if e.lag:
        e.sure_done[done_ids] = sure
        e.pending.append((e.steps - 1, done_ids.tolist()))
    else:
        for r in done_ids:
            e.finish(int(r), e.now)
    if e.free < 0:
        e.violations += 1
    if not e.lag:
        e.refill(e.now)
    return True


def decode_block(*, ids, gen, comp, held, output, T, bs, ag, free, cum_p, rng, cost, now, t_next, window: int):
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
