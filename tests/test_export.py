"""``treewy export-vllm``: the composite layout vLLM 0.26 serves, weights unchanged, token ids round-trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from treewy.cli import main
from treewy.memory import ModelSpec
from treewy.models import tokenizer as tk
from treewy.serve.export import export_dummy, export_vllm

TINY = Path(__file__).parents[1] / "treewy" / "models" / "tiny"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_vllm(TINY, tmp_path_factory.mktemp("x") / "tiny-vllm")


def test_config_is_the_composite_layout(exported):
    cfg = json.loads((exported / "config.json").read_text())
    src = json.loads((TINY / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and cfg["model_type"] == "qwen3_5"
    text = cfg["text_config"]
    assert {k: v for k, v in text.items() if k != "mamba_ssm_dtype"} == \
        {k: v for k, v in src.items() if k not in ("architectures", "transformers_version")}
    assert text["mamba_ssm_dtype"] == "float32" and text["model_type"] == "qwen3_5_text"
    assert cfg["vision_config"]["out_hidden_size"] == src["hidden_size"]
    assert all(src["vocab_size"] - 4 <= cfg[k] < src["vocab_size"] for k in ("image_token_id", "video_token_id"))


def test_weights_are_renamed_and_unchanged(exported):
    src, out = load_file(str(TINY / "model.safetensors")), load_file(str(exported / "model.safetensors"))
    assert len(src) == len(out)
    for k, v in src.items():
        new = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        assert torch.equal(out[new], v), k
    assert any(k.startswith("mtp.") for k in out) and "lm_head.weight" in out
    assert not any(k.startswith("model.") and not k.startswith("model.language_model.") for k in out)


def test_token_ids_round_trip(exported):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(exported))
    for text in ["def fibonacci(n):\n    return n", "héllo wörld ✓ 🙂", "  two  spaces\t\r\n", ""]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == tk.encode(text, bos=False), text
        assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids(["<bos>", "<eos>", "<pad>"]) == [tk.BOS, tk.EOS, tk.PAD]
    assert tok.encode("<bos>abc", add_special_tokens=False) == [tk.BOS, 97, 98, 99]
    assert tok.decode([tk.BOS, 104, 105, tk.EOS], skip_special_tokens=True) == "hi"
    vocab = json.loads((TINY / "config.json").read_text())["vocab_size"]
    assert None not in tok.convert_ids_to_tokens(list(range(vocab)))     # every id the model emits decodes
    gen = json.loads((exported / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tk.EOS and gen["bos_token_id"] == tk.BOS


def test_composite_checkpoint_is_passed_through(tmp_path, exported):
    again = export_vllm(exported, tmp_path / "again")
    for f in exported.iterdir():
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        export_vllm(tmp_path, tmp_path / "o")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        export_vllm(TINY, tmp_path / "full")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    with pytest.raises(ValueError, match="model_type = 'llama'"):
        export_vllm(bad, tmp_path / "o2")
    assert main(["export-vllm", str(TINY)]) == 2


def test_dummy_config_is_the_memory_models_architecture(tmp_path):
    out = export_dummy("qwen3.5-35b-a3b", tmp_path / "d")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    got, want = ModelSpec.from_config(cfg), ModelSpec.from_name("qwen3.5-35b-a3b")
    skip = {"name", "source", "extra_params", "weight_dtype"}
    assert {f.name: getattr(got, f.name) for f in dataclasses.fields(got) if f.name not in skip} == \
        {f.name: getattr(want, f.name) for f in dataclasses.fields(want) if f.name not in skip}
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(str(out)).text_config.num_experts == 256


def _tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_export_force_refuses_out_equal_to_src_or_around_or_inside_it(tmp_path, exported):
    models = tmp_path / "models"
    ck = models / "ckpt"
    ck.mkdir(parents=True)
    for f in exported.iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    before = _tree_bytes(models)
    for out, what in ((ck, "is the source folder"), (models, "holds the source folder"),
                      (ck / "vllm", "is inside the source folder")):
        with pytest.raises(ValueError, match=what):
            export_vllm(ck, out, overwrite=True)
        assert _tree_bytes(models) == before, out
    assert main(["export-vllm", "--force", str(ck), str(ck)]) == 2
    assert _tree_bytes(models) == before


@pytest.mark.parametrize("composite", [True, False], ids=["composite-source", "text-only-source"])
def test_export_force_keeps_the_files_it_does_not_write(tmp_path, exported, composite):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text("{}")
    export_vllm(exported if composite else TINY, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "config.json").read_bytes() == (exported / "config.json").read_bytes()
    assert (out / "model.safetensors").read_bytes() == (exported / "model.safetensors").read_bytes()


def test_export_force_refuses_weights_it_would_leave_beside_its_own(tmp_path, exported):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old")
    with pytest.raises(ValueError, match=r"holds weights this export does not write \(model-00001-of-00002"):
        export_vllm(exported, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["model-00001-of-00002.safetensors"]


def test_export_into_a_file_is_refused_before_writing(tmp_path, capsys):
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    assert main(["export-vllm", str(TINY), str(afile)]) == 2
    assert capsys.readouterr().err.startswith(f"treewy export-vllm: error: OUT {afile} is a file")
    with pytest.raises(ValueError, match="is a file, so no folder can be made under it"):
        export_dummy("qwen3.5-35b-a3b", afile / "d")
    assert afile.read_text() == "x"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not JSON"):
        export_vllm(bad, tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--dummy", "qwen3.5-35b-a3b", "--max-model-len", "-5"], "--max-model-len -5: expected a positive number"),
    (["--dummy", "bogus"], "--dummy 'bogus'"),
    (["--max-model-len", "4096", str(TINY)], "--max-model-len applies to --dummy only"),
], ids=["max-model-len-negative", "unknown-preset", "max-model-len-without-dummy"])
def test_export_cli_refuses_bad_arguments_and_makes_no_folder(tmp_path, capsys, argv, needle):
    out = tmp_path / "d"
    assert main(["export-vllm", *argv, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("treewy export-vllm: error: ") and needle in err and len(err.splitlines()) == 1
    assert not out.exists()
    with pytest.raises(ValueError, match="max_len = 0"):
        export_dummy("qwen3.5-35b-a3b", out, max_len=0)
    assert not out.exists()
