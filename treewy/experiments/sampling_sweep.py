"""Acceptance length against temperature: sampled tree speculation over held-out prompts, one row per
(drafter, tree shape, rule, temperature). Columns: those of ``treewy.experiments.acceptance.summarize`` (acceptance with
its 95 % interval over prompts, device, date...) plus rule, temperature, top_k, top_p and seed.
Temperature 0 is greedy for every rule: it runs once and its row is repeated under each rule."""

from __future__ import annotations

import platform
from pathlib import Path

from treewy.accept import RULES

TEMPERATURES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)
SHAPES = ((1, 1, 1), (3, 3, 3))


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def temperature_jobs(drafters=("mtp", "ngram"), shapes=SHAPES, rules=RULES, temperatures=TEMPERATURES):
    """(drafter, widths, rule, temperature) of every run; temperature 0 once per (drafter, shape), as 'match'."""
    jobs = []
    for dname in drafters:
        for widths in shapes:
            for t in temperatures:
                for rule in (RULES[:1] if t == 0 else rules):
                    jobs.append((dname, tuple(widths), rule, float(t)))
    return jobs


def temperature_sweep(model, prompts, drafters=("mtp", "ngram"), shapes=SHAPES, rules=RULES,
                      temperatures=TEMPERATURES, max_new_tokens: int = 48, top_k: int | None = None,
                      top_p: float | None = None, seed: int = 0, model_name: str = "tiny", progress=True,
                      on_job=None):
    """The sweep as a polars frame. progress: True shows a tqdm bar over the runs; on_job(i, n, job) is
    called before each run (for a widget's status line)."""
    import polars as pl

    from treewy.decode import generate
    from treewy.experiments.acceptance import device_name, progress_bar, summarize

    param = next(model.parameters())
    dev = f"CPU: {cpu_name()}" if param.device.type == "cpu" else device_name(param.device)
    dtype = str(param.dtype).removeprefix("torch.")
    jobs = temperature_jobs(drafters, shapes, rules, temperatures)
    rows = []
    for i, (dname, widths, rule, t) in enumerate(progress_bar(jobs, "temperature sweep", progress)):
        if on_job is not None:
            on_job(i, len(jobs), (dname, widths, rule, t))
        res = generate(model, prompts, drafter=dname, tree=widths, commit="reconstruct", max_new_tokens=max_new_tokens,
                       temperature=t, top_k=top_k, top_p=top_p, seed=seed, rule=rule)
        row = summarize(res, drafter=dname, kind="chain" if max(widths) == 1 else "tree", widths=widths,
                        mode="reconstruct", model_name=model_name, dtype=dtype, backend="auto", device=dev)
        for r in ((rule,) if t > 0 else tuple(x for x in rules)):
            rows.append({**row, "rule": r, "temperature": t, "top_k": top_k, "top_p": top_p, "seed": seed})
    return pl.DataFrame(rows, infer_schema_length=None)
