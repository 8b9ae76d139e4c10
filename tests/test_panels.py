"""Panels driven headless through set(): their frames and their charts' data follow the controls."""

import re

import polars as pl
import pytest

from treewy_lab.frames import PAPER_SOURCE
from treewy_lab.panels import PseudoValuePanel, TreePanel


def chart_values(panel, name):
    spec = panel.charts[name].chart.to_dict()
    return [row for rows in spec["datasets"].values() for row in rows]


def test_tree_panel_redraws_for_new_widths():
    p = TreePanel(widths=(2, 2))
    assert p.error is None
    assert p.frames["nodes"].height == 7
    p.set(level1=3, level2=3, level3=3)
    assert p.frames["nodes"].height == 40
    assert len([r for r in chart_values(p, "tree") if "node" in r]) == 40
    blocks = {r["mode"]: r["blocks"] for r in chart_values(p, "blocks")}
    assert blocks == {"store_all": 40, "reconstruct": 1}
    assert "N = 39 drafts" in p.status.value and "PASS" in p.status.value


def test_tree_panel_refuses_trees_over_the_limit_and_keeps_its_charts():
    p = TreePanel(widths=(2,))
    p.set(level1=8, level2=8, level3=8)
    assert "limit of 128" in p.status.value
    assert p.frames["nodes"].height == 1 + 8 + 64  # the last shape that fit: (8, 8)


def test_tree_panel_says_when_the_sliders_cannot_show_its_widths():
    for widths, shown in [((0,), (1,)), ((1,) * 6, (1, 1, 1, 1)), ((9,), (8,)), ((2, 0, 3), (2,))]:
        p = TreePanel(widths=widths)
        assert p.widths == shown
        assert f"widths {widths} do not fit the 4 level sliders" in p.status.value
        assert f"showing {shown}" in p.status.value
    p.set(level1=3)
    assert p.widths == (3,) and "do not fit" not in p.status.value  # the sliders now hold the user's tree
    assert "do not fit" not in TreePanel(widths=(2,)).status.value
    with pytest.raises(ValueError, match=r"widths\[0\] = 2.5: branching factors are integers"):
        TreePanel(widths=(2.5,))


@pytest.mark.parametrize("sizes", [dict(V=0, K=0), dict(K=0), dict(V=-3), dict(V=2.0)], ids=str)
def test_pseudo_value_panel_refuses_sizes_below_one(sizes):
    name, value = next((k, v) for k, v in sizes.items() if not (isinstance(v, int) and v >= 1))
    with pytest.raises(ValueError, match=rf"{name} = {value}: the value size V and key size K are positive integers"):
        PseudoValuePanel(**sizes)


def test_pseudo_value_panel_follows_the_sliders():
    p = PseudoValuePanel()
    u_before = p.frames["vectors"].filter(series="u (pseudo-value)")["value"].to_list()
    p.set(beta=0.0)
    u_zero = p.frames["vectors"].filter(series="u (pseudo-value)")["value"].to_list()
    assert u_zero != u_before and all(abs(x) < 1e-15 for x in u_zero)  # nothing is written at beta = 0
    err = float(re.search(r"to (\S+) \(relative\)", p.status.value).group(1))
    assert err < 1e-12
    values = [r["value"] for r in chart_values(p, "vectors") if r["series"] == "u (pseudo-value)"]
    assert values == pytest.approx(u_zero)


def test_set_rejects_unknown_controls():
    with pytest.raises(ValueError, match="unknown controls"):
        TreePanel().set(levels=3)


def test_serving_panel_follows_memory_and_labels_simulated():
    from treewy_lab.panels import ServingPanel

    p = ServingPanel(concurrency=(8, 128, 256))
    assert p.error is None
    sim = p.frames["simulated"]
    assert sim["simulated"].all() and set(sim["mode"]) == {"store_all", "reconstruct"}
    title = p.charts["curves"].chart.to_dict()["title"]
    assert title["text"][0].startswith("SIMULATED") and title["subtitle"][0].startswith("GDN step: ")
    assert title["subtitle"][1] == "fixed step costs: assumed"
    admitted = lambda: p.frames["simulated"].filter(mode="store_all")["peak_running"].max()  # noqa: E731
    before = admitted()
    p.set(gmu=0.9)
    assert "press <b>Run</b>" in p.status.value and admitted() == before   # a simulation waits for Run
    p.run_button.click()
    assert "gmu 0.90" in p.charts["curves"].chart.to_dict()["title"]["text"][0]
    assert admitted() > before  # more memory admits more store-all requests
    sources = set(p.frames["ratios"]["source"])
    assert sources == {"SIMULATED"}       # the paper's ratios are at gmu 0.6
    p.set(gmu=0.6)
    p.run_button.click()
    assert set(p.frames["ratios"]["source"]) == {"SIMULATED", PAPER_SOURCE}


