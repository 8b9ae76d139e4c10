"""Each panel's GPU path, on a GPU (skipped elsewhere): the kernels run at Qwen3.5's shapes on CUDA and pass, the
timing panel times this GPU, the acceptance sweep decodes on CUDA."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_parity_panel_runs_the_kernels_on_cuda_at_model_shapes():
    from treewy_lab.panels import ParityPanel

    p = ParityPanel(tree="(3, 3, 3)", batch=8, gva=2, dtype="bfloat16")
    assert p.error is None and p.ran_on == "cuda"
    assert "K = V = 128" in p.charts["errors"].chart.to_dict()["title"]
    assert p.status.value.endswith("PASS on GPU"), p.status.value


def test_timing_panel_times_this_gpu():
    from treewy_lab.panels import TimingPanel

    p = TimingPanel()
    assert p.error is None and not p.run_button.disabled
    timing = p.frames["timing"]
    assert set(timing["provider"]) >= {"treewy", "store_all"} and (timing["us"] > 0).all()
    assert torch.cuda.get_device_name() in p.charts["timing"].chart.to_dict()["title"]


def test_sweep_panel_decodes_on_cuda(monkeypatch):
    monkeypatch.setenv("TREEWY_DEVICE", "cuda")
    from treewy_lab.panels import SweepPanel

    p = SweepPanel(largest=3, chains=(1, 1), prompts=1, tokens=8)
    assert p.error is None
    assert set(p.frames["live"]["device"]) == {torch.cuda.get_device_name()}
