"""What the drafts of a served run accept, and whether vLLM's own counters show it within sampling noise.

Dummy weights accept no draft, so every step emits one token. vLLM 0.26.0's synthetic rejection sampler accepts
drafts at chosen rates instead (``vllm/config/speculative.py``, ``vllm/v1/sample/rejection_sampler.py``): the
``--speculative-config`` keys ``"rejection_sample_method": "synthetic"`` and ``"synthetic_acceptance_rates"``, k
*unconditional* per-position rates a_1 >= ... >= a_k in [0, 1] (a_i: the chance that drafts 1..i of a step are all
accepted; vLLM refuses another length, a value outside [0, 1] or an increase). The sampler turns them into conditional
rates c_i = a_i / a_(i-1) and accepts draft i when a fresh uniform draw is below c_i, stopping at the first
rejection, in its greedy and its random kernel alike. Steps are therefore independent, vLLM's counters
(``accepted_per_pos[i] / drafts``) estimate a_i, and a step emits 1 + sum(a) tokens on average. The accepted tokens
are the drafter's whatever the target says, so the text changes: synthetic acceptance is for benchmarks.

vLLM's other key, ``synthetic_acceptance_length``, spreads a length over positions with zero variance (1, 1, 0.23 for
3.23: every step emits 3 or 4 tokens); ``length=L`` here uses the geometric rule of ``treewy.paper`` instead.

Two sources of rates for a shape: the paper's (``paper-35b``: Qwen3.5-35B-A3B's Table 2 length, spread over the
depths by that rule) and the tiny checkpoint's (``tiny``: P(accepted depth >= d) as its MTP drafter measured them,
the committed acceptance sweep of ``treewy.results``), whose spread over the depths is measured, not assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from treewy.paper import ACCEPTANCE, PAPER_35B_ALPHA, geometric_acceptance_rates

#: --acceptance forms, for messages.
FORMS = "paper-35b, tiny, length=L, rates=A1,...,Ak or none"

#: Standard errors a measured acceptance may stray from the requested one before bench-serve warns.
NOISE_Z = 3.0


@dataclass(frozen=True)
class Acceptance:
    """``source``: the --acceptance text it came from; ``rates``: unconditional per-position rates passed to vLLM's
    synthetic sampler, or None for the drafts' real acceptance."""

    source: str
    rates: tuple[float, ...] | None = None

    @property
    def synthetic(self) -> bool:
        return self.rates is not None

    @property
    def expected_tokens_per_step(self) -> float | None:
        return None if self.rates is None else 1.0 + sum(self.rates)

    def speculative_config(self) -> dict:
        """The keys this acceptance adds to vLLM's --speculative-config."""
        if self.rates is None:
            return {}
        return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(self.rates)}

    def describe(self) -> str:
        """One phrase for logs and chart labels."""
        if self.rates is None:
            return "real acceptance"
        return (f"synthetic acceptance {self.expected_tokens_per_step:.2f} tokens/step ({self.source}; per position "
                + ", ".join(f"{a:.3f}" for a in self.rates) + ")")


