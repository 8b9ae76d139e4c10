"""Scrape vLLM's Prometheus ``/metrics`` during a benchmark run: peaks of the gauges, deltas of the counters.

Names as vLLM 0.26.0 (read from a live server on an H200) and 0.33.0 expose them
(vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py;
prometheus_client appends ``_total`` to counters). Samples carry labels (model_name, engine);
gauges are summed over engines for running requests and maxed for KV usage (a fraction per engine). The
accepted drafts per position (label ``position``) give vLLM's per-position acceptance rates, accepted / drafts.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label "position": 0 .. k - 1
COUNTERS = (PREEMPTIONS, SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED)

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{metric name: [(labels, value), ...]} from the Prometheus text format (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        lab = {k: bytes(val, "utf-8").decode("unicode_escape") for k, val in _LABEL.findall(labels)}
        out.setdefault(name, []).append((lab, v))
    return out


def _sum(samples, name) -> float | None:
    s = samples.get(name)
    return None if not s else sum(v for _, v in s)


def _max(samples, name) -> float | None:
    s = samples.get(name)
    return None if not s else max(v for _, v in s)


def accepted_per_position(samples) -> list[float] | None:
    """vLLM's accepted drafts per position (summed over engines), position 0 first; None when it reports none."""
    per: dict[int, float] = {}
    for labels, v in samples.get(SPEC_ACCEPTED_PER_POS, []):
        pos = labels.get("position", "")
        if pos.isdigit():
            per[int(pos)] = per.get(int(pos), 0.0) + v
    return [per.get(i, 0.0) for i in range(max(per) + 1)] if per else None


@dataclass
class MetricsSummary:
    peak_kv_usage: float | None = None
    peak_running: int | None = None
    preemptions: int | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_accepted_per_pos: list[float] | None = None
    scrapes: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens emitted per speculative step: 1 + accepted / drafts (vLLM's definition)."""
        if not self.spec_drafts or self.spec_accepted_tokens is None:
            return None
        return 1.0 + self.spec_accepted_tokens / self.spec_drafts

    @property
    def acceptance_rates(self) -> list[float] | None:
        """Per-position acceptance rates: accepted at position i / drafts (vLLM's definition; unconditional)."""
        if not self.spec_drafts or self.spec_accepted_per_pos is None:
            return None
        return [a / self.spec_drafts for a in self.spec_accepted_per_pos]


class MetricsScraper:
    """Polls ``base_url/metrics`` in a thread between ``start()`` and ``stop()``.

    Counters are reported as the difference between the first and the last successful scrape;
    gauges as their peak over all scrapes.
    """

    def __init__(self, base_url: str, interval: float = 0.5, timeout: float = 2.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval, self.timeout = interval, timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: dict | None = None
        self._last: dict | None = None
        self.summary = MetricsSummary()

    def scrape_once(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                samples = parse_prometheus(r.read().decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError, ValueError) as e:
            if len(self.summary.errors) < 5:
                self.summary.errors.append(f"{type(e).__name__}: {e}")
            return False
        s = self.summary
        s.scrapes += 1
        kv, run = _max(samples, KV_USAGE), _sum(samples, RUNNING)
        if kv is not None:
            s.peak_kv_usage = kv if s.peak_kv_usage is None else max(s.peak_kv_usage, kv)
        if run is not None:
            s.peak_running = int(run) if s.peak_running is None else max(s.peak_running, int(run))
        counters = {n: _sum(samples, n) for n in COUNTERS}
        counters[SPEC_ACCEPTED_PER_POS] = accepted_per_position(samples)
        if self._first is None:
            self._first = counters
        self._last = counters
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval)

    def start(self) -> MetricsScraper:
        self.scrape_once()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> MetricsSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + self.interval + 1)
        self.scrape_once()
        s = self.summary
        if self._first is not None and self._last is not None:
            def delta(n):
                a, b = self._first.get(n), self._last.get(n)
                return None if a is None or b is None else b - a
            p = delta(PREEMPTIONS)
            s.preemptions = None if p is None else int(round(p))
            s.spec_drafts, s.spec_draft_tokens = delta(SPEC_DRAFTS), delta(SPEC_DRAFT_TOKENS)
            s.spec_accepted_tokens = delta(SPEC_ACCEPTED)
            a, b = self._first.get(SPEC_ACCEPTED_PER_POS), self._last.get(SPEC_ACCEPTED_PER_POS)
            if b is not None:
                a = a or [0.0] * len(b)  # absent from the first scrape: counted from zero
                s.spec_accepted_per_pos = [y - x for x, y in zip(a, b)] if len(a) == len(b) else None
        return s

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
