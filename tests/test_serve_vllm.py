"""The plugin against vLLM 0.33.0: every name it touches exists with the parameters it uses, and it registers.

Three levels: always (no vLLM): the plugin is inert outside reconstruct mode and its page layout is
aligned; with TREEWY_VLLM_SRC pointing at an unpacked vllm==0.33.0 wheel: the names, parameters
and CLI flags read from its source; with vLLM installed (marker ``vllm``): the live objects, and
``register()`` puts the TreeWY layer in vLLM's out-of-tree registry.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from math import prod

import pytest
import torch

from treewy.serve import plugin
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
    with pytest.raises(ImportError, match=r"vllm==0.33.0"):
        plugin.register()


@pytest.mark.parametrize("tp,k", [(1, 3), (8, 3), (1, 1), (2, 7)])
def test_page_layout_is_one_block_with_an_aligned_stash(tp, k):
    """Qwen3.5-397B GDN shapes: every tensor of the page starts on a 4-byte boundary (bind_kv_cache
    views the int8 page per dtype) and the page is far smaller than store-all's 1 + k pages."""
    shapes, dtypes = plugin.page_layout(tp=tp, num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128,
                                        conv_kernel=4, num_spec=k, conv_shape_fn=lambda d, s: (s, d),
                                        conv_dtype=torch.bfloat16, ssm_dtype=torch.float32,
                                        stash_dtype=torch.float32, meta_dtype=torch.int32)
    assert len(shapes) == len(dtypes) == 7
    assert shapes[1] == (64 // tp, 128, 128) and shapes[0] == (3, (2 * 16 * 128 + 64 * 128) // tp)
    offset = 0
    for s, d in zip(shapes, dtypes):
        assert offset % 4 == 0, (s, d, offset)
        offset += prod(s) * d.itemsize
    stock_page = 3 * shapes[0][1] * 2 + prod(shapes[1]) * 4 + k * shapes[0][1] * 2
    assert offset < 1.25 * stock_page            # one reconstruct page vs one stock page
    assert offset < (1 + k) * stock_page / 1.6   # vs the 1 + k stock pages store-all holds


@pytest.mark.skipif(not os.environ.get("TREEWY_VLLM_SRC"), reason="set TREEWY_VLLM_SRC to an unpacked vllm wheel")
def test_names_exist_in_vllm_source():
    assert check_source(os.environ["TREEWY_VLLM_SRC"]) == []


def test_source_checker_catches_a_renamed_parameter(tmp_path):
    gdn = tmp_path / "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
    gdn.parent.mkdir(parents=True)
    gdn.write_text("class QwenGatedDeltaNetAttention:\n"
                   "    def _forward_core(self, mixed_qkv, beta, a, core_attn_out):\n        pass\n")
    problems = check_source(tmp_path)
    assert any("_forward_core: parameters ['b'] missing" in p for p in problems), problems
    assert any("QwenGatedDeltaNetAttention.get_kv_cache_spec: missing" in p for p in problems)
    assert any("vllm.forward_context: no source file" in p for p in problems)


@pytest.mark.vllm
def test_names_exist_in_installed_vllm():
    import vllm

    assert vllm.__version__.startswith("0.33.0"), f"pinned vllm==0.33.0, found {vllm.__version__}"
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
