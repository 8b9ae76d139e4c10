"""What a decode records per step, and how it reports progress: shared by the eager loop (``treewy.decode``) and
the static / captured step (``treewy.decode_graph``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepStat:
    step: int
    request: int
    accepted: int            # the committed node
    length: int              # tokens emitted this step = depth(accepted) + 1
    gdn_state_bytes: int     # GDN state blocks held by this request after the step, all GDN layers
    transient_bytes: int     # per request during the step: U (reconstruct) or the snapshots (store_all)
    step_ms: float           # wall time of the batch step: draft + verify + accept + commit + host bookkeeping
    draft_ms: float          # the drafter's proposal (ends with a device sync)
    host_ms: float = 0.0     # host bookkeeping after the device work (emitted tokens, the drafter's advance)
    verify_ms: float | None = None  # the model forward over the window (timing="phases" only)
    accept_ms: float | None = None  # acceptance (timing="phases" only)
    commit_ms: float | None = None  # cache commit (timing="phases" only; reconstruct's GDN commit runs in verify)


def progress_reporter(progress, total: int):
    """report(tokens so far) after each step, report(None) at the end: a tqdm bar, a callable or nothing."""
    if callable(progress):
        return lambda n: None if n is None else progress(n, total)
    if not progress:
        return lambda n: None
    from tqdm.auto import tqdm
    bar = tqdm(total=total, desc="tokens", leave=False)

    def report(n):
        if n is None:
            bar.close()
        else:
            bar.update(n - bar.n)
    return report
