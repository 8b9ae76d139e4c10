"""benchmarks/vllm_fp32_checks.py on the CPU: the counters it reads from vLLM's metrics, its verdict, and the
probe's comparison with the fp64 model (vLLM's engines themselves run on the GPU machine only)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch



@dataclass
class _Counter:
    name: str
    value: int


@dataclass
class _Vector:
    name: str
    values: list


def test_counters_are_read_from_llm_metrics(bench_script):
    metrics = [_Counter("vllm:spec_decode_num_drafts", 7), _Counter("vllm:spec_decode_num_draft_tokens", 21),
               _Counter("vllm:spec_decode_num_accepted_tokens", 12), _Counter("vllm:num_preemptions", 2),
               _Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [6, 4, 2]),
               _Counter("vllm:prompt_tokens", 99)]
    assert bench_script("vllm_fp32_checks").counters(metrics) == {
        "drafts": 7, "draft_tokens": 21, "accepted": 12, "accepted_per_pos": [6, 4, 2], "preemptions": 2}


def _run(outputs, accepted):
    return {"outputs": outputs, "num_gpu_blocks": 40, "block_size": 96,
            "counters": {"drafts": 2, "draft_tokens": 6, "accepted": accepted, "accepted_per_pos": [accepted, 0, 0],
                         "preemptions": 1}}


def test_verdict_needs_equal_outputs_equal_counters_and_treewys_outputs(bench_script):
    mod = bench_script("vllm_fp32_checks")
    ref = [[1, 2, 3], [4, 5, 6]]
    same = {"treewy_generate": ref, "runs": {"store_all": _run([[1, 2], [4, 5]], 3),
                                             "reconstruct": _run([[1, 2], [4, 5]], 3)}}
    assert mod.verdict(same)["all_equal"] is True
    off = {"treewy_generate": ref, "runs": {"store_all": _run([[1, 2], [4, 5]], 3),
                                            "reconstruct": _run([[1, 2], [4, 5]], 4)}}
    v = mod.verdict(off)
    assert v["all_equal"] is False and v["counters_equal"] is False and v["outputs_equal"] == 2
    wrong = {"treewy_generate": ref, "runs": {"store_all": _run([[1, 2], [4, 9]], 3),
                                              "reconstruct": _run([[1, 2], [4, 9]], 3)}}
    assert mod.verdict(wrong)["equal_to_treewy"] == {"store_all": 1, "reconstruct": 1}
    failed = {"treewy_generate": ref, "runs": {"store_all": {"error": "worker exited with 1"},
                                               "reconstruct": _run([[1, 2], [4, 5]], 3)}}
    assert mod.verdict(failed) == {"all_equal": False, "errors": {"store_all": "worker exited with 1"}}


def test_probe_compares_every_scored_token_with_fp64(bench_script):
    """A probe that reports the fp64 logprobs exactly scores 0 against fp64; one off by 1e-3 scores 1e-3."""
    mod = bench_script("vllm_fp32_checks")
    from treewy.models import load

    plist = [[3, 1, 4, 1, 5, 9], [2, 6, 5, 3]]
    ref64 = [mod.reference_logprobs(load("tiny", dtype=torch.float64), p) for p in plist]
    ref32 = [mod.reference_logprobs(load("tiny", dtype=torch.float32), p) for p in plist]

    def probe(shift):
        top = lambda row: {str(int(t)): float(row[t]) + shift for t in row.topk(5).indices}  # noqa: E731
        return {"prompt_logprobs": [[None] + [top(r[pos - 1]) for pos in range(1, len(p))]
                                    for p, r in zip(plist, ref64)],
                "next_logprobs": [top(r[len(p) - 1]) for p, r in zip(plist, ref64)]}

    exact = mod.probe_rows(probe(0.0), plist, ref64, ref32)
    assert exact["vllm_vs_fp64"]["max"] == 0.0 and exact["vllm_vs_fp64"]["n"] == 5 * (5 + 1 + 3 + 1)
    assert 0 < exact["fp32_model_vs_fp64"]["max"] < 1e-4
    assert mod.probe_rows(probe(1e-3), plist, ref64, ref32)["vllm_vs_fp64"]["max"] == pytest.approx(1e-3)


def test_ties_scores_where_an_output_parts_from_treewys(bench_script):
    """The gap is logit[treewy's token] - logit[vLLM's] of the fp64 model at the first differing position."""
    mod = bench_script("vllm_fp32_checks")
    from treewy.models import load

    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        lg = load("tiny", dtype=torch.float64)(torch.tensor([prompt])).logits[0, -1]
    best, other = int(lg.argmax()), int(lg.argmin())
    report = {"prompts": [prompt, prompt], "treewy_generate": [[best, 7], [best]],
              "runs": {"store_all": {"outputs": [[other, 7], [best]]}}}
    (row,) = mod.ties(report)
    assert (row["prompt"], row["position"], row["vllm"], row["treewy"]) == (0, 0, other, best)
    assert row["gap_float64"] == pytest.approx(float(lg[best] - lg[other]))
    assert abs(row["gap_float32"] - row["gap_float64"]) < 1e-3