def test_serving_panel_overlays_only_measured_rows_of_the_same_configuration(tmp_path):
    from treewy_lab.panels import ServingPanel
    from treewy.schema import serving_frame

    same = dict(model="qwen3.5-35b-a3b", gpu="NVIDIA H200", tp=1, gmu=0.6, workload="balanced-chat",
                tree="(1, 1, 1)", concurrency=8, simulated=False, device="NVIDIA H200", date="2026-12-01",
                output_throughput=900.0, peak_kv_usage=0.4, peak_running=8, p99_ttft_ms=50.0, failed=0)
    rows = [{**same, "mode": m} for m in ("store_all", "reconstruct")]
    rows += [{**same, "mode": "store_all", **change} for change in (
        dict(gmu=0.9), dict(tree="(3, 3, 3)"), dict(tp=2), dict(gpu="NVIDIA B200"), dict(model="qwen3.5-397b-a17b"),
        dict(max_num_seqs=256),                     # the panel simulates vLLM's default, 1024
        dict(workload="spec-bench", failed=None),   # `(A & B) | failed.is_null()` let this one through
        dict(failed=3), dict(error="the server died"))]
    serving_frame(rows).write_parquet(tmp_path / "serve.parquet")
    p = ServingPanel(measured_dirs=(tmp_path,), concurrency=(8,), gpu="h200", workload="balanced-chat")
    measured = p.frames["measured"]
    assert measured.height == 2 and set(measured["mode"]) == {"store_all", "reconstruct"}
    label = "vLLM measured: NVIDIA H200, 2026-12-01, weights not recorded, acceptance: real"
    assert label in set(p.frames["curves"]["source"])
    ratios = p.frames["ratios"].filter(source=label, metric="peak KV usage reduction")   # measured ratios too
    assert ratios["ratio"].to_list() == [1.0] and ratios["concurrency"].to_list() == [8]
    p.set(gmu=0.9)
    p.run_button.click()
    assert p.frames["measured"].height == 1 and p.frames["measured"]["gmu"].item() == 0.9
    # rows of real (unrecorded) weights are the paper's-acceptance kind, not the dummy weights' none
    p.set(gmu=0.6, acceptance="none (dummy weights)")
    p.run_button.click()
    assert p.frames["measured"].is_empty()
    from treewy_lab.frames import measured_matching
    with pytest.raises(ValueError, match="acceptance = 'real'"):
        measured_matching(serving_frame(rows), model="m", gpu="h200", tp=1, gmu=0.6, tree="(1, 1, 1)",
                          workload="balanced-chat", acceptance="real")


def test_serving_panel_overlays_the_committed_h200_sweep_with_its_settings():
    from treewy_lab.panels import ServingPanel

    p = ServingPanel(concurrency=(1, 32, 128), gpu="h200", gmu=0.6, workload="generation-short", max_num_seqs=256,
                     acceptance="none (dummy weights)", step_costs="fitted: H200, vLLM 0.26, decode graphs")
    measured = p.frames["measured"]
    assert measured.height == 12 and set(measured["weights"]) == {"dummy"}   # generation-short, c1-c256, both modes
    label = ("vLLM measured: H200, 2026-11-30, dummy weights, acceptance: real (dummy weights: none accepted)")
    assert label in set(p.frames["curves"]["source"]) and label in set(p.frames["ratios"]["source"])
    sim = p.frames["simulated"].filter(pl.col("concurrency") == 128).sort("mode")
    real = measured.filter(pl.col("concurrency") == 128).sort("mode")
    assert sim["peak_running"].to_list() == real["peak_running"].to_list() == [128, 48]
    assert (sim["acceptance_length"] == 1.0).all()
    p.set(max_num_seqs=1024)
    p.run_button.click()
    assert p.frames["measured"].is_empty()          # a 1024-request server has another pool
    # the paper's acceptance overlays the run that asked vLLM's synthetic sampler for it (2026-12-02), not the other
    p.set(max_num_seqs=256, acceptance="paper's")
    p.run_button.click()
    measured = p.frames["measured"]
    assert measured.height > 0 and set(measured["acceptance_source"]) == {"paper-35b"}
    assert set(measured["date"]) == {"2026-12-02"} and not (p.frames["simulated"]["acceptance_length"] == 1.0).any()


