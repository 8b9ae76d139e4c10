"""treewy.models: loading Hugging Face checkpoints, our forward against transformers', bad input."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from treewy.models import TINY_DIR, build, load, save, tiny_config  # noqa: E402
from treewy.models.hybrid import forward_sequence  # noqa: E402
from treewy.models.layers import chunk_gdn_torch  # noqa: E402
from treewy.models.spec import spec_of  # noqa: E402
from treewy.ops import naive_tree_recurrent  # noqa: E402
from treewy.tree import DraftTree  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
             linear_value_head_dim=16, max_position_embeddings=160, initializer_range=0.2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: threads only contend


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "small"
    model = build(tiny_config(**SMALL), seed=1)
    save(model, path, dtype=torch.float32)
    return model, path


def test_load_roundtrip_is_exact(saved):
    model, path = saved
    m2 = load(path)
    assert m2.mtp is not None
    for (k, a), (k2, b) in zip(model.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    keys = set(json.loads((path / "config.json").read_text()))
    assert {"model_type", "layer_types", "mtp_num_hidden_layers"} <= keys


def test_sequence_forward_matches_transformers(saved):
    _, path = saved
    model = load(path)
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        mine = spec_of(model).lm_head(forward_sequence(spec_of(model), ids))
    assert (mine - ref).abs().max() < 1e-4 * ref.abs().max()


def test_chunk_gdn_is_the_recurrence():
    g = torch.Generator().manual_seed(0)
    B, T, H, HV, K, V = 2, 70, 1, 2, 8, 8
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=g, dtype=torch.float64)
    gg = -torch.rand(B, T, HV, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, HV, generator=g, dtype=torch.float64)
    o, S = chunk_gdn_torch(q, k, v, gg, beta, chunk=16)
    o_ref, states = naive_tree_recurrent(q, k, v, gg, beta, torch.zeros(B, HV, V, K, dtype=torch.float64),
                                         DraftTree.chain(T - 1))
    assert (o.double() - o_ref).abs().max() < 1e-4
    assert (S.double() - states[:, -1]).abs().max() < 1e-4


def test_vl_wrapper_checkpoint_loads(saved, tmp_path):
    """A Qwen3.5 checkpoint as released (model_type qwen3_5, weights under model.language_model.*)."""
    from safetensors.torch import load_file, save_file
    model, path = saved
    cfg = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": cfg}))
    sd = load_file(str(path / "model.safetensors"))
    sd = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in sd.items()}
    sd["model.visual.patch_embed.weight"] = torch.zeros(2)
    save_file(sd, str(tmp_path / "model.safetensors"))
    m2 = load(tmp_path)
    assert torch.equal(m2.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert m2.mtp is not None


def test_unknown_model_type_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="unknown model type 'llama'"):
        load(tmp_path)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load(tmp_path / "nowhere")


def test_tiny_checkpoint_is_committed_and_small():
    if not (TINY_DIR / "config.json").exists():
        pytest.skip("tiny checkpoint not trained yet")
    assert (TINY_DIR / "model.safetensors").stat().st_size <= 16 * 2**20
    card = (TINY_DIR / "README.md").read_text()
    for word in ("held-out loss", "MTP", "parameters", "date, device"):
        assert word in card
    model = load("tiny")
    assert model.mtp is not None
    assert spec_of(model).kinds.count("gdn") == 3 * spec_of(model).kinds.count("attn")
