"""treewy.memory: the paper's figures, vLLM's paging, and errors that say what to do."""

import json

import pytest

from treewy.memory import GIB, KIB, MIB, GPU, ModelSpec, TINY_CONFIG, max_requests, paging

M35, M397 = "qwen3.5-35b-a3b", "qwen3.5-397b-a17b"


@pytest.mark.parametrize("name, kib", [(M35, 20), (M397, 30)], ids=["35b", "397b"])
def test_kv_per_token_is_the_papers(name, kib):
    assert ModelSpec.from_name(name).kv_bytes_per_token() == kib * KIB


@pytest.mark.parametrize("name, mib", [(M35, 30), (M397, 90)], ids=["35b", "397b"])
def test_bf16_gdn_state_per_sequence_is_the_papers(name, mib):
    assert ModelSpec.from_name(name).gdn_state_bytes("bfloat16") == mib * MIB


@pytest.mark.parametrize("name, mib", [(M35, 120), (M397, 360)], ids=["35b", "397b"])
def test_store_all_depth3_chain_holds_four_states(name, mib):
    m = ModelSpec.from_name(name)
    assert m.state_blocks("store_all", (1, 1, 1)) == 4
    assert m.state_blocks("reconstruct", (1, 1, 1)) == 1
    assert m.state_bytes("store_all", (1, 1, 1), "bfloat16") == mib * MIB
    assert m.state_bytes("reconstruct", (1, 1, 1), "bfloat16") == mib * MIB // 4


@pytest.mark.parametrize("name, gib", [(M35, 0.625), (M397, 0.94)], ids=["35b", "397b"])
def test_kv_at_32k_context_is_the_papers(name, gib):
    assert round(ModelSpec.from_name(name).kv_bytes_per_token() * 32768 / GIB, 3 if gib == 0.625 else 2) == gib


def test_store_all_blocks_follow_the_tree():
    m = ModelSpec.from_name(M35)
    assert [m.state_blocks("store_all", w) for w in [(2, 2, 2), (3, 3, 3)]] == [15, 40]


@pytest.mark.parametrize("name, billions", [(M35, 35), (M397, 397), ("qwen3-next-80b-a3b", 80)])
def test_parameter_count_matches_the_name(name, billions):
    """Weights are counted from the architecture; the total must land near the published size."""
    assert abs(ModelSpec.from_name(name).param_count() / 1e9 / billions - 1) < 0.05


def test_mamba_page_is_padded_to_the_attention_page():
    for mode in ("store_all", "reconstruct"):
        for dtype in ("float32", "bfloat16"):
            L = paging(M35, "b200", gmu=0.6, mode=mode, state_dtype=dtype)
            assert L.block_size % 16 == 0
            assert L.page_bytes == L.block_size * L.attn_bytes_per_token_layer
            assert 0 <= L.page_bytes - L.mamba_page_raw_bytes < 16 * L.attn_bytes_per_token_layer
    L = paging(M35, "b200", gmu=0.6, mode="store_all")
    # 10 attention layers + the MTP layer form the attention group; 30 GDN layers -> 3 groups
    assert (L.group_size, L.attn_groups, L.gdn_groups) == (11, 1, 3)
    assert L.state_blocks_per_request == 12
    assert L.blocks_per_request(2 * L.block_size) == 14
    assert L.num_blocks * L.block_bytes <= L.pool_bytes < (L.num_blocks + 1) * L.block_bytes


def test_conv_state_sits_in_the_same_page():
    m = ModelSpec.from_name(M35)
    L = paging(m, "b200", gmu=0.6, mode="store_all", state_dtype="float32")
    assert L.mamba_page_raw_bytes == m.gdn_state_bytes("float32") // 30 + m.conv_state_bytes(3 + 3)


def test_reconstruct_fits_more_requests_of_every_length():
    for tokens in (256, 2048, 32768):
        sa = max_requests(M35, "b200", tokens, gmu=0.6, mode="store_all")
        rc = max_requests(M35, "b200", tokens, gmu=0.6, mode="reconstruct")
        assert rc > sa > 0


