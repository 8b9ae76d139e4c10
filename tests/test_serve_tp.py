"""TreeWY's vLLM page under tensor parallelism: each rank holds HV / tp value heads and H / tp key heads of every GDN
layer, and its page, its stash and treewy.memory's figures follow.

Claims, at tp = 1, 2, 4, 8 for the tiny checkpoint's config and the Qwen3.5-35B-A3B / 397B-A17B presets:
- the plugin's page of a rank is vLLM 0.26's own per-rank page (written out below as ``vllm_gdn_page``) followed by
  the stash of the rank's heads, through both of the plugin's paths (the patched model classmethods that read
  ``parallel_config.tensor_parallel_size``, and ``page_layout`` as the layer calls it); a tp that does not split
  the GDN heads is refused there, as treewy.memory refuses it;
- treewy.memory's per-rank conv, state and stash bytes, and its paging's mamba page, are that page's bytes;
- a spec step run rank by rank on the ranks' own pages (slot ids shared, as vLLM's block table is) gives each rank
  exactly its heads' slice of the one-GPU step, and pools of another tp are refused;
- with TREEWY_VLLM_SRC set to an unpacked vLLM 0.26 wheel, the reference is vLLM's own function.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import types
from math import prod
from pathlib import Path

import pytest
import torch

from treewy.memory import GPU, TINY_CONFIG, ModelSpec, paging
from treewy.serve import plugin
from treewy.serve.reconstruct import ReconstructPools, spec_step_gated

MODELS = ("tiny", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b")
TPS = (1, 2, 4, 8)
K_SPEC = 3
#: big enough that every preset's weights fit at tp = 1: only the page is compared here, not the pool
ROOMY = GPU("roomy", 4096.0, 4.8, 989.0, 450.0)


def hf_config(name: str) -> types.SimpleNamespace:
    """The fields of the model's (text) config.json that vLLM reads for a GDN page."""
    if name == "tiny":
        cfg = json.loads(TINY_CONFIG.read_text())
        return types.SimpleNamespace(**cfg.get("text_config", cfg))
    m = ModelSpec.from_name(name)   # the fields treewy.serve.export.dummy_text_config writes for vLLM
    return types.SimpleNamespace(linear_num_key_heads=m.gdn_key_heads, linear_num_value_heads=m.gdn_value_heads,
                                 linear_key_head_dim=m.gdn_key_dim, linear_value_head_dim=m.gdn_value_dim,
                                 linear_conv_kernel_dim=m.conv_kernel)


def _divide(numerator: int, denominator: int) -> int:
    """vllm.distributed.utils.divide: an even split, asserted."""
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def vllm_gdn_page(hf, tp: int, num_spec: int):
    """vLLM 0.26.0's GDN page of one rank, (shapes, dtypes), as it computes it:

    shapes: vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator.gated_delta_net_state_shape
    (called with ``parallel_config.tensor_parallel_size`` by Qwen3_5ForConditionalGeneration /
    Qwen3NextForCausalLM.get_mamba_state_shape_from_config, and with the layer's ``tp_size`` by
    QwenGatedDeltaNetAttention.get_state_shape): the conv state in the default "SD" layout (_orient_conv_shape);
    dtypes: MambaStateDtypeCalculator.gated_delta_net_state_dtype with mamba_cache_dtype "auto" (conv: the model's
    bf16) and Qwen3.5's mamba_ssm_dtype float32 (the recurrent state)."""
    conv_dim = hf.linear_key_head_dim * hf.linear_num_key_heads * 2 + hf.linear_value_head_dim * hf.linear_num_value_heads
    conv_state = (hf.linear_conv_kernel_dim - 1 + num_spec, _divide(conv_dim, tp))
    temporal_state = (_divide(hf.linear_num_value_heads, tp), hf.linear_value_head_dim, hf.linear_key_head_dim)
    return (conv_state, temporal_state), (torch.bfloat16, torch.float32)


def page_bytes(shapes, dtypes) -> int:
    """vllm/v1/kv_cache_interface.py, MambaSpec.page_size_bytes (unpadded)."""
    return sum(prod(s) * d.itemsize for s, d in zip(shapes, dtypes))


def vllm_refuses(hf, tp: int) -> bool:
    try:
        vllm_gdn_page(hf, tp, 0)
    except AssertionError:
        return True
    return False


def splits(name: str, tp: int) -> bool:
    return tp in ModelSpec.from_name(name).tp_degrees()


