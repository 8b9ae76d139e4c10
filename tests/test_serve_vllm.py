"""The plugin against vLLM 0.26.x (run) and 0.33.x (source): every name it touches exists, and it registers.

Three levels: always (no vLLM): the plugin is inert outside reconstruct mode and its page layout is
aligned; with TREEWY_VLLM_SRC pointing at an unpacked vLLM wheel (TREEWY_VLLM_LINE 0.26 or 0.33): the names
and CLI flags read from its source; with vLLM installed (marker ``vllm``): the live objects, and
``register()`` puts the TreeWY layer in vLLM's out-of-tree registry.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from math import prod
from pathlib import Path

import pytest
import torch

from treewy.serve import plugin, vllm_adapter
from treewy.serve.vllm_names import check_installed, check_source


def test_plugin_is_inert_unless_reconstruct(monkeypatch):
    monkeypatch.setenv("TREEWY_MODE", "store_all")
    plugin.register()  # must not import vllm
    code = "import os, sys; os.environ['TREEWY_MODE']='store_all'; from treewy.serve.plugin import register; " \
           "register(); assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_reconstruct_without_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setenv("TREEWY_MODE", "reconstruct")
    with pytest.raises(ImportError, match=r"0\.26\.x .*0\.33\.x.*pip install 'treewy\[serve\]'"):
        plugin.register()


@pytest.mark.parametrize("version,line", [("0.26.0", "0.26"), ("0.26.3+cu130", "0.26"), ("0.33.0", "0.33"),
                                          ("0.27.0", None), ("0.34.1", None), ("1.0", None), ("garbage", None)])
def test_supported_versions(version, line):
    assert vllm_adapter.release_line(version) == line
    if line is None:
        with pytest.raises(ValueError, match=f"vLLM {version} is not supported.*0.26.x"):
            vllm_adapter.check_version(version)


def test_serve_extra_names_the_supported_versions():
    from packaging.requirements import Requirement

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'serve = ["{vllm_adapter.SERVE_REQUIREMENT}"]' in text
    spec = Requirement(vllm_adapter.SERVE_REQUIREMENT).specifier
    assert [v for v in ("0.25.0", "0.26.0", "0.26.2", "0.27.0", "0.30.1", "0.33.0", "0.33.4", "0.34.0")
            if spec.contains(v)] == ["0.26.0", "0.26.2", "0.33.0", "0.33.4"]


@pytest.mark.parametrize("tp,k", [(1, 3), (8, 3), (1, 1), (2, 7)])
def test_page_is_one_block_with_an_aligned_stash(tp, k):
    """Qwen3.5-397B GDN shapes: every tensor of the page starts on its dtype's boundary (vLLM views the
    raw page per dtype) and one page is far smaller than store-all's 1 + k pages."""
    C = (2 * 16 * 128 + 64 * 128) // tp
    stock = ((C, 3 + k), (64 // tp, 128, 128)), (torch.bfloat16, torch.float32)
    shapes, dtypes = plugin.page_layout(*stock, tp=tp, num_k_heads=16, num_v_heads=64, head_k_dim=128,
                                        head_v_dim=128, num_spec=k)
    assert shapes[:2] == stock[0] and len(shapes) == len(dtypes) == 6
    assert shapes[2] == (k + 1, 64 // tp, 128) and shapes[3] == (k + 1, 16 // tp, 128)
    offset = 0
    for sh, d in zip(shapes, dtypes):
        assert offset % d.itemsize == 0, (sh, d, offset)
        offset += prod(sh) * d.itemsize
    stock_page = prod(stock[0][0]) * 2 + prod(stock[0][1]) * 4
    assert offset < 1.1 * stock_page              # one reconstruct page vs one stock page
    assert offset < (1 + k) * stock_page / 1.8    # vs the 1 + k stock pages store-all holds


def test_reconstruct_holds_no_speculative_blocks_unless_equal_blocks_is_asked(monkeypatch):
    """One block per request by default; TREEWY_EQUAL_BLOCKS=1 (the preemption test's setting) keeps store-all's k."""
    monkeypatch.delenv("TREEWY_EQUAL_BLOCKS", raising=False)
    assert plugin.speculative_blocks(3) == 0
    monkeypatch.setenv("TREEWY_EQUAL_BLOCKS", "1")
    assert plugin.speculative_blocks(3) == 3
    monkeypatch.setenv("TREEWY_EQUAL_BLOCKS", "0")
    assert plugin.speculative_blocks(3) == 0


@pytest.mark.skipif(not os.environ.get("TREEWY_VLLM_SRC"), reason="set TREEWY_VLLM_SRC to an unpacked vllm wheel")
def test_names_exist_in_vllm_source():
    line = os.environ.get("TREEWY_VLLM_LINE", "0.33")
    assert check_source(os.environ["TREEWY_VLLM_SRC"], line) == []


def test_source_checker_catches_a_renamed_parameter(tmp_path):
    gdn = tmp_path / "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
    gdn.parent.mkdir(parents=True)
    gdn.write_text("class QwenGatedDeltaNetAttention:\n"
                   "    def _forward_core(self, mixed_qkv, beta, a, core_attn_out):\n        pass\n")
    problems = check_source(tmp_path)
    assert any("_forward_core: parameters ['b'] missing" in p for p in problems), problems
    assert any("QwenGatedDeltaNetAttention.rearrange_mixed_qkv: missing" in p for p in problems)
    assert any("vllm.forward_context: no source file" in p for p in problems)


@pytest.mark.vllm
def test_names_exist_in_installed_vllm():
    import vllm

    assert vllm_adapter.release_line(vllm.__version__) == "0.26", f"tested on vLLM 0.26.x, found {vllm.__version__}"
    assert check_installed() == []


@pytest.mark.vllm
def test_plugin_registers(monkeypatch):
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    monkeypatch.setenv("TREEWY_MODE", "reconstruct")
    plugin.register()
    plugin.register()  # vLLM calls plugins once per process, sometimes more: must be re-entrant
    cls = op_registry_oot["QwenGatedDeltaNetAttention"]
    assert issubclass(cls, QwenGatedDeltaNetAttention) and cls.__name__ == "TreeWYGatedDeltaNetAttention"
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "treewy"]
    assert eps and eps[0].value == "treewy.serve.plugin:register"