def test_more_memory_never_admits_fewer():
    for mode in ("store_all", "reconstruct"):
        fits = [max_requests(M35, "b200", 4096, gmu=g, mode=mode) for g in (0.45, 0.5, 0.6, 0.7, 0.8, 0.9)]
        assert fits == sorted(fits) and fits[-1] > fits[0]
    per_gpu = [max_requests(M35, g, 4096, tp=2, gmu=0.9) for g in ("h100", "h200", "b200")]
    assert per_gpu == sorted(per_gpu)


def test_tensor_parallel_splits_weights_and_state():
    m = ModelSpec.from_name(M397)
    assert m.weight_bytes(8) * 8 == pytest.approx(m.weight_bytes(1), rel=1e-9)
    assert m.gdn_state_bytes("bfloat16", tp=8) * 8 == m.gdn_state_bytes("bfloat16")
    assert m.kv_bytes_per_token(tp=8) == m.kv_bytes_per_token() // 2   # 2 KV heads: replicated past tp = 2
    assert paging(M397, "b200", tp=8, gmu=0.9).num_blocks > 0


def test_tiny_preset_describes_the_tiny_checkpoint():
    m = ModelSpec.from_name("tiny")
    assert m.num_gdn_layers >= 1 and m.num_attn_layers >= 1
    if TINY_CONFIG.exists():
        cfg = json.loads(TINY_CONFIG.read_text())
        cfg = cfg.get("text_config", cfg)
        assert m.hidden_size == cfg["hidden_size"]
        assert m.num_gdn_layers + m.num_attn_layers == cfg["num_hidden_layers"]
        assert m.gdn_value_heads == cfg["linear_num_value_heads"]
    assert paging(m, "h100", gmu=0.5).num_blocks > 0


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(ValueError, match="qwen3.5-35b-a3b.*tiny|tiny.*qwen3.5-35b-a3b"):
        ModelSpec.from_name("llama-70b")
    with pytest.raises(ValueError, match="b200.*h100.*h200"):
        GPU.from_name("a100")


def test_gmu_without_room_for_weights_says_so_with_numbers():
    with pytest.raises(ValueError, match=r"gmu = 0\.3.*53\.4 GiB.*weights take 66\.1 GiB.*raise gmu above 0\.\d\d"):
        paging(M35, "b200", gmu=0.3)
    with pytest.raises(ValueError, match=r"does not fit this GPU at this tp: raise tp") as e:   # no gmu above 1
        paging("qwen3.5-397b-a17b", "h200", tp=1, gmu=0.9)
    assert "raise gmu" not in str(e.value)


@pytest.mark.parametrize("bad", [0, -5])
def test_nonpositive_lengths_are_rejected(bad):
    L = paging(M35, "b200", gmu=0.6)
    with pytest.raises(ValueError, match=rf"tokens = {bad}: expected a positive integer"):
        L.max_requests(bad)


def test_bad_gmu_tp_and_dtype_are_rejected():
    with pytest.raises(ValueError, match="gmu = 1.5"):
        paging(M35, "b200", gmu=1.5)
    with pytest.raises(ValueError, match="tp = 0"):
        paging(M35, "b200", tp=0)
    with pytest.raises(ValueError, match="dtype = 'int8'"):
        ModelSpec.from_name(M35).gdn_state_bytes("int8")


def test_layout_matches_vllms_own_capacity_on_the_h200(monkeypatch):
    """vLLM 0.26 logged its pool for Qwen3.5-35B-A3B (dummy weights, gmu 0.9, eager, max len 8192) in both
    modes on an H200 (benchmarks/results/vllm_h200_2026-11-30/capacity_35b_gmu0.9_*.log): the attention
    block size it chose and its maximum concurrency. The memory model reproduces both, for the page that run
    served (the stash's keys and decays in one half: ``reconstruct_stash_bytes(halves=1, key_dtype="float32")``)."""
    import re
    from functools import partialmethod
    from pathlib import Path

    from treewy.memory import ServerConfig, paging

    one_half = partialmethod(ModelSpec.reconstruct_stash_bytes, halves=1, key_dtype="float32")
    monkeypatch.setattr(ModelSpec, "reconstruct_stash_bytes", one_half)

    logs = Path(__file__).parents[1] / "benchmarks/results/vllm_h200_2026-11-30"
    for mode in ("store_all", "reconstruct"):
        text = (logs / f"capacity_35b_gmu0.9_{mode}.log").read_text()
        block = int(re.search(r"attention block size to (\d+) tokens", text).group(1))
        conc = float(re.search(r"Maximum concurrency for 8,192 tokens per request: ([\d.]+)x", text).group(1))
        layout = paging("qwen3.5-35b-a3b", "h200", gmu=0.9, mode=mode,
                        server=ServerConfig(max_num_seqs=256, cudagraph_gib=0.0))   # as that run was launched
        assert layout.block_size == block, (mode, layout.block_size, block)
        assert abs(layout.max_concurrency(8192) / conc - 1) < 0.01, (mode, layout.max_concurrency(8192), conc)