def layer_page(name: str, tp: int, num_spec: int = K_SPEC):
    """The plugin's page as its layer's get_kv_cache_spec builds it: from vLLM's per-rank spec and the model's
    (global) head counts with the layer's tp_size."""
    hf = hf_config(name)
    return plugin.page_layout(*vllm_gdn_page(hf, tp, num_spec), tp=tp, num_k_heads=hf.linear_num_key_heads,
                              num_v_heads=hf.linear_num_value_heads, head_k_dim=hf.linear_key_head_dim,
                              head_v_dim=hf.linear_value_head_dim, num_spec=num_spec)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("tp", TPS, ids=[f"tp{t}" for t in TPS])
def test_rank_page_is_vllms_page_then_the_stash_of_the_ranks_heads(name, tp):
    hf = hf_config(name)
    if not splits(name, tp):   # the stash alone: vLLM's own shapes may not even exist at this tp (tiny at 8)
        with pytest.raises(ValueError, match=rf"tensor_parallel_size = {tp}: .* GDN key.*degrees that do: 1"):
            plugin.page_layout((), (), tp=tp, num_k_heads=hf.linear_num_key_heads,
                               num_v_heads=hf.linear_num_value_heads, head_k_dim=hf.linear_key_head_dim,
                               head_v_dim=hf.linear_value_head_dim, num_spec=K_SPEC)
        return
    shapes, dtypes = layer_page(name, tp)
    H, HV = hf.linear_num_key_heads // tp, hf.linear_num_value_heads // tp
    T, Kd, Vd = K_SPEC + 1, hf.linear_key_head_dim, hf.linear_value_head_dim
    stock = vllm_gdn_page(hf, tp, K_SPEC)
    assert shapes == (*stock[0], (T, HV, Vd), (2, T, H, Kd), (2, T, HV), (1,))     # keys and decays: two halves
    # the raw keys in the conv state's dtype (the model's bf16, as they arrive), u and the decays in fp32
    assert dtypes == (*stock[1], torch.float32, torch.bfloat16, torch.float32, torch.int32)
    assert page_bytes(shapes, dtypes) == page_bytes(*stock) + T * (HV * Vd * 4 + 2 * (H * Kd * 2 + HV * 4)) + 4


def _fake_model_module(monkeypatch):
    """A module with a model class whose stock classmethods are vLLM's (vllm_gdn_page from the vllm_config)."""
    mod = types.ModuleType("treewy_test_fake_qwen")

    class Model:
        @classmethod
        def get_mamba_state_shape_from_config(cls, vllm_config):
            spec = vllm_config.speculative_config
            return vllm_gdn_page(vllm_config.model_config.hf_text_config,
                                 vllm_config.parallel_config.tensor_parallel_size,
                                 spec.num_speculative_tokens if spec else 0)[0]

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vllm_config):
            return vllm_gdn_page(vllm_config.model_config.hf_text_config, 1, 0)[1]

    mod.Model = Model
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return Model


@pytest.mark.parametrize("name", MODELS)
def test_patched_model_classes_plan_the_ranks_page(monkeypatch, name):
    """The page vLLM plans its padding for (get_mamba_state_*_from_config, patched) is the layer's page, per rank."""
    Model = _fake_model_module(monkeypatch)
    plugin._patch_model_classes([("treewy_test_fake_qwen", "Model")])
    for tp in TPS:
        cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=hf_config(name)),
                                    parallel_config=types.SimpleNamespace(tensor_parallel_size=tp),
                                    speculative_config=types.SimpleNamespace(num_speculative_tokens=K_SPEC))
        if not splits(name, tp):   # vLLM's divide refuses first where it can (tiny at 8); the plugin where not (4)
            with pytest.raises(AssertionError if vllm_refuses(hf_config(name), tp) else ValueError):
                Model.get_mamba_state_shape_from_config(cfg)
            continue
        want = layer_page(name, tp)
        assert Model.get_mamba_state_shape_from_config(cfg) == want[0], tp
        assert Model.get_mamba_state_dtype_from_config(cfg) == want[1], tp


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("tp", TPS, ids=[f"tp{t}" for t in TPS])
def test_memory_model_per_rank_bytes_are_the_plugins_page(name, tp):
    m = ModelSpec.from_name(name)
    if not splits(name, tp):
        with pytest.raises(ValueError, match=rf"tp = {tp}: "):
            m.reconstruct_stash_bytes((1,) * K_SPEC, tp)
        return
    stock = vllm_gdn_page(hf_config(name), tp, K_SPEC)
    page = layer_page(name, tp)
    conv, state = (prod(s) * d.itemsize for s, d in zip(*stock))
    assert m.conv_state_bytes(m.conv_kernel - 1 + K_SPEC, tp) == conv
    assert m.gdn_state_bytes("float32", tp) == m.num_gdn_layers * state
    assert m.reconstruct_stash_bytes((1,) * K_SPEC, tp) == page_bytes(*page) - conv - state
    for mode, want in (("store_all", conv + state), ("reconstruct", page_bytes(*page))):
        layout = paging(m, ROOMY, tp=tp, gmu=0.9, mode=mode, tree=(1,) * K_SPEC, state_dtype="float32")
        assert layout.mamba_page_raw_bytes == want, (mode, layout.mamba_page_raw_bytes, want)


