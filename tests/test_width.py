"""Notebook 06's tree-width figure: every tree against the chain of its own source, mode and load, the decode-bound
identity's terms, and measured tree sweeps overlaid only where one run served more than one tree."""

from __future__ import annotations

import polars as pl
import pytest

from treewy.schema import serving_frame


def _rows(date, trees, throughput):
    base = dict(model="qwen3.5-35b-a3b", gpu="H200", tp=1, gmu=0.9, workload="generation-short", concurrency=8,
                simulated=False, device="H200", date=date, weights="dummy", acceptance_source="paper-35b", failed=0,
                mean_tpot_ms=5.0, acceptance_length=3.4, peak_running=8)
    return [dict(base, mode=m, tree=str(t), output_throughput=throughput[t]) for m in ("store_all", "reconstruct")
            for t in trees]


def test_width_frame_divides_by_the_chain_of_the_same_run(tmp_path):
    from treewy_lab.width import METRICS, width_figure, width_frame

    chain, tree = (1, 1, 1), (2, 2, 1)
    serving_frame(_rows("2026-12-09", (chain, tree), {chain: 1000.0, tree: 1100.0})
                  + _rows("2026-12-10", (tree,), {tree: 1.0})).write_parquet(tmp_path / "trees.parquet")
    f = width_frame(trees=(chain, tree), concurrency=(8,), measured_dirs=(tmp_path,))
    assert set(f["metric"]) == set(METRICS)
    measured = f.filter(pl.col("source") != "SIMULATED")
    assert set(measured["source"]) == {"vLLM measured: H200, 2026-12-09, dummy weights, acceptance: synthetic "
                                       "(paper-35b)"}                      # the one-tree run has no chain to beat
    got = measured.filter(metric="vs_chain", tree=str(tree))["value"].to_list()
    assert got == pytest.approx([1.1, 1.1])
    assert measured.filter(metric="step_ms")["value"].to_list() == pytest.approx([17.0] * 4)   # TPOT x tokens/step
    sim = f.filter(source="SIMULATED", metric="vs_chain", tree=str(chain))["value"].to_list()
    assert sim == [1.0, 1.0]
    fig = width_figure(trees=(chain, tree), concurrency=(8,), measured_dirs=(tmp_path,))
    assert fig["vs_chain"].height == 8 and "2026-12-09" in str(fig["chart"].to_dict()["title"])


def test_width_frame_at_the_tiny_checkpoints_acceptance_overlays_only_runs_that_asked_for_it(tmp_path):
    """``acceptance="tiny"``: the simulator takes the tiny checkpoint's per-depth rates (conditional, so their running
    product is the served sampler's P(depth >= d)), and a measured run at the paper's acceptance is not overlaid."""
    from treewy.serve.acceptance import parse_acceptance
    from treewy.sim.predict import served_acceptance
    from treewy_lab.width import width_frame

    chain, tree = (1, 1, 1), (2, 2, 1)
    for t in (chain, tree):
        for acc in ("paper-35b", "tiny"):
            cond, a = served_acceptance(t, acc), parse_acceptance(acc, 3, dummy=True, tree=t).rates
            assert [cond[0], cond[0] * cond[1], cond[0] * cond[1] * cond[2]] == pytest.approx(list(a))
    paper = _rows("2026-12-09", (chain, tree), {chain: 1000.0, tree: 1100.0})
    tiny = [dict(r, date="2026-12-11", acceptance_source="tiny") for r in paper]
    serving_frame(paper + tiny).write_parquet(tmp_path / "trees.parquet")
    kw = dict(trees=(chain, tree), concurrency=(8,), measured_dirs=(tmp_path,))
    f_tiny, f_paper = width_frame(acceptance="tiny", **kw), width_frame(**kw)
    sources = set(f_tiny["source"]) - {"SIMULATED"}
    assert len(sources) == 1 and "2026-12-11" in sources.pop() and "(tiny)" in str(set(f_tiny["source"]))
    assert not any("2026-12-11" in s for s in set(f_paper["source"]))

    def sim_tokens(f):
        return f.filter(source="SIMULATED", metric="tokens_per_step", tree=str(tree))["value"].to_list()

    assert sim_tokens(f_tiny) != pytest.approx(sim_tokens(f_paper))
    with pytest.raises(ValueError, match="acceptance = 'table-2': expected one of paper-35b, tiny"):
        width_frame(acceptance="table-2", **kw)


def test_the_notebooks_simulated_curves_are_the_width_predictions():
    """What notebook 06 draws SIMULATED is what benchmarks/sim_width_predictions.py commits before a run: the same
    grid, requests per point, graphs and rates."""
    from benchmarks.sim_width_predictions import predict_width
    from treewy_lab.width import width_frame

    trees = ((1, 1, 1), (2, 2, 1))
    f = width_frame(trees=trees, concurrency=(1, 64), acceptance="tiny", measured_dirs=())
    drawn = (f.filter(source="SIMULATED", metric="tokens_per_step").sort("mode", "tree", "concurrency")["value"])
    rows = predict_width(gmus=(0.9,), acceptances=("tiny",), trees=trees, concurrency=(1, 64))
    assert drawn.to_list() == rows.sort("mode", "tree", "concurrency")["acceptance_length"].to_list()
