"""The one workload catalogue: what the simulator samples and what ``treewy bench-serve`` asks vLLM to send.

Five workloads, each a stand-in for a benchmark people run against vLLM, plus a smoke test. Lengths are in
tokens.

=================  ========================================  ======================================
workload           input (prompt) length                      output length
=================  ========================================  ======================================
sharegpt-chat      ShareGPT (vLLM's sampler: prompt <= 1024,   the dataset's replies (total <= 2048);
                   total <= 2048); simulated as a lognormal,   simulated as a lognormal, median 150,
                   median 150, sigma 1.0                       sigma 0.9
spec-bench         Spec-Bench's 480 questions, six equal      256, fixed (``--spec-bench-output-len``
                   categories (MT-bench 80, translation 50,   default of ``vllm bench serve``)
                   summarization 700, QA 40, math 80, RAG
                   600); simulated as a lognormal, sigma 0.4
                   around each median
balanced-chat      random, uniform 1024 +- 20 %               uniform 1024 +- 20 %
generation-heavy   random, uniform 1024 +- 20 %               uniform 8192 +- 20 %
summarize-heavy    random, uniform 8192 +- 20 %               uniform 1024 +- 20 %
smoke              random, uniform 64 +- 20 %                 uniform 16 +- 20 % (a quick check only)
mt-bench           MT-Bench's 80 questions (first turns),     256, fixed (``--custom-output-len``)
                   shipped in ``treewy/data/mt_bench/``;
                   simulated as their byte lengths / 4
generation-short   random, uniform 64 +- 20 %                 uniform 512 +- 20 %
summarize-short    random, uniform 1024 +- 20 %               uniform 128 +- 20 %
balanced-short     random, uniform 128 +- 20 %                uniform 128 +- 20 %
=================  ========================================  ======================================

Why these: ShareGPT as ``vllm bench serve --dataset-name sharegpt`` samples it (replies as output lengths,
mean ~230 / ~200 tokens); Spec-Bench's question mix with vLLM's fixed 256-token outputs; and the three
input/output pairs the public InferenceMAX serving benchmarks use for chat (1k/1k), reasoning (1k/8k) and
summarization (8k/1k), with vLLM's random dataset at ``--random-range-ratio 0.2``. The paper does not publish
its exact traffic, so none of these were tuned to its table. All random outputs run to their length
(``--ignore-eos``).

``mt-bench`` is the one workload of real prompts that needs no download: MT-Bench's questions (Apache-2.0, the
file and its licence in ``treewy/data/mt_bench/``, which says where they came from), Spec-Bench's first 80. vLLM
0.26 reads the file with its ``custom`` loader, sent as plain text (``--skip-chat-template``): its ``spec_bench``
loader always applies the tokenizer's chat template, and the byte tokenizer of ``treewy export-vllm`` (the tiny
checkpoint, ``--dummy`` presets) has none. The outputs run to 256 tokens (``--ignore-eos``), as the simulator
assumes. More requests than 80 repeat questions, so prefix caching can serve repeated prompts. The simulator's
prompt lengths are what Qwen3.5's tokenizer would give, approximated as UTF-8 bytes / 4 (no Qwen tokenizer is
available offline here); the byte tokenizer sees the byte lengths themselves, about 4x as many tokens.

The three ``-short`` workloads are what the measured serving sweep on real vLLM runs (35B-A3B with dummy
weights on one GPU): generation-heavy at 1/16, summarize-heavy and balanced-chat at 1/8 of their lengths, so that
every point finishes within a minute or two and one mode's sweep over concurrency 1..256 fits in one short GPU run. Short requests make the GDN state, not the
attention KV, most of a request's memory, so the admission knee shows at least as clearly as at full length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

#: Prompt files shipped with the package (each with its licence beside it).
DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Workload:
    """How a workload's requests are drawn: a ``vllm bench serve`` dataset (``dataset``; ``path_file`` for those
    read from disk: a name under ``--dataset-dir``, or an absolute path for a file shipped in ``DATA_DIR``), for
    the random dataset centre lengths with a +- ``range_ratio`` uniform spread, and ``extra_args`` passed on to
    ``vllm bench serve`` as they are."""

    name: str
    dataset: str
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float = 0.0
    path_file: str | None = None
    extra_args: tuple[str, ...] = ()


CATALOGUE: dict[str, Workload] = {w.name: w for w in (
    Workload("sharegpt-chat", "sharegpt", path_file="ShareGPT_V3_unfiltered_cleaned_split.json"),
    Workload("spec-bench", "spec_bench", output_len=256, path_file="question.jsonl"),
    Workload("balanced-chat", "random", 1024, 1024, 0.2),
    Workload("generation-heavy", "random", 1024, 8192, 0.2),
    Workload("summarize-heavy", "random", 8192, 1024, 0.2),
    Workload("smoke", "random", 64, 16, 0.2),
    Workload("generation-short", "random", 64, 512, 0.2),
    Workload("summarize-short", "random", 1024, 128, 0.2),
    Workload("balanced-short", "random", 128, 128, 0.2),
    Workload("mt-bench", "custom", output_len=256, path_file=str(DATA_DIR / "mt_bench" / "question.jsonl"),
             extra_args=("--skip-chat-template", "--ignore-eos")),
)}

#: UTF-8 bytes of English text per Qwen3.5 token, approximated (see the module docstring).
BYTES_PER_QWEN_TOKEN = 4


def prompt_rows(workload: str) -> list[dict]:
    """The rows of a workload shipped as a file (``mt-bench``), in file order; each has a ``prompt``."""
    w = CATALOGUE.get(workload)
    if w is None or w.path_file is None or not Path(w.path_file).is_absolute():
        shipped = [n for n, x in CATALOGUE.items() if x.path_file and Path(x.path_file).is_absolute()]
        raise ValueError(f"workload = {workload!r}: no prompt file ships with it; workloads shipped as files are "
                         f"{shipped}")
    with open(w.path_file, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def qwen_token_lengths(prompts: list[str]) -> list[int]:
    """Approximate prompt lengths in Qwen3.5 tokens: ceil(UTF-8 bytes / ``BYTES_PER_QWEN_TOKEN``)."""
    return [math.ceil(len(p.encode("utf-8")) / BYTES_PER_QWEN_TOKEN) for p in prompts]

#: The three workloads of the measured 35B serving sweep on real vLLM (see above).
MEASURED_WORKLOADS = ("generation-short", "summarize-short", "balanced-short")
#: Requests per measured point at least (TTFT and TPOT from more than one sample at low concurrency).
MIN_REQUESTS = 16

#: The five workloads of the serving sweep (the paper's table is a geomean over five).
SWEEP_WORKLOADS = ("sharegpt-chat", "spec-bench", "balanced-chat", "generation-heavy", "summarize-heavy")
