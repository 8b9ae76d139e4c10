"""Named serving presets: ``ServePreset.from_name("qwen3.5-35b-a3b")``.

The model ids are Hugging Face ids (vLLM resolves them from its cache or downloads them);
``--model PATH`` replaces the id with a local checkpoint. Defaults follow the paper's sweep
(DESIGN.md section 4): depth-3 MTP chain, gpu-memory-utilization 0.6 on the 35B model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ServePreset:
    name: str
    model: str
    tp: int = 1
    gmu: float = 0.9
    num_speculative_tokens: int = 3
    max_num_seqs: int = 256
    max_model_len: int | None = None

    @classmethod
    def from_name(cls, name: str) -> ServePreset:
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))} "
                             "(or pass --model PATH)") from None

    def with_overrides(self, **kw) -> ServePreset:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    @property
    def tree(self) -> str:
        """The draft shape as the serving table writes it: a chain of k is "(1, 1, 1)"."""
        return str((1,) * self.num_speculative_tokens)


PRESETS: dict[str, ServePreset] = {
    "qwen3.5-35b-a3b": ServePreset("qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", tp=1, gmu=0.6),
    "qwen3.5-397b-a17b": ServePreset("qwen3.5-397b-a17b", "Qwen/Qwen3.5-397B-A17B", tp=8, gmu=0.9),
}
