"""Helpers shared by the GPU scripts: log lines, the environment, token divergence, the kernel
backend's cross-check, and tables written as JSON lines (standard library, always) and as parquet
(polars or pyarrow, where installed)."""

from __future__ import annotations

import datetime
import json
import platform
import time
from pathlib import Path

import torch

import treewy  # noqa: F401  (before triton: switches the Triton interpreter on where there is no GPU)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def environment(device: str) -> dict:
    """Versions, device and start time for a run's summary."""
    env = dict(device=device, torch=torch.__version__, python=platform.python_version(),
               started=time.strftime("%Y-%m-%d %H:%M:%S"))
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    for name in ("triton", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except ImportError:
            env[name] = None
    return env


def time_families(cases, dot_precision: str | None = None) -> list[tuple[str, int, dict]]:
    """(case name, B, {family: us}) for each (name, tree, B, families) of ``cases``: one GDN layer of Qwen3.5-35B-A3B
    per step, bf16 q, k, v, fp32 state, the previous commit folded in, each family forced (autotuned), medians of
    CUDA-graph replays; ``dot_precision`` as ``tree_verify_fwd`` takes it. A progress bar and a line per case."""
    from tqdm import tqdm

    from treewy.bench.timing import MODELS, bench, make, step_fn

    d = MODELS["35B-A3B"]
    out = []
    for name, tree, B, families in tqdm(cases, desc="cases"):
        x = make(B, tree.num_nodes, d["H"], d["HV"], d["K"], d["V"], torch.float32)
        us = {f: bench(step_fn("treewy", x, tree, kernel=f, dot_precision=dot_precision)) for f in families}
        out.append((name, B, us))
        tqdm.write(f"{name} B = {B:3d}{f' {dot_precision}' if dot_precision else ''}: "
                   + ", ".join(f"{f} {t:9.2f} us" for f, t in us.items()))
    return out


def write_measured(out: Path, stem: str, rows: list[dict], **meta) -> Path:
    """``rows`` and their device, date and torch version (plus ``meta``) as out/<stem>_<gpu>_<date>.json."""
    gpu, date = torch.cuda.get_device_name(), str(datetime.date.today())
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}_{gpu.split()[-1].lower()}_{date}.json"
    path.write_text(json.dumps(dict(meta=dict(device=gpu, date=date, torch=torch.__version__, **meta), rows=rows),
                               indent=1))
    print(f"wrote {path}")
    return path


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ, over their common length (None: one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def next_logits(model, tokens: list[int]) -> torch.Tensor:
    """The model's logits (float64) for the token after ``tokens``, without gradients: where two greedy runs
    part, the gap between their two tokens."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].double()


def divergence(ref: list[list[int]], other: list[list[int]]) -> dict:
    """Token agreement of two greedy runs over the same prompts."""
    same = total = 0
    first = []
    for a, b in zip(ref, other):
        n = min(len(a), len(b))
        total += n
        same += sum(x == y for x, y in zip(a[:n], b[:n]))
        first.append(first_difference(a, b))
    diverged = [f for f in first if f is not None]
    return dict(tokens=total, identical_fraction=same / max(1, total), requests=len(first),
                requests_diverged=len(diverged),
                first_divergence_positions=first,
                mean_first_divergence=sum(diverged) / len(diverged) if diverged else None)


def backend_check(model, prompts, tree=(2, 2, 2), max_new_tokens: int = 24,
                  modes=("reconstruct", "store_all")) -> dict[str, bool]:
    """Per commit mode: the Triton kernels emit the torch references' tokens and accept the same nodes."""
    from treewy.decode import generate

    check = {}
    for mode in modes:
        a, b = (generate(model, prompts, drafter="mtp", tree=tree, commit=mode, max_new_tokens=max_new_tokens,
                         backend=backend) for backend in ("triton", "torch"))
        check[mode] = a.tokens == b.tokens and [s.accepted for s in a.steps] == [s.accepted for s in b.steps]
    return check


def write_rows(rows: list[dict], stem: Path) -> list[str]:
    """stem.jsonl (always) and stem.parquet (with polars, else pyarrow, when either imports); the names written."""
    stem = Path(stem)
    written = [stem.with_suffix(".jsonl")]
    written[0].write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    parquet = stem.with_suffix(".parquet")
    try:
        import polars as pl
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(parquet)
        written.append(parquet)
    except ImportError:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.Table.from_pylist(rows), parquet)
            written.append(parquet)
        except ImportError:
            pass
    return [p.name for p in written]