# --- a spec step, rank by rank ------------------------------------------------------------------------------------

H, HV, KD, VD, TP = 2, 6, 12, 10, 2     # GVA 3; each of the 2 ranks holds 1 key and 3 value heads
SLOTS = 6


def rank_pools(tp: int) -> ReconstructPools:
    """A rank's pools as vLLM views its raw int8 page buffer (gpu_model_runner's Mamba reshape: one strided view per
    (shape, dtype), slot stride = the page), the page being the plugin's for that rank."""
    hf = types.SimpleNamespace(linear_num_key_heads=H, linear_num_value_heads=HV, linear_key_head_dim=KD,
                               linear_value_head_dim=VD, linear_conv_kernel_dim=4)
    stock = vllm_gdn_page(hf, tp, K_SPEC)
    shapes, dtypes = plugin.page_layout(*stock, tp=tp, num_k_heads=H, num_v_heads=HV, head_k_dim=KD, head_v_dim=VD,
                                        num_spec=K_SPEC)
    page = page_bytes(shapes, dtypes)
    raw = torch.full((SLOTS * page,), 0xFF, dtype=torch.uint8)     # NaN in every fp32 part
    views, off = [], 0
    for shape, dtype in zip(shapes, dtypes):
        assert off % dtype.itemsize == 0 and page % dtype.itemsize == 0
        inner = torch.empty(shape).stride()
        views.append(torch.as_strided(raw.view(dtype), (SLOTS, *shape), (page // dtype.itemsize, *inner),
                                      off // dtype.itemsize))
        off += prod(shape) * dtype.itemsize
    _, state, u, k, g, meta = views          # the plugin's treewy_pools
    meta.zero_()
    return ReconstructPools(state=state, u=u, k=k, g=g, meta=meta)


def _shard(x: torch.Tensor, heads: int, r: int, tp: int, dim: int) -> torch.Tensor:
    n = heads // tp
    return x.narrow(dim, r * n, n)


def test_spec_step_rank_by_rank_is_the_one_gpu_step_sliced_by_heads():
    gen = torch.Generator().manual_seed(11)
    full, ranks = rank_pools(1), [rank_pools(TP) for _ in range(TP)]
    S0 = torch.randn(SLOTS, HV, VD, KD, generator=gen) * 0.3
    full.state.copy_(S0)
    for r, p in enumerate(ranks):
        p.state.copy_(_shard(S0, HV, r, TP, 1))
    A_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen)
    for lens, slots, acc in (([4, 2], [3, 5], [1, 1]), ([3, 4], [3, 5], [3, 2])):   # the second folds the first
        N = sum(lens)
        cu = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)
        q, k = torch.randn(N, H, KD, generator=gen), torch.randn(N, H, KD, generator=gen)
        v = torch.randn(N, HV, VD, generator=gen)
        a, b = torch.randn(N + 2, HV, generator=gen) * 2, torch.randn(N + 2, HV, generator=gen)
        slots, acc = torch.tensor(slots), torch.tensor(acc)
        o = spec_step_gated(full, slots, acc, q, k, v, A_log, a, b, dt_bias, cu)
        for r, p in enumerate(ranks):
            kh = lambda x: _shard(x, H, r, TP, 1)     # noqa: E731
            vh = lambda x, d=1: _shard(x, HV, r, TP, d)  # noqa: E731
            o_r = spec_step_gated(p, slots, acc, kh(q), kh(k), vh(v), vh(A_log, 0), vh(a), vh(b), vh(dt_bias, 0), cu)
            assert torch.equal(o_r, vh(o)), f"rank {r}: outputs"
            for s in slots.tolist():
                assert torch.equal(p.state[s], vh(full.state[s], 0)), f"rank {r}: state of slot {s}"
                assert int(p.meta[s, 0]) == int(full.meta[s, 0])
                (_, u_f, k_f, g_f), (_, u_r, k_r, g_r) = full.pending_window(s), p.pending_window(s)
                assert torch.equal(u_r, vh(u_f)), f"rank {r}: stash u of slot {s}"
                assert torch.equal(k_r, kh(k_f)), f"rank {r}: stash k of slot {s}"
                assert torch.equal(g_r, vh(g_f)), f"rank {r}: stash g of slot {s}"
    for r, p in enumerate(ranks):    # slots no step used are untouched on every rank
        assert torch.isnan(p.u[2]).all() and int(p.meta[2, 0]) == 0


def test_pools_of_another_tp_are_refused():
    """A rank handed pages laid out for all heads (or another rank count) would read other heads' stash."""
    pools = rank_pools(1)
    N, cu = 3, torch.tensor([0, 3], dtype=torch.int32)
    q = k = torch.randn(N, H // TP, KD)
    v, a = torch.randn(N, HV // TP, VD), torch.randn(N, HV // TP)
    with pytest.raises(ValueError, match=r"window has 1 key / 3 value heads, the pools 2 / 6: .*rank's heads only"):
        spec_step_gated(pools, torch.tensor([1]), torch.ones(1), q, k, v, a[0], a, a, a[0], cu)


@pytest.mark.skipif(not os.environ.get("TREEWY_VLLM_SRC"), reason="set TREEWY_VLLM_SRC to an unpacked vllm 0.26 wheel")
def test_reference_is_vllms_own_state_shape_function():
    """vllm_gdn_page's shapes against MambaStateShapeCalculator.gated_delta_net_state_shape read from vLLM's source
    (the class compiled alone, with vllm.distributed.divide and the default conv layout)."""
    path = Path(os.environ["TREEWY_VLLM_SRC"]) / "vllm/model_executor/layers/mamba/mamba_utils.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MambaStateShapeCalculator")
    scope = {"divide": _divide, "is_conv_state_dim_first": lambda: False}
    exec(compile(ast.Module([cls], type_ignores=[]), str(path), "exec"), scope)  # noqa: S102 (vLLM's own source)
    calc = scope["MambaStateShapeCalculator"]
    for name in MODELS:
        hf = hf_config(name)
        for tp in (t for t in TPS if splits(name, t)):
            got = calc.gated_delta_net_state_shape(tp, hf.linear_num_key_heads, hf.linear_num_value_heads,
                                                   hf.linear_key_head_dim, hf.linear_value_head_dim,
                                                   hf.linear_conv_kernel_dim, K_SPEC)
            assert tuple(got) == vllm_gdn_page(hf, tp, K_SPEC)[0], (name, tp)


# --- treewy serve / bench-serve --tp N ----------------------------------------------------------------------------

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

from treewy.cli import main  # noqa: E402
from treewy.serve.launcher import visible_gpus  # noqa: E402

SMI = [("0", "GPU-aa11", "NVIDIA H200"), ("1", "GPU-bb22", "NVIDIA H100"), ("2", "GPU-cc33", "NVIDIA H200")]


@pytest.mark.parametrize("cvd,want", [(None, 3), ("", 0), ("-1", 0), ("1", 1), ("2,0", 2), ("GPU-bb", 1),
                                      ("0,7,1", 1), ("GPU-zz,0", 0), (" 0, 1 ", 2)])
def test_visible_gpus_follow_cuda_visible_devices(cvd, want):
    """Indices or uuid prefixes, up to the first entry that names no device (CUDA's rule); empty: none."""
    names = visible_gpus(SMI, cvd)
    assert len(names) == want
    if cvd == "1":
        assert names == ["NVIDIA H100"]


def _gpu_env(tmp_path, monkeypatch, n: int, cvd: str | None):
    bin_dir = support.fake_vllm_bin(tmp_path)
    support.fake_nvidia_smi(bin_dir, n)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    log = tmp_path / "bench_calls.jsonl"
    monkeypatch.setenv("FAKE_VLLM_CALL_LOG", str(log))
    return log


@pytest.mark.parametrize("command", ["serve", "bench-serve"])
@pytest.mark.parametrize("n,cvd,where", [(1, None, "this machine has 1"),
                                         (4, "2", "CUDA_VISIBLE_DEVICES='2' shows 1 of the 4 on this machine")])
def test_too_few_visible_gpus_for_tp_is_one_line_before_vllm_starts(tmp_path, monkeypatch, capsys, command, n, cvd,
                                                                   where):
    calls = _gpu_env(tmp_path, monkeypatch, n, cvd)
    args = [command, "--model", str(support.checkpoint(tmp_path)), "--tp", "2", "--port", str(support.free_port())]
    if command == "bench-serve":
        args += ["--workloads", "smoke", "--concurrency", "1", "--out", str(tmp_path / "t.parquet")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"treewy {command}: error: --tp 2 needs 2 GPUs, 1 visible ({where}): lower --tp to 1 or less, " \
                  "or make more GPUs visible"
    assert not calls.exists() and not (tmp_path / "t.parquet").exists()


def test_bench_serve_tp_reaches_vllm_and_every_row(tmp_path, monkeypatch):
    """--tp 2 on two visible GPUs: vLLM gets --tensor-parallel-size 2, and each tidy row records tp = 2."""
    import polars as pl

    _gpu_env(tmp_path, monkeypatch, 4, "3,1")
    out = tmp_path / "tp.parquet"
    assert main(["bench-serve", "--model", str(support.checkpoint(tmp_path)), "--tp", "2", "--port",
                 str(support.free_port()), "--workloads", "smoke", "--num-prompts", "2", "--concurrency", "1,2",
                 "--modes", "reconstruct", "--out", str(out), "--metrics-interval", "0.05", "--health-timeout", "30",
                 "--point-timeout", "60", "--no-progress"]) == 0
    df = pl.read_parquet(out)
    assert df.height == 2 and df["error"].is_null().all() and (df["tp"] == 2).all()
    assert (df["device"] == "NVIDIA H200").all()
    log = (tmp_path / "tp_results" / "server-reconstruct.log").read_text()
    assert "tensor_parallel_size=2" in log


def test_gpu_script_serves_the_35b_at_tp2_and_reports_capacity_beside_the_memory_model(tmp_path, monkeypatch,
                                                                                      bench_script):
    """benchmarks/vllm_serve_gpu.py sweep --tp 2: vLLM gets --tensor-parallel-size 2 with NVLink multicast off in the
    environment of what it starts, and capacity_<mode>_tp2.json puts vLLM's logged pool beside treewy.memory's."""
    import treewy.serve.export as export
    from treewy.memory import ServerConfig
    from treewy.serve.launcher import build_command

    mod = bench_script("vllm_serve_gpu")
    _gpu_env(tmp_path, monkeypatch, 2, None)
    for name in mod.ENV_026:
        monkeypatch.setenv(name, "unset by the script")      # restored after the test
    monkeypatch.setattr(export, "export_dummy", lambda *a, **k: str(tmp_path / "model"))
    seen = []

    class FakeSweep:
        def __init__(self, cfg, log=None):
            self.cfg = cfg

        def run(self, progress=False):
            seen.append((self.cfg, {k: os.environ.get(k) for k in mod.ENV_MULTI_GPU}))
            self.cfg.result_dir.mkdir(parents=True, exist_ok=True)
            (self.cfg.result_dir / "server-reconstruct.log").write_text(
                "INFO Setting attention block size to 1136 tokens to ensure that attention page size is >= mamba page "
                "size.\nINFO GPU KV cache size: 4,511,920 tokens\n"
                "INFO Maximum concurrency for 2,048 tokens per request: 790.25x\n")
            return 1, 0

    monkeypatch.setattr("treewy.serve.sweep.Sweep", FakeSweep)
    assert mod.main(["sweep", "--tp", "2", "--gmu", "0.4", "--mode", "reconstruct", "--workloads", "summarize-short",
                     "--concurrency", "1,128", "--out", str(tmp_path / "o")]) == 0
    cfg, env = seen[0]
    assert env == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    argv, _ = build_command(cfg.server)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and cfg.out.name == "serve35b_reconstruct_tp2.parquet"
    report = json.loads((tmp_path / "o" / "capacity_reconstruct_tp2.json").read_text())
    assert report["vllm"] == {"attention_block_size": 1136, "kv_cache_tokens": 4511920, "max_concurrency_at_len": 2048,
                              "max_concurrency": 790.25}
    layout = paging("qwen3.5-35b-a3b", "h200", tp=2, gmu=0.4, mode="reconstruct", server=ServerConfig(max_num_seqs=256))
    assert report["treewy_memory"]["attention_block_size"] == layout.block_size
    assert report["treewy_memory"]["max_concurrency"] == round(layout.max_concurrency(2048), 2)
    knee = report["simulated_knee"]
    assert knee["SIMULATED"] and knee["workloads"] == ["summarize-short"]
    assert knee["store_all"] is not None and 1 <= knee["store_all"] <= 256   # the gmu the item-2 run uses


def test_gpu_script_refuses_tp_above_the_visible_gpus(tmp_path, monkeypatch, bench_script):
    mod = bench_script("vllm_serve_gpu")
    _gpu_env(tmp_path, monkeypatch, 1, None)
    from treewy.serve.launcher import ServeError

    with pytest.raises(ServeError, match=r"--tp 2 needs 2 GPUs, 1 visible"):
        mod.main(["sweep", "--tp", "2", "--mode", "store_all", "--out", str(tmp_path / "o")])