def test_stash_bytes_are_the_plugins_page():
    from math import prod

    import torch

    from treewy.memory import ModelSpec
    from treewy.serve.reconstruct import stash_layout

    m = ModelSpec.from_name("qwen3.5-397b-a17b")
    for tp, tree in ((1, (1, 1, 1)), (8, (1,) * 5)):
        for key_dtype in (torch.bfloat16, torch.float32):
            shapes, dtypes = stash_layout(H=m.gdn_key_heads // tp, HV=m.gdn_value_heads // tp, K=m.gdn_key_dim,
                                          V=m.gdn_value_dim, max_nodes=len(tree) + 1, key_dtype=key_dtype)
            want = sum(prod(s) * torch.empty(0, dtype=d).element_size() for s, d in zip(shapes, dtypes))
            assert m.reconstruct_stash_bytes(tree, tp, key_dtype=str(key_dtype)) == want


@pytest.mark.parametrize("tp", [3, 5, 6, 32, 64])
def test_tp_that_does_not_split_the_heads_is_refused_with_the_degrees_that_do(tp):
    """vLLM shards the GDN key and value heads and the attention heads evenly (KV heads: evenly, or replicated); a
    degree that does not split them would count fractional heads for the state and truncated ones for the stash."""
    with pytest.raises(ValueError, match=rf"tp = {tp}: .*16 GDN key.*32 GDN value.*1, 2, 4, 8, 16$"):
        max_requests(M35, "h200", 8192, tp=tp, mode="reconstruct")
    with pytest.raises(ValueError, match=rf"tp = {tp}: "):
        ModelSpec.from_name(M35).reconstruct_stash_bytes((1, 1, 1), tp)


def test_simulator_refuses_a_tp_that_does_not_split_the_heads():
    from treewy.sim import simulate

    with pytest.raises(ValueError, match=r"tp = 3: .*1, 2, 4, 8, 16"):
        simulate(M35, "h200", tp=3, concurrency=[1], kernels=None)


def test_tp_degrees_that_split_every_preset_are_accepted():
    assert ModelSpec.from_name(M35).tp_degrees() == (1, 2, 4, 8, 16)
    assert ModelSpec.from_name(M397).tp_degrees() == (1, 2, 4, 8, 16)   # 2 KV heads replicated past tp = 2
    assert ModelSpec.from_name("tiny").tp_degrees() == (1, 2)
    assert paging(M397, "h200", tp=16, gmu=0.9).num_blocks > 0


def test_every_name_the_repo_imports_from_treewy_memory_is_still_there():
    """treewy.memory is a package (specs, server, paging, capacity); every ``from treewy.memory import ...`` in the
    package, the lab, the notebooks, the benchmarks, the tests and the README still finds its names."""
    import re
    from pathlib import Path

    import treewy.memory as memory

    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", *root.glob("notebooks/*.ipynb")]
    files += [p for d in ("treewy", "treewy_lab", "benchmarks", "tests") for p in (root / d).rglob("*.py")]
    names = set()
    for f in files:
        for group in re.findall(r"from treewy\.memory import \(?([\w ,\\n]+)", f.read_text()):
            names |= {n for n in re.split(r"[\s,]+|\\n", group) if n}
    assert {"ModelSpec", "max_requests", "paging", "ServerConfig"} <= names   # the scan saw the users
    assert not [n for n in names if not hasattr(memory, n)]
    assert set(memory.__all__) <= set(vars(memory))
