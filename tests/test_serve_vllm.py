"""The plugin against vLLM 0.26.x (run) and 0.33.x (source): every name it touches exists, and it registers.

Three levels: always (no vLLM): the plugin is inert outside reconstruct mode and its page layout is
aligned; with TREEWY_VLLM_SRC pointing at an unpacked vLLM wheel (TREEWY_VLLM_LINE 0.26 or 0.33): the names
and CLI flags read from its source; with vLLM installed (marker ``vllm``): the live objects, and
``register()`` puts the TreeWY layer in vLLM's out-of-tree registry.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
from math import prod
from pathlib import Path

import pytest
import torch

from treewy.serve import fp32_prefill, plugin, reconstruct, vllm_adapter
from treewy.serve.vllm_names import FLAGS, TREE_FLAGS, TREE_NAMES, check_installed, check_source, names_for

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import stand_in_vllm  # noqa: E402

SERVE = Path(plugin.__file__).parent


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
    assert shapes[2] == (k + 1, 64 // tp, 128) and shapes[3] == (2, k + 1, 16 // tp, 128)   # keys: two halves
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


def _vllm_names(line: str) -> set[str]:
    """Every module part, class, function, attribute and field name the check list holds for ``line``."""
    return {p for n in names_for(line) for p in n.qualname.split(".")} - {"__init__"}


@pytest.mark.parametrize("path", ["plugin.py", "reconstruct.py", "fp32_prefill.py", "tree_vllm.py"])
def test_the_plugin_reads_vllm_only_through_the_adapter(path):
    """No vLLM import, no attribute of a vLLM object read by name and no getattr of one by string in the plugin's
    modules: each goes through vllm_adapter, whose names vllm_names checks per release line. The subclass's
    overrides call their vLLM parents through ``super()``."""
    names = set().union(*(_vllm_names(line) for line in vllm_adapter.SUPPORTED)) - {"np"}   # numpy's, in tree_vllm
    tree = ast.parse((SERVE / path).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            found.append(f"line {node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
            found.append(f"line {node.lineno}: import vllm")
        elif isinstance(node, ast.Attribute) and node.attr in names:
            is_super = (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                        and node.value.func.id == "super")
            is_adapter = isinstance(node.value, ast.Name) and node.value.id == "adapter"
            if not (is_super or is_adapter):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    assert not found, f"{path} reads vLLM names directly: {found}"


@pytest.mark.parametrize("line", sorted(vllm_adapter.SUPPORTED))
def test_every_adapter_name_is_in_the_check_list(line):
    """Each vLLM spelling the adapter holds (modules, classes, functions, attributes, keywords; the line's own for
    the per-line tables) is something vllm_names checks: a module, a part of a checked name, a checked parameter,
    or inside a checked source string."""
    checked = set(_vllm_names(line)) | {n.module for n in names_for(line)} | {p for n in names_for(line)
                                                                             for p in n.params}
    needles = [x for v in (*FLAGS.values(), *TREE_FLAGS.values()) for x in v]   # TREE_FLAGS: on TREE_LINES
    not_vllm = {"SUPPORTED", "SERVE_REQUIREMENT", "TREE_LINES"}
    spellings = []
    for const in (c for c in dir(vllm_adapter) if c.isupper() and c not in not_vllm):
        value = getattr(vllm_adapter, const)
        if isinstance(value, dict):
            value = value[line] if line in value else tuple(value.values())
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                spellings.append((const, v))
            else:
                stack.extend(v)
    if line not in vllm_adapter.TREE_LINES:   # trees are wired for TREE_LINES only: their names are checked there
        checked |= {p for n in TREE_NAMES for p in (n.module, *n.qualname.split("."), *n.params)}
    unchecked = [(c, v) for c, v in spellings if v not in checked and not any(v in x for x in needles)]
    assert len(spellings) > 60 and not unchecked, unchecked


def test_the_stand_ins_take_vllms_keywords():
    """reconstruct.vllm_spec_update is called with the spec kernel's keywords, recurrent_prefill with the prefill's:
    every parameter they name is one the check list holds for those vLLM functions."""
    spec = [p for p, v in inspect.signature(reconstruct.vllm_spec_update).parameters.items()
            if v.kind is inspect.Parameter.KEYWORD_ONLY and p != "config"]
    assert set(spec) <= set(vllm_adapter.SPEC_UPDATE_PARAMS) and vllm_adapter.NUM_ACCEPTED in spec, spec
    prefill = [p for p, v in inspect.signature(fp32_prefill.recurrent_prefill).parameters.items()
               if v.kind is not inspect.Parameter.VAR_KEYWORD]
    assert set(prefill) <= set(vllm_adapter.PREFILL_PARAMS) and len(prefill) == len(vllm_adapter.PREFILL_PARAMS) - 1


@pytest.mark.parametrize("line", sorted(vllm_adapter.SUPPORTED))
def test_plugin_in_a_stand_in_vllm(monkeypatch, line):
    """register() against stand-in vLLM modules: the layer registered once, its page one block with the stash, the
    model classes planning that page, the fused paths off, prefill rows flushed, the spec rows' slots widened to
    k + 1 views of column 0, the spec-row kernel call routed to TreeWY's step and every other call left to vLLM's."""
    vllm = stand_in_vllm.StandIn(line).install(monkeypatch)
    for env in ("TREEWY_EQUAL_BLOCKS", "TREEWY_FP32_PREFILL"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("TREEWY_MODE", "reconstruct")
    seen = []
    monkeypatch.setattr(plugin, "flush_slots", lambda pools, slots: seen.append(("flush", pools, slots)))
    monkeypatch.setattr(plugin, "vllm_spec_update",
                        lambda pools, **kw: (seen.append(("treewy", pools, kw)), ("treewy", None))[1])
    plugin.register()
    plugin.register()
    cls = vllm.registry[vllm_adapter.GDN_LAYER]
    assert list(vllm.registry) == [vllm_adapter.GDN_LAYER] and cls.__name__ == "TreeWYGatedDeltaNetAttention"
    cfg = stand_in_vllm.vllm_config()
    layer = cls(None, cfg, prefix="model.layers.0.linear_attn")
    assert all(getattr(layer, f) is False for f in vllm_adapter.FUSED_PATH_FLAGS[line])

    spec = layer.get_kv_cache_spec(cfg)
    stock = vllm.stock_page(vllm_adapter.config_dims(cfg))
    want = plugin.page_layout(*stock, tp=1, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, num_spec=3)
    assert (spec.shapes, spec.dtypes, spec.num_speculative_blocks) == (*want, 0)
    for module, name in vllm_adapter.MODEL_CLASSES[line]:
        model = getattr(sys.modules[module], name)
        assert model.get_mamba_state_shape_from_config(cfg) == want[0]
        assert model.get_mamba_state_dtype_from_config(cfg) == want[1]

    pools = reconstruct.ReconstructPools.empty(12, H=2, HV=4, K=8, V=8, max_nodes=4)
    layer.kv_cache = (torch.zeros(12, 4, 6), pools.state, pools.u, pools.k, pools.g, pools.meta)
    md = stand_in_vllm.Metadata(num_prefills=1, non_spec_state_indices_tensor=torch.tensor([5]),
                                spec_state_indices_tensor=torch.tensor([[7], [9]]))
    vllm.metadata[layer.prefix] = md
    assert layer._forward_core("qkv", "b", "a", None) is None
    (flush, flush_pools, flushed), (routed, step_pools, kw) = seen
    assert flush == "flush" and flushed.tolist() == [5] and flush_pools.state is pools.state
    assert routed == "treewy" and step_pools.meta is pools.meta
    assert md.spec_state_indices_tensor.tolist() == [[7] * 4, [9] * 4]
    assert kw[vllm_adapter.NUM_ACCEPTED].tolist() == [2, 1] and kw["ssm_state_indices"] is md.spec_state_indices_tensor
    assert len(vllm.stock_calls) == 1 and vllm_adapter.NUM_ACCEPTED not in vllm.stock_calls[0]

    # a prefill that starts a request (no initial state) may land on a block another layer's page filled: its meta
    # word is stale bytes (served trees folded such "windows" into new requests, 2026-12-05), so it is reset before
    # the flush; a row that continues its state keeps its window for the flush to commit
    md.num_prefills = 3
    md.non_spec_state_indices_tensor = torch.tensor([5, 6, -1])
    md.has_initial_state = torch.tensor([False, True, False])
    pools.meta[5, 0], pools.meta[6, 0], pools.meta[0, 0] = 1041592600, 3, 0
    seen.clear()
    layer._forward_core("qkv", "b", "a", None)
    assert seen[0][0] == "flush" and seen[0][2].tolist() == [5, 6, -1]
    assert pools.meta[:7, 0].tolist() == [0, 0, 0, 0, 0, 0, 3]
    md.has_initial_state = None
    md.num_prefills = 0            # a step of spec rows only: nothing to flush
    seen.clear()
    layer._forward_core("qkv", "b", "a", None)
    assert [s[0] for s in seen] == ["treewy"]
    with pytest.raises(ValueError, match="mamba_cache_mode 'none' only.*--no-enable-prefix-caching"):
        cls(None, stand_in_vllm.vllm_config(cache_mode="all"), prefix="p")


def test_source_checker_follows_the_layer_to_its_bases(tmp_path):
    """An attribute the plugin reads off the layer counts where a base class (imported from another module) sets it
    on self or declares it; one set nowhere is named."""
    base = tmp_path / "vllm/model_executor/layers/mamba/gdn/base.py"
    base.parent.mkdir(parents=True)
    base.write_text("class MambaBase:\n    kv_cache: tuple\n\n\nclass GatedDeltaNetAttention(MambaBase):\n"
                    "    def __init__(self, prefix):\n        self.prefix = prefix\n        self.tp_size, x = 1, 2\n")
    (base.parent / "qwen_gdn_linear_attn.py").write_text(
        "from vllm.model_executor.layers.mamba.gdn.base import GatedDeltaNetAttention as Base\n\n\n"
        "class QwenGatedDeltaNetAttention(Base):\n    def __init__(self, config):\n"
        "        self.num_k_heads = config.linear_num_key_heads\n")
    problems = check_source(tmp_path, "0.26")
    layer = f"{vllm_adapter.GDN_MODULE}.{vllm_adapter.GDN_LAYER}"
    for attr in ("prefix", "tp_size", "kv_cache", "num_k_heads"):
        assert not any(p.startswith(f"{layer}.{attr}:") for p in problems), (attr, problems)
    for attr in ("num_v_heads", "num_spec", "cache_config", "enable_packed_recurrent_decode"):
        assert f"{layer}.{attr}: not set on the class (nor on a base class)" in problems, (attr, problems)
    assert any("config.linear_num_value_heads not found" in p for p in problems)


def test_installed_checker_finds_attributes_set_on_self_or_a_base():
    from treewy.serve.vllm_names import _installed_instance_attr

    class Base:
        declared: int

        def __init__(self):
            self.tp_size = 1

    class Layer(Base):
        def __init__(self):
            super().__init__()
            self.num_spec = 3

    assert all(_installed_instance_attr(Layer, a) for a in ("tp_size", "num_spec", "declared"))
    assert not _installed_instance_attr(Layer, "num_k_heads")