def _number(text: str, what: str, flag: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{flag} {what}: {text!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{flag} {what}: {text!r} is not a finite number")
    return x


def conditional_rates(rates) -> list[float]:
    """Unconditional rates a_1 >= ... >= a_k (P(drafts 1..i accepted), or P(accepted depth >= d)) as the conditional
    ones a sampler draws against, c_i = a_i / a_(i-1) (0 after a 0), as vLLM's synthetic sampler turns them."""
    return [a / p if p > 0 else 0.0 for a, p in zip(rates, [1.0, *rates[:-1]])]


def paper_depth_rates(tree: tuple[int, ...] | None, k: int) -> tuple[float, ...]:
    """``paper-35b``'s rates for a chain of ``k`` drafts or a ``tree`` of depth ``k``: the paper's 35B Table 2 length
    for the shape (its chain: 3.23 tokens per step), spread over the depths by the geometric rule; a chain of another
    length, or a tree the table lacks, keeps the depth-3 chain's per-draft rate (a_d = alpha ** d)."""
    if tree is not None and tuple(tree) in ACCEPTANCE:
        return geometric_acceptance_rates(ACCEPTANCE[tuple(tree)], k)
    return tuple(PAPER_35B_ALPHA ** i for i in range(1, k + 1))


def tiny_depth_rates(tree: tuple[int, ...] | None, k: int, drafter: str = "mtp") -> dict:
    """``tiny``'s rates for a chain of ``k`` drafts or a ``tree`` of depth ``k``: P(accepted depth >= d), d = 1..k, of
    the tiny checkpoint's ``drafter`` on that shape, from the committed acceptance sweep (``treewy.results.table(
    "acceptance_sweeps")``, columns accept_ge_d1..). A dict: ``rates``, ``acceptance`` (its tokens per step, the same
    measurement), ``device``, ``date``, ``table``. A shape the sweep did not run is an error naming those it did."""
    import polars as pl

    from treewy.results import table

    shape = tuple(tree) if tree is not None else (1,) * k
    path = table("acceptance_sweeps")
    df = pl.read_parquet(path).filter((pl.col("drafter") == drafter) & (pl.col("mode") == "reconstruct"))
    rows = df.filter(pl.col("shape") == str(shape))
    if rows.height == 0:
        have = ", ".join(sorted(set(df["shape"].to_list()), key=lambda t: (len(t), t)))
        raise ValueError(f"tiny: the acceptance sweep {path.name} has no {drafter!r} row for the shape {shape}; "
                         f"measured shapes: {have} (or pass paper-35b, length=L or rates=...)")
    row = rows.row(0, named=True)
    rates = tuple(float(row[f"accept_ge_d{d}"]) for d in range(1, k + 1))
    return dict(rates=rates, acceptance=float(row["acceptance"]), device=row["device"], date=row["date"],
                table=path.name)


def parse_acceptance(text: str | None, k: int, *, dummy: bool, flag: str = "--acceptance",
                     tree: tuple[int, ...] | None = None) -> Acceptance:
    """The acceptance a run of ``k`` drafts per step asks for (a served ``tree``: ``k`` is its depth, the rates per
    depth). ``text`` None: ``paper-35b`` on dummy weights (they accept nothing), ``none`` on real ones (synthetic
    acceptance would change their text). ``paper-35b``: ``paper_depth_rates``; ``tiny``: ``tiny_depth_rates``."""
    if text is None:
        text = "paper-35b" if dummy else "none"
    if not isinstance(text, str):
        raise ValueError(f"{flag} {text!r}: expected text, one of {FORMS}")
    spec = text.strip()
    head, sep, body = spec.partition("=")
    head = head.strip().lower()
    if not sep and head == "none":
        return Acceptance("none")
    if not sep and head == "paper-35b":
        return Acceptance("paper-35b", paper_depth_rates(tree, k))
    if not sep and head == "tiny":
        try:
            return Acceptance("tiny", tiny_depth_rates(tree, k)["rates"])
        except ValueError as e:
            raise ValueError(f"{flag} {e}") from None
    if sep and head == "length":
        length = _number(body.strip(), "length", flag)
        if not 1.0 <= length <= k + 1:
            raise ValueError(f"{flag} {spec}: a chain of {k} drafts emits 1 to {k + 1} tokens per step; pick a length "
                             f"in [1, {k + 1}], e.g. length={ACCEPTANCE[(1, 1, 1)]}")
        return Acceptance(f"length={body.strip()}", geometric_acceptance_rates(length, k))
    if sep and head == "rates":
        parts = [p.strip() for p in body.split(",")]
        rates = tuple(_number(p, "rates", flag) for p in parts)
        if len(rates) != k:
            raise ValueError(f"{flag} {spec}: {len(rates)} rate(s) for {k} drafts per step; give one per draft "
                             f"position (or change -k)")
        if not all(0.0 <= a <= 1.0 for a in rates):
            raise ValueError(f"{flag} {spec}: rates are probabilities; every one must lie in [0, 1]")
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"{flag} {spec}: rates are unconditional (drafts 1..i all accepted), so they cannot rise "
                             "from one position to the next; give a non-increasing list, e.g. rates=0.8,0.6,0.4")
        return Acceptance("rates=" + ",".join(parts), rates)
    raise ValueError(f"{flag} {text!r}: expected one of {FORMS}")


@dataclass(frozen=True)
class AcceptanceCheck:
    """vLLM's counters over a load point beside the request: measured tokens per step and per-position rates, the
    standard error of the measured tokens per step for this many drafts, and why they disagree (None: they agree)."""

    tokens_per_step: float | None
    rates: tuple[float, ...] | None
    stderr: float | None
    warning: str | None


def check_acceptance(acc: Acceptance, k: int, drafts: float | None, accepted: float | None,
                     accepted_per_pos: list[float] | None, draft_tokens: float | None = None,
                     z: float = NOISE_Z) -> AcceptanceCheck:
    """Compare vLLM's spec-decode counters (deltas over one load point) with the requested acceptance.

    The accepted drafts of one step, A, have P(A >= i) = a_i, so E[A] = sum a_i and E[A^2] = sum (2i - 1) a_i;
    over n independent steps the measured tokens per step 1 + mean(A) has standard error sqrt(Var A / n), and the
    per-position rate i (a binomial count over n drafts) sqrt(a_i (1 - a_i) / n). A measurement more than ``z`` of
    them from the request gets a warning. Real acceptance (no rates) is reported, never checked."""
    if not drafts:
        warn = (f"vLLM reported no speculative steps here, so the requested {acc.describe()} could not be checked"
                if acc.synthetic else None)
        return AcceptanceCheck(None, None, None, warn)
    tokens = None if accepted is None else 1.0 + accepted / drafts
    rates = (tuple(x / drafts for x in accepted_per_pos)
             if accepted_per_pos is not None and len(accepted_per_pos) == k else None)
    if not acc.synthetic:
        return AcceptanceCheck(tokens, rates, None, None)
    a = acc.rates
    mean = sum(a)
    var = max(0.0, sum((2 * i - 1) * ai for i, ai in enumerate(a, start=1)) - mean * mean)
    stderr = math.sqrt(var / drafts)
    off = []
    if tokens is not None and abs(tokens - 1.0 - mean) > z * stderr + 1e-9:
        off.append(f"{tokens:.3f} tokens per step against {1 + mean:.3f} "
                   f"({abs(tokens - 1 - mean) / stderr:.1f} standard errors)" if stderr else
                   f"{tokens:.3f} tokens per step against exactly {1 + mean:.3f}")
    if rates is not None:
        bad = [i for i, (m, e) in enumerate(zip(rates, a)) if abs(m - e) > z * math.sqrt(e * (1 - e) / drafts) + 1e-9]
        if bad:
            off.append("per position " + ", ".join(f"{rates[i]:.3f} vs {a[i]:.3f}" for i in bad)
                       + f" (position{'s' if len(bad) > 1 else ''} {', '.join(str(i) for i in bad)})")
    if tokens is None and rates is None:
        off.append("vLLM reported drafts but no accepted-token counters")
    warn = None
    if off:
        short = ""
        if draft_tokens is not None and draft_tokens < k * drafts - 1e-9:
            short = (f"; {1 - draft_tokens / (k * drafts):.1%} of draft positions went unscheduled (steps cut by "
                     "the token budget or the context end), which lowers the later positions")
        warn = ("vLLM measured " + "; ".join(off) + f" over {drafts:.0f} drafts, beyond {z:g} standard errors of "
                f"the requested {acc.describe()}{short}")
    return AcceptanceCheck(tokens, rates, stderr, warn)