def test_serving_panel_reports_a_budget_that_cannot_hold_the_weights():
    from treewy_lab.panels import ServingPanel

    p = ServingPanel(concurrency=(8,), model="qwen3.5-397b-a17b", gpu="h100")
    assert p.error is None and "weights" in p.status.value


def test_parity_panel_reports_every_node_within_tolerance():
    from treewy_lab.panels import ParityPanel

    p = ParityPanel(tree="chain 3", batch=1, gva=4)
    errors = p.frames["errors"]
    assert sorted(errors["node"].unique().to_list()) == [0, 1, 2, 3]
    assert (errors["error"] <= errors["tol"]).all() and (errors["error"] > 0).all()
    p.set(tree="(2, 1, 1)")
    assert p.frames["errors"]["node"].n_unique() == 4       # controls take effect on Run only
    p.run_button.click()
    assert p.frames["errors"]["node"].n_unique() == 7
    assert "PASS" in p.status.value


def test_timing_panel_says_it_needs_a_gpu():
    import torch

    from treewy_lab.panels import TimingPanel

    p = TimingPanel()
    if not torch.cuda.is_available():
        assert p.run_button.disabled and "need a CUDA GPU" in p.status.value


def test_sweep_panel_runs_live_and_overlays_its_sources():
    from treewy_lab.panels import SweepPanel

    p = SweepPanel(largest=6, chains=(1, 1), prompts=1, tokens=8)
    live = p.frames["live"]
    assert set(live["mode"]) == {"reconstruct", "store_all"}
    assert sorted(live["N"].unique().to_list()) == [1, 3, 6]
    blocks = {(r["N"], r["mode"]): r["blocks"] for r in p.frames["blocks"].iter_rows(named=True)}
    assert blocks[(6, "store_all")] == 7 and blocks[(6, "reconstruct")] == 1
    sources = set(p.frames["acceptance"]["source"])
    assert any(s.endswith("(live)") for s in sources) and any(s.startswith("paper") for s in sources)
    assert "the same tokens per step" in p.status.value
    p.set(drafter="ngram")
    p.run_button.click()
    assert not any(s.startswith("paper") for s in p.frames["acceptance"]["source"])  # the paper drafts with MTP


def test_kernel_targets_frame_reads_the_committed_targets(tmp_path):
    """The notebook's targets table: every target of the committed run, labelled measured with device and date."""
    import json

    from treewy_lab.frames import kernel_targets_frame

    df = kernel_targets_frame()
    assert df.height >= 12 and set(df["result"]) <= {"PASS", "FAIL", "report"}
    assert all(s.endswith("(measured)") for s in df["source"])
    assert {"1", "2", "3", "4", "5", "6"} <= {t.split()[0] for t in df["target"]}   # every target of the issue
    path = tmp_path / "targets_x.json"
    path.write_text(json.dumps(dict(device="GPU X", date="2026-01-01", targets=[
        dict(target="1 step", measured=250.0, bar="<= 300", ok=True, unit="us"),
        dict(target="3 memory", measured=600.0, bar="device 140", ok=True, unit="GiB"),
        dict(target="4 latency", measured=31.0, bar="<= 15", ok=False, unit="us")])))
    mine = kernel_targets_frame(path)
    assert mine["result"].to_list() == ["PASS", "report", "FAIL"]
    assert mine["source"][0] == "GPU X, 2026-01-01 (measured)"


def test_measured_ratios_come_one_chart_per_gmu_with_their_acceptance(tmp_path):
    from treewy_lab.panels.serving import measured_ratio_figure
    from treewy.schema import serving_frame

    base = dict(model="qwen3.5-35b-a3b", gpu="NVIDIA H200", tp=1, workload="balanced-chat", tree="(1, 1, 1)",
                concurrency=8, simulated=False, device="NVIDIA H200", date="2026-12-02", output_throughput=900.0,
                peak_kv_usage=0.4, peak_running=8, p99_ttft_ms=50.0, mean_tpot_ms=20.0, failed=0, max_num_seqs=256)
    rows = [{**base, "gmu": 0.6, "mode": m, "weights": "dummy"} for m in ("store_all", "reconstruct")]
    rows += [{**base, "gmu": 0.75, "mode": m, "weights": "dummy", "acceptance_source": "paper-35b",
              "acceptance_length": 3.2, "peak_kv_usage": 0.4 if m == "store_all" else 0.01}
             for m in ("store_all", "reconstruct")]
    serving_frame(rows).write_parquet(tmp_path / "serve.parquet")
    seen = []
    fig = measured_ratio_figure((tmp_path,), on_point=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (4, 4)
    spec = fig["chart"].to_dict()
    assert [c["title"]["text"].split(" · ")[-1] for c in spec["vconcat"]] == ["gmu 0.60", "gmu 0.75"]
    sources = set(fig["ratios"]["source"])
    assert ("vLLM measured: NVIDIA H200, 2026-12-02, dummy weights, acceptance: real (dummy weights: none accepted)"
            in sources)
    assert "vLLM measured: NVIDIA H200, 2026-12-02, dummy weights, acceptance: synthetic (paper-35b)" in sources
    assert any(s.startswith("paper") for s in fig["ratios"].filter(gmu=0.6)["source"])       # the paper's gmu
    assert not any(s.startswith("paper") for s in fig["ratios"].filter(gmu=0.75)["source"])
    kv = fig["parting"].filter(metric="peak KV usage reduction", gmu=0.75)   # measured 40x: far from the simulated
    assert kv.height == 1 and kv["measured"].item() == pytest.approx(40.0)
    # each twin is priced by the fit made on runs like it, and says which
    twins = {s for s in sources if s.startswith("SIMULATED twin")}
    assert {s.split("fixed costs ")[-1].rstrip(")") for s in twins} == {"H200_VLLM026_DECODE_GRAPHS",
                                                                         "H200_VLLM026_GRAPHS1024_TWO_GMU"}


def test_an_h200_twin_takes_the_fit_made_on_runs_that_accepted_as_it_did():
    from treewy.sim.calibrated import H200_DEFAULT_FIT
    from treewy_lab.panels.serving import h200_twin_fit

    assert h200_twin_fit(3.2) == H200_DEFAULT_FIT == "H200_VLLM026_GRAPHS1024_TWO_GMU"
    assert h200_twin_fit(1.0) == h200_twin_fit(None) == "H200_VLLM026_DECODE_GRAPHS"   # dummy weights, none accepted


def test_a_slow_panel_is_on_screen_before_its_first_run(monkeypatch):
    """In a notebook a slow panel shows itself (status line, progress) before it computes, and the cell's own
    display of it then adds nothing; a later display shows it again."""
    from treewy_lab.panels import ServingPanel
    from treewy_lab.panels import base

    shown = []
    monkeypatch.setattr(base, "_in_kernel", lambda: True)
    monkeypatch.setattr(base, "display", lambda box: shown.append(("display", box)))
    monkeypatch.setattr(ServingPanel, "update", lambda self: shown.append(("update", None)))
    p = ServingPanel(concurrency=(8,))
    assert [what for what, _ in shown] == ["display", "update"]
    p._ipython_display_()
    assert len(shown) == 2
    p._ipython_display_()
    assert [what for what, _ in shown] == ["display", "update", "display"]


def test_a_measured_runs_twin_captures_the_graphs_its_server_captured():
    from treewy_lab.panels.serving import captured_graphs

    assert captured_graphs(pl.DataFrame({"cudagraph_max_size": [1024, 1024, None]})) == {"graph_max_tokens": 1024}
    assert captured_graphs(pl.DataFrame({"cudagraph_max_size": [512, 1024]})) == {}      # two servers: no one size
    assert captured_graphs(pl.DataFrame({"concurrency": [1]})) == {}                     # tables from before the column


def test_the_refitted_step_costs_are_a_choice_of_the_serving_panel():
    from treewy_lab.panels import ServingPanel
    from treewy_lab.panels.serving import STEP_COSTS

    refit = "refitted: H200, vLLM 0.26, graphs to 1024, accepted drafts"
    long_steps = "long-step fit: the refit, eager steps priced as measured"
    assert STEP_COSTS[refit].graph_max_tokens == STEP_COSTS[long_steps].graph_max_tokens == 1024
    tpot = {}
    for costs in ("fitted: H200, vLLM 0.26, decode graphs", refit, long_steps):
        p = ServingPanel(concurrency=(1, 32), gpu="h200", gmu=0.6, workload="generation-short", max_num_seqs=256,
                         step_costs=costs)
        tpot[costs] = p.frames["simulated"].filter(pl.col("concurrency") == 1)["mean_tpot_ms"].to_list()
    assert len({tuple(v) for v in tpot.values()}) == 3
